"""Aggregation: the CSV equals the runs' own metrics, the summary ranks runs, missing runs show."""

from __future__ import annotations

import csv
import json
import re

import pytest

from voxjet.report.aggregate import aggregate, flatten_eval
from voxjet.report.runs import RunInfo


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


def test_figures_for_every_dataset_and_the_pipeline(tmp_path):
    import h5py
    import numpy as np

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 300)
    probs = np.eye(3)[labels] * 0.5 + rng.random((300, 3)) * 0.5
    probs /= probs.sum(1, keepdims=True)
    log = [
        {"step": s, "loss": 1 / s, "jets_per_s": 1e4, "data_wait_fraction": 0.05}
        for s in (10, 20, 30)
    ] + [{"step": 30, "split": "val", "auc_macro": 0.9, "score": 0.9}]
    jets = _run(
        tmp_path,
        "pfn",
        "jets",
        {
            "auc_macro": 0.9,
            "vs_QCD": {
                "Wqq": {"auc": 0.9, "rej50": 30.0, "rej30": 90.0},
                "Tbqq": {"auc": 0.95, "rej50": 80.0, "rej30": 200.0},
            },
        },
        train=log,
    )
    with h5py.File(tmp_path / "pfn" / "eval" / "predictions.h5", "w") as f:
        f["probs"], f["labels"] = probs, labels
        f.attrs["classes"] = ["QCD", "Wqq", "Tbqq"]
    seg_log = [
        {"step": 5, "loss": 0.8, "patches_per_s": 40, "data_wait_fraction": 0.2},
        {"step": 5, "split": "val", "score": 0.7},
    ]
    seg = _run(
        tmp_path,
        "unet",
        "volumes",
        {
            "dice_mean": 0.8,
            "per_case": {
                "c1": {
                    "organ": {"dice": 0.9, "hd95": 1.0, "present": True},
                    "lesion": {"dice": None, "hd95": None, "present": False},
                },
                "c2": {
                    "organ": {"dice": 0.7, "hd95": 2.0, "present": True},
                    "lesion": {"dice": 0.5, "hd95": 3.0, "present": True},
                },
            },
        },
        train=seg_log,
    )
    bench = tmp_path / "bench" / "train_jets" / "ds"
    bench.mkdir(parents=True)
    (bench / "pfn.tsv").write_text("s\th:m:s\tmax_rss\n12.5\t0:00:12\t800.1\n")
    out = aggregate([jets, seg], tmp_path / "summary", str(tmp_path / "bench"))
    expected = {
        "jets-ds_jets-roc.png",
        "jets-ds_jets-rejection.png",
        "jets-ds_jets-training.png",
        "volumes-ds_volumes-dice.png",
        "volumes-ds_volumes-training.png",
        "pipeline-all-throughput.png",
        "pipeline-all-cost.png",
    }
    assert set(out["figures"]) == expected
    for name in expected:
        png = (tmp_path / "summary" / "figures" / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert (
        "![jets-ds_jets-roc.png](figures/jets-ds_jets-roc.png)"
        in (tmp_path / "summary" / "summary.md").read_text()
    )


def test_cli_summarises_from_a_config_listing_failed_runs_as_missing(tmp_path, monkeypatch):
    """After a run failed (snakemake --keep-going finished the others), the CLI summarises
    what exists from the config and lists the rest as missing."""
    import shutil

    import yaml
    from conftest import REPO

    from voxjet.cli import main

    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "config", tmp_path / "config")  # the config and its schema
    done = tmp_path / "results" / "toy_jets" / "runs" / "part" / "eval"
    done.mkdir(parents=True)
    (done / "metrics.json").write_text(json.dumps({"auc_macro": 0.9, "accuracy": 0.8}))
    assert main(["aggregate", "--from-config", "config/config.yaml", "--out", "summary"]) == 0
    md = (tmp_path / "summary" / "summary.md").read_text()
    assert "| part ★ |" in md
    cfg = yaml.safe_load((tmp_path / "config" / "config.yaml").read_text())
    for experiment, run in (("particlenet", "particlenet"), ("unet", "unet_lr-0.001")):
        assert experiment in cfg["experiments"] and f"{run} (missing" in md


