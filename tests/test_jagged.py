"""Jagged particle arrays: gathering jets across chunks, slicing, padding per batch."""

from __future__ import annotations

import numpy as np
import torch

from voxjet.jets.dataset import JetArrays
from voxjet.jets.jagged import (
    JaggedBuffer,
    SlabPool,
    offsets_of,
    pad_particles,
    pad_rows,
    ragged_arange,
    take_from_chunks,
    take_rows,
)


def _chunk(rng, n: int, tag: int) -> dict[str, np.ndarray]:
    counts = rng.integers(0, 6, n)
    m = int(counts.sum())
    # each particle carries (tag, jet, position) so any mix-up shows
    jet = np.repeat(np.arange(n), counts)
    pos = np.arange(m) - np.repeat(offsets_of(counts)[:-1], counts)
    parts = np.stack([np.full(m, tag), jet, pos], 1).astype(np.float32)
    return {"particles": parts, "offsets": offsets_of(counts), "labels": np.arange(n) + 100 * tag}


def _jets(c: dict[str, np.ndarray]) -> list[list[list[float]]]:
    o = c["offsets"]
    return [c["particles"][o[i] : o[i + 1]].tolist() for i in range(len(o) - 1)]


def test_ragged_arange_concatenates_ranges():
    assert ragged_arange(np.array([5, 0, 2]), np.array([2, 0, 3])).tolist() == [5, 6, 2, 3, 4]
    assert ragged_arange(np.array([1]), np.array([0])).tolist() == []


def test_take_rows_takes_whole_jets_of_concatenated_chunks_in_order():
    rng = np.random.default_rng(0)
    chunks = [_chunk(rng, n, t) for t, n in enumerate((7, 0, 11, 5))]
    buf = JaggedBuffer()
    for c in chunks:
        buf.append(c)
    data = buf.view()
    assert _jets(data) == [j for c in chunks for j in _jets(c)]
    rows = rng.permutation(23)
    out = take_rows(data, rows)
    assert _jets(out) == [_jets(data)[r] for r in rows]
    assert out["labels"].tolist() == data["labels"][rows].tolist()
    assert out["offsets"][-1] == len(out["particles"])
    assert _jets(take_rows(data, rows[:0])) == []
    # the same jets straight from the chunks, as a shard job takes them
    chunk_of = np.repeat(np.arange(4), [7, 0, 11, 5])
    row_in = np.concatenate([np.arange(n) for n in (7, 0, 11, 5)])
    direct = take_from_chunks(chunks, chunk_of[rows], row_in[rows])
    assert _jets(direct) == _jets(out) and direct["labels"].tolist() == out["labels"].tolist()


def test_jagged_buffer_grows_keeping_its_content_and_is_reused_after_clear():
    rng = np.random.default_rng(4)
    buf = JaggedBuffer()
    first = [_chunk(rng, n, t) for t, n in enumerate((3, 9))]
    for c in first:
        buf.append(c)
    small = buf.arrays["particles"]
    for t in range(2, 12):  # grows several times; what was in stays
        first.append(_chunk(rng, 20, t))
        buf.append(first[-1])
    assert _jets(buf.view()) == [j for c in first for j in _jets(c)]
    assert len(buf.arrays["particles"]) > len(small)
    grown = buf.arrays["particles"]
    buf.clear()
    again = _chunk(rng, 4, 99)
    buf.append(again)
    assert buf.arrays["particles"] is grown  # the memory is kept
    assert _jets(buf.view()) == _jets(again) and buf.view()["labels"].tolist() == [
        9900,
        9901,
        9902,
        9903,
    ]


def test_slab_pool_reuses_a_slab_only_once_no_view_of_it_is_alive():
    pool = SlabPool()
    specs = {"x": ((100, 3), np.dtype(np.float32)), "m": ((100,), np.dtype(bool))}
    first = pool.arrays(specs)
    first_slab = id(first["x"].base)  # an id: a reference would keep the slab in use
    batch = torch.from_numpy(first["x"][10:20])  # a batch handed out as a view
    first["x"][:] = 1
    del first
    second = pool.arrays(specs)  # the batch still holds the first slab: a new one
    second["x"][:] = 2
    assert id(second["x"].base) != first_slab and batch.eq(1).all()
    del batch
    third = pool.arrays(specs)  # the first slab is free again; the second is still held
    assert id(third["x"].base) == first_slab and len(pool.slabs) == 2
    assert third["x"].shape == (100, 3) and third["m"].dtype == bool and (second["x"] == 2).all()


def test_device_and_worker_padding_give_the_same_arrays():
    c = _chunk(np.random.default_rng(2), 12, 1)
    counts = np.diff(c["offsets"])
    padded, mask = pad_particles(torch.from_numpy(c["particles"]), torch.from_numpy(counts), 6)
    assert mask.sum(1).tolist() == counts.tolist()
    assert not padded[~mask].any()
    # the worker's gather, for a selection of rows, from a buffer with a zero row at its end
    flat = np.concatenate([c["particles"], np.zeros_like(c["particles"][:1])])
    rows = np.array([3, 0, 11, 3])
    out = np.full((4, 6, flat.shape[1]), np.nan, np.float32)
    m, idx = np.empty((4, 6), bool), np.empty((4, 6), np.int64)
    pad_rows(flat, c["offsets"], rows, len(flat) - 1, out, m, idx)
    np.testing.assert_array_equal(out, padded.numpy()[rows])
    np.testing.assert_array_equal(m, mask.numpy()[rows])


def test_jet_arrays_take_pads_any_selection():
    c = _chunk(np.random.default_rng(3), 10, 0)
    data = JetArrays(
        torch.from_numpy(c["particles"]),
        c["offsets"],
        torch.zeros(10, 1),
        torch.from_numpy(c["labels"]),
        5,
    )
    for idx in (np.arange(2, 8), np.array([9, 0, 4])):
        b = data.take(idx)
        assert b["particles"].shape == (len(idx), 5, 3)
        for row, i in enumerate(idx):
            n = int(b["mask"][row].sum())
            assert b["particles"][row, :n].tolist() == _jets(c)[i]


def test_shards_of_an_older_format_are_refused_with_the_fix(tmp_path):
    import json

    import pytest

    from voxjet.errors import VoxjetError
    from voxjet.jets.dataset import load_index

    (tmp_path / "index.json").write_text(json.dumps({"format_version": 1, "splits": {}}))
    with pytest.raises(VoxjetError, match=r"index.json: shards of format 1.*-R shard_jets"):
        load_index(tmp_path)
