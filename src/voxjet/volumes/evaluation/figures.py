"""Segmentation figures: slices of a few test cases with their label and prediction overlaid,
and Dice per case as box plots (one group a class, one box a run)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from voxjet.plotting import pyplot, save_figure


def overlays(path: Path, rows: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """Image, label and prediction of each case at its slice with the most foreground."""
    plt = pyplot()

    fig, axes = plt.subplots(len(rows), 3, figsize=(8, 2.7 * len(rows)), squeeze=False)
    for r, (cid, image, label, pred) in enumerate(rows):
        z = int(np.argmax((label > 0).sum((0, 1)))) if label.any() else image.shape[-1] // 2
        for c, (title, over) in enumerate(
            (("image", None), ("label", label), ("prediction", pred))
        ):
            ax = axes[r, c]
            ax.imshow(image[0, :, :, z].T, cmap="gray", origin="lower")
            if over is not None:
                ax.imshow(
                    np.ma.masked_equal(over[:, :, z].T, 0),
                    cmap="autumn",
                    alpha=0.5,
                    origin="lower",
                    vmin=0,
                    vmax=max(2, int(over.max())),
                )
            ax.set_title(f"{cid}: {title} (z={z})", fontsize=8)
            ax.axis("off")
    save_figure(fig, path, dpi=100)


def dice_boxes(
    path: Path, title: str, per_run: Mapping[str, Mapping[str, Sequence[float]]]
) -> None:
    """Dice per case as box plots: one group a class, one box a run."""
    plt = pyplot()
    runs = list(per_run)
    classes = sorted({c for v in per_run.values() for c in v})
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(classes) * len(runs)), 3.8))
    width = 0.8 / max(1, len(runs))
    for k, run in enumerate(runs):
        data = [list(per_run[run].get(c, [])) or [np.nan] for c in classes]
        pos = np.arange(len(classes)) + k * width - 0.4 + width / 2
        bp = ax.boxplot(data, positions=pos, widths=width * 0.9, patch_artist=True, showmeans=True)
        colour = plt.rcParams["axes.prop_cycle"].by_key()["color"][k % 10]
        for box in bp["boxes"]:
            box.set_facecolor(colour)
            box.set_alpha(0.6)
        ax.plot([], [], color=colour, lw=6, alpha=0.6, label=run)
    ax.set_xticks(np.arange(len(classes)), classes)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("Dice per case")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)
