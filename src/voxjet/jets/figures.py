"""Jet-tagging figures: ROC curves (rejection against signal efficiency, runs overlaid), the
confusion matrix, and in the field's style (mplhep) the discriminant's distribution for signal
and background, the ROC curve in bins of jet pT, and the soft-drop mass of the background jets
a tagger keeps at fixed signal efficiency against all of them (mass sculpting)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from voxjet.jets.metrics import roc_curve, signal_vs_background
from voxjet.plotting import pyplot, save_figure


def roc_overlay(
    path: Path,
    title: str,
    runs: Mapping[str, tuple[np.ndarray, np.ndarray, list[str]]],
    background: str | None = None,
    shown: list[str] | None = None,
) -> None:
    """One panel a signal class (of `shown`, default all): rejection of the background class
    (default the first) 1/eps_B against signal efficiency, runs overlaid."""
    plt = pyplot()
    classes = next(iter(runs.values()))[2]
    background = background or classes[0]
    signals = _signals(classes, background, shown)
    fig, axes = plt.subplots(1, len(signals), figsize=(4.2 * len(signals), 3.8), squeeze=False)
    for ax, sig in zip(axes[0], signals, strict=True):
        for run, (probs, labels, cls) in runs.items():
            score, is_signal = signal_vs_background(
                probs, labels, cls.index(sig), cls.index(background)
            )
            eff_s, eff_b = roc_curve(score, is_signal)
            ok = eff_b > 0
            ax.plot(eff_s[ok], 1 / eff_b[ok], label=run)
        ax.set_yscale("log")
        ax.set_xlim(0, 1)
        ax.set_xlabel(f"{sig} efficiency ε_S")
        ax.set_ylabel(f"{background} rejection 1/ε_B")
        ax.set_title(f"{sig} vs {background}")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title + _of_all(signals, classes))
    save_figure(fig, path)


def confusion(path: Path, probs: np.ndarray, labels: np.ndarray, classes: list[str]) -> None:
    """The confusion matrix, each true class's row normalised; its cells written out up to
    ANNOTATED classes, a heat map beyond (JetClass-II's 188: the diagonal's strength at a
    glance, every number in metrics.json)."""
    plt = pyplot()
    n = len(classes)
    cm = np.zeros((n, n))
    np.add.at(cm, (labels, probs.argmax(1)), 1)
    cm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    side = min(n, ANNOTATED)
    fig, ax = plt.subplots(figsize=(1.1 * side + 2, 1.0 * side + 1.5))
    im = ax.imshow(cm, cmap="Blues", vmin=0, vmax=1)
    if n <= ANNOTATED:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{cm[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if cm[i, j] > 0.5 else "black")  # fmt: skip
        ax.set_xticks(range(n), classes)
        ax.set_yticks(range(n), classes)
    else:  # every tenth class named: 188 names would overprint each other
        ticks = list(range(0, n, 10))
        ax.set_xticks(ticks, [classes[i] for i in ticks], rotation=90, fontsize=7)
        ax.set_yticks(ticks, [classes[i] for i in ticks], fontsize=7)
        ax.set_title(f"{n} classes (every tenth named)")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    fig.colorbar(im, ax=ax, label="fraction of the true class")
    save_figure(fig, path)


ANNOTATED = 12  # classes whose confusion cells are written out


def _of_all(signals: list[str], classes: list[str]) -> str:
    """A title's note when the panels show some of the signal classes."""
    n = len(classes) - 1
    if len(signals) >= n:
        return ""
    return f" ({len(signals)} of {n} signal classes: the hardest by AUC; all in metrics.json)"


@contextmanager
def _style():
    """(pyplot, mplhep) inside mplhep's ROOT-like style, for this figure only."""
    import mplhep

    plt = pyplot()
    with plt.style.context(mplhep.style.ROOT):
        yield plt, mplhep


def _signals(classes: list[str], background: str, shown: list[str] | None = None) -> list[str]:
    """The panels' signal classes: `shown` (voxjet.jets.metrics.shown_signals), else all."""
    return list(shown) if shown is not None else [c for c in classes if c != background]


def score_distributions(path: Path, probs: np.ndarray, labels: np.ndarray, classes: list[str],
                        background: str, shown: list[str] | None = None) -> None:  # fmt: skip
    """One panel a signal class (of `shown`): its discriminant s / (s + b) for signal and
    background jets, each normalised to unit area, log scale."""
    with _style() as (plt, hep):
        _score_distributions(plt, hep, path, probs, labels, classes, background, shown)


