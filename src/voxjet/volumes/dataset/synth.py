"""Synthetic CT-like volumes in the Medical Segmentation Decathlon layout.

Each case: air (-1000 HU) around a body ellipse of fat and soft tissue, an organ (label 1) as a
smooth irregular blob of about 50 HU, sometimes a lesion (label 2) inside it, partial-volume
edges, Gaussian noise; varied shapes, anisotropic spacings and orientations (not all RAS).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
from scipy import ndimage

from voxjet.io.atomic import atomic_path
from voxjet.progress import progress as progress_of

LABELS = {"0": "background", "1": "organ", "2": "lesion"}


@dataclass
class ToyVolumesConfig:
    """What `voxjet synth-volumes` writes."""

    train_cases: int = 12
    test_cases: int = 2
    seed: int = 7
    min_shape: tuple[int, int, int] = (56, 56, 24)
    max_shape: tuple[int, int, int] = (80, 80, 36)
    lesions: bool = True


def _smooth_blob(rng: np.random.Generator, shape, centre, radii, roughness: float) -> np.ndarray:
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1)
    r = np.sqrt((((grid - centre) / radii) ** 2).sum(-1))
    noise = ndimage.gaussian_filter(rng.normal(size=shape), sigma=max(shape) / 8)
    noise /= np.abs(noise).max() + 1e-9
    return r + roughness * noise


def _orientation_affine(rng: np.random.Generator, spacing: np.ndarray, shape) -> np.ndarray:
    flips = rng.random(3) < 0.4  # some cases LPS-like or flipped in z: not all RAS
    aff = np.diag([*(spacing * np.where(flips, -1, 1)), 1.0])
    aff[:3, 3] = -aff[:3, :3] @ (np.array(shape) / 2)
    return aff


def make_case(
    rng: np.random.Generator, cfg: ToyVolumesConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image int16 HU, label uint8, affine) for one synthetic case."""
    shape = tuple(
        int(rng.integers(lo, hi + 1)) for lo, hi in zip(cfg.min_shape, cfg.max_shape, strict=True)
    )
    spacing = np.array([rng.uniform(0.7, 1.0), 0.0, rng.uniform(2.0, 3.0)])
    spacing[1] = spacing[0]
    s = np.array(shape, float)
    body = _smooth_blob(rng, shape, s / 2, s * np.array([0.45, 0.38, 0.6]), 0.08) < 1
    fat = body & ~(_smooth_blob(rng, shape, s / 2, s * np.array([0.40, 0.33, 0.6]), 0.1) < 1)
    centre = s / 2 + rng.uniform(-0.1, 0.1, 3) * s
    radii = s * rng.uniform(0.14, 0.22, 3) * np.array([1, 1, 1.4])
    organ_field = _smooth_blob(rng, shape, centre, radii, 0.35)
    organ = (organ_field < 1) & body & ~fat
    label = organ.astype(np.uint8)
    hu = np.full(shape, -1000.0)
    hu[body] = 30.0 + 10 * ndimage.gaussian_filter(rng.normal(size=shape), 2)[body]
    hu[fat] = -100.0
    hu[organ] = rng.normal(55, 5)
    if cfg.lesions and rng.random() < 0.7 and organ.sum() > 200:
        pts = np.argwhere(organ_field < 0.5)
        if len(pts):
            c = pts[rng.integers(len(pts))]
            lesion = (_smooth_blob(rng, shape, c, radii * rng.uniform(0.25, 0.4), 0.2) < 1) & organ
            label[lesion] = 2
            hu[lesion] = rng.normal(15, 4)
    # Partial-volume edges: blur in-plane less than through-plane, as thick slices do.
    hu = ndimage.gaussian_filter(hu, sigma=(0.7, 0.7, 0.35 * spacing[2] / spacing[0]))
    hu += rng.normal(0, 12, shape)
    return (
        np.clip(hu, -1024, 3071).astype(np.int16),
        label,
        _orientation_affine(rng, spacing, shape),
    )


def _save(arr: np.ndarray, affine: np.ndarray, path: Path) -> None:
    img = nib.Nifti1Image(arr, affine)
    img.header.set_xyzt_units("mm")
    with atomic_path(path) as tmp:
        nib.save(img, str(tmp) + ".nii.gz")
        os.replace(str(tmp) + ".nii.gz", tmp)


def case_ids(cfg: ToyVolumesConfig) -> list[str]:
    """The training cases' ids generate_dataset writes (known before it runs)."""
    return [f"toy_{i:03d}" for i in range(cfg.train_cases)]


def generate_dataset(
    out_dir: str | os.PathLike,
    cfg: ToyVolumesConfig,
    progress: bool = True,
    name: str = "Task00_Toy",
) -> Path:
    """Write an MSD-layout dataset (dataset.json, imagesTr, labelsTr, imagesTs)."""
    out = Path(out_dir)
    for sub in ("imagesTr", "labelsTr", "imagesTs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    training, test = [], []
    total = cfg.train_cases + cfg.test_cases
    for i in progress_of(range(total), "synth-volumes", "case", disable=not progress):
        image, label, affine = make_case(rng, cfg)
        case = f"toy_{i:03d}.nii.gz"
        if i < cfg.train_cases:
            _save(image, affine, out / "imagesTr" / case)
            _save(label, affine, out / "labelsTr" / case)
            training.append({"image": f"./imagesTr/{case}", "label": f"./labelsTr/{case}"})
        else:
            _save(image, affine, out / "imagesTs" / case)
            test.append(f"./imagesTs/{case}")
    meta = {
        "name": name,
        "description": "voxjet synthetic CT-like volumes",
        "tensorImageSize": "3D",
        "modality": {"0": "CT"},
        "labels": LABELS,
        "numTraining": len(training),
        "numTest": len(test),
        "training": training,
        "test": test,
    }
    with atomic_path(out / "dataset.json") as tmp:
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
    return out
