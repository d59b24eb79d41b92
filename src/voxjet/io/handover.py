"""Batches from DataLoader workers in shared-memory slabs that are used again once the
training process has let go of them.

A DataLoader worker puts every batch into fresh shared memory, and touching fresh memory costs
a page fault every 4 KiB — on a small VM more than the copy itself: a 2-worker DataLoader that
only hands over new 4.5 MB batches manages ~360 a second here, the same batches in reused
slabs ~1200. Reuse needs to know when the training process is done with a batch, so the two
sides share a small table of slot states: a worker hands a slot's slab out (OUT), and the
process that iterates gives it back (FREE) once no tensor refers to its storage any more (the
storage's use count, which counts every view), never earlier; it keeps each slab mapped, so
the next batch in it is not mapped (and faulted in) again. A batch held for long just keeps
its slot; the worker then takes another slot or, with none free, fresh memory as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from voxjet.io.layout import Specs, pack_layout

FREE, OUT, RETIRED = 0, 1, 2  # RETIRED: still held when its loader stopped; never reused
SLOT, LAYOUT = "_slot", "_layout"  # batch keys of the hand-over, removed before it goes on


def slot_table(workers: int, slots: int) -> torch.Tensor:
    """The shared [workers, slots] table of slot states (all FREE)."""
    return torch.zeros((max(workers, 1), slots), dtype=torch.int8).share_memory_()


def tensors_in(storage: torch.UntypedStorage, specs: Specs) -> dict[str, torch.Tensor]:
    """Tensors of `specs` as views of `storage`, laid out by `pack_layout`."""
    layout, _ = pack_layout(specs)
    raw = torch.empty(0, dtype=torch.uint8).set_(storage)
    return {
        k: raw[layout[k][0] : layout[k][0] + layout[k][1]].view(_TORCH[np.dtype(dtype)]).view(shape)
        for k, (shape, dtype) in specs.items()
    }


# torch internals, each with a fallback for a torch that lacks them (tested): a storage
# created in shared memory at once (else made, then moved there), and a storage's use count
# (else a slot is never freed: workers take fresh memory a batch, as a plain DataLoader does)
_NEW_SHARED = getattr(torch.UntypedStorage, "_new_shared", None)
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def new_shared(nbytes: int) -> torch.UntypedStorage:
    """A storage of `nbytes` in shared memory."""
    if _NEW_SHARED is not None:
        return _NEW_SHARED(nbytes)
    return torch.UntypedStorage(nbytes).share_memory_()


def fresh_batch(
    specs: Specs, shared: bool = True
) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """Arrays of `specs` to fill and their tensors, in one new storage (shared memory, for a
    DataLoader worker to hand over, or plain)."""
    _, nbytes = pack_layout(specs)
    tensors = tensors_in(new_shared(nbytes) if shared else torch.UntypedStorage(nbytes), specs)
    return {k: t.numpy() for k, t in tensors.items()}, tensors


class SharedSlabs:
    """A worker's side: shared-memory storages for its batches, reused when FREE again."""

    def __init__(self, table: torch.Tensor, worker: int) -> None:
        self.states = table.numpy()[worker]  # shared with the iterating process
        self.first = worker * table.shape[1]
        self.slabs: list[torch.UntypedStorage | None] = [None] * table.shape[1]
        self.sent = [False] * table.shape[1]  # the iterating process has this slab mapped

    def batch(self, specs: Specs) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays of `specs` to fill, and what to yield once they are filled: the tensors
        (fresh memory, or a slab the iterating process has not seen yet) or, for a slab it
        holds mapped, only the slot and the shapes — sending a storage again would pass its
        file descriptor through a socket connection, ~1 ms a batch."""
        _, nbytes = pack_layout(specs)
        for s, state in enumerate(self.states):
            if state == OUT:
                continue
            slab = self.slabs[s]
            if state == RETIRED or slab is None or slab.nbytes() < nbytes:
                # room for somewhat larger batches (jagged ones differ in size)
                slab = self.slabs[s] = new_shared(nbytes + nbytes // 4)
                self.sent[s] = False
            self.states[s] = OUT
            tensors = tensors_in(slab, specs)
            arrays = {k: t.numpy() for k, t in tensors.items()}
            if self.sent[s]:
                return arrays, {SLOT: self.first + s, LAYOUT: specs}
            self.sent[s] = True
            return arrays, {**tensors, SLOT: self.first + s}
        return fresh_batch(specs)


def _unused(storage: torch.UntypedStorage) -> bool:
    # one reference: the `held` entry's; every tensor view of the batch adds one. A torch
    # without the count never frees a slot: its workers then take fresh memory, as before
    return _USE_COUNT is not None and _USE_COUNT(storage._cdata) == 1


class ReturningLoader:
    """A DataLoader (`batch_size=None`) over a dataset that takes its batch memory from
    `SharedSlabs` on `dataset.slot_table`; iterating it yields the batches and frees each
    slot once the batch in it is no longer referenced."""

    def __init__(self, dataset: Any, num_workers: int, slots: int = 8, **loader_kw: Any) -> None:
        self.table = slot_table(num_workers, slots)
        dataset.slot_table = self.table  # the workers get it with the dataset
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=None, num_workers=num_workers, **loader_kw
        )
        # every slab seen, kept mapped here (persistent workers reuse them pass after pass)
        self.held: dict[int, torch.UntypedStorage] = {}

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        states, held = self.table.numpy().reshape(-1), self.held
        out: set[int] = set()
        try:
            for batch in self.loader:
                slot = batch.pop(SLOT, -1)
                for s in [s for s in out if _unused(held[s])]:
                    out.discard(s)
                    states[s] = FREE
                if LAYOUT in batch:  # the slab's tensors again, and what else came along
                    layout = batch.pop(LAYOUT)
                    batch = {**tensors_in(held[slot], layout), **batch}
                elif slot >= 0:
                    first = next(v for v in batch.values() if torch.is_tensor(v))
                    held[slot] = first.untyped_storage()
                if slot >= 0:
                    out.add(slot)
                yield batch
        finally:
            for s in out:
                states[s] = FREE if _unused(held[s]) else RETIRED


_TORCH = {
    np.dtype(d): getattr(torch, d)
    for d in ("float32", "float64", "int64", "int32", "int8", "uint8")
} | {np.dtype(bool): torch.bool}
