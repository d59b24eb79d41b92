"""Aggregation: the CSV equals the runs' own metrics, the summary ranks runs, missing runs show."""

from __future__ import annotations

import csv
import json

from voxjet.report.aggregate import RunInfo, aggregate, flatten_eval


def _run(tmp_path, name, domain, metrics, params=None, train=None):
    d = tmp_path / name
    (d / "eval").mkdir(parents=True)
    (d / "eval" / "metrics.json").write_text(json.dumps(metrics))
    if train is not None:
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    return RunInfo(
        dataset="ds_" + domain,
        domain=domain,
        experiment=name.split("_")[0],
        run=name,
        eval_metrics=str(d / "eval" / "metrics.json"),
        train_metrics=str(d / "metrics.jsonl"),
        params=params or {},
    )


def test_csv_matches_metrics_and_summary_ranks(tmp_path):
    jets = {
        "accuracy": 0.8,
        "auc_macro": 0.91,
        "rej50_mean": 20.0,
        "n_jets": 10,
        "auc_ovr": {"QCD": 0.9, "Wqq": 0.92},
        "vs_QCD": {"Wqq": {"auc": 0.93, "rej50": 20.0, "rej30": 50.0}},
    }
    better = dict(jets, auc_macro=0.95)
    seg = {"dice_mean": 0.83, "hd95_mean": 3.5, "per_class": {"organ": {"dice": 0.83, "hd95": 3.5}}}
    runs = [
        _run(
            tmp_path,
            "pfn_lr-1",
            "jets",
            jets,
            {"train.lr": 1},
            train=[
                {"step": 10, "loss": 1.0, "jets_per_s": 100, "data_wait_fraction": 0.1},
                {"step": 20, "loss": 0.5, "jets_per_s": 300, "data_wait_fraction": 0.3},
            ],
        ),
        _run(tmp_path, "pfn_lr-2", "jets", better, {"train.lr": 2}),
        _run(tmp_path, "unet", "volumes", seg),
    ]
    missing = RunInfo(
        "ds_volumes",
        "volumes",
        "unet2",
        "unet2",
        str(tmp_path / "nope.json"),
        str(tmp_path / "nope.jsonl"),
    )
    out = aggregate(runs + [missing], tmp_path / "summary")
    assert out["missing"] == ["unet2"]
    rows = list(csv.DictReader(open(tmp_path / "summary" / "metrics.csv")))
    val = {(r["run"], r["split"], r["metric"]): float(r["value"]) for r in rows}
    assert val[("pfn_lr-1", "test", "auc_macro")] == 0.91
    assert val[("pfn_lr-2", "test", "auc_macro")] == 0.95
    assert val[("pfn_lr-1", "test", "rej50_Wqq_vs_QCD")] == 20.0
    assert val[("unet", "test", "dice_organ")] == 0.83
    assert val[("pfn_lr-1", "train", "train_loss_final")] == 0.5
    assert val[("pfn_lr-1", "train", "data_wait_fraction")] == 0.2
    assert val[("pfn_lr-1", "train", "train_jets_per_s")] == 200
    assert {r["params"] for r in rows if r["run"] == "pfn_lr-2"} == {"train.lr=2"}
    md = (tmp_path / "summary" / "summary.md").read_text()
    jets_table = md.split("## ds_jets")[1]
    assert jets_table.index("pfn_lr-2 ★") < jets_table.index("pfn_lr-1")
    assert "unet2 (missing" in md


def test_flatten_eval_keeps_scalars_and_nested_classes():
    flat = flatten_eval(
        {
            "dice_mean": None,
            "n_cases": 3,
            "domain": "volumes",
            "per_class": {"lesion": {"dice": None, "hd95": 2.0}},
        }
    )
    assert set(flat) == {"dice_mean", "dice_lesion", "hd95_lesion"}
    assert flat["hd95_lesion"] == 2.0
