"""Regression targets beside the classes (`jets.targets`, a weaver config's custom labels): the
values the shard job stores are the expression's for the same jets, a NaN/inf or per-particle
target and an input reading a target's truth are refused by name, a mass regression trains
beside the classes and beats the training median's resolution, and evaluation, predict and
export agree on its values."""

from __future__ import annotations

import copy
import json

import h5py
import numpy as np
import pytest
import torch
import uproot
import yaml

from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.dataset import load_columns, load_index
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.jets.targets import (
    parse_targets,
    regression_metrics,
    response_resolution,
    target_loss,
)
from voxjet.stage.transfer import stage

MASS = {"gen_mass": {"expr": "aux_genjet_mass", "loss": "huber"}}
# an auxiliary classification: whether the jet has a secondary vertex (from its displaced tracks)
VERTEX = {"vertex": {"expr": "minimum(nsv, 1)", "kind": "classification",
                     "classes": ["none", "some"], "weight": 0.5}}  # fmt: skip


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    d = tmp_path_factory.mktemp("targets")
    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=600, seed=11),
                     progress=False)  # fmt: skip
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    return d


@pytest.fixture(scope="module")
def trained(raw):
    """Toy jets with the generated jet mass as a regression target beside the 4 classes: a
    PFN trained on both, evaluated on the test split."""
    from voxjet.jets.evaluate import evaluate
    from voxjet.jets.train import run

    cfg = JetDataConfig(max_particles=48, jets_per_shard=1000, test_fraction=0.25,
                        targets={**MASS, **VERTEX})  # fmt: skip
    shard_jets(raw / "m.json", raw / "shards", cfg)
    train = {"steps": 400, "batch_size": 128, "lr": 3e-3, "eval_every": 200}
    model = {"name": "pfn", "phi_sizes": [64, 64], "f_sizes": [64]}
    run(str(raw / "shards"), {"model": model, "train": train}, str(raw / "run"))
    metrics = evaluate(str(raw / "shards"), str(raw / "run" / "model.pt"), str(raw / "eval"))
    return raw, metrics


def test_targets_parse_with_defaults_and_refuse_what_they_cannot_be():
    (t,) = parse_targets({"m": "fj_gen_mass"})
    assert (t.name, t.expr, t.loss, t.weight) == ("m", "fj_gen_mass", "mse", 1.0)
    (c,) = parse_targets(VERTEX)
    assert (c.loss, c.columns) == ("cross_entropy", ["vertex_none", "vertex_some"])
    for spec, match in (({"loss": "l1", "expr": "x"}, r"'jets\.targets\.m\.loss': 'l1'"),
                        ({"kind": "ranking", "expr": "x"}, r"targets\.m\.kind"),
                        ({"weight": 0, "expr": "x"}, r"targets\.m\.weight"),
                        ({"loss": "mse"}, r"'jets\.targets\.m\.expr'"),
                        ({"kind": "classification", "expr": "x"}, r"targets\.m\.classes"),
                        ({"kind": "classification", "expr": "x", "classes": ["a", "b"],
                          "loss": "mse"}, r"targets\.m\.loss': 'mse'")):  # fmt: skip
        with pytest.raises(VoxjetError, match=match):
            parse_targets({"m": spec})


def test_response_and_resolution_are_the_median_and_half_the_central_interval():
    true = np.full(10001, 100.0)
    ratio = np.linspace(0.5, 1.5, 10001)  # uniform: median 1, 16–84% interval 0.34 × 2 / 2
    r = response_resolution(ratio * true, true)
    assert r["response"] == pytest.approx(1.0) and r["resolution"] == pytest.approx(0.34, 1e-3)
    zero = response_resolution(np.ones(3), np.zeros(3))  # no ratio to a zero truth
    assert zero["n_jets"] == 0 and np.isnan(zero["resolution"])
    pt = np.repeat([100.0, 200.0, 300.0, 400.0], 2500)
    pred = true[:10000] * np.where(pt > 250, 1.2, 1.0)
    m = regression_metrics(pred[:, None], true[:10000, None], ["m"], [100.0], pt)["m"]
    assert [b["response"] for b in m["pt_bins"]] == pytest.approx([1.0, 1.0, 1.2, 1.2])
    assert m["median_baseline"] == {"response": 1.0, "resolution": 0.0, "n_jets": 10000}
    assert m["rmse"] == pytest.approx(np.sqrt(0.5 * 20.0**2))


