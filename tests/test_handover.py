"""The shared-memory hand-over of DataLoader batches: slabs are reused only once nothing in
the training process refers to the batch in them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voxjet.io.handover import (
    FREE,
    LAYOUT,
    OUT,
    RETIRED,
    SLOT,
    ReturningLoader,
    SharedSlabs,
    slot_table,
    tensors_in,
)

SPECS = {"x": ((4, 3), np.dtype(np.float32)), "n": ((4,), np.dtype(np.int64))}


def test_a_slab_goes_out_once_then_only_its_slot_until_it_is_freed():
    table = slot_table(1, 2)
    slabs = SharedSlabs(table, 0)
    arrays, first = slabs.batch(SPECS)
    assert set(first) == {"x", "n", SLOT} and first[SLOT] == 0
    arrays["x"][:] = 7
    assert torch.equal(first["x"], torch.full((4, 3), 7.0))  # the arrays are the tensors' bytes
    _, second = slabs.batch(SPECS)  # slot 0 is out: the next batch takes slot 1
    assert second[SLOT] == 1 and table[0].tolist() == [OUT, OUT]
    _, third = slabs.batch(SPECS)  # none free: fresh memory, no slot
    assert SLOT not in third and set(third) == {"x", "n"}
    table[0, 0] = FREE
    _, again = slabs.batch(SPECS)  # mapped on the other side already: only slot and shapes
    assert again == {SLOT: 0, LAYOUT: SPECS}
    assert torch.equal(tensors_in(slabs.slabs[0], SPECS)["x"], first["x"])
    table[0, 0] = RETIRED  # held past its loader's end: a new slab, sent whole
    _, retired = slabs.batch(SPECS)
    assert retired[SLOT] == 0 and "x" in retired
    assert retired["x"].data_ptr() != first["x"].data_ptr()


class Counting(torch.utils.data.IterableDataset):
    """Batch i holds i everywhere, in slabs from the hand-over."""

    def __init__(self, n: int) -> None:
        self.n, self.slot_table = n, None

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        slabs = SharedSlabs(self.slot_table, info.id)
        for i in range(info.id, self.n, info.num_workers):
            arrays, batch = slabs.batch({"x": ((1000,), np.dtype(np.int64))})
            arrays["x"][:] = i
            yield batch


@pytest.mark.parametrize("hold", [False, True])
def test_returning_loader_reuses_slabs_only_when_the_batch_is_let_go(hold):
    # 6 slots a worker: more than its batches in transit (2) plus the one used here and the
    # one let go since the last check, so no batch needs fresh memory
    loader = ReturningLoader(Counting(40), num_workers=2, slots=6, persistent_workers=True)
    for _ in range(2):  # a second pass of the same workers reuses the slabs mapped here
        kept, pointers = [], set()
        for i, b in enumerate(loader):
            assert torch.equal(b["x"], torch.full((1000,), i))
            pointers.add(b["x"].data_ptr())
            if hold:
                kept.append(b)
        # held batches were never overwritten; let go, the slots' slabs served all 40 (plus a
        # new one for a slot whose batch was still held when the pass ended)
        assert all(torch.equal(b["x"], torch.full((1000,), i)) for i, b in enumerate(kept))
        assert len(pointers) == 40 if hold else len(pointers) <= 2 * 6 + 2
        del kept, b


def test_without_the_torch_internals_batches_stay_right_in_fresh_memory(monkeypatch):
    """A torch without UntypedStorage._new_shared or the storage use count (private APIs):
    storages are moved to shared memory after creation, and no slot is ever freed, so every
    batch past the slots takes fresh memory — the same values, nothing overwritten."""
    import voxjet.io.handover as handover

    monkeypatch.setattr(handover, "_NEW_SHARED", None)
    monkeypatch.setattr(handover, "_USE_COUNT", None)
    assert handover.new_shared(64).is_shared()
    loader = ReturningLoader(Counting(30), num_workers=2, slots=3)
    seen, pointers = [], set()
    for b in loader:
        seen.append(b)
        pointers.add(b["x"].data_ptr())
    assert all(torch.equal(b["x"], torch.full((1000,), i)) for i, b in enumerate(seen))
    assert len(pointers) == 30  # nothing reused while a batch could still be held


def test_slab_pool_without_reliable_reference_counts_never_hands_a_slab_out_twice(monkeypatch):
    import voxjet.jets.jagged as jagged

    specs = {"x": ((8, 4), np.dtype(np.float32))}
    pool = jagged.SlabPool()
    first = pool.arrays(specs)["x"]
    del first
    again = pool.arrays(specs)["x"]
    assert again.base is pool.slabs[0] or again.base.base is pool.slabs[0]  # reused when free
    monkeypatch.setattr(jagged, "REFCOUNT_TELLS_FREE", False)
    a = jagged.SlabPool()
    one = a.arrays(specs)["x"]
    one[:] = 1
    del one
    two = a.arrays(specs)["x"]
    two[:] = 2
    assert not a.slabs and np.all(two == 2)
