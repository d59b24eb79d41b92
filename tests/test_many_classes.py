"""Label sets of JetClass-II's size (188 classes): the toy generator makes them (resonances of
many masses and decays), the one-hot labels are checked on every one, a tiny PFN trains, and
what a person reads stays readable — figures and the summary show the hardest few classes (the
summary's tables no wider than with four), metrics.csv has every class."""

from __future__ import annotations

import csv
import json

import matplotlib.image as mpimg
import numpy as np
import pytest
import uproot

from voxjet.jets.metrics import SHOWN_CLASSES, jet_metrics, shown_signals
from voxjet.jets.synth import ToyJetsConfig, generate_dataset, resonance_classes

SCREEN = 200  # characters a table row of summary.md may take (HTML tables do not wrap)


def test_a_jetclass_ii_sized_label_set_is_188_distinct_resonances():
    classes = resonance_classes(188)
    assert len(classes) == len(set(classes)) == 188 and classes[0] == "QCD"
    assert {"X40_bb", "X120_bqg", "X260_bqg"} <= set(classes)


def test_resonances_peak_at_their_mass_and_every_file_has_every_label(tmp_path):
    classes = ["QCD", "X60_qq", "X200_bqg"]
    generate_dataset(tmp_path, ToyJetsConfig(classes=classes, files_per_class=1,
                                             jets_per_file=200), progress=False)  # fmt: skip
    masses = {}
    for c in classes:
        with uproot.open(tmp_path / f"{c}_000.root") as f:
            t = f["tree"]
            onehot = np.stack([t[f"label_{k}"].array(library="np") for k in classes], 1)
            assert (onehot.sum(1) == 1).all() and onehot[:, classes.index(c)].all()
            masses[c] = float(np.median(t["jet_sdmass"].array(library="np")))
    # near the resonance's mass (soft radiation adds some, particles outside the cone take
    # some away)
    assert 50 < masses["X60_qq"] < 90 < 160 < masses["X200_bqg"] < 220, masses


def _metrics(n_classes: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, 4000)
    logits = rng.normal(size=(4000, n_classes))
    logits[np.arange(4000), labels] += np.linspace(0.5, 3.0, n_classes)[labels]
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return jet_metrics(probs, labels, resonance_classes(n_classes))


def test_the_hardest_classes_are_shown_all_when_few():
    few = _metrics(5)
    assert shown_signals(few) == resonance_classes(5)[1:]
    # metrics.json as aggregate reads it: a class without test jets has a null AUC
    missing = json.loads(json.dumps(_metrics(12)).replace("NaN", "null"))
    missing["vs_QCD"]["X40_bq"]["auc"] = None
    assert "X40_bq" in shown_signals(missing)
    many = _metrics(40)
    shown = shown_signals(many)
    aucs = {c: v["auc"] for c, v in many["vs_QCD"].items()}
    assert len(shown) == SHOWN_CLASSES
    assert max(aucs[c] for c in shown) <= min(aucs[c] for c in aucs if c not in shown)
    order = list(aucs)
    assert shown == sorted(shown, key=order.index)  # in class order


@pytest.mark.long
@pytest.mark.slow
def test_188_classes_train_a_tiny_pfn_and_the_summary_stays_one_screen_wide(workflow_dir):
    """Real snakemake: 188 toy classes (one file of 10 jets each) through stage, shard, a
    tiny PFN, evaluation and the summary."""
    from conftest import run_pfn_workflow

    classes = resonance_classes(188)
    jets = {"labels": [f"label_{c}" for c in classes], "max_particles": 16,
            "jet_features": ["jet_pt", "jet_sdmass"], "val_fraction": 0.2,
            "test_fraction": 0.3}  # fmt: skip
    source = {"synthetic": {"generator": "toy", "classes": classes, "files_per_class": 1,
                            "jets_per_file": 10, "seed": 7}}  # fmt: skip
    r = run_pfn_workflow(workflow_dir, source, jets,
                         {"steps": 30, "eval_every": 15, "batch_size": 64})  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (metrics,) = (workflow_dir / "results").rglob("eval/metrics.json")
    m = json.loads(metrics.read_text())
    assert m["classes"] == classes and len(m["vs_QCD"]) == 187
    summary = (workflow_dir / "results" / "summary" / "summary.md").read_text()
    rows = [line for line in summary.splitlines() if line.startswith("|")]
    assert max(len(line) for line in rows) <= SCREEN, max(rows, key=len)
    assert f"the {SHOWN_CLASSES} of 187 signal classes it separates worst" in summary
    per_class = [line for line in rows if line.startswith("| X")]
    assert len(per_class) == SHOWN_CLASSES
    with open(workflow_dir / "results" / "summary" / "metrics.csv") as f:
        names = {row["metric"] for row in csv.DictReader(f)}
    assert all(f"auc_{c}" in names for c in classes)  # every class, in the CSV
    assert all(f"rej50_{c}_vs_QCD" in names for c in classes[1:])
    for png in ("roc.png", "scores.png", "confusion.png"):
        height, width = mpimg.imread(metrics.parent / png).shape[:2]
        assert width <= 6000 and height <= 3000, (png, width, height)