def test_the_loss_is_each_targets_weighted_loss():
    pred, true = torch.tensor([[0.0, 1.0], [3.0, -2.0]]), torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    targets = parse_targets({"a": {"expr": "x", "loss": "mse", "weight": 2.0},
                             "b": {"expr": "y", "loss": "logcosh"}})  # fmt: skip
    d = (pred - true).numpy()
    want = 2.0 * np.mean(d[:, 0] ** 2) + np.mean(np.log(np.cosh(d[:, 1])))
    got = target_loss(pred, true, targets, [0.0, 0.0], [1.0, 1.0])
    assert float(got) == pytest.approx(want, rel=1e-6)
    # the truth standardised by the training split's mean and std, as the head learns it
    scaled = target_loss(pred, true * 4 + 10, targets, [10.0, 10.0], [4.0, 4.0])
    assert float(scaled) == pytest.approx(want, rel=1e-5)
    huber = parse_targets({"a": {"expr": "x", "loss": "huber"}})
    h = np.where(np.abs(d[:, 0]) < 1, 0.5 * d[:, 0] ** 2, np.abs(d[:, 0]) - 0.5).mean()
    assert float(target_loss(pred[:, :1], true[:, :1], huber, [0.0], [1.0])) == pytest.approx(h)
    both = parse_targets({"a": {"expr": "x", "loss": "mse"}, **VERTEX})
    out = torch.tensor([[0.5, 2.0, -1.0], [1.0, 0.0, 3.0]])
    y = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    ce = torch.nn.functional.cross_entropy(out[:, 1:], torch.tensor([1, 0]))
    want = np.mean([0.25, 1.0]) + 0.5 * float(ce)
    assert float(target_loss(out, y, both, [0.0, 0.0], [1.0, 1.0])) == pytest.approx(want)


def test_shards_hold_the_targets_expression_for_the_same_jets(raw, tmp_path):
    """A target computed from a jet feature's branch (an input: fine) equals that feature jet by
    jet; index.json has the training split's median and 16-84% spread of it (robust: a 1e30
    cannot move them)."""
    cfg = JetDataConfig(max_particles=16, jets_per_shard=700, jet_features=["jet_sdmass"],
                        targets={"half_mass": "jet_sdmass / 2"})  # fmt: skip
    index = shard_jets(raw / "m.json", tmp_path / "s", cfg)
    assert index["targets"] == ["half_mass"]
    for split in ("train", "test"):
        c = load_columns(tmp_path / "s", split, ("jets", "targets"))
        assert c["targets"].shape == (len(c["jets"]), 1) and c["targets"].dtype == np.float32
        np.testing.assert_allclose(c["targets"][:, 0], c["jets"][:, 0] / 2, rtol=1e-6)
    train = load_columns(tmp_path / "s", "train", ("targets",))["targets"][:, 0].astype(float)
    low, mid, high = np.percentile(train, [16, 50, 84])
    assert load_index(tmp_path / "s")["target_mean"] == pytest.approx([mid], rel=1e-6)
    assert index["target_std"] == pytest.approx([max(high - mid, mid - low)], rel=1e-4)


@pytest.mark.parametrize(
    "targets,match",
    [
        ({"m": "sqrt(jet_sdmass - 150)"},
         r"target 'm' is NaN or ±inf for \d+ selected jets \(entries \[\d+"),
        ({"m": "part_px"}, r"jets\.targets\.m: part_px has one value a particle"),
        ({"f": {"expr": "nsv", "kind": "classification", "classes": ["a", "b"]}},
         r"classification target 'f' is \[[\d., ]+\] for \d+ selected jets \(entries "
         r"\[\d+.*not a class number 0–1 of \['a', 'b'\]"),
    ],
)  # fmt: skip
def test_a_target_not_one_number_a_jet_stops_the_shard_job(raw, tmp_path, targets, match):
    cfg = JetDataConfig(max_particles=16, targets=targets)
    with pytest.raises(VoxjetError, match=match) as e:
        shard_jets(raw / "m.json", tmp_path / "s", cfg)
    assert ".root" in str(e.value) and not (tmp_path / "s").exists()


def test_an_input_reading_a_targets_truth_is_leakage_a_target_reading_an_input_is_not():
    from voxjet.jets.leakage import check_inputs

    leaky = {"jet_features": ["jet_pt", "jet_genmass"], "targets": MASS,
             "new_variables": {"jet_genmass": "aux_genjet_mass * 1"}}  # fmt: skip
    with pytest.raises(VoxjetError, match=r"'jet_genmass' reads \['aux_genjet_mass'\].*"
                       r"the regression target\(s\) \['gen_mass'\]"):  # fmt: skip
        check_inputs(leaky, "jets")
    check_inputs({"jet_features": ["jet_sdmass"], "targets": {"r": "aux_genjet_mass / jet_sdmass"}},
                 "jets")  # fmt: skip


def test_a_mass_regression_trains_beside_the_classes_and_beats_the_training_median(trained):
    d, m = trained
    reg = m["regression"]["gen_mass"]
    # the generated mass from the jet's particles: far better than one number for every jet
    assert reg["resolution"] < 0.5 * reg["median_baseline"]["resolution"], reg
    assert abs(reg["response"] - 1) < 0.1, reg
    assert len(reg["pt_bins"]) == 4 and all(b["n_jets"] > 0 for b in reg["pt_bins"])
    assert m["auc_macro"] > 0.8  # the classes are still learned
    # the auxiliary classification beside them: whether a jet has a secondary vertex
    aux = m["classification"]["vertex"]
    assert aux["auc_macro"] > 0.8 and aux["n_jets"] == reg["n_jets"], aux
    assert (d / "eval" / "regression.png").stat().st_size > 10_000
    with h5py.File(d / "eval" / "predictions.h5") as f:
        assert list(f.attrs["targets"]) == ["gen_mass", "vertex"]
        assert f["targets_pred"].shape[1] == 3  # the mass, then P(no vertex), P(vertex)
        np.testing.assert_allclose(f["targets_pred"][:, 1:].sum(1), 1, rtol=1e-5)
        true = f["targets_true"][:, 0]
    want = []
    for path in sorted((d / "raw").glob("*.root")):
        with uproot.open(path) as r:
            want.append(r["tree"]["aux_genjet_mass"].array(library="np"))
    assert np.isin(true, np.concatenate(want)).all()  # the truth in the file's units


