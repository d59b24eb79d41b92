"""Decoded HDF5 chunks kept in memory, so that reading a patch is a few numpy copies.

HDF5's own chunk cache still copies a selection element-run by element-run through its
hyperslab machinery (about 1 ms for a 96x96x48 float patch here); decoding each chunk once,
keeping it as an array and slicing it with numpy is several times faster. Only the chunks a
read touches are decoded, and the cache is bounded in bytes (least recently used goes first).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

from voxjet.io.integrity import corrupt_error


class ChunkCache:
    """Least-recently-used decoded chunks, bounded by their total bytes."""

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The cached array for `key`, loading (and possibly evicting) on a miss."""
        arr = self._items.get(key)
        if arr is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return arr
        self.misses += 1
        arr = load()
        self._items[key] = arr
        self.bytes += arr.nbytes
        while self.bytes > self.max_bytes and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.nbytes
        return arr


class ChunkedArray:
    """A chunked h5py dataset read box by box through a ChunkCache."""

    def __init__(self, dset, cache: ChunkCache, key: Hashable, where: str = "") -> None:
        self.dset = dset
        self.where = where or f"{dset.file.filename}:{dset.name}"  # named in errors
        self.shape = tuple(dset.shape)
        self.dtype = dset.dtype
        self.chunks = tuple(dset.chunks or dset.shape)
        self.cache = cache
        self.key = key

    def read(
        self, lo: tuple[int, ...], hi: tuple[int, ...], out: np.ndarray | None = None
    ) -> np.ndarray:
        """The box [lo, hi) (within the array's bounds), into `out` when given (no extra copy)."""
        if out is None:
            out = np.empty(tuple(b - a for a, b in zip(lo, hi, strict=True)), self.dtype)
        # per axis, once: the chunks the box crosses, and which part of each goes where
        axes = []
        for a, b, c in zip(lo, hi, self.chunks, strict=True):
            segments = []
            for i in range(a // c, (b - 1) // c + 1) if b > a else ():
                start, stop = max(a, i * c), min(b, (i + 1) * c)
                segments.append((i, slice(start - i * c, stop - i * c), slice(start - a, stop - a)))
            axes.append(segments)
        for combo in itertools.product(*axes):
            idx = tuple(seg[0] for seg in combo)
            chunk = self.cache.get((self.key, idx), lambda idx=idx: self._decode(idx))
            out[tuple(seg[2] for seg in combo)] = chunk[tuple(seg[1] for seg in combo)]
        return out

    def _decode(self, idx: tuple[int, ...]) -> np.ndarray:
        box = tuple(
            slice(i * c, min((i + 1) * c, s))
            for i, c, s in zip(idx, self.chunks, self.shape, strict=True)
        )
        try:
            return self.dset[box]
        except (OSError, RuntimeError, ValueError) as e:
            raise corrupt_error(
                self.where, f"{self.dset.name} chunk {idx}", "preprocess_case", e
            ) from e
