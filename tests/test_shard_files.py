"""Shard storage (voxjet.jets.shard_files): mapped and compressed shards hold the same jets,
and a mapped shard's CRC32s catch a changed value in any dataset, once a process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.dataset import load_split
from voxjet.jets.shard import shard_jets
from voxjet.jets.shard_files import CHECK_JETS, CRCS, ShardChecks
from voxjet.jets.stream import JetStream


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> dict[str, Path]:
    """The same toy files sharded both ways; the train shard spans 2+ checksum units."""
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset
    from voxjet.stage.transfer import stage

    d = tmp_path_factory.mktemp("storage")
    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=700), progress=False)
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    out = {}
    for storage in ("mapped", "compressed"):
        cfg = JetDataConfig(max_particles=32, jets_per_shard=5000, val_fraction=0.05,
                            test_fraction=0.05, storage=storage)  # fmt: skip
        shard_jets(d / "m.json", d / storage, cfg)
        out[storage] = d / storage
    return out


def _train_shard(shards: Path) -> Path:
    index = json.loads((shards / "index.json").read_text())
    return shards / index["splits"]["train"]["shards"][0]["file"]


def test_layouts_differ_and_hold_the_same_jets(both):
    with h5py.File(_train_shard(both["mapped"])) as f:
        assert f["particles"].chunks is None and f["particles"].compression is None
        n = len(f["labels"])
        assert n > 2 * CHECK_JETS  # the last unit is a partial one
        assert f[CRCS].shape == (-(-n // CHECK_JETS), len(f[CRCS].attrs["keys"]))
    with h5py.File(_train_shard(both["compressed"])) as f:
        assert f["particles"].chunks is not None and f["particles"].fletcher32
        assert CRCS not in f
    for split in ("train", "test"):
        a, b = load_split(both["mapped"], split), load_split(both["compressed"], split)
        assert np.array_equal(a.offsets, b.offsets)
        for k in ("particles", "jets", "labels"):
            assert np.array_equal(getattr(a, k).numpy(), getattr(b, k).numpy())
    batches = [list(JetStream(both[s], "train", 64, seed=3).at(1, 0)) for s in both]
    assert len(batches[0]) == len(batches[1]) > 0
    for x, y in zip(*batches, strict=True):
        assert all(np.array_equal(x[k].numpy(), y[k].numpy()) for k in x)


@pytest.mark.parametrize(
    ("key", "row", "unit"),
    [  # a particle of the last jet (the last, partial unit), a jet, a label, an offset
        ("particles", -5, 2),
        ("jets", CHECK_JETS + 3, 1),
        ("labels", 2 * CHECK_JETS, 2),
        ("offsets", 17, 0),
    ],
)
def test_a_changed_value_fails_naming_the_file_dataset_and_jets(both, tmp_path, key, row, unit):
    copy = tmp_path / "shards"
    shutil.copytree(both["mapped"], copy)
    path = _train_shard(copy)
    with h5py.File(path, "r+") as f:  # one value changed where HDF5 has no checksum to see it
        f[key][row] = f[key][row] + 1
    lo = unit * CHECK_JETS
    with pytest.raises(VoxjetError) as e:
        for _ in JetStream(copy, "train", 32, seed=0).at(0, 0):
            pass
    msg = str(e.value)
    assert path.name in msg and f"CRC32 mismatch in {key} of jets {lo}-" in msg
    assert "rerun shard_jets" in msg
    with pytest.raises(VoxjetError, match=rf"{path.name}: train jets .*CRC32 mismatch in {key}"):
        load_split(copy, "train")
    if key == "jets":  # a rank's share ends inside units: those are read to be checked
        with pytest.raises(VoxjetError, match=r"CRC32 mismatch in jets of jets 1024-2048"):
            load_split(copy, "train", part=(1, 3))


class _Counting(dict):
    """h5py datasets that count the reads made through them."""

    def __init__(self, sets: dict) -> None:
        super().__init__({k: self._wrap(d) for k, d in sets.items()})
        self.reads = 0

    def _wrap(self, d):
        outer = self

        class Reads:
            def __getitem__(self, sl):
                outer.reads += 1
                return d[sl]

        return Reads()


def test_a_unit_is_verified_once_a_process(both):
    with h5py.File(_train_shard(both["mapped"])) as f:
        checks = ShardChecks(f)
        n = len(f["labels"])
        sets = _Counting({k: f[k] for k in f[CRCS].attrs["keys"]})
        checks.verify(sets, 0, 10)
        first = sets.reads
        assert first == len(sets) and checks.done[:2].all(1).tolist() == [True, False]
        checks.verify(sets, 5, CHECK_JETS)  # inside the verified unit: nothing read
        assert sets.reads == first
        checks.verify(sets, 0, n)
        assert checks.done.all() and sets.reads == first * len(checks.done)
        # given what a reader already read, a unit inside it is checked there: nothing read
        offsets = f["offsets"][...]
        have = {k: f[k][...] for k in checks.keys if k != "offsets"}
        again, sets.reads = ShardChecks(f), 0
        again.verify(sets, 0, n, have, offsets)
        assert again.done.all() and sets.reads == 0
        have["jets"][5, 0] += 1  # and a changed value there is still caught
        with pytest.raises(ValueError, match=r"CRC32 mismatch in jets of jets 0-1024"):
            ShardChecks(f).verify(sets, 0, n, have, offsets)


def test_an_unknown_storage_names_the_key(both, tmp_path):
    from voxjet.jets.shard import shard_part

    manifest = both["mapped"].parent / "m.json"
    with pytest.raises(VoxjetError, match=r"jets.storage 'lz4'.*mapped, compressed"):
        shard_part(manifest, tmp_path / "p", JetDataConfig(storage="lz4"))
