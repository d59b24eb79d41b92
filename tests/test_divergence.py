"""Divergence caught (voxjet.training.divergence): a loss that stays far above the lowest it
reached, above its first step's, or above guessing, is marked diverged in metrics.jsonl and the
summary — also when it blew up inside its first logging window; a non-finite loss stops
training naming the step (tests/test_training.py)."""

from __future__ import annotations

import json
import math

from voxjet.report.aggregate import summary_markdown, train_summary
from voxjet.training.divergence import PATIENCE, DivergenceWatch
from voxjet.training.logger import read_metrics


def test_the_watch_flags_a_sustained_rise_once_and_ignores_a_spike():
    w = DivergenceWatch(chance=math.log(4))
    losses = [1.3, 0.9, 0.6, 9.0, 0.6, 0.5]  # one spike: not divergence
    assert all(w.update(10 * (i + 1), x) is None for i, x in enumerate(losses))
    flags = [w.update(100 + 10 * i, x) for i, x in enumerate([8.0] * (PATIENCE + 2))]
    (flag,) = [f for f in flags if f]
    assert flag["step"] == 100 + 10 * (PATIENCE - 1) and flag["diverged"]
    assert "lowest loss so far" in flag["why"]
    high = DivergenceWatch(chance=math.log(2))  # 1e17, then settling at 105: far above guessing
    flags = [high.update(10 * (i + 1), x) for i, x in enumerate([1e17, 3e5, 105, 105, 105])]
    assert [f["step"] for f in flags if f] == [30] and "guessing" in flags[2]["why"]


def test_lr_1e4_on_the_tiny_pfn_is_marked_diverged_in_the_log_and_the_summary(shards, tmp_path):
    from voxjet.jets.train import run

    model = {"name": "pfn", "phi_sizes": [16, 16], "f_sizes": [16]}
    train = {"steps": 60, "batch_size": 64, "lr": 1e4, "log_every": 5, "eval_every": 60,
             "warmup_steps": 0, "grad_clip": 0}  # fmt: skip
    run(str(shards), {"model": model, "train": train}, str(tmp_path / "run"))
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    (flag,) = [r for r in lines if r.get("diverged")]
    assert flag["step"] <= 60 and flag["window_loss"] > 10 * flag["reference"]
    assert train_summary(lines)["diverged_at_step"] == flag["step"]
    rows = [{"dataset": "d", "domain": "jets", "run": name, "experiment": "pfn", "params": "",
             "group": name,
             "split": split, "metric": metric, "value": value, "note": ""}
            for name, split, metric, value in (
                ("ok", "test", "auc_macro", 0.7), ("bad", "test", "auc_macro", 0.9),
                ("bad", "train", "diverged_at_step", float(flag["step"])))]  # fmt: skip
    md = summary_markdown(rows, [])
    ranked = [ln for ln in md.splitlines() if ln.startswith("| 1 ") or ln.startswith("| 2 ")]
    assert (
        ranked[0].startswith("| 1 | ok ★") and f"bad ⚠ diverged at step {flag['step']}" in ranked[1]
    )
    assert json.dumps(flag)  # the record is plain JSON


def test_a_run_that_blew_up_inside_its_first_window_is_caught_by_its_first_step():
    """lr 1000 on a U-Net: 3.1e5 → 7.6e3 over the windows, falling all along (the lowest-loss
    rule never fires), but far above its first step's 1.2; the sane run 1.2 → 0.75 is not."""
    w = DivergenceWatch(initial=1.2)
    flags = [w.update(10 * (i + 1), x) for i, x in enumerate([3.1e5, 9e4, 2e4, 7.6e3])]
    assert [f["step"] for f in flags if f] == [30] and "first step" in flags[2]["why"]
    sane = DivergenceWatch(initial=1.2)
    assert all(sane.update(10 * (i + 1), x) is None for i, x in enumerate([1.1, 0.9, 0.8, 0.75]))


def test_a_segmentation_lr_that_diverges_in_the_first_window_is_marked(tmp_path):
    """A U-Net at lr 1000, logged every 4 steps: marked diverged in metrics.jsonl and in the
    summary; the same run at the demo's lr is not."""
    from conftest import toy_cases

    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig
    from voxjet.volumes.training.train import run

    cases = toy_cases(tmp_path / "data", ToyVolumesConfig(train_cases=4, test_cases=0, seed=2,
                      min_shape=(32, 32, 16), max_shape=(36, 36, 16)),
                      VolumePrepConfig(patch_size=[16, 16, 8], network_depth=2))  # fmt: skip
    model = {"name": "unet", "channels": [8, 16], "num_res_units": 0}
    marks = {}
    for lr in (1000.0, 0.002):
        train = {"steps": 24, "batch_size": 2, "lr": lr, "log_every": 4, "eval_every": 24,
                 "warmup_steps": 0, "grad_clip": 0, "iterations_per_epoch": 4}  # fmt: skip
        out = tmp_path / f"lr{lr:g}"
        run(str(cases), {"model": model, "train": train}, str(out))
        lines = read_metrics(out / "metrics.jsonl")
        marks[lr] = train_summary(lines).get("diverged_at_step")
    assert marks[1000.0] is not None and marks[1000.0] <= 24 and marks[0.002] is None, marks
