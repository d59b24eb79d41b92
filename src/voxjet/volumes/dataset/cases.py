"""Loading a case as the user gave it: its channels (one 4-D file, or one file a channel on one
grid), its label map, both checked (shape, affine, shear, finite intensities, declared label
values) and reoriented to RAS; and the non-zero region nnU-Net crops to."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.geometry import corner_distance_mm, ras_spacing, refuse_shear, to_ras
from voxjet.volumes.dataset.images import read_image
from voxjet.volumes.dataset.msd import Case, MSDDataset

MAX_CHANNELS = 16  # a 4-D image with more along its last axis is a time series, not channels
LABEL_SLAB = 16  # planes of a label map checked at a time


@dataclass
class LoadedCase:
    """One case checked and reoriented to RAS."""

    case_id: str
    image: np.ndarray  # [C, X, Y, Z] float32 (RAS)
    label: np.ndarray  # [X, Y, Z] uint8 (RAS)
    affine: np.ndarray  # the original image's
    spacing: np.ndarray  # along R, A, S
    original_label: np.ndarray  # as stored, on the original grid
    label_values: tuple[int, ...] = ()  # the values the label map holds


def label_values(label: np.ndarray) -> np.ndarray:
    """The distinct values of a label map: one comparison pass a value for a byte map with a
    handful of classes, a histogram otherwise (never a sort of every voxel)."""
    top = int(label.max())
    if label.dtype == np.uint8 and top < 32:
        return np.array([v for v in range(top + 1) if v == 0 or (label == v).any()])
    return np.flatnonzero(np.bincount(label.ravel(order="K")))


def read_label(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A label map (non-negative integers up to 255) and its affine: read in its stored type
    and checked slab by slab (no float64 copy of the case)."""
    data, affine = read_image(path, None)
    if data.ndim != 3:
        raise VoxjetError(f"{path}: label of shape {data.shape}; expected a 3-D label map")
    out = np.empty(data.shape, np.uint8)
    top = 0
    for z in range(0, data.shape[2], LABEL_SLAB):
        slab = data[:, :, z : z + LABEL_SLAB]
        if slab.dtype.kind == "f" and bool((slab != np.floor(slab)).any()):  # NaN too
            raise VoxjetError(f"{path}: label values must be non-negative integers")
        if slab.size and slab.min() < 0:
            raise VoxjetError(f"{path}: label values must be non-negative integers")
        top = max(top, slab.max() if slab.size else 0)
        if top > 255:
            raise VoxjetError(f"{path}: label values above 255 (found {data.max():g})")
        out[:, :, z : z + LABEL_SLAB] = slab
    return out, affine


def read_channel_files(files: list[Path], case_id: str) -> tuple[np.ndarray, np.ndarray]:
    """A case's image [C, X, Y, Z] as stored, from one 4-D file (channels last) or one file a
    channel (which must share one grid), and its affine; sheared grids and NaN/inf refused."""
    arrays, affine, shape = [], None, None
    for path in files:
        data, aff = read_image(path)
        if data.ndim not in (3, 4) or (data.ndim == 4 and data.shape[3] > MAX_CHANNELS):
            raise VoxjetError(
                f"{path}: image of shape {data.shape}; expected 3-D, or 4-D with channels last "
                f"(case {case_id})"
            )
        refuse_shear(aff, path, case_id)
        if affine is None:
            affine, shape = aff, data.shape[:3]
        elif data.shape[:3] != shape or not np.allclose(aff, affine, atol=1e-3, rtol=1e-3):
            raise VoxjetError(f"{path}: another grid than {files[0]} (channels of case "
                              f"{case_id} must share shape and affine)")  # fmt: skip
        if not np.isfinite(data).all():
            raise VoxjetError(
                f"{path}: {int((~np.isfinite(data)).sum())} NaN/inf voxels; fix the image or "
                f"drop case {case_id}"
            )
        arrays.append(data if data.ndim == 4 else data[..., None])
    # one channel is used as read (a concatenation would copy the case)
    image = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=-1)
    return np.moveaxis(image, -1, 0), affine


def read_channels(ds: MSDDataset, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """A dataset case's image [C, X, Y, Z] as stored and its affine, with as many channels as
    dataset.json declares."""
    image, affine = read_channel_files([ds.path(rel) for rel in case.images], case.case_id)
    if image.shape[0] != len(ds.channels):
        raise VoxjetError(
            f"{ds.path(case.images[0])}: case {case.case_id} has {image.shape[0]} channel(s), "
            f"dataset.json declares {len(ds.channels)} ({ds.channels})"
        )
    return image, affine


def load_case(ds: MSDDataset, case: Case) -> LoadedCase:
    """Load a case and check it: channels on one grid, a 3-D label on the same grid and
    affine, finite intensities, declared label values, some foreground."""
    image, affine = read_channels(ds, case)
    lpath = ds.path(case.label)
    label, laff = read_label(lpath)
    if image.shape[1:] != label.shape:
        raise VoxjetError(
            f"{lpath}: shape {label.shape} differs from the image's {image.shape[1:]}; "
            "fix or drop this case"
        )
    if not np.allclose(affine, laff, atol=1e-3, rtol=1e-3):
        mm = corner_distance_mm(affine, laff, label.shape)
        raise VoxjetError(
            f"{lpath}: affine differs from the image's ({ds.path(case.images[0]).name}) by up "
            f"to {mm:.3g} mm at the grid's corners; the label is not in the image's space. "
            "If only its header is off (a tool that rewrote it), give the label the image's "
            "affine (nibabel: nib.save(nib.Nifti1Image(label, image.affine), path)); else "
            "export the label again on the image's grid, or drop the case"
        )
    values = label_values(label)
    bad = sorted(set(values.tolist()) - set(ds.labels) - {ds.ignore})
    if bad:
        raise VoxjetError(
            f"{lpath}: label values {bad} are not declared in dataset.json labels "
            f"{sorted(ds.labels)}"
        )
    if not (set(values.tolist()) - {0, ds.ignore}):
        raise VoxjetError(f"{lpath}: no foreground (every voxel is 0"
                          + (" or ignore" if ds.ignore is not None else "")
                          + f") in case {case.case_id}")  # fmt: skip
    ras = to_ras(np.moveaxis(image, 0, -1), affine)
    return LoadedCase(
        case.case_id,
        np.moveaxis(ras, -1, 0),  # a view: resampling makes the one contiguous copy
        to_ras(label, affine),
        affine,
        ras_spacing(affine),
        label,
        tuple(int(v) for v in values),
    )


def crop_box(image: np.ndarray) -> list[list[int]]:
    """nnU-Net's crop: the bounding box of voxels non-zero in any channel ([C, X, Y, Z]);
    found per axis, without listing the coordinates of every voxel."""
    nonzero = (image != 0).any(0)
    box = []
    for axis in range(3):
        hit = np.flatnonzero(nonzero.any(axis=tuple(a for a in range(3) if a != axis)))
        box.append([int(hit[0]), int(hit[-1]) + 1] if len(hit) else [0, nonzero.shape[axis]])
    return box
