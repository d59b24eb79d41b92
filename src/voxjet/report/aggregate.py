"""Gather each run's eval/metrics.json (and training log) into a tidy metrics.csv and a
summary.md that ranks the runs of each dataset by its headline metric (and summary.html, the
same with its figures inside, for the report's first page)."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any

from voxjet.io.atomic import atomic_path
from voxjet.io.integrity import corrupt_error
from voxjet.jets.figures import roc_overlay
from voxjet.jets.metrics import shown_signals
from voxjet.report import figures
from voxjet.report.runs import RunInfo
from voxjet.report.scaling import Point, scaling_figure, steady_rate, study_markdown, study_table
from voxjet.report.summary_html import summary_html
from voxjet.training.logger import read_metrics
from voxjet.volumes.evaluation.figures import dice_boxes
from voxjet.volumes.evaluation.find_best import summary_rows

# (metric, higher is better) that ranks the runs of a domain, then the other summary columns.
HEADLINE = {"jets": ("auc_macro", True), "volumes": ("dice_mean", True)}
# what each run cost, beside what it bought (from the training log's cost record)
COST_COLUMNS = ["device_hours", "energy_kwh", "peak_memory_gib"]
COLUMNS = {
    "jets": ["auc_macro", "accuracy", "rej50_mean", "baseline_jet_mass_auc_macro", *COST_COLUMNS],
    "volumes": ["dice_mean", "iou_mean", "hd95_mean", "misses", "false_detections", *COST_COLUMNS],
}
CSV_FIELDS = [
    "dataset", "domain", "experiment", "group", "run", "params", "split", "metric", "value", "note"
]  # fmt: skip
BOUNDS_NAMED = 4  # metrics at their bound named a run; the rest counted
COST_METRICS = ["wall_h", "device_hours", "peak_memory_gib", "memory_estimate_gib",
                "peak_over_estimate", "utilisation", "energy_kwh", "sessions"]  # fmt: skip


def flatten_eval(metrics: dict[str, Any]) -> dict[str, float]:
    """Scalar metrics of one eval/metrics.json, nested per-class values as `name_class`."""
    flat: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or k in ("best_step", "n_jets", "n_cases"):
            continue
        if isinstance(v, (int, float)) or v is None:
            flat[k] = _num(v)
    for k in ("rej50_mean", "rej30_mean"):
        if metrics.get(f"{k}_lower_bound"):  # a bound among the classes: the mean is one too
            flat[f"{k}_is_lower_bound"] = 1.0
    for c, v in metrics.get("auc_ovr", {}).items():
        flat[f"auc_{c}"] = _num(v)
    background = metrics.get("background", "QCD")
    for c, d in metrics.get(f"vs_{background}", {}).items():
        for m, v in d.items():
            if not m.endswith("_lower_bound"):  # a bound is flagged below, not a value
                flat[f"{m}_{c}_vs_{background}"] = _num(v)
            elif v:
                flat[f"{m.removesuffix('_lower_bound')}_{c}_vs_{background}_is_lower_bound"] = 1.0
    for k, v in metrics.get("baseline_jet_mass", {}).items():
        flat[f"baseline_jet_mass_{k}"] = _num(v)
    for name, r in metrics.get("regression", {}).items():  # regression targets
        for m in ("response", "resolution", "rmse"):
            flat[f"{m}_{name}"] = _num(r.get(m))
        flat[f"resolution_{name}_median_baseline"] = _num(r["median_baseline"]["resolution"])
        for i, b in enumerate(r.get("pt_bins", [])):
            flat[f"resolution_{name}_pt_bin{i}"] = _num(b.get("resolution"))
    for name, r in metrics.get("classification", {}).items():  # auxiliary classifications
        flat[f"accuracy_{name}"] = _num(r.get("accuracy"))
        flat[f"auc_macro_{name}"] = _num(r.get("auc_macro"))
    for c, d in metrics.get("per_class", {}).items():
        for m in ("dice", "iou", "hd95", "misses", "false_detections"):
            if m in d:
                flat[f"{m}_{c}"] = _num(d.get(m))
    return flat


def _target_columns(table: dict[str, dict[str, Any]]) -> list[str]:
    """Each regression target's response and resolution, with the training median's
    resolution beside them (what the model has to beat)."""
    base = "_median_baseline"
    names = sorted({k.removeprefix("resolution_").removesuffix(base) for t in table.values()
                    for k in t if k.startswith("resolution_") and k.endswith(base)})  # fmt: skip
    return [c for n in names for c in (f"response_{n}", f"resolution_{n}", f"resolution_{n}{base}")]


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
    diverged = next((r for r in lines if r.get("diverged")), None)
    if diverged is not None:  # voxjet.training.divergence
        out["diverged_at_step"] = float(diverged["step"])
    return out


def cost_summary(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's cost (the last cost record of metrics.jsonl), or None for a run without one."""
    return next((r["cost"] for r in reversed(lines) if isinstance(r.get("cost"), dict)), None)


