"""The target spacing a dataset's cases are resampled to (one rule, nnU-Net's), and their shapes
once resampled."""

from __future__ import annotations

import numpy as np

ANISOTROPY = 3  # nnU-Net's ANISO_THRESHOLD


def target_spacing(spacings: list[list[float]], shapes: list[list[int]]) -> np.ndarray:
    """nnU-Net's target spacing (`determine_fullres_target_spacing`), for voxjet's planner and
    the ResEnc presets alike: the median, except on an axis both more than 3× coarser and more
    than 3× shorter (in voxels) than the others, which takes its 10th percentile — kept at
    least as coarse as the other axes (their largest spacing + 1e-5 where the percentile is
    finer)."""
    sp = np.vstack(spacings).astype(float)
    target = np.percentile(sp, 50, 0)
    size = np.percentile(np.vstack(shapes), 50, 0)
    worst = int(np.argmax(target))
    others = [i for i in range(len(target)) if i != worst]
    aniso_spacing = target[worst] > ANISOTROPY * max(target[others])
    aniso_voxels = size[worst] * ANISOTROPY < min(size[others])
    if aniso_spacing and aniso_voxels:
        t = np.percentile(sp[:, worst], 10)
        if t < max(target[others]):
            t = max(max(target[others]), t) + 1e-5
        target[worst] = t
    return target


def resampled_shapes(shapes: list[list[int]], spacings: list[list[float]],
                     target: list[float]) -> np.ndarray:  # fmt: skip
    """Each case's (cropped) shape once resampled to `target`."""
    return np.maximum(1, np.round(np.asarray(shapes) * np.asarray(spacings) / np.asarray(target)))


def dataset_voxels(shapes: np.ndarray) -> float:
    """The voxels of all cases once resampled (what the batch's dataset share is taken of)."""
    return float(np.prod(np.asarray(shapes, dtype=np.float64), axis=1).sum())
