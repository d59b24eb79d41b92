"""The `volumes:` section of a segmentation dataset, typed: what planning and preprocessing
are asked for."""

from __future__ import annotations

from dataclasses import dataclass

# the folder under results/<dataset>/ of each configuration's preprocessed cases (a cascade's
# and a 2d run's are the full-resolution ones)
CASE_FOLDERS = {"3d_fullres": "cases", "3d_lowres": "cases_3d_lowres"}


@dataclass
class VolumePrepConfig:
    """Preprocessing and planning choices from the dataset's `volumes:` section."""

    target_spacing: list[float] | None = None
    patch_size: list[int] | None = None
    network_depth: int = 3
    plan_channels: list[int] | None = None
    plan: str = "voxjet"
    gpu_memory_gb: float | None = None
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    foreground_samples: int = 10000
    on_bad_case: str = "fail"
    storage: str = "auto"
    node_memory_gb: float | None = None
    seed: int = 42
