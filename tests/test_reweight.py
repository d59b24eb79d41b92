"""Reweighting (a weaver data config's `weights:`): the weight tables equal weaver-core's own
WeightMaker's for the same jets; training batches drawn by them follow the reweighted
distribution (classes equalised, flat in the plane, nothing from outside it); a bad weights
section stops at the config check naming the key."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from voxjet.errors import VoxjetError
from voxjet.jets import reweight
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.shard import shard_jets
from voxjet.jets.stream import JetStream
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage

LABELS = ["label_QCD", "label_Hbb", "label_Wqq", "label_Tbqq"]
PT_BINS = [500.0, 600.0, 700.0, 800.0, 900.0]  # the toy jets reach 1000: the top is outside
MASS_BINS = [0.0, 60.0, 120.0, 250.0, 1000.0]


def _weights(method: str = "flat", **more) -> dict:
    plane = {"jet_pt": PT_BINS, "jet_sdmass": MASS_BINS}
    return {"reweight_method": method, "reweight_vars": plane, "reweight_classes": LABELS,
            "reweight_threshold": 10, **more}  # fmt: skip


def _jets(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(pt, mass) of jets [N, 2] and classes with unequal counts and unequal pT spectra."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(4, size=n, p=[0.55, 0.25, 0.15, 0.05])
    pt = 500 + rng.exponential(120 + 60 * labels)
    mass = rng.uniform(0, 300, n) + 40 * labels
    return np.stack([pt, mass], 1), labels


@pytest.mark.parametrize("method", ["flat", "ref"])
@pytest.mark.parametrize("discard", [True, False])
def test_tables_equal_weaver_cores_weight_maker(method, discard):
    """weaver's make_weights on the same jets gives the same tables (times its fixed 0.9)."""
    ak = pytest.importorskip("awkward")
    preprocess = pytest.importorskip("weaver.utils.data.preprocess")
    values, labels = _jets(20000)
    rw = reweight.parse(_weights(method, reweight_discard_under_overflow=discard), LABELS, "w")
    ours = reweight.make_tables(reweight.histograms(values, labels, rw, 4), rw, LABELS)
    table = {"jet_pt": values[:, 0], "jet_sdmass": values[:, 1]}
    table.update({name: (labels == i).astype(np.int32) for i, name in enumerate(LABELS)})
    if discard:  # weaver histograms only jets inside (else it waits 10 s, warning)
        inside = (values[:, 0] <= PT_BINS[-1]) & (values[:, 1] <= MASS_BINS[-1])
        table = {k: v[inside] for k, v in table.items()}
    maker = preprocess.WeightMaker.__new__(preprocess.WeightMaker)
    maker._data_config = SimpleNamespace(
        reweight_branches=("jet_pt", "jet_sdmass"), reweight_bins=(PT_BINS, MASS_BINS),
        reweight_discard_under_overflow=discard, reweight_classes=tuple(LABELS),
        reweight_basewgt=None, reweight_method=method, class_weights=np.ones(4),
        reweight_threshold=10,
    )  # fmt: skip
    theirs = maker.make_weights(ak.Array(table))
    for i, name in enumerate(LABELS):
        np.testing.assert_allclose(theirs[name], 0.9 * ours[i], rtol=1e-5, err_msg=name)


def test_drawing_by_the_weights_flattens_and_equalises_the_classes():
    values, labels = _jets(200000, seed=1)
    rw = reweight.parse(_weights("flat", reweight_threshold=0), LABELS, "w")
    tables = reweight.make_tables(reweight.histograms(values, labels, rw, 4), rw, LABELS)
    w = reweight.jet_weights(values, labels, rw, tables)
    drawn = reweight.resample(w, np.random.default_rng(0), "test")
    counts = reweight.histograms(values[drawn], labels[drawn], rw, 4)
    per_class = counts.sum(axis=(1, 2))
    np.testing.assert_allclose(per_class / per_class.sum(), 0.25, atol=0.01)
    for c in range(4):  # flat in the plane wherever the class has jets (threshold 0)
        filled = counts[c][reweight.histograms(values, labels, rw, 4)[c] > 0]
        assert filled.std() / filled.mean() < 0.1, counts[c]
    assert (values[drawn, 0] <= PT_BINS[-1]).all()  # outside the plane: weight 0


