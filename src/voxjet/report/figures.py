"""The summary's own figures (the domains draw theirs: voxjet.jets.figures,
voxjet.volumes.evaluation.figures): rejection per class, spread over repeats, training curves,
throughput and data stall per run, where the pipeline's time and memory went per rule, and the
planner against the runs.
Each function takes plain data and a path, so tests can call it without a workflow."""

from __future__ import annotations

import csv
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from voxjet.plotting import pyplot, save_figure


def grouped_bars(
    path: Path,
    title: str,
    values: Mapping[str, Mapping[str, float]],
    ylabel: str,
    log: bool = False,
    lower_bounds: Mapping[str, set[str]] | None = None,
) -> None:
    """Bars grouped by category (e.g. class), one colour a run; a bar in `lower_bounds`
    (run → categories) is only a lower bound: drawn hatched with an arrow up."""
    plt = pyplot()
    runs = list(values)
    cats = sorted({c for v in values.values() for c in v})
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(cats) * max(1, len(runs)) / 2 + 2), 3.8))
    width = 0.8 / max(1, len(runs))
    x = np.arange(len(cats))
    bounded = False
    for k, run in enumerate(runs):
        at = x + k * width - 0.4 + width / 2
        heights = [values[run].get(c, np.nan) for c in cats]
        bars = ax.bar(at, heights, width, label=run)
        for c, bar, h in zip(cats, bars, heights, strict=True):
            if c in (lower_bounds or {}).get(run, set()):
                bounded = True
                bar.set_hatch("//")
                ax.annotate("", (bar.get_x() + width / 2, h * (1.6 if log else 1.1)),
                            (bar.get_x() + width / 2, h),
                            arrowprops={"arrowstyle": "->", "lw": 1.2})  # fmt: skip
    if bounded:
        ax.bar([np.nan], [np.nan], color="white", edgecolor="black", hatch="//",
               label="lower bound (no background passed)")  # fmt: skip
    ax.set_xticks(x, cats)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y", which="both")
    save_figure(fig, path)


def repeat_spread(
    path: Path, title: str, groups: Mapping[str, Sequence[float]], metric: str
) -> None:
    """Each group's runs (repeats with other seeds) as points, with their mean ± std."""
    plt = pyplot()
    names = sorted(groups)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(names) + 2), 3.6))
    for i, g in enumerate(names):
        v = np.asarray(groups[g], float)
        ax.scatter(np.full(len(v), i), v, s=14, alpha=0.6, color="tab:blue")
        if len(v) > 1:
            ax.errorbar(i + 0.15, v.mean(), yerr=v.std(ddof=1), fmt="o", color="black", capsize=4)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{metric} (test)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)


def training_curves(
    path: Path, title: str, logs: Mapping[str, list[dict[str, Any]]], val_metric: str
) -> None:
    """Training loss and the validation metric against step, one line a run."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for run, lines in logs.items():
        tr = [r for r in lines if "loss" in r]
        va = [r for r in lines if r.get("split") == "val" and r.get(val_metric) is not None]
        a.plot([r["step"] for r in tr], [r["loss"] for r in tr], label=run)
        b.plot([r["step"] for r in va], [r[val_metric] for r in va], marker="o", label=run)
    a.set_xlabel("step")
    a.set_ylabel("training loss")
    a.set_yscale("log")
    b.set_xlabel("step")
    b.set_ylabel(f"validation {val_metric}")
    for ax in (a, b):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)


def throughput(path: Path, rows: list[tuple[str, str, float, float]]) -> None:
    """Per run: training throughput (items/s, with its unit) and the data-stall fraction."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 0.45 * len(rows) + 1.8))
    names = [r[0] for r in rows]
    y = np.arange(len(rows))
    a.barh(y, [r[2] for r in rows], color="tab:blue")
    a.set_yticks(y, [f"{r[0]} ({r[1]})" for r in rows], fontsize=8)
    a.set_xlabel("training throughput (items/s; unit in brackets)")
    a.set_xscale("log")
    b.barh(y, [100 * r[3] for r in rows], color="tab:red")
    b.set_yticks(y, names, fontsize=8)
    b.set_xlabel("time waiting for data (% of step time)")
    b.set_xlim(0, 100)
    for ax in (a, b):
        ax.grid(alpha=0.3, axis="x", which="both")
        ax.invert_yaxis()
    save_figure(fig, path)


def read_benchmarks(root: str | os.PathLike) -> list[dict[str, Any]]:
    """Snakemake benchmark files under `root` (root/<rule>/.../<job>.tsv): rule, job, s, max_rss."""
    out = []
    root = Path(root)
    for tsv in sorted(root.rglob("*.tsv")):
        rel = tsv.relative_to(root)
        with open(tsv) as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        for r in rows[-1:]:  # the last repeat, if a rule was benchmarked several times
            out.append(
                {
                    "rule": rel.parts[0],
                    "job": str(rel.with_suffix("")),
                    "s": float(r["s"]),
                    "max_rss_mb": _float(r.get("max_rss")),
                }
            )
    return out


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def pipeline_cost(path: Path, bench: list[dict[str, Any]]) -> None:
    """Wall time summed over each rule's jobs, and the largest peak memory of a job of it."""
    plt = pyplot()
    time, mem, jobs = defaultdict(float), defaultdict(float), defaultdict(int)
    for b in bench:
        time[b["rule"]] += b["s"]
        jobs[b["rule"]] += 1
        if np.isfinite(b["max_rss_mb"]):
            mem[b["rule"]] = max(mem[b["rule"]], b["max_rss_mb"])
    rules = sorted(time, key=lambda r: -time[r])
    y = np.arange(len(rules))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 0.4 * len(rules) + 1.8))
    a.barh(y, [time[r] for r in rules], color="tab:blue")
    a.set_yticks(y, [f"{r} ×{jobs[r]}" for r in rules], fontsize=8)
    a.set_xlabel("wall time, all jobs of the rule (s)")
    b.barh(y, [mem.get(r, 0) for r in rules], color="tab:green")
    b.set_yticks(y, rules, fontsize=8)
    b.set_xlabel("peak memory of one job (MB RSS)")
    for ax in (a, b):
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
    save_figure(fig, path)


def predicted_vs_measured(path: Path, check: list[dict[str, Any]]) -> None:
    """The planner's predicted throughput of each run against the measured one (log-log), with
    the line where they agree and a ±15% band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    pred = np.array([c["predicted"] for c in check])
    meas = np.array([c["measured"] for c in check])
    for c in check:
        ax.scatter(c["measured"], c["predicted"], s=25)
        ax.annotate(f"{c['run']} ({c['processes']})", (c["measured"], c["predicted"]),
                    fontsize=7, xytext=(3, 3), textcoords="offset points")  # fmt: skip
    lo, hi = min(pred.min(), meas.min()) / 1.5, max(pred.max(), meas.max()) * 1.5
    grid = np.geomspace(lo, hi, 20)
    ax.plot(grid, grid, color="grey", lw=1)
    ax.fill_between(grid, grid * 0.85, grid * 1.15, color="grey", alpha=0.15, label="±15%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured items/s (training log)")
    ax.set_ylabel("predicted items/s (results/plan/runs.json)")
    ax.set_title("The planner against the runs")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    save_figure(fig, path)
