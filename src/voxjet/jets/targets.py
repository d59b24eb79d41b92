"""Regression targets beside the classes (`jets.targets`, or a weaver config's custom labels):
their values from the files, the loss, and the field's measures of a regression — the response
(median of predicted / true) and the resolution (half the 16–84% interval of predicted / true),
overall and in bins of jet pT, against predicting the training median for every jet.

A model's head has one output a class, then one a target; the targets are learned
standardised by the training split's mean and standard deviation (index.json), and every
prediction is turned back into the target's units before anyone reads it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from voxjet.errors import VoxjetError

LOSSES = ("mse", "huber", "logcosh")
PT_BINS = 4  # jet-pT quantile bins of the resolution table and figure


@dataclass(frozen=True)
class Target:
    """One regression target: its expression over the file's branches, loss and weight."""

    name: str
    expr: str
    loss: str = "mse"
    weight: float = 1.0


def parse_targets(targets: Mapping[str, Any] | None, where: str = "jets.targets") -> list[Target]:
    """`jets.targets` ({name: {expr, loss, weight}} or {name: expr}) as Targets, in order."""
    out = []
    for name, spec in (targets or {}).items():
        spec = {"expr": spec} if isinstance(spec, str) else dict(spec or {})
        if not isinstance(spec.get("expr"), str) or not spec["expr"].strip():
            raise VoxjetError(f"config key '{where}.{name}.expr': give the target's expression "
                              "over the file's branches, e.g. fj_gen_mass")  # fmt: skip
        if spec.get("kind", "regression") != "regression":
            raise VoxjetError(f"config key '{where}.{name}.kind': {spec['kind']!r}; targets are "
                              "regressions (the classes come from jets.labels)")  # fmt: skip
        loss = spec.get("loss", "mse")
        if loss not in LOSSES:
            raise VoxjetError(f"config key '{where}.{name}.loss': {loss!r}; use one of {LOSSES}")
        weight = spec.get("weight", 1.0)
        if not isinstance(weight, (int, float)) or not weight > 0:
            raise VoxjetError(f"config key '{where}.{name}.weight': {weight!r}; a positive number")
        out.append(Target(str(name), spec["expr"], loss, float(weight)))
    return out


def expression_names(targets: list[Target]) -> dict[str, str]:
    """The targets as named variables (the shard job evaluates them with new_variables)."""
    return {variable_name(t.name): t.expr for t in targets}


def variable_name(target: str) -> str:
    return f"__target_{target}__"


def check_values(values: np.ndarray, names: list[str], entries: np.ndarray) -> None:
    """Refuse a target that is NaN or ±inf for some jet, naming the target and the entries."""
    bad = ~np.isfinite(values)
    for i, name in enumerate(names):
        if bad[:, i].any():
            where = entries[bad[:, i]]
            raise VoxjetError(
                f"regression target {name!r} is NaN or ±inf for {int(bad[:, i].sum())} selected "
                f"jets (entries {where[:5].tolist()}{', …' if len(where) > 5 else ''}): a loss "
                "over them is undefined. Fix the expression (e.g. guard a division with "
                "maximum(x, 1)) or leave those jets out with jets.selection"
            )


def regression_loss(pred, true, targets: list[Target]):
    """The weighted sum of each target's loss (mean over jets) on standardised values."""
    import torch.nn.functional as F

    total = pred.new_zeros(())
    for i, t in enumerate(targets):
        p, y = pred[:, i], true[:, i]
        if t.loss == "mse":
            loss = F.mse_loss(p, y)
        elif t.loss == "huber":
            loss = F.huber_loss(p, y)
        else:  # log cosh, written so that large errors do not overflow
            d = p - y
            loss = (d + F.softplus(-2 * d) - np.log(2.0)).mean()
        total = total + t.weight * loss
    return total