def test_predict_writes_the_targets_evaluation_computed_for_the_same_jets(trained, tmp_path):
    from conftest import assert_predict_equals_evaluation

    from voxjet.predict import run_predict

    d, _ = trained
    run_predict(str(d / "run" / "model.pt"), [str(d / "raw")], str(tmp_path / "out"))
    assert_predict_equals_evaluation(
        d / "eval",
        tmp_path / "out",
        {"pred_gen_mass": ("targets_pred", 0), "pred_vertex_some": ("targets_pred", 2)},
        atol=1e-4,
    )


def test_an_onnx_export_names_its_outputs_and_gives_targets_in_units(trained, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from voxjet.export import export_model
    from voxjet.jets.tagger import load_trained

    d, _ = trained
    export_model(d / "run" / "model.pt", "onnx", tmp_path / "x")
    info = json.loads((tmp_path / "x" / "export.json").read_text())
    assert info["targets"] == ["gen_mass", "vertex_none", "vertex_some"]
    assert set(info["output"]) == {"softmax", "targets"}
    s = ort.InferenceSession(str(tmp_path / "x" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in s.get_outputs()] == ["softmax", "targets"]
    model, saved = load_trained(d / "run" / "model.pt")
    x, mask = torch.randn(5, 20, 17), torch.ones(5, 20, dtype=torch.bool)
    probs, mass = s.run(None, {"particles": x.numpy(), "mask": mask.numpy()})
    with torch.no_grad():
        out = model.eval()(x, mask)
    t = saved["model_config"]["targets"]
    np.testing.assert_allclose(mass[:, 0], out[:, 4].numpy() * t["std"][0] + t["mean"][0],
                               rtol=1e-4)  # fmt: skip
    np.testing.assert_allclose(probs.sum(1), 1, rtol=1e-5)


# weaver-core's ak8 mass regression's target, on the toy files' branches
MASS_EXPR = "np.maximum(1, np.where(label_QCD, jet_sdmass, aux_genjet_mass))"
CUSTOM = {"type": "custom", "value": {"target_mass": MASS_EXPR}}


def test_weaver_custom_labels_are_targets_beside_the_sections_classes(demo_config, tmp_path):
    """CMS's mass-regression config form (labels: {type: custom}): its targets, learned beside
    the classes the dataset's own labels give; without those, the dry run says so."""
    from test_weaver import data_config

    from voxjet.config import check_config

    doc = data_config("kin")
    doc["labels"] = CUSTOM
    path = tmp_path / "mass.yaml"
    path.write_text(yaml.safe_dump(doc))
    jets = JetDataConfig(weaver_config=str(path), labels=["label_QCD", "label_Hbb"])
    assert jets.targets == {"target_mass": CUSTOM["value"]["target_mass"]}
    cfg = copy.deepcopy(demo_config)
    cfg["datasets"]["toy_jets"]["jets"] = {"weaver_config": str(path)}
    with pytest.raises(VoxjetError, match=r"jets'?: weaver_config .*mass\.yaml has custom "
                       r"labels \(regression targets \['target_mass'\]\)"):  # fmt: skip
        check_config(cfg, "config/schema.yaml")
    cfg["datasets"]["toy_jets"]["jets"]["labels"] = ["label_QCD", "label_Hbb"]
    check_config(cfg, "config/schema.yaml")
    cfg["datasets"]["toy_jets"]["jets"]["targets"] = {"m": "jet_sdmass"}
    with pytest.raises(VoxjetError, match="has its own targets"):
        check_config(cfg, "config/schema.yaml")


def test_the_summary_carries_each_targets_response_and_resolution(trained):
    from voxjet.report.aggregate import _target_columns, flatten_eval

    _, m = trained
    flat = flatten_eval(m)
    reg = m["regression"]["gen_mass"]
    assert flat["resolution_gen_mass"] == reg["resolution"]
    assert flat["response_gen_mass"] == reg["response"]
    assert flat["resolution_gen_mass_median_baseline"] == reg["median_baseline"]["resolution"]
    assert flat["resolution_gen_mass_pt_bin3"] == reg["pt_bins"][3]["resolution"]
    assert _target_columns({"run": flat}) == [
        "response_gen_mass",
        "resolution_gen_mass",
        "resolution_gen_mass_median_baseline",
    ]
