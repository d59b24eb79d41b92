"""Between an image's original voxel grid and the plan's: reorientation to RAS, cropping and
resampling, and their inverse, so predictions land on the original image (same shape, affine)."""

from __future__ import annotations

import nibabel as nib
import numpy as np
from scipy import ndimage


def to_ras(data: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Array axes reordered/flipped to RAS (the first three axes)."""
    return nib.orientations.apply_orientation(data, nib.io_orientation(affine))


def from_ras(data: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Inverse of to_ras: a RAS array back into the original image's axis order and flips."""
    ras = nib.orientations.axcodes2ornt(("R", "A", "S"))
    back = nib.orientations.ornt_transform(ras, nib.io_orientation(affine))
    return nib.orientations.apply_orientation(data, back)


def ras_spacing(affine: np.ndarray) -> np.ndarray:
    """Voxel sizes along R, A, S."""
    ornt = nib.io_orientation(affine)
    zooms = np.sqrt((affine[:3, :3] ** 2).sum(0))
    out = np.zeros(3)
    for axis, (ras_axis, _) in enumerate(ornt):
        out[int(ras_axis)] = zooms[axis]
    return out


def zoom_to(arr: np.ndarray, shape: tuple[int, ...], order: int) -> np.ndarray:
    """Resample the last three axes to exactly `shape` (order 0 nearest, 1 linear)."""
    lead = arr.shape[:-3]
    if tuple(arr.shape[-3:]) == tuple(shape):
        return arr
    factors = (1,) * len(lead) + tuple(s / a for s, a in zip(shape, arr.shape[-3:], strict=True))
    out = ndimage.zoom(arr, factors, order=order, mode="nearest", grid_mode=True)
    # zoom rounds the output shape; pad or cut by at most a voxel to land exactly
    fix = [(0, 0)] * len(lead) + [
        (0, max(0, s - o)) for s, o in zip(shape, out.shape[-3:], strict=True)
    ]
    out = np.pad(out, fix, mode="edge")
    return out[(...,) + tuple(slice(0, s) for s in shape)]


def zoom_labels(label: np.ndarray, shape: tuple[int, ...], n_classes: int) -> np.ndarray:
    """Labels resampled by interpolating each class's indicator linearly and taking the
    arg-max (smoother than nearest neighbour, as nnU-Net does)."""
    if tuple(label.shape) == tuple(shape):
        return label
    best = np.zeros(shape, np.float32)
    out = np.zeros(shape, np.uint8)
    for c in range(n_classes):
        p = zoom_to((label == c).astype(np.float32), shape, order=1)
        take = p > best
        out[take], best[take] = c, p[take]
    return out


def plan_shape(shape: tuple[int, ...], spacing: np.ndarray, target: np.ndarray) -> tuple[int, ...]:
    """The voxel grid of a (cropped) region once resampled to `target` spacing."""
    return tuple(int(v) for v in np.maximum(1, np.round(np.array(shape) * spacing / target)))


def labels_to_original(pred: np.ndarray, attrs, n_classes: int) -> np.ndarray:
    """A class map in the plan's space mapped back: un-resample, un-crop, un-reorient."""
    box = np.asarray(attrs["crop_box"])
    cropped = tuple(int(b - a) for a, b in box)
    full = np.zeros(tuple(int(s) for s in attrs["ras_shape"]), np.uint8)
    full[tuple(slice(int(a), int(b)) for a, b in box)] = zoom_labels(pred, cropped, n_classes)
    return from_ras(full, np.asarray(attrs["original_affine"]))
