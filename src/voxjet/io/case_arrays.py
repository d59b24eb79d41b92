"""The reader of a case file's image or label, whichever store wrote it: a memory map
(`storage: mapped`), a blosc2 frame (`blosc2`) or LZ4 chunks through the decoded-chunk cache
(`compressed`); each with .read(lo, hi, out) and the store's own integrity check."""

from __future__ import annotations

import h5py
import numpy as np

from voxjet.io.chunks import ChunkCache, ChunkedArray
from voxjet.io.integrity import corrupt_error
from voxjet.io.mapped import MappedArray, is_mapped
from voxjet.io.packed import PackedArray, is_packed

CaseArray = MappedArray | PackedArray | ChunkedArray


def open_array(f: h5py.File, name: str, axis: int, where: str, path: str | None,
               cache: ChunkCache, key: tuple) -> CaseArray:  # fmt: skip
    """Dataset `name` of an open case file as its store reads it (`path`: the file on local
    disk, None for a file held in memory; `axis`: the first spatial axis)."""
    dset = f[name]
    if is_packed(dset):
        return PackedArray(dset, where, path)
    if is_mapped(dset):  # uncompressed: a memory map, no decoding to cache
        return MappedArray(dset, axis, where, path)
    return ChunkedArray(dset, cache, key, where)


def read_verified(f: h5py.File, name: str, axis: int, where: str) -> np.ndarray:
    """A whole dataset of a case file, verified as its store verifies it (slabs, chunks, or
    the fletcher32 filter)."""
    dset = f[name]
    try:
        if is_packed(dset):
            return PackedArray(dset, where, None).whole()
        if is_mapped(dset):
            return MappedArray(dset, axis, where, None).whole()
        return dset[...]
    except (OSError, RuntimeError, ValueError) as e:
        raise corrupt_error(where, name, "preprocess_case", e) from e
