"""Targets beside the classes (`jets.targets`, or a weaver config's custom labels): regressions
(a jet's mass) and auxiliary classifications (a jet's flavour, from an integer expression):
their values from the files, the loss, and the field's measures — for a regression the response
(median of predicted / true) and the resolution (half the 16–84% interval of predicted / true),
overall and in bins of jet pT, against predicting the training median for every jet; for a
classification the accuracy and the AUC of each class.

A model's head has one output a class, then a block a target: one output a regression (learned
standardised by the training split's median and 16-84% spread, index.json), one logit a
class of a classification. `decode` turns a block into what anyone reads: the regression in its
units, the classification's probabilities."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from voxjet.errors import VoxjetError
from voxjet.jets.metrics import roc_auc
from voxjet.jets.robust import OUTLIER_SPREADS
from voxjet.plotting import pyplot, save_figure

LOSSES = ("mse", "huber", "logcosh")
KINDS = ("regression", "classification")
PT_BINS = 4  # jet-pT quantile bins of the resolution table and figure


@dataclass(frozen=True)
class Target:
    """One target: its expression over the file's branches, kind, loss and weight (and, for a
    classification, its classes: the expression gives each jet's class number)."""

    name: str
    expr: str
    loss: str = "mse"
    weight: float = 1.0
    kind: str = "regression"
    classes: tuple[str, ...] = ()

    @property
    def columns(self) -> list[str]:
        """Its outputs' names: the target, or target_<class> for each class."""
        return [f"{self.name}_{c}" for c in self.classes] if self.classes else [self.name]


def parse_targets(targets: Mapping[str, Any] | None, where: str = "jets.targets") -> list[Target]:
    """`jets.targets` ({name: {expr, loss, weight}} or {name: expr}) as Targets, in order."""
    out = []
    for name, spec in (targets or {}).items():
        spec = {"expr": spec} if isinstance(spec, str) else dict(spec or {})
        if not isinstance(spec.get("expr"), str) or not spec["expr"].strip():
            raise VoxjetError(f"config key '{where}.{name}.expr': give the target's expression "
                              "over the file's branches, e.g. fj_gen_mass")  # fmt: skip
        kind = spec.get("kind", "regression")
        if kind not in KINDS:
            raise VoxjetError(f"config key '{where}.{name}.kind': {kind!r}; one of {KINDS}")
        classes = tuple(str(c) for c in spec.get("classes") or ())
        if (kind == "classification") != (len(classes) >= 2):
            raise VoxjetError(f"config key '{where}.{name}.classes': a classification target "
                              "names its classes (at least two; the expression gives each jet's "
                              "class number), a regression none")  # fmt: skip
        loss = spec.get("loss", "mse" if kind == "regression" else "cross_entropy")
        allowed = LOSSES if kind == "regression" else ("cross_entropy",)
        if loss not in allowed:
            raise VoxjetError(f"config key '{where}.{name}.loss': {loss!r}; use one of {allowed}")
        weight = spec.get("weight", 1.0)
        if not isinstance(weight, (int, float)) or not weight > 0:
            raise VoxjetError(f"config key '{where}.{name}.weight': {weight!r}; a positive number")
        out.append(Target(str(name), spec["expr"], loss, float(weight), kind, classes))
    return out


def output_columns(targets: list[Target]) -> list[str]:
    """Every target output's name, in the head's order."""
    return [c for t in targets for c in t.columns]


def _blocks(targets: list[Target]) -> list[slice]:
    out, lo = [], 0
    for t in targets:
        out.append(slice(lo, lo + len(t.columns)))
        lo += len(t.columns)
    return out


def expression_names(targets: list[Target]) -> dict[str, str]:
    """The targets as named variables (the shard job evaluates them with new_variables)."""
    return {variable_name(t.name): t.expr for t in targets}


def variable_name(target: str) -> str:
    return f"__target_{target}__"


def check_values(values: np.ndarray, targets: list[Target], entries: np.ndarray) -> None:
    """Refuse a target that is NaN or ±inf for some jet, or a classification's value that is no
    class number, naming the target and the entries."""
    bad = ~np.isfinite(values)
    for i, t in enumerate(targets):
        v = values[:, i]
        wrong = bad[:, i] | ((v != np.round(v)) | (v < 0) | (v >= len(t.classes)) if t.classes
                             else np.zeros(len(v), bool))  # fmt: skip
        if t.classes and wrong.any() and not bad[:, i].any():
            where = entries[wrong]
            raise VoxjetError(
                f"classification target {t.name!r} is {v[wrong][:3].tolist()} for "
                f"{int(wrong.sum())} selected jets (entries {where[:5].tolist()}), not a class "
                f"number 0–{len(t.classes) - 1} of {list(t.classes)}; fix the expression or "
                "the classes"
            )
        name = t.name
        if bad[:, i].any():
            where = entries[bad[:, i]]
            raise VoxjetError(
                f"regression target {name!r} is NaN or ±inf for {int(bad[:, i].sum())} selected "
                f"jets (entries {where[:5].tolist()}{', …' if len(where) > 5 else ''}): a loss "
                "over them is undefined. Fix the expression (e.g. guard a division with "
                "maximum(x, 1)) or leave those jets out with jets.selection"
            )


