"""Jagged particle arrays as flat rows plus offsets (awkward's ListOffsetArray layout, what
the shards store): a reusable buffer to read chunks into, gathering jets, and padding a
batch to [B, P, F] with a mask.

Shards keep only real particles (a JetClass jet has ~40 of its 128 slots filled), so every
copy on the way to the model moves a third of the bytes; padding happens last: per batch on
the GPU when there is one, else by the loader (voxjet.jets.stream, `pad_to`)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from voxjet.io.layout import pack_layout

if TYPE_CHECKING:
    import torch


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """[n + 1] offsets (int64) of rows with these particle counts."""
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def ragged_arange(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The ranges [start, start + count) of every row, concatenated."""
    counts = np.asarray(counts, np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.cumsum(counts) - counts  # where each row's range begins in the output
    return np.arange(total, dtype=np.int64) + np.repeat(np.asarray(starts) - first, counts)


Specs = dict[str, tuple[tuple[int, ...], np.dtype]]


def _empty(specs: Specs) -> dict[str, np.ndarray]:
    return {k: np.empty(shape, dtype) for k, (shape, dtype) in specs.items()}


def take_rows(
    data: dict[str, np.ndarray],
    rows: np.ndarray,
    alloc: Callable[[Specs], dict[str, np.ndarray]] = _empty,
) -> dict[str, np.ndarray]:
    """Jets `rows` of `data`, in that order, each key copied once (np.take: several times
    faster than fancy indexing for rows of particles). "particles" is jagged by "offsets".
    `alloc` gives the output arrays from their shapes (e.g. in one shared-memory buffer)."""
    rowwise = [k for k in data if k not in ("particles", "offsets")]
    specs = {k: ((len(rows), *data[k].shape[1:]), data[k].dtype) for k in rowwise}
    if "particles" in data:
        off, p = data["offsets"], data["particles"]
        counts = off[1:][rows] - off[:-1][rows]
        specs["particles"] = ((int(counts.sum()), *p.shape[1:]), p.dtype)
        specs["offsets"] = ((len(rows) + 1,), np.dtype(np.int64))
    out = alloc(specs)
    for k in rowwise:
        np.take(data[k], rows, axis=0, out=out[k])
    if "particles" in data:
        out["offsets"][0] = 0
        np.cumsum(counts, out=out["offsets"][1:])
        gather_rows(p, ragged_arange(off[:-1][rows], counts), out["particles"])
    return out


def gather_rows(src: np.ndarray, index: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[i] = src[index[i]] along the first axis. torch's index_select copies rows 2x as
    fast as np.take on one thread and uses the intra-op threads, so it runs in a process's
    main thread (a DataLoader worker, a loader on its own); from a background thread (a
    training loop's prefetch thread) it would start a second OpenMP team on the cores the
    training step uses (measured: PFN 16-18k jets/s instead of 22-23k), so there np.take."""
    if not len(index):
        return out
    if threading.current_thread() is threading.main_thread():
        import torch  # loaded by then in any process that trains; the dry run never is

        torch.index_select(
            torch.from_numpy(src), 0, torch.from_numpy(np.asarray(index)), out=torch.from_numpy(out)
        )
    else:
        np.take(src, index, axis=0, out=out)
    return out


class JaggedBuffer:
    """A jagged chunk (flat "particles" + "offsets" + row-wise keys) that grows in place and
    is reused: a loader reads block after block straight into it (h5py read_direct) instead
    of reading each into new arrays and joining them, since touching fresh memory costs a
    page fault every 4 KiB (on a small VM, as long as the copy itself)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.jets = 0
        self.particles = 0

    def clear(self) -> None:
        """Empty it, keeping the memory."""
        self.jets = self.particles = 0

    def reserve(self, jets: int, particles: int, like: Specs) -> None:
        """Room for `jets` more rows and `particles` more particles (plus one spare particle
        row, for a zero row); `like` gives each key's row shape and dtype. Growing keeps the
        content and adds at least a quarter (appends in a loop copy O(n) in all)."""
        need = {"particles": self.particles + particles + 1, "offsets": self.jets + jets + 1}
        for k, (tail, dtype) in like.items():
            have = self.arrays.get(k)
            n = need.get(k, self.jets + jets)
            if have is None or len(have) < n or have.shape[1:] != tail or have.dtype != dtype:
                grown = np.empty(
                    (max(n, len(have) * 5 // 4 if have is not None else n), *tail), dtype
                )
                if have is not None:
                    used = {"particles": self.particles, "offsets": self.jets + 1}
                    m = used.get(k, self.jets)
                    grown[:m] = have[:m]
                else:
                    grown[:1] = 0  # offsets start at 0
                self.arrays[k] = grown

    def view(self) -> dict[str, np.ndarray]:
        """The filled part (views: valid until the next clear or reserve)."""
        a = self.arrays
        out = {k: v[: self.jets] for k, v in a.items() if k not in ("particles", "offsets")}
        out["particles"] = a["particles"][: self.particles]
        out["offsets"] = a["offsets"][: self.jets + 1]
        return out

    def append(self, chunk: dict[str, np.ndarray]) -> None:
        """Copy a jagged chunk in after what is there."""
        n, m = len(chunk["offsets"]) - 1, len(chunk["particles"])
        self.reserve(n, m, {k: (v.shape[1:], v.dtype) for k, v in chunk.items()})
        j, p = self.jets, self.particles
        for k, v in chunk.items():
            if k == "particles":
                self.arrays[k][p : p + m] = v
            elif k == "offsets":
                self.arrays[k][j + 1 : j + n + 1] = v[1:] - v[0] + p
            else:
                self.arrays[k][j : j + n] = v
        self.jets, self.particles = j + n, p + m


def take_from_chunks(
    chunks: list[dict[str, np.ndarray]], chunk: np.ndarray, rows: np.ndarray
) -> dict[str, np.ndarray]:
    """Jets (chunk[i], rows[i]) of same-keyed chunks, in that order, without joining the
    chunks first (a shard job holds everything it read once, not twice)."""
    counts = np.zeros(len(rows), np.int64)
    # each chunk's output positions, from one sort (not a scan of every row for every chunk:
    # a shard job of many files holds thousands of chunks)
    by_chunk = np.argsort(chunk, kind="stable")
    bounds = np.searchsorted(chunk[by_chunk], np.arange(len(chunks) + 1))
    groups = [by_chunk[bounds[c] : bounds[c + 1]] for c in range(len(chunks))]
    for c, sel in zip(chunks, groups, strict=True):
        counts[sel] = np.diff(c["offsets"])[rows[sel]]
    out = _empty(
        {
            k: (((int(counts.sum()) if k == "particles" else len(rows)), *v.shape[1:]), v.dtype)
            for k, v in chunks[0].items()
            if k != "offsets"
        }
    )
    out["offsets"] = offsets_of(counts)
    for c, sel in zip(chunks, groups, strict=True):
        if len(sel):
            part = take_rows(c, rows[sel])
            for k, v in part.items():
                if k == "particles":
                    out[k][ragged_arange(out["offsets"][sel], counts[sel])] = v
                elif k != "offsets":
                    out[k][sel] = v
    return out


# Padding happens in one of two places, each where the batch already is: on the device that
# trains (pad_particles: the loader ships the unpadded bytes to the GPU), or in a DataLoader
# worker for a model on the CPU (pad_rows: straight into the worker's shared-memory buffer).
# Both give the same arrays (tests/test_jagged.py).


def pad_particles(
    flat: torch.Tensor, counts: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat particles [sum(counts), F] of jets with `counts` (each ≤ length) as padded
    [B, length, F] (zeros beyond each jet's count) and the mask [B, length]; on the tensors'
    device."""
    import torch

    mask = torch.arange(length, device=flat.device) < counts.to(flat.device)[:, None]
    out = flat.new_zeros(len(counts), length, flat.shape[-1])
    out[mask] = flat  # row-major order of the mask is jet by jet, particle by particle
    return out, mask


def pad_rows(
    flat: np.ndarray,
    offsets: np.ndarray,
    rows: np.ndarray,
    zero_row: int,
    out: np.ndarray,
    mask: np.ndarray,
    index: np.ndarray,
) -> None:
    """Jets `rows` of flat particles with `offsets`, padded into `out` [n, length, F] with
    `mask` [n, length]: one gather through `index` [n, length] (scratch), whose pad slots point
    at `zero_row`, a row of zeros in `flat` (no fill, no scatter). Counts must be ≤ length."""
    n, length = mask.shape
    starts = offsets[:-1][rows]
    np.less(np.arange(length), (offsets[1:][rows] - starts)[:, None], out=mask)
    np.add(starts[:, None], np.arange(length), out=index)
    np.copyto(index, zero_row, where=~mask)
    gather_rows(flat, index.reshape(-1), out.reshape(n * length, out.shape[-1]))


# A slab is free when only the pool refers to it, which sys.getrefcount tells on the CPython
# versions it was tested on; elsewhere (3.14 counts borrowed references differently, PyPy has
# no counts) a slab is never handed out twice: fresh memory a buffer, as without the pool.
REFCOUNT_TELLS_FREE = sys.implementation.name == "cpython" and sys.version_info < (3, 14)


class SlabPool:
    """Byte buffers handed out again once nothing else refers to them: a loader that makes a
    shuffle buffer's batches as views of one padded array need not touch fresh memory for
    every buffer (a page fault every 4 KiB: 140 MB of padded JetClass jets cost ~0.3 s here).
    In use means referenced: every numpy view keeps its base array alive, and a tensor made
    with torch.from_numpy keeps its array alive, so a batch still queued or held anywhere
    keeps its slab out of the pool."""

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep
        self.slabs: list[np.ndarray] = []

    def arrays(self, specs: Specs) -> dict[str, np.ndarray]:
        """Arrays of these shapes and dtypes, laid out in one free slab."""
        layout, total = pack_layout(specs)
        slab = self._free(total)
        out = {}
        for k, (shape, dtype) in specs.items():
            start, n = layout[k]
            out[k] = slab[start : start + n].view(dtype).reshape(shape)
        return out

    def _free(self, nbytes: int) -> np.ndarray:
        if not REFCOUNT_TELLS_FREE:
            return np.empty(nbytes, np.uint8)
        for slab in self.slabs:
            # referenced only by the list, `slab` and getrefcount's argument: nothing uses it
            if len(slab) >= nbytes and sys.getrefcount(slab) <= 3:
                return slab
        new = np.empty(nbytes + nbytes // 4, np.uint8)  # room for a somewhat larger buffer
        self.slabs = [*self.slabs, new][-self.keep :]
        return new