def _score_distributions(plt, hep, path, probs, labels, classes, background, shown) -> None:
    sigs = _signals(classes, background, shown)
    fig, axes = plt.subplots(1, len(sigs), figsize=(5.5 * len(sigs), 5), squeeze=False)
    edges = np.linspace(0, 1, 41)
    for ax, sig in zip(axes[0], sigs, strict=True):
        score, is_sig = signal_vs_background(probs, labels, classes.index(sig),
                                             classes.index(background))  # fmt: skip
        for mask, name in ((is_sig, sig), (~is_sig, background)):
            if mask.any():
                h, _ = np.histogram(score[mask], edges, density=True)
                hep.histplot(h, edges, ax=ax, label=f"{name} ({int(mask.sum())} jets)")
        ax.set_yscale("log")
        ax.set_xlabel(f"{sig} vs {background} discriminant")
        ax.set_ylabel("a.u.")
        ax.legend(fontsize=11)
    save_figure(fig, path)


def roc_in_pt_bins(path: Path, probs: np.ndarray, labels: np.ndarray, classes: list[str],
                   background: str, jet_pt: np.ndarray, bins: int = 4,
                   shown: list[str] | None = None) -> None:  # fmt: skip
    """One panel a signal class (of `shown`): rejection against efficiency in `bins` jet-pT
    quantile bins (equal jet counts), where each bin has signal and background jets."""
    with _style() as (plt, _):
        _roc_in_pt_bins(plt, path, probs, labels, classes, background, jet_pt, bins, shown)


def _roc_in_pt_bins(plt, path, probs, labels, classes, background, jet_pt, bins, shown) -> None:
    sigs = _signals(classes, background, shown)
    edges = np.unique(np.quantile(jet_pt, np.linspace(0, 1, bins + 1)))
    fig, axes = plt.subplots(1, len(sigs), figsize=(5.5 * len(sigs), 5), squeeze=False)
    for ax, sig in zip(axes[0], sigs, strict=True):
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            inside = (jet_pt >= lo) & (jet_pt <= hi)
            s, b = classes.index(sig), classes.index(background)
            score, is_sig = signal_vs_background(probs[inside], labels[inside], s, b)
            if is_sig.all() or not is_sig.any():
                continue
            eff_s, eff_b = roc_curve(score, is_sig)
            ok = eff_b > 0
            ax.plot(eff_s[ok], 1 / eff_b[ok], label=f"{lo:.0f} ≤ pT ≤ {hi:.0f} GeV")
        ax.set_yscale("log")
        ax.set_xlim(0, 1)
        ax.set_xlabel(f"{sig} efficiency ε_S")
        ax.set_ylabel(f"{background} rejection 1/ε_B")
        ax.legend(fontsize=11)
    save_figure(fig, path)


def mass_sculpting(path: Path, probs: np.ndarray, labels: np.ndarray, classes: list[str],
                   background: str, mass: np.ndarray, signal_eff: float = 0.5,
                   shown: list[str] | None = None) -> None:  # fmt: skip
    """One panel a signal class (of `shown`): the soft-drop mass of all background jets and of
    those that pass the cut keeping `signal_eff` of the signal, both normalised: a tagger that
    sculpts the background into the signal's mass peak shows it here."""
    with _style() as (plt, hep):
        _mass_sculpting(plt, hep, path, probs, labels, classes, background, mass, signal_eff, shown)


def _mass_sculpting(plt, hep, path, probs, labels, classes, background, mass, signal_eff, shown):
    sigs = _signals(classes, background, shown)
    b = classes.index(background)
    fig, axes = plt.subplots(1, len(sigs), figsize=(5.5 * len(sigs), 5), squeeze=False)
    edges = np.linspace(0, max(1.0, float(np.quantile(mass, 0.99))), 31)
    for ax, sig in zip(axes[0], sigs, strict=True):
        s = classes.index(sig)
        sel = (labels == s) | (labels == b)
        score, is_sig = signal_vs_background(probs, labels, s, b)
        m = mass[sel]
        if not is_sig.any() or is_sig.all():
            continue
        cut = np.quantile(score[is_sig], 1 - signal_eff)
        passing = f"{background}, passing (ε_S = {signal_eff:g})"
        for mask, name in (
            (~is_sig, f"{background}, all"),
            (~is_sig & (score >= cut), passing),
            (is_sig, f"{sig}, all"),
        ):
            if mask.any():
                h, _ = np.histogram(m[mask], edges, density=True)
                hep.histplot(h, edges, ax=ax, label=f"{name}: {int(mask.sum())}")
        ax.set_xlabel("soft-drop mass [GeV]")
        ax.set_ylabel("a.u.")
        ax.legend(fontsize=10)
    save_figure(fig, path)
