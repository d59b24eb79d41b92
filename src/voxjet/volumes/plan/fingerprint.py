"""The dataset fingerprint (nnU-Net's): each training case's spacing and cropped shape, and
each channel's foreground intensity statistics, from a sample of foreground voxels; cases that
fail their checks stop the run, or are set aside with their reason (`on_bad_case: skip`)."""

from __future__ import annotations

import sys

import numpy as np

from voxjet.errors import VoxjetError
from voxjet.progress import progress
from voxjet.volumes.dataset.cases import LoadedCase, crop_box, load_case
from voxjet.volumes.dataset.msd import MSDDataset
from voxjet.volumes.dataset.settings import VolumePrepConfig


def _foreground_sample(lc: LoadedCase, n: int, rng: np.random.Generator,
                       ignore: int | None = None) -> np.ndarray:  # fmt: skip
    """[C, k] intensities of up to n foreground voxels (annotated ones: the ignore label's
    voxels are not foreground), every channel at the same voxels."""
    fg = lc.label > 0
    if ignore is not None:
        fg &= lc.label != ignore
    idx = np.flatnonzero(fg)
    if len(idx) > n:
        idx = rng.choice(idx, size=n, replace=False)
    coords = np.unravel_index(idx, lc.label.shape)
    return np.stack([np.asarray(ch)[coords] for ch in lc.image])


def inspect_cases(
    ds: MSDDataset, case_ids: list[str], cfg: VolumePrepConfig
) -> tuple[dict[str, dict], dict[str, str]]:
    """Load and check each case once: spacing, cropped shape and a foreground intensity sample
    of the good ones; the bad ones fail the run, or are returned with their reason when
    on_bad_case is 'skip'."""
    rng = np.random.default_rng(cfg.seed)
    by_id = {c.case_id: c for c in ds.cases}
    stats, skipped = {}, {}
    for cid in progress(case_ids, "fingerprint", "case"):
        try:
            lc = load_case(ds, by_id[cid])
        except VoxjetError as e:
            if cfg.on_bad_case != "skip":
                raise
            skipped[cid] = str(e)
            print(f"skipping case {cid}: {e}", file=sys.stderr)
            continue
        box = crop_box(lc.image)
        stats[cid] = {
            "labels": list(lc.label_values),
            "spacing": lc.spacing.tolist(),
            "shape": [b - a for a, b in box],
            "fg": _foreground_sample(lc, cfg.foreground_samples, rng, ds.ignore),
        }
    return stats, skipped


def check_labels_seen(stats: dict[str, dict], ds: MSDDataset) -> None:
    """Every declared label value is in some labelled case (nnU-Net's integrity check): a class
    no case has cannot be learned, and its Dice would be NaN in every evaluation."""
    seen = {v for s in stats.values() for v in s.get("labels", [])}
    never = sorted(set(ds.labels) - seen)
    if never:
        names = {v: ds.labels[v] for v in never}
        raise VoxjetError(
            f"{ds.root / 'dataset.json'}: label(s) {names} are declared but in none of the "
            f"{len(stats)} labelled cases; remove them from dataset.json (renumbering the rest: "
            "`voxjet relabel`), or add cases that have them"
        )


def fingerprint_from(stats: dict[str, dict], ds: MSDDataset) -> dict:
    """Spacings, shapes and per-channel foreground intensity statistics of the inspected
    cases."""
    spacings = [s["spacing"] for s in stats.values()]
    shapes = [s["shape"] for s in stats.values()]
    fg = np.concatenate([s["fg"] for s in stats.values()], axis=1)
    per_channel = [
        {
            "mean": float(c.mean()),
            "std": float(c.std()),
            "percentile_00_5": float(np.percentile(c, 0.5)),
            "percentile_99_5": float(np.percentile(c, 99.5)),
        }
        for c in fg
    ]
    return {
        "cases": len(stats),
        "case_ids": list(stats),  # the order of spacings and shapes
        "channels": ds.channels,
        "labels": ds.labels,
        **({"ignore_label": ds.ignore} if ds.ignore is not None else {}),
        "regions": ds.regions,
        "spacings": spacings,
        "shapes": shapes,
        "median_spacing": np.median(spacings, 0).tolist(),
        "foreground_intensity_per_channel": per_channel,
        # the first channel's, where older code looks
        "foreground_intensity": per_channel[0],
    }
