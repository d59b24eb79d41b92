"""Gather each run's eval/metrics.json (and training log) into a tidy metrics.csv and a
summary.md that ranks the runs of each dataset by its headline metric."""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxjet.io.atomic import atomic_path

# (metric, higher is better) that ranks the runs of a domain, then the other summary columns.
HEADLINE = {"jets": ("auc_macro", True), "volumes": ("dice_mean", True)}
COLUMNS = {"jets": ["auc_macro", "accuracy", "rej50_mean"], "volumes": ["dice_mean", "hd95_mean"]}
CSV_FIELDS = ["dataset", "domain", "experiment", "run", "params", "split", "metric", "value"]


@dataclass
class RunInfo:
    """Where a run's outputs are and what distinguishes it within its experiment."""

    dataset: str
    domain: str
    experiment: str
    run: str
    eval_metrics: str
    train_metrics: str
    params: dict[str, Any] = field(default_factory=dict)


def flatten_eval(metrics: dict[str, Any]) -> dict[str, float]:
    """Scalar metrics of one eval/metrics.json, nested per-class values as `name_class`."""
    flat: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or k in ("best_step", "n_jets", "n_cases"):
            continue
        if isinstance(v, (int, float)) or v is None:
            flat[k] = _num(v)
    for c, v in metrics.get("auc_ovr", {}).items():
        flat[f"auc_{c}"] = _num(v)
    for c, d in metrics.get("vs_QCD", {}).items():
        for m, v in d.items():
            flat[f"{m}_{c}_vs_QCD"] = _num(v)
    for c, d in metrics.get("per_class", {}).items():
        for m in ("dice", "hd95"):
            flat[f"{m}_{c}"] = _num(d.get(m))
    return flat


def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


def train_summary(lines: list[dict[str, Any]]) -> dict[str, float]:
    """Final training loss, mean throughput and mean data-wait fraction from metrics.jsonl."""
    steps = [r for r in lines if "loss" in r]
    if not steps:
        return {}
    rate_key = next((k for k in steps[-1] if k.endswith("_per_s")), None)
    out = {
        "train_loss_final": float(steps[-1]["loss"]),
        "data_wait_fraction": sum(r.get("data_wait_fraction", 0) for r in steps) / len(steps),
    }
    if rate_key:
        out[f"train_{rate_key}"] = sum(r[rate_key] for r in steps) / len(steps)
    return out


def collect(runs: list[RunInfo]) -> tuple[list[dict[str, Any]], list[RunInfo]]:
    """Tidy rows for every run that has metrics, and the runs that have none (missing)."""
    rows, missing = [], []
    for r in runs:
        if not Path(r.eval_metrics).is_file():
            missing.append(r)
            continue
        metrics = json.loads(Path(r.eval_metrics).read_text())
        values = {("test", k): v for k, v in flatten_eval(metrics).items()}
        if Path(r.train_metrics).is_file():
            lines = [json.loads(x) for x in Path(r.train_metrics).read_text().splitlines() if x]
            values.update({("train", k): v for k, v in train_summary(lines).items()})
        params = ";".join(f"{k}={v}" for k, v in sorted(r.params.items()))
        for (split, metric), value in values.items():
            rows.append(
                {
                    "dataset": r.dataset,
                    "domain": r.domain,
                    "experiment": r.experiment,
                    "run": r.run,
                    "params": params,
                    "split": split,
                    "metric": metric,
                    "value": value,
                }
            )
    return rows, missing


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.4g}"


def summary_markdown(rows: list[dict[str, Any]], missing: list[RunInfo]) -> str:
    """Per dataset, the runs ranked by the domain's headline metric; the best marked ★."""
    out = ["# voxjet results", ""]
    datasets = sorted(
        {(r["dataset"], r["domain"]) for r in rows} | {(m.dataset, m.domain) for m in missing}
    )
    for ds, domain in datasets:
        head, higher = HEADLINE[domain]
        cols = COLUMNS[domain]
        table: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["dataset"] == ds and r["split"] == "test":
                t = table.setdefault(
                    r["run"], {"experiment": r["experiment"], "params": r["params"]}
                )
                t[r["metric"]] = r["value"]
        ranked = sorted(table.items(), key=lambda kv: -_rank_value(kv[1].get(head), higher))
        out += [
            f"## {ds} ({domain}) — ranked by {head}",
            "",
            "| rank | run | experiment | parameters | " + " | ".join(cols) + " |",
            "|---|---|---|---|" + "---|" * len(cols),
        ]
        for i, (run, t) in enumerate(ranked, 1):
            star = " ★" if i == 1 else ""
            out.append(
                f"| {i} | {run}{star} | {t['experiment']} | {t['params'] or '–'} | "
                + " | ".join(_fmt(t.get(c)) for c in cols)
                + " |"
            )
        for m in missing:
            if m.dataset == ds:
                out.append(
                    f"| – | {m.run} (missing: no {m.eval_metrics}) | {m.experiment} | – | "
                    + " | ".join("–" for _ in cols)
                    + " |"
                )
        out.append("")
    return "\n".join(out)


def _rank_value(v: float | None, higher: bool) -> float:
    if v is None or math.isnan(v):
        return float("-inf")
    return v if higher else -v


def aggregate(runs: list[RunInfo], out_dir: str | os.PathLike) -> dict[str, Any]:
    """Write metrics.csv and summary.md into `out_dir` (each atomically)."""
    out = Path(out_dir)
    rows, missing = collect(runs)
    with atomic_path(out / "metrics.csv") as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(rows)
    with atomic_path(out / "summary.md") as tmp:
        tmp.write_text(summary_markdown(rows, missing))
    return {"rows": len(rows), "missing": [m.run for m in missing]}
