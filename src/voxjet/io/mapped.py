"""Uncompressed arrays in an HDF5 file read through a memory map, verified by a CRC32 a slab.

A random patch out of an LZ4-compressed chunked array decodes every chunk it touches (several
patches' worth of data); from an uncompressed contiguous array it is a strided copy out of the
page cache — nnU-Net's own trade (it trained from unpacked, memory-mapped arrays for years).
What fletcher32 gives a compressed chunk, a CRC32 of each slab of `SLAB` planes along the first
spatial axis gives here: each slab is verified the first time a process reads it, so a flipped
byte is caught before it reaches a batch, and verification costs one pass over the data a
process, not one a read."""

from __future__ import annotations

import zlib

import h5py
import numpy as np

from voxjet.io.integrity import corrupt_error

SLAB = 8  # planes along the first spatial axis a checksum covers


def slab_crcs(arr: np.ndarray, axis: int) -> np.ndarray:
    """CRC32 of each slab of SLAB planes along `axis`, for every index of the axes before it
    (for an image [C, X, Y, Z] and axis 1: [C, slabs]); the slabs of a C-order array are
    contiguous, so each is checksummed in place."""
    lead = arr.shape[:axis]
    n = -(-arr.shape[axis] // SLAB)
    out = np.zeros((*lead, n), np.uint32)
    for idx in np.ndindex(*lead):
        sub = arr[idx]
        for s in range(n):
            out[(*idx, s)] = zlib.crc32(np.ascontiguousarray(sub[s * SLAB : (s + 1) * SLAB]))
    return out


def write_mapped(f: h5py.File, name: str, data: np.ndarray, axis: int) -> None:
    """`data` as a contiguous uncompressed dataset with its slab checksums beside it."""
    f.create_dataset(name, data=data)  # no chunks, no filters: contiguous
    f.create_dataset(f"{name}_crc32", data=slab_crcs(data, axis))


def is_mapped(dset: h5py.Dataset) -> bool:
    """Whether a dataset was written by write_mapped."""
    return dset.chunks is None and f"{dset.name}_crc32" in dset.file


class MappedArray:
    """A write_mapped dataset read box by box out of a memory map of its file (of a file held
    in memory, as from a URL: out of a copy of the array), each slab verified on first use."""

    def __init__(self, dset: h5py.Dataset, axis: int, where: str, path: str | None) -> None:
        self.dset, self.axis, self.where = dset, axis, where
        self.shape, self.dtype = tuple(dset.shape), dset.dtype
        self.crcs = dset.file[f"{dset.name}_crc32"][...]
        self.verified = np.zeros(self.crcs.shape, bool)
        offset = dset.id.get_offset()
        self.map = None
        if path is not None and offset is not None:
            self.map = np.memmap(path, self.dtype, "r", offset=offset, shape=self.shape)
        elif offset is not None:
            # a fetched file held in memory: the array read once, in one piece (h5py reads a
            # box out of a file object with one Python call a row: ~40x slower a patch)
            self.map = np.empty(self.shape, self.dtype)
            dset.read_direct(self.map)

    def _verify(self, lo: int, hi: int) -> None:
        slabs = range(lo // SLAB, (hi - 1) // SLAB + 1)
        todo = [s for s in slabs if not self.verified[..., s].all()]
        for s in todo:
            block = (slice(None),) * self.axis + (slice(s * SLAB, (s + 1) * SLAB),)
            data = self.map[block] if self.map is not None else self.dset[block]
            for idx in np.ndindex(*self.crcs.shape[:-1]):
                if zlib.crc32(np.ascontiguousarray(data[idx])) != self.crcs[(*idx, s)]:
                    what = f"{self.dset.name} planes {s * SLAB}-{(s + 1) * SLAB - 1}"
                    raise corrupt_error(self.where, what, "preprocess_case",
                                        ValueError("CRC32 mismatch"))  # fmt: skip
            self.verified[..., s] = True

    def read(
        self, lo: tuple[int, ...], hi: tuple[int, ...], out: np.ndarray | None = None
    ) -> np.ndarray:
        """The box [lo, hi) (within the array's bounds), into `out` when given."""
        if hi[self.axis] > lo[self.axis]:
            self._verify(lo[self.axis], hi[self.axis])
        box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
        src = self.map[box] if self.map is not None else self.dset[box]
        if out is None:
            return np.array(src)
        out[...] = src
        return out

    def whole(self) -> np.ndarray:
        """The whole array, verified."""
        return self.read((0,) * len(self.shape), self.shape)