def test_precomputed_weights_are_the_product_of_the_branches():
    rw = reweight.parse(
        {"use_precomputed_weights": True, "weight_branches": ["a", "b"]}, LABELS, "w"
    )
    w = reweight.jet_weights(np.array([[2.0, 3.0], [0.5, 0.0]]), np.array([0, 1]), rw, None)
    np.testing.assert_allclose(w, [6.0, 0.0])


@pytest.fixture(scope="module")
def reweighted(tmp_path_factory):
    d = tmp_path_factory.mktemp("rw")
    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=600), progress=False)
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    cfg = JetDataConfig(max_particles=16, jets_per_shard=500, weights=_weights("flat"),
                        shard_jobs=2)  # fmt: skip
    shard_jets(d / "m.json", d / "shards", cfg)
    return d / "shards"


def test_training_batches_follow_the_weights(reweighted):
    """Every jet a batch holds comes from inside the plane, classes come in the shares the
    index predicts, jets repeat (drawn with replacement); validation is not reweighted."""
    index = json.loads((reweighted / "index.json").read_text())
    rw = index["reweight"]
    assert np.asarray(rw["counts"]).sum() > 0 and len(rw["tables"]) == 4
    stream = JetStream(reweighted, "train", batch_size=64, seed=3, block_jets=256)
    pt = {}
    for s in index["splits"]["train"]["shards"]:
        with h5py.File(reweighted / s["file"]) as f:
            pt[stream.shard_numbers[s["file"]]] = f["reweight"][:, 0]
    seen, classes = [], []
    for epoch in range(3):
        for batch in stream.at(epoch, 0):
            src = batch["source"].numpy()
            seen += [tuple(r) for r in src]
            classes += batch["labels"].tolist()
            assert "reweight" not in batch
            assert all(pt[int(a)][int(b)] <= PT_BINS[-1] for a, b in src)
    shares = np.bincount(classes, minlength=4) / len(classes)
    np.testing.assert_allclose(shares, rw["shares"], atol=0.06)
    assert len(set(seen)) < len(seen)
    val = JetStream(reweighted, "val", batch_size=16, seed=3)
    assert val.reweight is None


def test_a_resumed_reweighted_epoch_gives_the_same_batches(reweighted):
    stream = JetStream(reweighted, "train", batch_size=32, seed=5, block_jets=128)
    full = [b["source"].numpy() for b in stream.at(1, 0)]
    tail = [b["source"].numpy() for b in stream.at(1, 3)]
    assert len(full) > 3
    for a, b in zip(full[3:], tail, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"reweight_classes": LABELS[:3]}, r"\['label_Tbqq'\] are labels but not reweighted"),
        ({"reweight_vars": {"jet_pt": [500, 400]}}, "two variables"),
        ({"reweight_vars": {"jet_pt": [500, 400], "jet_sdmass": [0, 1]}},
         "reweight_vars.jet_pt: .* increasing bin edges"),
        ({"reweight_method": "equal"}, "reweight_method 'equal'"),
        ({"class_weights": [1, 1]}, "class_weights: 4 positive numbers"),
        ({"reweight_basewgt": "w"}, "reweight_basewgt"),
        ({"reweigth_method": "flat"}, r"\['reweigth_method'\] are not weaver weights keys"),
    ],
)  # fmt: skip
def test_bad_weights_are_refused_at_the_config_check(demo_config, change, match):
    from voxjet.config import check_config

    ds = next(d for d in demo_config["datasets"].values() if d["domain"] == "jets")
    ds.setdefault("jets", {})["labels"] = LABELS  # the classes _weights() names
    ds["jets"]["weights"] = {**_weights(), **change}
    with pytest.raises(VoxjetError, match=rf"datasets\.\w+\.jets\.weights.*{match}"):
        check_config(demo_config, Path(__file__).parents[1] / "config" / "schema.yaml")


