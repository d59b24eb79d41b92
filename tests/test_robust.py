"""Robust input standardisation (voxjet.jets.robust): weaver's `auto` centre and scale, missing
values left out and given the centre, inputs clipped; a 1e30 and −999 in some entries of one
file are named with feature, file and entries, and a tagger trained on them scores as on the
clean files."""

from __future__ import annotations

import re
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


def _auc(shards, out, steps: int = 150):
    from voxjet.jets.evaluate import evaluate
    from voxjet.jets.train import run

    model = {"name": "pfn", "phi_sizes": [32, 32], "f_sizes": [32]}
    train = {"steps": steps, "batch_size": 64, "lr": 3e-3, "seed": 0, "eval_every": steps}
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


def _neutral_deta(src, value: float) -> None:
    """Every neutral particle's Δη set to `value` in every file (as ntuples that never compute
    it for neutrals write their "not computed" default)."""
    for path in sorted(src.glob("*.root")):
        with uproot.open(path) as f:
            arrays = f["tree"].arrays(library="ak")
        fields = {k: arrays[k] for k in arrays.fields}
        deta = ak.to_numpy(ak.flatten(fields["part_deta"])).copy()
        deta[ak.to_numpy(ak.flatten(fields["part_charge"])) == 0] = value
        fields["part_deta"] = ak.unflatten(deta.astype(np.float32), ak.num(fields["part_deta"]))
        with uproot.recreate(path) as f:
            f.mktree("tree", {k: v.type for k, v in fields.items()}).extend(fields)


@pytest.fixture(scope="module")
def neutral_sentinel(toy, tmp_path_factory):
    """The toy files with neutral Δη at 0 (inside its range: an ordinary value) and at −999
    (a sentinel below every other value): the same information, two encodings."""
    d = tmp_path_factory.mktemp("neutral")
    for name, value in (("zero", 0.0), ("sentinel", -999.0)):
        shutil.copytree(toy / "src", d / name)
        _neutral_deta(d / name, value)
    return d


def test_a_sentinel_for_every_neutral_particle_is_found_named_and_left_out(
    toy, neutral_sentinel, tmp_path, capsys
):
    """The issue's case: −999 for every neutral particle's Δη, nothing declared: named in the
    log and index.json with its share, left out of the statistics and given the centre, so the
    scale is the original files' (not 998); `sentinels: fail` refuses it; a declared one is not
    reported again. At 0 (inside Δη's range) the same values are no sentinel."""
    clean = _shards(toy / "src", tmp_path / "clean")
    zero = _shards(neutral_sentinel / "zero", tmp_path / "zero")
    dirty = _shards(neutral_sentinel / "sentinel", tmp_path / "sentinel")
    i = FEATURES.index("part_deta")
    found = dirty["sentinels"]["part_deta"]
    assert found["value"] == -999.0 and found["input"] == "particles"
    assert 0.2 < found["share"] < 0.6  # the neutral particles' share of the training values
    assert "part_deta" not in zero["sentinels"]
    assert dirty["particle_missing"][i] == -999.0
    assert dirty["particle_std"][i] == pytest.approx(clean["particle_std"][i], rel=0.10)
    assert dirty["outliers"] == {}
    log = capsys.readouterr().err
    assert re.search(r"sentinel: part_deta = -999 in \d+\.\d% of its training values", log)
    with pytest.raises(VoxjetError, match=r"(?s)jets\.sentinels: fail.*part_deta = -999 in "
                       r"\d+\.\d% of its training values"):  # fmt: skip
        _shards(neutral_sentinel / "sentinel", tmp_path / "strict", sentinels="fail")
    declared = _shards(neutral_sentinel / "sentinel", tmp_path / "declared",
                       missing={"part_deta": -999})  # fmt: skip
    assert "part_deta" not in declared["sentinels"]
    assert declared["particle_std"][i] == dirty["particle_std"][i]
    kept = _shards(neutral_sentinel / "sentinel", tmp_path / "kept", sentinels="keep")
    assert kept["sentinels"] == {} and kept["particle_std"][i] > 100  # what it was before