def cost_values(cost: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """(value, note) a cost metric: missing ones NaN with the reason, device-hours with the
    kind of device they count."""
    out = {}
    for k in COST_METRICS:
        v = cost.get(k)
        note = ""
        if k == "device_hours":
            note = "GPU-hours" if cost.get("device_kind") == "gpu" else "CPU core-hours"
        elif k == "energy_kwh":
            note = (f"from {cost['energy_source']}" if v is not None
                    else f"not measured: {cost.get('energy_missing', 'no source')}")  # fmt: skip
        elif k in ("memory_estimate_gib", "peak_over_estimate") and v is None:
            continue
        out[k] = (_num(v), note)
    return out


def scaling_studies(runs: list[RunInfo]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Per (domain, dataset, experiment) with a scaling study of two or more trained sizes:
    its fit and table (report.scaling.study_table)."""
    points: dict[tuple[str, str, str], list] = {}
    for r in runs:
        if r.role != "scaling" or not Path(r.train_metrics).is_file():
            continue
        log = _train_log(r)
        rate = steady_rate(log)
        if rate is None:
            continue
        cost = cost_summary(log) or {}
        missing = "" if cost.get("energy_per_item_j") is not None else cost.get(
            "energy_missing", "no cost record")  # fmt: skip
        points.setdefault((r.domain, r.dataset, r.experiment), []).append(
            Point(
                r.run,
                int(r.params["processes"]),
                rate[0],
                rate[1],
                cost.get("energy_per_item_j"),
                missing,
                int(r.params.get("cores") or 0),
            )  # fmt: skip
        )
    return {k: study_table(v) for k, v in sorted(points.items())
            if len({p.processes for p in v}) >= 2}  # fmt: skip


def planner_check(runs: list[RunInfo], plan: dict[str, Any],
                  benchmarks: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Each run's predicted throughput at its own size beside what its training measured,
    with the relative error: over the whole training job (its Snakemake benchmark's wall time
    against the prediction's startup, data, steps, validations, checkpoints and export) where
    the job was timed, else over the steady windows of its log."""
    predicted = {p["run"]: next((r for r in p["predictions"] if r.get("own")), None)
                 for p in plan.get("runs", [])}  # fmt: skip
    out = []
    for r in runs:
        pred = predicted.get(r.run)
        if pred is None:
            continue
        wall = _job_wall(benchmarks, r)
        measured = steady_rate(_train_log(r)) if Path(r.train_metrics).is_file() else None
        if wall is not None and pred.get("job_s"):
            rate = pred["job_items_per_s"]
            unit = measured[1] if measured else "items"
            # the same items over each side's time: the rates' error is the times' inverse
            out.append({"run": r.run, "processes": pred["processes_total"], "unit": unit,
                        "basis": "job", "predicted": rate, "measured": rate * pred["job_s"] / wall,
                        "predicted_s": pred["job_s"], "measured_s": wall,
                        "error": wall / pred["job_s"] - 1})  # fmt: skip
        elif measured is not None:
            out.append({"run": r.run, "processes": pred["processes_total"], "unit": measured[1],
                        "basis": "steady", "predicted": pred["items_per_s"],
                        "measured": measured[0],
                        "error": pred["items_per_s"] / measured[0] - 1})  # fmt: skip
    return out


def _job_wall(benchmarks: str | None, r: RunInfo) -> float | None:
    """The training job's wall seconds from its Snakemake benchmark file, if it has one."""
    if not benchmarks:
        return None
    rule = "train_jets" if r.domain == "jets" else "train_seg"
    path = Path(benchmarks) / rule / r.dataset / f"{r.run}.tsv"
    try:
        with open(path) as f:
            return float(next(csv.DictReader(f, delimiter="\t"))["s"])
    except (OSError, StopIteration, KeyError, ValueError):
        return None


def planner_check_markdown(check: list[dict[str, Any]]) -> str:
    """summary.md's section on how far the planner's predictions were from the runs."""
    if not check:
        return ""
    out = ["", "## The planner against the runs", "",
           "Throughput each run was predicted to reach at its own size (results/plan/runs.md) "
           "beside what it measured: over the whole training job (start, data, steps, "
           "validations, checkpoints, export: what a job's time limit is sized by) where the "
           "job was timed, else between its log's windows (steady).", "",
           "| run | processes | over | predicted | measured | job time predicted / measured "
           "| error |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in check:
        times = (f"{c['predicted_s']:.3g} s / {c['measured_s']:.3g} s" if "predicted_s" in c
                 else "–")  # fmt: skip
        out.append(f"| {c['run']} | {c['processes']} | {c.get('basis', 'steady')} | "
                   f"{c['predicted']:.4g} {c['unit']}/s | {c['measured']:.4g} {c['unit']}/s | "
                   f"{times} | {100 * c['error']:+.0f}% |")  # fmt: skip
    errs = [abs(c["error"]) for c in check]
    out += ["", f"Mean absolute error {100 * sum(errs) / len(errs):.0f}% over {len(errs)} runs.",
            ""]  # fmt: skip
    return "\n".join(out)


def _train_log(r: RunInfo) -> list[dict[str, Any]]:
    return read_metrics(r.train_metrics) if Path(r.train_metrics).is_file() else []


def collect(runs: list[RunInfo]) -> tuple[list[dict[str, Any]], list[RunInfo]]:
    """Tidy rows for every run that has metrics, and the runs that have none (missing)."""
    rows, missing = [], []
    for r in runs:
        if r.role != "train":
            continue  # scaling runs: summarised by report.scaling
        if not Path(r.eval_metrics).is_file():
            missing.append(r)
            continue
        metrics = json.loads(Path(r.eval_metrics).read_text())
        log = _train_log(r)
        values = {("test", k): (v, "") for k, v in flatten_eval(metrics).items()}
        values.update({("train", k): (v, "") for k, v in train_summary(log).items()})
        cost = cost_summary(log)
        if cost is not None:
            values.update({("cost", k): vn for k, vn in cost_values(cost).items()})
        params = ";".join(f"{k}={v}" for k, v in sorted(r.params.items()))
        for (split, metric), (value, note) in values.items():
            rows.append(
                {
                    "dataset": r.dataset,
                    "domain": r.domain,
                    "experiment": r.experiment,
                    "group": r.group,
                    "run": r.run,
                    "params": params,
                    "split": split,
                    "metric": metric,
                    "value": value,
                    "note": note,
                }
            )
    return rows, missing


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:.4g}"


def best_metrics(metrics: dict[str, dict]) -> dict:
    """Of runs' metrics.json, the one with the highest macro AUC (the summary's ★)."""
    return max(metrics.values(), key=lambda m: _rank_value(m.get("auc_macro"), True))


def class_tables(runs: list[RunInfo]) -> dict[str, list[str]]:
    """Per jets dataset, the best run's per-class table: AUC and rejections against the
    background of at most SHOWN_CLASSES signal classes (the hardest, when there are more:
    JetClass-II's 187), every class being in metrics.csv."""
    out: dict[str, list[str]] = {}
    by_ds: dict[str, dict[str, dict]] = {}
    for r in runs:
        if r.domain == "jets" and r.role == "train" and Path(r.eval_metrics).is_file():
            by_ds.setdefault(r.dataset, {})[r.run] = json.loads(Path(r.eval_metrics).read_text())
    for ds, metrics in by_ds.items():
        run, best = max(metrics.items(), key=lambda kv: _rank_value(kv[1].get("auc_macro"), True))
        per = best.get("vs_" + str(best.get("background")))
        if not per:
            continue
        shown = shown_signals(best)
        which = (f"all {len(per)} signal classes" if len(shown) == len(per) else
                 f"the {len(shown)} of {len(per)} signal classes it separates worst; every "
                 "class is in metrics.csv")  # fmt: skip
        lines = [f"Per class, {run} against {best['background']} ({which}):", "",
                 "| class | AUC | rej50 | rej30 |", "|---|---|---|---|"]  # fmt: skip
        for c in shown:
            v = per[c]
            lines.append(f"| {c} | {_fmt(v.get('auc'))} | " + " | ".join(
                ("≥ " if v.get(f"{k}_lower_bound") else "") + _fmt(v.get(k))
                for k in ("rej50", "rej30")) + " |")  # fmt: skip
        out[ds] = [*lines, ""]
    return out


def data_notes(runs: list[RunInfo]) -> dict[str, list[str]]:
    """Per dataset, what its shards left out (files skipped with on_bad_file: skip, jets
    dropped with bad_labels: drop), from the first evaluated run's metrics.json."""
    notes: dict[str, list[str]] = {}
    for r in runs:
        if r.dataset in notes or not Path(r.eval_metrics).is_file():
            continue
        data = json.loads(Path(r.eval_metrics).read_text()).get("data") or {}
        lines = [f"Skipped file `{s['file']}`: {s['reason']}"
                 for s in data.get("skipped_files", [])]  # fmt: skip
        dropped = {k: v for k, v in (data.get("dropped_labels") or {}).items() if v}
        if dropped:
            why = {"several": "several classes set", "none": "no class set",
                   "out_of_range": "label out of range"}  # fmt: skip
            lines.append("Jets dropped for their labels (bad_labels: drop): " + ", ".join(
                f"{v} with {why.get(k, k)}" for k, v in sorted(dropped.items())))  # fmt: skip
        notes[r.dataset] = lines
    return notes


def summary_markdown(rows: list[dict[str, Any]], missing: list[RunInfo],
                     notes: dict[str, list[str]] | None = None,
                     studies: dict[tuple[str, str, str], dict[str, Any]] | None = None,
                     per_class: dict[str, list[str]] | None = None) -> str:  # fmt: skip
    """Per dataset, the runs ranked by the domain's headline metric (the best marked ★), what
    its data left out, the best run's per-class table (class_tables) and its experiments'
    scaling studies."""
    notes, studies = notes or {}, studies or {}
    out = ["# voxjet results", ""]
    datasets = sorted(
        {(r["dataset"], r["domain"]) for r in rows}
        | {(m.dataset, m.domain) for m in missing}
        | {(ds, domain) for domain, ds, _ in studies}
    )
    for ds, domain in datasets:
        head, higher = HEADLINE[domain]
        table: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["dataset"] == ds and r["split"] in ("test", "cost"):
                t = table.setdefault(
                    r["run"], {"experiment": r["experiment"], "params": r["params"]}
                )
                t[r["metric"]] = r["value"]
        cols = COLUMNS[domain] + _target_columns(table)
        diverged = {r["run"]: int(r["value"]) for r in rows
                    if r["dataset"] == ds and r["metric"] == "diverged_at_step"}  # fmt: skip
        # a diverged run is never ranked among the others: it comes last, marked
        ranked = sorted(
            table.items(),
            key=lambda kv: (kv[0] in diverged, -_rank_value(kv[1].get(head), higher)),
        )
        out += [
            f"## {ds} ({domain}) — ranked by {head}",
            "",
            "| rank | run | experiment | parameters | " + " | ".join(cols) + " |",
            "|---|---|---|---|" + "---|" * len(cols),
        ]
        for i, (run, t) in enumerate(ranked, 1):
            star = " ★" if i == 1 and run not in diverged else ""
            if run in diverged:
                star = f" ⚠ diverged at step {diverged[run]}"
            out.append(
                f"| {i} | {run}{star} | {t['experiment']} | {t['params'] or '–'} | "
                + " | ".join(
                    ("≥ " if t.get(f"{c}_is_lower_bound") == 1.0 else "") + _fmt(t.get(c))
                    for c in cols
                )  # fmt: skip
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
        unmeasured = sorted({r["note"] for r in rows if r["dataset"] == ds and
                             r["metric"] == "energy_kwh" and math.isnan(r["value"])})  # fmt: skip
        for why in unmeasured:
            out += [f"Energy {why}", ""]
        if notes.get(ds):
            out += ["Data left out of every run of this dataset:", "",
                    *(f"- {n}" for n in notes[ds]), ""]  # fmt: skip
        bounds: dict[str, list[str]] = {}
        for r in rows:
            if r["dataset"] == ds and r["split"] == "test" and r["value"] == 1.0 \
                    and r["metric"].endswith("_is_lower_bound"):  # fmt: skip
                bounds.setdefault(r["run"], []).append(r["metric"].removesuffix("_is_lower_bound"))
        if bounds:
            out += [
                "Rejections at their bound (no background jet passed the cut: the value is "
                "N_B, only a lower bound; it enters rej50_mean as such, and a mean marked ≥ is "
                "a lower bound too): "
                + "; ".join(
                    f"{run}: {', '.join(sorted(ms)[:BOUNDS_NAMED])}"
                    + (f" and {len(ms) - BOUNDS_NAMED} more" if len(ms) > BOUNDS_NAMED else "")
                    for run, ms in sorted(bounds.items())
                ),  # fmt: skip
                "",
            ]
        out += (per_class or {}).get(ds, [])
        out += repeats_markdown([r for r in rows if r["dataset"] == ds], cols)
        for (_, sds, exp), table in studies.items():
            if sds == ds:
                out += study_markdown(exp, table)
    return "\n".join(out)


def repeat_stats(rows: list[dict[str, Any]], metric: str) -> dict[str, dict[str, float]]:
    """Per group of repeats (runs differing only in seed) with a value of `metric`: n, mean,
    std (sample, n − 1), min and max over its runs' test values."""
    values: dict[str, list[float]] = {}
    for r in rows:
        if r["split"] in ("test", "cost") and r["metric"] == metric and not math.isnan(r["value"]):
            values.setdefault(r["group"], []).append(float(r["value"]))
    out = {}
    for g, v in values.items():
        n = len(v)
        mean = sum(v) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else float("nan")
        out[g] = {"n": n, "mean": mean, "std": std, "min": min(v), "max": max(v)}
    return out


def repeats_markdown(rows: list[dict[str, Any]], cols: list[str]) -> list[str]:
    """A table of the groups with several repeats: mean ± std (min–max) of each column."""
    stats = {c: repeat_stats(rows, c) for c in cols}
    groups = sorted(g for g, st in stats[cols[0]].items() if st["n"] > 1)
    if not groups:
        return []
    out = [
        "### Repeats (runs that differ only in seed): mean ± std (min–max)",
        "",
        "| group | n | " + " | ".join(cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for g in groups:
        cells = []
        for c in cols:
            st = stats[c].get(g)
            cells.append(
                "–"
                if st is None
                else f"{_fmt(st['mean'])} ± {_fmt(st['std'])} ({_fmt(st['min'])}–{_fmt(st['max'])})"
            )
        out.append(f"| {g} | {stats[cols[0]][g]['n']} | " + " | ".join(cells) + " |")
    return [*out, ""]


def _rank_value(v: float | None, higher: bool) -> float:
    if v is None or math.isnan(v):
        return float("-inf")
    return v if higher else -v


def _read_predictions(path: Path) -> tuple:
    """(probabilities, labels, class names) of an evaluation's predictions.h5."""
    import h5py
    import hdf5plugin  # noqa: F401  (registers the LZ4 filter evaluation writes with)

    try:
        with h5py.File(path) as f:
            return f["probs"][...], f["labels"][...], [str(c) for c in f.attrs["classes"]]
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        raise corrupt_error(path, "the test predictions", "evaluate_jets", e) from e


def _jets_figures(rs: list[RunInfo], metrics: dict[str, dict], fig_dir: Path, ds: str,
                  stem: str) -> list[str]:  # fmt: skip
    """A jets dataset's ROC curves (runs overlaid) and rejection at 50% signal efficiency."""
    names = []
    preds = {}
    for r in rs:
        p = Path(r.eval_metrics).parent / "predictions.h5"
        if p.is_file():
            preds[r.run] = _read_predictions(p)
    best = best_metrics(metrics)
    shown = shown_signals(best) if best.get("vs_" + best.get("background", "")) else None
    if preds:
        roc_overlay(fig_dir / f"{stem}-roc.png", f"{ds}: ROC curves (test)", preds, shown=shown)
        names.append(f"{stem}-roc.png")
    background = next(iter(metrics.values())).get("background", "QCD")
    per = {run: m.get(f"vs_{background}", {}) for run, m in metrics.items()}
    rej = {run: {c: v["rej50"] for c, v in p.items() if v.get("rej50") is not None
                 and (shown is None or c in shown)} for run, p in per.items()}  # fmt: skip
    bounds = {run: {c for c, v in p.items() if v.get("rej50_lower_bound")}
              for run, p in per.items()}  # fmt: skip
    if any(rej.values()):
        figures.grouped_bars(
            fig_dir / f"{stem}-rejection.png",
            f"{ds}: {background} rejection at 50% signal efficiency",
            rej,
            "1/ε_B at ε_S = 0.5",
            log=True,
            lower_bounds=bounds,
        )
        names.append(f"{stem}-rejection.png")
    return names


def _volumes_figures(metrics: dict[str, dict], fig_dir: Path, ds: str, stem: str) -> list[str]:
    """A volumes dataset's Dice per case as box plots, one group a class."""
    per_run = {}
    for run, m in metrics.items():
        per_class: dict[str, list[float]] = {}
        for case in m.get("per_case", {}).values():
            for c, v in case.items():
                # every case where the class is scored (a false positive's 0 included)
                if v.get("dice") is not None and math.isfinite(v["dice"]):
                    per_class.setdefault(c, []).append(v["dice"])
        per_run[run] = per_class
    if not any(per_run.values()):
        return []
    dice_boxes(fig_dir / f"{stem}-dice.png", f"{ds}: Dice per class (test cases)", per_run)
    return [f"{stem}-dice.png"]


def _dataset_figures(domain: str, ds: str, rs: list[RunInfo], fig_dir: Path) -> list[str]:
    """One dataset's figures: the domain's own, the spread over repeats, training curves."""
    metrics = {r.run: json.loads(Path(r.eval_metrics).read_text()) for r in rs}
    logs = {r.run: _train_log(r) for r in rs}
    stem = f"{domain}-{ds}"
    if domain == "jets":
        names = _jets_figures(rs, metrics, fig_dir, ds, stem)
        val_metric = "auc_macro"
    else:
        names = _volumes_figures(metrics, fig_dir, ds, stem)
        val_metric = "score"
    groups: dict[str, list[float]] = {}
    for r in rs:
        v = flatten_eval(metrics[r.run]).get(HEADLINE[domain][0])
        if v is not None and not math.isnan(v):
            groups.setdefault(r.group, []).append(v)
    if any(len(v) > 1 for v in groups.values()):
        figures.repeat_spread(
            fig_dir / f"{stem}-repeats.png",
            f"{ds}: {HEADLINE[domain][0]} over repeats (mean ± std, range)",
            groups,
            HEADLINE[domain][0],
        )
        names.append(f"{stem}-repeats.png")
    if any(logs.values()):
        figures.training_curves(
            fig_dir / f"{stem}-training.png",
            f"{ds}: training" + (" (validation: mean Dice)" if val_metric == "score" else ""),
            logs,
            val_metric,
        )
        names.append(f"{stem}-training.png")
    return names


def _pipeline_figures(done: list[RunInfo], fig_dir: Path, benchmarks: str | None) -> list[str]:
    """Throughput and data stall per run; time and memory per rule (Snakemake benchmarks)."""
    names = []
    rows = []
    for r in done:
        summary = train_summary(_train_log(r))
        rate = next((k for k in summary if k.startswith("train_") and k.endswith("_per_s")), None)
        if rate:
            unit = rate.removeprefix("train_").removesuffix("_per_s")
            rows.append((r.run, unit, summary[rate], summary["data_wait_fraction"]))
    if rows:
        figures.throughput(fig_dir / "pipeline-all-throughput.png", rows)
        names.append("pipeline-all-throughput.png")
    bench = figures.read_benchmarks(benchmarks) if benchmarks and Path(benchmarks).is_dir() else []
    if bench:
        figures.pipeline_cost(fig_dir / "pipeline-all-cost.png", bench)
        names.append("pipeline-all-cost.png")
    return names


def write_figures(runs: list[RunInfo], fig_dir: Path, benchmarks: str | None) -> list[str]:
    """Every summary figure into `fig_dir`, named <domain>-<dataset>-<kind>.png; returns names."""
    done = [r for r in runs if Path(r.eval_metrics).is_file()]
    names: list[str] = []
    by_ds: dict[tuple[str, str], list[RunInfo]] = {}
    for r in done:
        by_ds.setdefault((r.domain, r.dataset), []).append(r)
    for (domain, ds), rs in sorted(by_ds.items()):
        names += _dataset_figures(domain, ds, rs, fig_dir)
    return names + _pipeline_figures(done, fig_dir, benchmarks)


def aggregate(
    runs: list[RunInfo],
    out_dir: str | os.PathLike,
    benchmarks: str | None = None,
    plan: str | None = None,
    best: list[str] | None = None,
) -> dict[str, Any]:
    """Write metrics.csv, summary.md and figures/ into `out_dir` (each atomically); `best`:
    the volumes datasets' best-configuration choices (results/<dataset>/best/choice.json)."""
    out = Path(out_dir)
    rows, missing = collect(runs)
    studies = scaling_studies(runs)
    check = planner_check(runs, json.loads(Path(plan).read_text()), benchmarks) if plan and \
        Path(plan).is_file() else []  # fmt: skip
    with atomic_path(out / "figures", directory=True) as tmp:
        names = write_figures(runs, tmp, benchmarks)
        for (domain, ds, exp), table in studies.items():
            name = f"{domain}-{ds}-scaling-{exp}.png"
            scaling_figure(tmp / name, f"{ds}: scaling of {exp}", table)
            names.append(name)
        if check:
            figures.predicted_vs_measured(tmp / "pipeline-all-planner.png", check)
            names.append("pipeline-all-planner.png")
    with atomic_path(out / "metrics.csv") as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(rows)
    md = summary_markdown(rows, missing, data_notes(runs), studies, class_tables(runs))
    md += planner_check_markdown(check)
    if best:
        md += summary_rows({Path(b).parent.parent.name: json.loads(Path(b).read_text())
                            for b in best})  # fmt: skip
    if names:
        md += "\n## Figures\n\n" + "".join(f"![{n}](figures/{n})\n\n" for n in names)
    with atomic_path(out / "summary.md") as tmp:
        tmp.write_text(md)
    with atomic_path(out / "summary.html") as tmp:
        tmp.write_text(summary_html(md, out))
    return {"rows": len(rows), "missing": [m.run for m in missing], "figures": names}
