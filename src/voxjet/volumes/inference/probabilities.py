"""The probabilities of a case saved on its original grid (what find-best combines and a
cascade's next stage reads), and the label map they make."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path
from voxjet.volumes.inference.segment import to_labels
from voxjet.volumes.plan.plan_file import LabelSet

PROBABILITIES = "probabilities"  # the folder of a validation's per-case probability files


def save_probabilities(folder: Path, case_id: str, probs: np.ndarray) -> None:
    """A case's probabilities on its original grid, channels last ([X, Y, Z, C], float16)."""
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / f"{case_id}.npz") as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, probabilities=probs.astype(np.float16))


def load_probabilities(path: Path) -> np.ndarray:
    """[X, Y, Z, C] float32 from a validation's probability file."""
    try:
        with np.load(path) as z:
            return z["probabilities"].astype(np.float32)
    except (OSError, KeyError, ValueError) as e:
        raise VoxjetError(
            f"{path}: not a readable probability file ({e}); rerun the run's validate_seg job"
        ) from e


def labels_of(probs: np.ndarray, classes: LabelSet) -> np.ndarray:
    """The label map of channels-last probabilities (arg-max, or regions in their order)."""
    return to_labels(torch.from_numpy(np.moveaxis(probs, -1, 0)), classes)