def test_a_flag_or_a_count_is_no_sentinel():
    """0/1 flags and integer counts hold one value most of the time at an edge, but are not
    continuous: no sentinel. A positive feature with 0 for "not computed" is one."""
    from voxjet.jets.robust import find_sentinel

    rng = np.random.default_rng(1)
    flag = (rng.random(5000) < 0.3).astype(float)
    count = rng.poisson(3, 5000).astype(float)
    assert find_sentinel(flag) is None and find_sentinel(count) is None
    positive = rng.exponential(1.0, 5000)
    positive[:1500] = 0.0
    assert find_sentinel(positive) == (0.0, pytest.approx(0.3))
    assert find_sentinel(rng.normal(size=5000)) is None
    rare = rng.normal(size=5000)
    rare[:50] = -999.0  # 1%: an outlier to name, not a sentinel to replace
    assert find_sentinel(rare) is None


@pytest.mark.slow
def test_a_found_sentinel_trains_as_the_same_information_without_it(tmp_path):
    """The tagger trained on the −999 files scores within 0.01 AUC of the one trained on the
    same information encoded as an ordinary 0 (what the sentinel costs beyond the information
    the files lack: nothing). Large enough that the test split's AUC is known to ±0.005."""
    src = tmp_path / "src"
    generate_dataset(src, ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=2,
                     jets_per_file=3000, seed=12), progress=False)  # fmt: skip
    aucs = {}
    for name, value in (("zero", 0.0), ("sentinel", -999.0)):
        shutil.copytree(src, tmp_path / name)
        _neutral_deta(tmp_path / name, value)
        _shards(tmp_path / name, tmp_path / f"{name}_out")
        aucs[name] = _auc(tmp_path / f"{name}_out" / "shards", tmp_path / f"run_{name}",
                          steps=400)  # fmt: skip
    assert abs(aucs["sentinel"] - aucs["zero"]) <= 0.01, aucs


def test_a_1e30_in_a_regression_target_is_named_and_moves_nothing(toy, tmp_path):
    """Targets standardised as the inputs (median, 16/84% spread): 1e30 in 14 jets of one file
    is named with file and entries, the target's scale is within 10% of the clean one, and
    `outliers: fail` refuses it; the loss leaves those jets out."""
    from voxjet.jets.targets import parse_targets, target_loss

    targets = {"mass": "jet_sdmass"}
    clean = _shards(toy / "src", tmp_path / "clean", targets=targets)
    dirty_src = tmp_path / "dirty_src"
    shutil.copytree(toy / "src", dirty_src)
    entries = list(range(5, 75, 5))
    with uproot.open(dirty_src / "Wqq_000.root") as f:
        arrays = f["tree"].arrays(library="ak")
    fields = {k: arrays[k] for k in arrays.fields}
    mass = ak.to_numpy(fields["jet_sdmass"]).astype(np.float32).copy()
    mass[entries] = 1e30
    fields["jet_sdmass"] = ak.Array(mass)
    with uproot.recreate(dirty_src / "Wqq_000.root") as f:
        f.mktree("tree", {k: v.type for k, v in fields.items()}).extend(fields)
    dirty = _shards(dirty_src, tmp_path / "dirty", targets=targets, jet_features=["jet_pt"])
    assert dirty["target_std"][0] == pytest.approx(clean["target_std"][0], rel=0.10)
    assert dirty["target_mean"][0] == pytest.approx(clean["target_mean"][0], rel=0.10)
    assert dirty["outliers"]["mass"]["input"] == "targets"
    assert dirty["outliers"]["mass"]["count"] == 14
    assert dirty["outliers"]["mass"]["worst"] == pytest.approx(1e30)
    assert dirty["outliers"]["mass"]["files"]["Wqq_000.root"] == entries[:5]
    with pytest.raises(VoxjetError, match=r"mass: 14 value.*worst 1e\+30.*Wqq_000\.root"):
        _shards(dirty_src, tmp_path / "strict", targets=targets, jet_features=["jet_pt"],
                outliers="fail")  # fmt: skip
    spec = parse_targets(targets)
    out = torch.zeros(3, 1)
    true = torch.tensor([[60.0], [80.0], [1e30]])
    loss = target_loss(out, true, spec, dirty["target_mean"], dirty["target_std"])
    without = target_loss(out[:2], true[:2], spec, dirty["target_mean"], dirty["target_std"])
    assert torch.isfinite(loss) and float(loss) == pytest.approx(float(without))