def test_repeats_are_summarised_as_mean_std_and_range(tmp_path):
    aucs = {"pfn": 0.90, "pfn_rep-1": 0.92, "pfn_rep-2": 0.97}
    runs = []
    for name, auc in aucs.items():
        r = _run(tmp_path, name, "jets", {"auc_macro": auc, "accuracy": 0.8, "rej50_mean": 10.0})
        r.group = "pfn"
        runs.append(r)
    runs.append(_run(tmp_path, "other", "jets", {"auc_macro": 0.5}))
    out = aggregate(runs, tmp_path / "summary")
    md = (tmp_path / "summary" / "summary.md").read_text()
    # mean 0.93, sample std 0.0361, range 0.9-0.97; a group of one gets no repeat row
    assert "| pfn | 3 | 0.93 ± 0.03606 (0.9–0.97) |" in md
    assert "| other | 1 |" not in md
    assert "jets-ds_jets-repeats.png" in out["figures"]
    rows = list(csv.DictReader(open(tmp_path / "summary" / "metrics.csv")))
    assert {r["group"] for r in rows if r["run"].startswith("pfn")} == {"pfn"}


def test_any_background_class_and_rejections_at_their_bound(tmp_path):
    """Classes signal/background (the HZZ example's): rejection metrics, their figure, and a
    1/ε_B that only bounds the rejection from below is flagged, not ranked as a value."""
    import h5py
    import numpy as np

    from voxjet.jets.metrics import jet_metrics

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 600)
    good = np.stack([1 - labels, labels], 1) * 0.98 + 0.01  # separates perfectly: at the bound
    fuzzy = np.clip(good + rng.normal(0, 0.4, good.shape), 0.01, None)
    fuzzy /= fuzzy.sum(1, keepdims=True)
    runs = []
    for name, probs in (("perfect", good), ("fuzzy", fuzzy)):
        m = jet_metrics(probs, labels, ["background", "signal"])
        r = _run(tmp_path, name, "jets", m)
        with h5py.File(tmp_path / name / "eval" / "predictions.h5", "w") as f:
            f["probs"], f["labels"] = probs, labels
            f.attrs["classes"] = ["background", "signal"]
        runs.append(r)
    aggregate(runs, tmp_path / "summary", None)
    rows = list(csv.DictReader(open(tmp_path / "summary" / "metrics.csv")))
    val = {(r["run"], r["metric"]): float(r["value"]) for r in rows}
    assert val[("perfect", "rej50_signal_vs_background_is_lower_bound")] == 1.0
    assert ("fuzzy", "rej50_signal_vs_background_is_lower_bound") not in val
    assert val[("fuzzy", "rej50_signal_vs_background")] > 1
    summary = (tmp_path / "summary" / "summary.md").read_text()
    assert "Rejections at their bound" in summary
    assert re.search(r"perfect: [^;]*rej50_signal_vs_background", summary)
    figs = {p.name for p in (tmp_path / "summary" / "figures").iterdir()}
    assert {"jets-ds_jets-roc.png", "jets-ds_jets-rejection.png"} <= figs


def test_summary_lists_the_files_and_jets_the_shards_left_out(tmp_path):
    """A dataset sharded with on_bad_file: skip and bad_labels: drop says so beside its runs."""
    jets = {"accuracy": 0.8, "auc_macro": 0.9, "n_jets": 10, "data": {
        "skipped_files": [{"file": "Wqq_000.root", "reason": "truncated ROOT file (10 bytes "
                                                             "where its header says 20)"}],
        "dropped_labels": {"several": 5, "none": 0}}}  # fmt: skip
    clean = {"accuracy": 0.7, "auc_macro": 0.8, "n_jets": 10}
    runs = [_run(tmp_path, "pfn", "jets", jets)]
    other = _run(tmp_path, "seg", "volumes", {"dice_mean": 0.8, "hd95_mean": 2.0})
    aggregate([*runs, other], tmp_path / "summary")
    md = (tmp_path / "summary" / "summary.md").read_text()
    jets_part = md.split("## ds_jets")[1].split("## ds_volumes")[0]
    assert "- Skipped file `Wqq_000.root`: truncated ROOT file" in jets_part
    assert "- Jets dropped for their labels (bad_labels: drop): 5 with several classes set" in (
        jets_part
    )
    assert "no class set" not in md and "left out" not in md.split("## ds_volumes")[1]
    aggregate([_run(tmp_path / "again", "pfn", "jets", clean)], tmp_path / "s2")
    assert "left out" not in (tmp_path / "s2" / "summary.md").read_text()