def to_units(pred: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    """Standardised predictions [N, T] back in the targets' units."""
    return pred * np.asarray(std, pred.dtype) + np.asarray(mean, pred.dtype)


def response_resolution(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """Median of pred/true (response) and half its 16–84% interval (resolution), on jets with a
    true value away from zero (a ratio to zero says nothing)."""
    ok = np.abs(true) > 1e-12
    if not ok.any():
        return {"response": float("nan"), "resolution": float("nan"), "n_jets": 0}
    r = pred[ok] / true[ok]
    q16, q50, q84 = np.percentile(r, [16, 50, 84])
    return {"response": float(q50), "resolution": float((q84 - q16) / 2), "n_jets": int(ok.sum())}


def regression_metrics(pred: np.ndarray, true: np.ndarray, names: list[str],
                       train_median: list[float], jet_pt: np.ndarray | None) -> dict:  # fmt: skip
    """Per target: response and resolution overall and in jet-pT quantile bins, the same for
    the training median predicted for every jet (what a model must beat), and the RMSE."""
    out = {}
    edges = None
    if jet_pt is not None and len(jet_pt):
        edges = np.unique(np.quantile(jet_pt, np.linspace(0, 1, PT_BINS + 1)))
    for i, name in enumerate(names):
        p, y = pred[:, i].astype(np.float64), true[:, i].astype(np.float64)
        const = np.full_like(y, train_median[i])
        entry = {**response_resolution(p, y), "rmse": float(np.sqrt(np.mean((p - y) ** 2))),
                 "median_baseline": response_resolution(const, y)}  # fmt: skip
        if edges is not None:
            bins = []
            for lo, hi in zip(edges[:-1], edges[1:], strict=True):
                inside = (jet_pt >= lo) & (jet_pt <= hi)
                base = response_resolution(const[inside], y[inside])["resolution"]
                bins.append({"pt_min": float(lo), "pt_max": float(hi),
                             **response_resolution(p[inside], y[inside]),
                             "median_baseline_resolution": base})  # fmt: skip
            entry["pt_bins"] = bins
        out[name] = entry
    return out


def regression_figure(path, pred: np.ndarray, true: np.ndarray, names: list[str],
                      metrics: dict) -> None:  # fmt: skip
    """One row a target: pred/true's distribution (with the training median's beside it),
    and response and resolution in jet-pT bins."""
    from voxjet.report.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 4.2 * len(names)), squeeze=False)
    for i, name in enumerate(names):
        m = metrics[name]
        y = true[:, i].astype(np.float64)
        ok = np.abs(y) > 1e-12
        r = pred[ok, i] / y[ok]
        lo, hi = np.percentile(r, [1, 99]) if ok.any() else (0.0, 2.0)
        ax = axes[i, 0]
        ax.hist(r, bins=np.linspace(min(lo, 0.5), max(hi, 1.5), 61), histtype="step",
                label=f"model: resolution {m['resolution']:.3f}")  # fmt: skip
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.set_xlabel(f"{name}: predicted / true")
        ax.set_ylabel("jets")
        ax.set_title(f"response {m['response']:.3f}; training median: resolution "
                     f"{m['median_baseline']['resolution']:.3f}", fontsize=10)  # fmt: skip
        ax.legend(fontsize=9)
        ax = axes[i, 1]
        bins = m.get("pt_bins") or []
        if bins:
            mid = [(b["pt_min"] + b["pt_max"]) / 2 for b in bins]
            ax.plot(mid, [b["resolution"] for b in bins], "o-", label="resolution (model)")
            ax.plot(mid, [b["median_baseline_resolution"] for b in bins], "s--",
                    label="resolution (training median)")  # fmt: skip
            ax.plot(mid, [b["response"] for b in bins], "^-", label="response (model)")
            ax.set_xlabel("jet pT [GeV] (quantile bins)")
            ax.legend(fontsize=9)
        else:
            ax.text(0.5, 0.5, "no jet_pt among the jet features:\nno pT bins", ha="center",
                    va="center", transform=ax.transAxes)  # fmt: skip
        ax.set_ylabel(name)
    save_figure(fig, path)
