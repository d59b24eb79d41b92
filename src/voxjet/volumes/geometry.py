"""Between an image's original voxel grid and the plan's: reorientation to RAS, cropping and
resampling, and their inverse, so predictions land on the original image (same shape, affine)."""

from __future__ import annotations

import nibabel as nib
import numpy as np


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
    """Resample the last three axes to exactly `shape`: order 1 trilinear, 0 nearest (torch's
    interpolation: multi-threaded, several times faster than scipy's on a CT volume)."""
    import torch
    import torch.nn.functional as F

    shape = tuple(int(s) for s in shape)
    if tuple(arr.shape[-3:]) == shape:
        return arr
    lead = arr.shape[:-3]
    t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).reshape(
        1, -1, *arr.shape[-3:]
    )
    if order == 0:
        out = F.interpolate(t, size=shape, mode="nearest-exact")
    else:
        out = F.interpolate(t, size=shape, mode="trilinear", align_corners=False)
    return out.reshape(*lead, *shape).numpy().astype(arr.dtype, copy=False)


def zoom_labels(label: np.ndarray, shape: tuple[int, ...], n_classes: int) -> np.ndarray:
    """Labels resampled by interpolating each class's indicator linearly and taking the
    arg-max (smoother than nearest neighbour, as nnU-Net does)."""
    import torch
    import torch.nn.functional as F

    shape = tuple(int(s) for s in shape)
    if tuple(label.shape) == shape:
        return label
    # one class at a time: a running maximum is much faster than argmax over a class axis
    src = torch.from_numpy(label.astype(np.int64))[None, None]
    best = torch.full((1, 1, *shape), -1.0)
    out = torch.zeros(shape, dtype=torch.uint8)
    for c in range(n_classes):
        p = F.interpolate((src == c).float(), size=shape, mode="trilinear", align_corners=False)
        take = p > best
        best = torch.where(take, p, best)
        out[take[0, 0]] = c
    return out.numpy()


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
