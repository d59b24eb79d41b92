"""A predicted case's probabilities written without every class at full resolution in memory:
the sliding window's finished slabs go into a chunked HDF5 file at the plan's spacing (one
chunk column a class), then each class in turn is resampled onto the case's original grid
and streamed into the 4-D NIfTI (channels last: in NIfTI's Fortran order each channel is one
contiguous block, so the file is written class after class through gzip)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import h5py
import numpy as np
import torch

from voxjet.io.atomic import atomic_path, temporary_name
from voxjet.volumes.dataset.geometry import from_ras, zoom_to

NIFTI1_DATA_OFFSET = 352  # a single-file NIfTI-1's header and empty extension flag


@contextmanager
def plan_space_buffer(
    folder: Path, case_id: str, classes: int, shape: tuple[int, ...]
) -> Iterator[h5py.Dataset]:
    """A temporary chunked [C, X, Y, Z] float32 dataset beside the outputs (removed after),
    chunks of one class each, which the slabs are written into."""
    # this process's temporary name: a killed job's leftover is swept by the next writer
    tmp = temporary_name(folder / f"{case_id}_probabilities.plan.h5")
    try:
        with h5py.File(tmp, "w") as f:
            chunks = (1, *(min(int(n), 64) for n in shape))
            yield f.create_dataset("p", (classes, *shape), np.float32, chunks=chunks)
    finally:
        tmp.unlink(missing_ok=True)


def write_slab(buffer: h5py.Dataset, axis: int, lo: int, hi: int, slab: torch.Tensor) -> None:
    """One finished slab [C, …] of probabilities into the buffer."""
    index = (slice(None),) * (1 + axis) + (slice(lo, hi),)
    buffer[index] = slab.cpu().numpy()


def stream_to_nifti(target: Path, buffer: h5py.Dataset, attrs: dict, background: float) -> None:
    """The buffer's classes resampled linearly onto the case's original grid (outside the crop
    box: `background` for class 0, 0 for the others) and written as a 4-D float32 NIfTI
    [X, Y, Z, C] in the original orientation and affine, one class in memory at a time."""
    import nibabel as nib

    affine = np.asarray(attrs["original_affine"], float)
    box = np.asarray(attrs["crop_box"])
    cropped = tuple(int(b - a) for a, b in box)
    inside = tuple(slice(int(a), int(b)) for a, b in box)
    ras_shape = tuple(int(s) for s in attrs["ras_shape"])
    n = buffer.shape[0]
    first = from_ras(np.broadcast_to(np.uint8(0), ras_shape), affine)  # its shape only
    header = nib.Nifti1Header()
    header.set_data_shape((*first.shape, n))
    header.set_data_dtype(np.float32)
    header.set_qform(affine, code=1)
    header.set_sform(affine, code=1)
    header.set_data_offset(NIFTI1_DATA_OFFSET)
    # nibabel's own level for .nii.gz (what every other NIfTI voxjet writes gets): deflating
    # every class's float32 volume at a higher level costs more time than the prediction
    with atomic_path(target) as tmp, gzip.open(tmp, "wb", compresslevel=1) as out:
        header.write_to(out)
        out.write(b"\0" * (NIFTI1_DATA_OFFSET - out.tell()))  # the extension flag, if not yet
        for c in range(n):
            full = np.full(ras_shape, background if c == 0 else 0.0, np.float32)
            full[inside] = zoom_to(buffer[c][None], cropped, 1)[0]
            out.write(np.asarray(from_ras(full, affine), "<f4").tobytes(order="F"))
