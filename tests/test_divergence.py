"""Divergence caught (voxjet.training.divergence): a loss that stays far above the lowest it
reached, or above guessing, is marked diverged in metrics.jsonl and the summary; a non-finite
loss stops training naming the step (tests/test_training.py)."""

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
