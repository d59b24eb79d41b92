"""Robust input standardisation (voxjet.jets.robust): weaver's `auto` centre and scale, missing
values left out and given the centre, inputs clipped; a 1e30 and −999 in some entries of one
file are named with feature, file and entries, and a tagger trained on them scores as on the
clean files."""

from __future__ import annotations

import shutil

import awkward as ak
import numpy as np
import pytest
import torch
import uproot

from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.models.layers import Standardize
from voxjet.jets.robust import centre_and_spread, outliers
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage


def test_centre_and_spread_are_weavers_auto_and_ignore_sentinels():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, (20000, 2))
    clean = centre_and_spread(x)
    low, mid, high = np.percentile(x[:, 0], [16, 50, 84])  # weaver's AutoStandardizer
    assert clean[0][0] == pytest.approx(mid)
    assert clean[1][0] == pytest.approx(max(high - mid, mid - low))
    dirty = x.copy()
    dirty[:50, 0] = 1e30  # an overflow in 0.25% of the values moves the mean by 2.5e27
    dirty[50:500, 1] = -999.0  # a sentinel in 2%
    c, s = centre_and_spread(dirty, [None, -999.0])
    assert abs(c[0] - clean[0][0]) < 0.02 and abs(s[0] / clean[1][0] - 1) < 0.02
    assert abs(c[1] - clean[0][1]) < 0.05  # the sentinel left out
    far = outliers(dirty, c, s, [None, -999.0])
    assert far[:50, 0].all() and far.sum() == 50  # the overflow, not the declared sentinel


def test_standardize_gives_missing_values_the_centre_and_clips():
    norm = Standardize([1.0, 0.0], [2.0, 1.0], clip=5.0, missing=[None, -999.0])
    x = torch.tensor([[3.0, -999.0], [1e30, 2.0]])
    assert norm(x).tolist() == [[1.0, 0.0], [5.0, 2.0]]
    assert Standardize([0.0], [1.0])(torch.tensor([[1e30]])).item() > 1e29  # old models: as before


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("robust")
    generate_dataset(d / "src", ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=2,
                     jets_per_file=500, seed=11), progress=False)  # fmt: skip
    return d


def _poison(path, branch, value, entries):
    with uproot.open(path) as f:
        arrays = f["tree"].arrays(library="ak")
    fields = {k: arrays[k] for k in arrays.fields}
    counts = ak.num(fields[branch])
    flat = ak.to_numpy(ak.flatten(fields[branch])).copy()
    starts = np.concatenate([[0], np.cumsum(ak.to_numpy(counts))[:-1]])
    for e in entries:  # every particle of these jets
        flat[starts[e] : starts[e] + counts[e]] = value
    fields[branch] = ak.unflatten(flat, counts)
    with uproot.recreate(path) as f:
        f.mktree("tree", {k: v.type for k, v in fields.items()}).extend(fields)


FEATURES = ["part_deta", "part_dphi", "part_pt_log", "part_e_log", "part_d0val"]


def _shards(src, out, **extra):
    stage(str(src), out / "staged", out / "m.json", patterns=["*.root"], tree="tree")
    cfg = JetDataConfig.checked({"labels": ["label_QCD", "label_Wqq"], "max_particles": 16,
                                 "particle_features": FEATURES, "test_fraction": 0.3,
                                 **extra}, "jets")  # fmt: skip
    return shard_jets(out / "m.json", out / "shards", cfg)


def _auc(shards, out):
    from voxjet.jets.evaluate import evaluate
    from voxjet.jets.train import run

    model = {"name": "pfn", "phi_sizes": [32, 32], "f_sizes": [32]}
    train = {"steps": 150, "batch_size": 64, "lr": 3e-3, "seed": 0, "eval_every": 150}
    run(str(shards), {"model": model, "train": train}, str(out))
    return evaluate(str(shards), str(out / "model.pt"), str(out / "eval"))["auc_macro"]


def test_overflows_and_sentinels_are_named_and_do_not_move_the_tagger(toy, tmp_path, capsys):
    clean = _shards(toy / "src", tmp_path / "clean")
    assert clean["outliers"] == {}
    dirty_src = tmp_path / "dirty_src"
    shutil.copytree(toy / "src", dirty_src)
    _poison(dirty_src / "Wqq_001.root", "part_deta", 1e30, [3, 17, 40])
    _poison(dirty_src / "QCD_000.root", "part_d0val", -999.0, list(range(0, 400, 7)))
    with pytest.raises(VoxjetError, match=r"part_deta: \d+ value.*worst 1e\+30.*Wqq_001\.root "
                       r"entries \[3, 17, 40\]"):  # fmt: skip
        _shards(dirty_src, tmp_path / "strict", outliers="fail", missing={"part_d0val": -999})
    dirty = _shards(dirty_src, tmp_path / "dirty", missing={"part_d0val": -999})
    log = capsys.readouterr().err
    assert "warning: part_deta:" in log and "Wqq_001.root entries [3, 17, 40]" in log
    assert set(dirty["outliers"]) == {"part_deta"}  # the declared sentinel is no outlier
    assert dirty["outliers"]["part_deta"]["files"] == {"Wqq_001.root": [3, 17, 40]}
    i = FEATURES.index("part_deta")
    assert dirty["particle_std"][i] == pytest.approx(clean["particle_std"][i], rel=0.05)
    assert dirty["particle_missing"][FEATURES.index("part_d0val")] == -999.0
    a_clean = _auc(tmp_path / "clean" / "shards", tmp_path / "run_clean")
    a_dirty = _auc(tmp_path / "dirty" / "shards", tmp_path / "run_dirty")
    assert abs(a_dirty - a_clean) <= 0.01, (a_clean, a_dirty)


def test_a_missing_value_for_an_unknown_feature_is_refused():
    with pytest.raises(VoxjetError, match=r"jets\.missing': \['part_foo'\] are not input features"):
        JetDataConfig.checked({"labels": ["label_QCD", "label_Wqq"],
                               "missing": {"part_foo": -999}}, "jets")  # fmt: skip