def test_a_scaling_study_is_fitted_as_a_power_law_and_drawn(tmp_path):
    """Throughput 1000·n^0.8 jets/s at 1, 2 and 4 processes: T(n) = 1.0·n^(−0.8) s per 1000
    jets, efficiency n^(−0.2); the start-up window is left out of the rate."""
    runs = []
    for n in (1, 2, 4):
        d = tmp_path / f"pfn_scale-{n}"
        d.mkdir()
        rate = 1000 * n**0.8
        lines = [{"step": 4, "loss": 1.0, "jets_per_s": rate / 10}]  # start-up: left out
        lines += [{"step": 4 * k, "loss": 1.0, "jets_per_s": rate} for k in range(2, 10)]
        lines += [{"step": 40, "loss": 1.0, "jets_per_s": rate}]
        cost = {"energy_per_item_j": 0.5 * n} if n == 1 else {"energy_missing": "no GPU"}
        lines += [{"step": 40, "cost": cost}]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        runs.append(RunInfo("ds_jets", "jets", "pfn", d.name, str(d / "eval" / "metrics.json"),
                            str(d / "metrics.jsonl"), {"processes": n, "nodes": 1},
                            role="scaling"))  # fmt: skip
    trained = _run(tmp_path, "pfn", "jets", {"accuracy": 0.8, "auc_macro": 0.9})
    out = aggregate([trained, *runs], tmp_path / "summary")
    assert out["missing"] == [] and "jets-ds_jets-scaling-pfn.png" in out["figures"]
    assert (tmp_path / "summary" / "figures" / "jets-ds_jets-scaling-pfn.png").stat().st_size > 1e4
    md = (tmp_path / "summary" / "summary.md").read_text()
    assert "### Scaling of pfn: T(n) = 1·n^(−0.800) (seconds per 1000 jets)" in md
    row4 = next(line for line in md.splitlines() if line.startswith("| pfn_scale-4 "))
    cells = [c.strip() for c in row4.strip("|").split("|")]
    assert cells[1] == "4" and float(cells[5]) == pytest.approx(4**0.8, rel=1e-3)
    assert float(cells[6]) == pytest.approx(4**-0.2, rel=1e-3) and cells[7] == "–"
    assert "| pfn_scale-1 | 1 |" in md and "Energy per jets not measured: no GPU" in md
    rows = list(csv.DictReader(open(tmp_path / "summary" / "metrics.csv")))
    assert {r["run"] for r in rows} == {"pfn"}  # scaling runs are timed, not ranked


def test_two_sizes_give_a_speedup_not_a_fit_and_cpu_sizes_count_their_cores(tmp_path):
    """Two sizes of CPU processes sharing the job's 2 threads (2 cores at both): no power law
    is fitted through two points, the speed-up stands as a ratio against the ideal of the cores
    used (1 here), and no exponent is printed with a doubled sign."""
    runs = []
    for n, rate in ((1, 1000.0), (2, 900.0)):
        d = tmp_path / f"particlenet_scale-{n}"
        d.mkdir()
        lines = [{"step": 4 * k, "loss": 1.0, "jets_per_s": rate} for k in range(1, 11)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        runs.append(RunInfo("ds_jets", "jets", "particlenet", d.name,
                            str(d / "eval" / "metrics.json"), str(d / "metrics.jsonl"),
                            {"processes": n, "nodes": 1, "cores": 2}, role="scaling"))  # fmt: skip
    aggregate([_run(tmp_path, "particlenet", "jets", {"auc_macro": 0.9}), *runs],
              tmp_path / "summary")  # fmt: skip
    md = (tmp_path / "summary" / "summary.md").read_text()
    assert "### Scaling of particlenet: 2 sizes, so a speed-up, not a fit" in md
    assert "−-" not in md and "T(n) = " not in md
    row = next(line for line in md.splitlines() if line.startswith("| particlenet_scale-2 "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "–" and float(cells[5]) == pytest.approx(0.9)  # no fit; the ratio
    assert float(cells[6]) == pytest.approx(0.9) and cells[8] == "2" and cells[9] == "1"


def test_summary_html_has_the_ranked_tables_and_its_figures_inside(tmp_path):
    """summary.html (the report's first page) holds summary.md's tables as tables and its
    figures as data URIs, so it needs no file beside it."""
    from voxjet.report.summary_html import summary_html

    (tmp_path / "figures").mkdir()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.plot([0, 1])
    plt.savefig(tmp_path / "figures" / "jets-j-roc.png")
    plt.close()
    md = ("# voxjet results\n\n## j (jets) — ranked by auc_macro\n\n| rank | run |\n|---|---|\n"
          "| 1 | part ★ |\n| 2 | pfn |\n\n## Figures\n\n![jets-j-roc.png](figures/jets-j-roc.png)\n"
          "\n![gone.png](figures/gone.png)\n")  # fmt: skip
    page = summary_html(md, tmp_path)
    assert "<td>part ★</td>" in page and page.index("part ★") < page.index("pfn")
    assert page.count('src="data:image/png;base64,') == 1 and 'src="figures/gone.png"' in page
    assert "<script" not in summary_html("<script>alert(1)</script>", tmp_path)