def target_loss(out, true, targets: list[Target], mean: list[float], std: list[float]):
    """The weighted sum of each target's loss (mean over jets): a regression's on values
    standardised by the training split's centre `mean` and spread `std` (voxjet.jets.robust;
    values more than OUTLIER_SPREADS spreads out left out), a classification's cross entropy.
    `out`: the head's target block [B, W]; `true`: the targets in their units [B, T]."""
    import torch.nn.functional as F

    total = out.new_zeros(())
    for i, (t, block) in enumerate(zip(targets, _blocks(targets), strict=True)):
        if t.classes:
            total = total + t.weight * F.cross_entropy(out[:, block], true[:, i].long())
            continue
        p, y = out[:, block.start], (true[:, i] - mean[i]) / std[i]
        # a value far outside the target's percentiles (a 1e30 overflow: the index job names it)
        # teaches nothing and would swamp the batch: it is left out of the loss
        kept = y.abs() <= OUTLIER_SPREADS
        if not bool(kept.all()):
            p, y = p[kept], y[kept]
            if not len(y):
                continue
        if t.loss == "mse":
            loss = F.mse_loss(p, y)
        elif t.loss == "huber":
            loss = F.huber_loss(p, y)
        else:  # log cosh, written so that large errors do not overflow
            d = p - y
            loss = (d + F.softplus(-2 * d) - np.log(2.0)).mean()
        total = total + t.weight * loss
    return total


def decode(out, targets: list[Target], mean: list[float], std: list[float]):
    """The head's target block [N, W] (torch) as read: regressions in their units, each
    classification's probabilities."""
    import torch

    parts = []
    for i, (t, block) in enumerate(zip(targets, _blocks(targets), strict=True)):
        x = out[:, block]
        parts.append(torch.softmax(x, dim=1) if t.classes else x * std[i] + mean[i])
    return torch.cat(parts, 1) if parts else out[:, :0]


def decode_numpy(out: np.ndarray, targets: list[Target], mean: list[float],
                 std: list[float]) -> np.ndarray:  # fmt: skip
    """`decode` for a numpy array."""
    import torch

    return decode(torch.from_numpy(out), targets, mean, std).numpy()


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


def target_metrics(pred: np.ndarray, true: np.ndarray, targets: list[Target],
                   train_median: list[float], jet_pt: np.ndarray | None) -> dict:  # fmt: skip
    """{"regression": regression_metrics of the regressions, "classification": per
    classification target its accuracy and each class's one-vs-rest AUC}."""
    out: dict = {}
    blocks = _blocks(targets)
    reg = [i for i, t in enumerate(targets) if not t.classes]
    if reg:
        cols = [blocks[i].start for i in reg]
        out["regression"] = regression_metrics(pred[:, cols], true[:, reg],
                                               [targets[i].name for i in reg],
                                               [train_median[i] for i in reg], jet_pt)  # fmt: skip
    for i, t in enumerate(targets):
        if t.classes:
            probs, y = pred[:, blocks[i]], true[:, i].astype(np.int64)
            aucs = {c: roc_auc(probs[:, k], y == k) for k, c in enumerate(t.classes)}
            macro = float(np.nanmean(list(aucs.values())))
            out.setdefault("classification", {})[t.name] = {
                "accuracy": float((probs.argmax(1) == y).mean()), "auc": aucs,
                "auc_macro": macro, "n_jets": int(len(y))}  # fmt: skip
    return out


def regression_columns(targets: list[Target]) -> list[int]:
    """The output columns of the regression targets."""
    return [b.start for t, b in zip(targets, _blocks(targets), strict=True) if not t.classes]


def regression_figure(path, pred: np.ndarray, true: np.ndarray, names: list[str],
                      metrics: dict) -> None:  # fmt: skip
    """One row a target: pred/true's distribution (with the training median's beside it),
    and response and resolution in jet-pT bins."""
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
