"""Jet-tagging metrics as pure functions of scores and labels: ROC, AUC, background rejection
1/eps_B at fixed signal efficiency (the ParT paper's table columns), accuracy."""

from __future__ import annotations

import numpy as np

from voxjet.errors import VoxjetError


def roc_auc(scores: np.ndarray, is_signal: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with ties counted half)."""
    is_signal = np.asarray(is_signal, bool)
    n_s, n_b = int(is_signal.sum()), int((~is_signal).sum())
    if n_s == 0 or n_b == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    return float((ranks[is_signal].sum() - n_s * (n_s + 1) / 2) / (n_s * n_b))


def roc_curve(scores: np.ndarray, is_signal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(signal efficiency, background efficiency) at every threshold, from strict to loose."""
    is_signal = np.asarray(is_signal, bool)
    order = np.argsort(-np.asarray(scores), kind="stable")
    s = np.cumsum(is_signal[order]) / max(1, is_signal.sum())
    b = np.cumsum(~is_signal[order]) / max(1, (~is_signal).sum())
    return np.concatenate([[0.0], s]), np.concatenate([[0.0], b])


def rejection_at(scores: np.ndarray, is_signal: np.ndarray, signal_eff: float) -> float:
    """Background rejection 1/eps_B at the threshold keeping `signal_eff` of the signal
    (N_B, only a lower bound, when no background passes: see rejection_with_bound)."""
    return rejection_with_bound(scores, is_signal, signal_eff)[0]


def rejection_with_bound(
    scores: np.ndarray, is_signal: np.ndarray, signal_eff: float
) -> tuple[float, bool]:
    """(1/eps_B, whether it is only a lower bound) as puma computes it (atlas-ftag-tools'
    `calculate_rejection`, puma's `calc_rej`): the cut at the (1 − eps_S) percentile of the
    signal scores (linear interpolation, numpy's default), eps_B the fraction of background
    scores at or above it. With no background jet passing, eps_B < 1/N_B, so N_B bounds the
    rejection from below (puma gives inf) and is no measurement of it."""
    is_signal = np.asarray(is_signal, bool)
    scores = np.asarray(scores, np.float64)
    sig, bkg = scores[is_signal], scores[~is_signal]
    if len(sig) == 0 or len(bkg) == 0:
        return float("nan"), False
    cut = np.percentile(sig, 100.0 * (1.0 - signal_eff))
    passed = int((bkg >= cut).sum())
    return len(bkg) / max(1, passed), passed == 0


def signal_vs_background(
    probs: np.ndarray, labels: np.ndarray, signal: int, background: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(score, is_signal) for one signal class: p_s / (p_s + p_b) on jets of the two classes
    (the ParT paper's discriminant), or p_s on all jets when there is no background class."""
    labels = np.asarray(labels)
    if background is None:
        return probs[:, signal], labels == signal
    sel = (labels == signal) | (labels == background)
    ps, pb = probs[sel, signal], probs[sel, background]
    return ps / np.maximum(ps + pb, 1e-12), labels[sel] == signal


def jet_metrics(
    probs: np.ndarray, labels: np.ndarray, classes: list[str], background: str | None = None
) -> dict:
    """Accuracy, macro one-vs-rest AUC, and per signal class vs the background class (default
    the first): AUC and 1/eps_B at 50% and 30% signal efficiency, each with a flag when it is
    only a lower bound; `rej50_mean` / `rej30_mean` average every class, bounds included (the
    mean is then flagged a lower bound)."""
    labels = np.asarray(labels)
    background = background or classes[0]
    if background not in classes:
        raise VoxjetError(f"jets.background: {background!r} is none of the classes {classes}")
    out: dict = {"accuracy": float((probs.argmax(1) == labels).mean()), "n_jets": int(len(labels))}
    aucs = [roc_auc(probs[:, i], labels == i) for i in range(len(classes))]
    out["auc_macro"] = float(np.nanmean(aucs)) if np.isfinite(aucs).any() else float("nan")
    out["auc_ovr"] = dict(zip(classes, aucs, strict=True))
    b = classes.index(background)
    per = {}
    for i, c in enumerate(classes):
        if i == b:
            continue
        score, sig = signal_vs_background(probs, labels, i, b)
        entry = {"auc": roc_auc(score, sig)}
        for eff, key in ((0.5, "rej50"), (0.3, "rej30")):
            value, bound = rejection_with_bound(score, sig, eff)
            entry[key] = value
            entry[f"{key}_lower_bound"] = bound
        per[c] = entry
    out["background"] = background
    out["vs_" + background] = per
    for key in ("rej50", "rej30"):
        values = [v[key] for v in per.values() if np.isfinite(v[key])]
        # every class counts: a bound (N_B, no background passed) enters the mean as the
        # least its rejection can be, which makes the mean a lower bound too, and says so
        out[f"{key}_mean"] = float(np.mean(values)) if values else float("nan")
        out[f"{key}_mean_lower_bound"] = any(v[f"{key}_lower_bound"] for v in per.values())
        out[f"{key}_lower_bounds"] = sorted(c for c, v in per.items() if v[f"{key}_lower_bound"])
    return out


# signal classes a figure's panels or the summary's per-class table show (JetClass-II has 187):
# beyond it, the hardest by AUC against the background; every class stays in metrics.json/.csv
SHOWN_CLASSES = 8


def shown_signals(metrics: dict, k: int = SHOWN_CLASSES) -> list[str]:
    """The signal classes to show, in class order: all when there are at most `k`, else the
    `k` with the lowest AUC against the background (the hardest to tell from it)."""
    per = metrics["vs_" + metrics["background"]]
    if len(per) <= k:
        return list(per)

    # a class without an AUC (no test jet; null in metrics.json) first: it most needs a look
    def auc(c: str) -> float:
        v = per[c].get("auc")
        return float(v) if v is not None and np.isfinite(v) else -1.0

    chosen = set(sorted(per, key=auc)[:k])
    return [c for c in per if c in chosen]