def test_reweight_classes_grouping_the_labels_equalise_the_groups(reweighted, tmp_path):
    """CMS's configs reweight by branches grouping the labels (fj_isTop, fj_isQCD): here
    QCD, the two-prong resonances and top; batches come in the shares the index predicts,
    and a jet in no group, or a group branch the files lack, is refused by name."""
    raw = reweighted.parent
    groups = {"is_resonance": "label_Hbb + label_Wqq", "is_top": "label_Tbqq * 1"}
    w = _weights(reweight_classes=["label_QCD", "is_resonance", "is_top"])
    cfg = JetDataConfig(max_particles=16, jets_per_shard=500, weights=w, new_variables=groups)
    index = shard_jets(raw / "m.json", tmp_path / "s", cfg)
    rw = index["reweight"]
    assert rw["by_branches"] and len(rw["tables"]) == 3 and np.asarray(rw["counts"]).sum() > 0
    group_of = np.array([0, 1, 1, 2])  # QCD, Hbb, Wqq, Tbqq
    stream = JetStream(tmp_path / "s", "train", batch_size=64, seed=3, block_jets=256)
    seen = [group_of[b["labels"].numpy()] for e in range(3) for b in stream.at(e, 0)]
    shares = np.bincount(np.concatenate(seen), minlength=3) / sum(map(len, seen))
    np.testing.assert_allclose(shares, rw["shares"], atol=0.06)
    two = JetDataConfig(
        max_particles=16,
        new_variables=groups,
        weights=_weights(reweight_classes=["label_QCD", "is_resonance"]),
    )
    with pytest.raises(VoxjetError, match=r"jets \(entries \[\d+.* are in none of jets\.weights"
                       r"\.reweight_classes \['label_QCD', 'is_resonance'\]"):  # fmt: skip
        shard_jets(raw / "m.json", tmp_path / "a", two)
    lacking = JetDataConfig(
        max_particles=16, weights=_weights(reweight_classes=[*LABELS, "fj_isTop"])
    )
    with pytest.raises(VoxjetError, match=r"has no branch 'fj_isTop' \(read by jets.weights\)"):
        shard_jets(raw / "m.json", tmp_path / "b", lacking)


def test_a_class_with_no_jet_in_the_plane_is_named(tmp_path):
    generate_dataset(tmp_path / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=100),
                     progress=False)  # fmt: skip
    stage(str(tmp_path / "raw"), tmp_path / "st", tmp_path / "m.json", patterns=["*.root"])
    w = _weights(reweight_vars={"jet_pt": [0.0, 10.0], "jet_sdmass": MASS_BINS})
    with pytest.raises(VoxjetError, match="class 'label_QCD' has no training jet inside"):
        shard_jets(tmp_path / "m.json", tmp_path / "s", JetDataConfig(max_particles=8, weights=w))


def test_a_real_nanoaod_file_reweights_by_class_names(tmp_path):
    """A CMS NanoAOD skim that scikit-hep-testdata ships, labelled by an integer branch (so the
    reweight classes are class names): MET flattened a class, classes drawn equally."""
    import shutil

    from conftest import hep_file

    (tmp_path / "raw").mkdir()
    shutil.copy(hep_file("uproot-small-dy-withoffsets.root"), tmp_path / "raw")
    stage(str(tmp_path / "raw"), tmp_path / "st", tmp_path / "m.json", patterns=["*"])
    weights = {"reweight_method": "flat", "reweight_classes": ["0mu", "1mu"],
               "reweight_vars": {"MET_pt": [0, 20, 40, 80, 1000], "nJet": [0.5, 20.5]}}  # fmt: skip
    cfg = JetDataConfig(
        tree="tree", new_variables={"part_pt_log": "log(Jet_pt)"},
        particle_features=["part_pt_log", "Jet_jetId"], jet_features=["nJet"], sort_by="Jet_pt",
        selection="(nJet >= 1) & (nMuon <= 1)",
        labels={"branch": "nMuon", "classes": ["0mu", "1mu"]},
        max_particles=10, val_fraction=0.1, test_fraction=0.1, weights=weights,
    )  # fmt: skip
    index = shard_jets(tmp_path / "m.json", tmp_path / "s", cfg)
    counts = np.asarray(index["reweight"]["counts"])
    assert counts.sum() == index["splits"]["train"]["jets"]  # every training event in the plane
    np.testing.assert_allclose(index["reweight"]["shares"], [0.5, 0.5], atol=1e-6)
    raw = index["splits"]["train"]["class_counts"]
    assert raw["1mu"] / (raw["0mu"] + raw["1mu"]) < 0.35  # unequal as they come
    labels = [b["labels"] for b in JetStream(tmp_path / "s", "train", batch_size=16, seed=1)]
    assert abs(np.concatenate(labels).mean() - 0.5) < 0.15  # 1mu drawn as often as 0mu
