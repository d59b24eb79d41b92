"""Jet-tagging metrics as pure functions of scores and labels: ROC, AUC, background rejection
1/eps_B at fixed signal efficiency (the ParT paper's table columns), accuracy."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def roc_auc(scores: np.ndarray, is_signal: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with ties counted half)."""
    is_signal = np.asarray(is_signal, bool)
    n_s, n_b = int(is_signal.sum()), int((~is_signal).sum())
    if n_s == 0 or n_b == 0:
        return float("nan")
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
    (N_B, a lower bound, when no background passes)."""
    is_signal = np.asarray(is_signal, bool)
    sig = np.sort(np.asarray(scores)[is_signal])
    if len(sig) == 0:
        return float("nan")
    cut = sig[int(np.floor((1 - signal_eff) * (len(sig) - 1)))]
    bkg = np.asarray(scores)[~is_signal]
    if len(bkg) == 0:
        return float("nan")
    # No background passing means eps_B < 1/N_B: report that bound rather than infinity.
    return len(bkg) / max(1, int((bkg >= cut).sum()))


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
    probs: np.ndarray, labels: np.ndarray, classes: list[str], background: str = "QCD"
) -> dict:
    """Accuracy, macro one-vs-rest AUC, and per signal class vs background: AUC and 1/eps_B."""
    labels = np.asarray(labels)
    out: dict = {"accuracy": float((probs.argmax(1) == labels).mean()), "n_jets": int(len(labels))}
    aucs = [roc_auc(probs[:, i], labels == i) for i in range(len(classes))]
    out["auc_macro"] = float(np.nanmean(aucs))
    out["auc_ovr"] = dict(zip(classes, aucs, strict=True))
    if background in classes:
        b = classes.index(background)
        per = {}
        for i, c in enumerate(classes):
            if i == b:
                continue
            score, sig = signal_vs_background(probs, labels, i, b)
            per[c] = {
                "auc": roc_auc(score, sig),
                "rej50": rejection_at(score, sig, 0.5),
                "rej30": rejection_at(score, sig, 0.3),
            }
        out["vs_" + background] = per
        rej = [v["rej50"] for v in per.values() if np.isfinite(v["rej50"])]
        out["rej50_mean"] = float(np.mean(rej)) if rej else float("nan")
    return out
