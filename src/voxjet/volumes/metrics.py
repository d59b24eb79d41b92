"""Segmentation metrics, the one place they are computed: each foreground class (or region)
as a mask of a label map, Dice and HD95 (in mm of the given voxel sizes) per case, and the
means over cases and classes that validation, evaluation and find-best report."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from monai.metrics import compute_dice, compute_hausdorff_distance

from voxjet.volumes.plan.plan_file import LabelSet


def targets(label: np.ndarray, classes: LabelSet) -> dict[str, np.ndarray]:
    """{class or region name: its mask} of a label map, the foreground ones."""
    if classes.regions:
        return {name: np.isin(label, values) for name, values in classes.regions.items()}
    names = {int(k): v for k, v in classes.labels.items()}
    return {names[c]: label == c for c in range(1, classes.num_classes) if c in names}


def class_values(classes: LabelSet) -> dict[str, list[int]]:
    """The label values a reported class (or region) covers in a label map."""
    if classes.regions:
        order = classes.region_order
        return {
            name: [v for v in order if v in set(vals)] for name, vals in classes.regions.items()
        }
    return {name: [int(v)] for v, name in classes.labels.items() if int(v) > 0}


def seg_metrics(
    pred: np.ndarray, label: np.ndarray, classes: LabelSet, spacing: list[float] | None = None
) -> dict[str, dict[str, float]]:
    """Dice and HD95 (in mm when `spacing`, the voxel sizes along the arrays' axes, is given)
    per foreground class or region; `present`: the reference has it (Dice of an absent class
    is not counted, HD95 is NaN)."""
    pm, lm = targets(pred, classes), targets(label, classes)
    names = list(lm)
    p = torch.from_numpy(np.stack([pm[n] for n in names]))[None].float()
    y = torch.from_numpy(np.stack([lm[n] for n in names]))[None].float()
    dice = compute_dice(p, y, include_background=True, ignore_empty=True)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MONAI warns on empty masks; they give NaN, as wanted
        hd = compute_hausdorff_distance(
            p, y, include_background=True, percentile=95, spacing=spacing
        )[0]
    return {
        n: {
            "dice": float(dice[i]),
            "hd95": float(hd[i]),
            "present": bool(lm[n].any()),
        }
        for i, n in enumerate(names)
    }


def dice(pred: np.ndarray, ref: np.ndarray, classes: LabelSet) -> dict[str, float]:
    """Dice a class (or region) present in the reference, as evaluation counts it."""
    pm, rm = targets(pred, classes), targets(ref, classes)
    return {c: float(2 * (pm[c] & r).sum() / (pm[c].sum() + r.sum()))
            for c, r in rm.items() if r.any()}  # fmt: skip


def class_means(per_case: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each class's mean Dice over the cases that have it."""
    names = sorted({c for d in per_case.values() for c in d})
    return {c: float(np.mean([d[c] for d in per_case.values() if c in d])) for c in names}


def mean_of(per_class: dict[str, float]) -> float:
    """The mean over classes of their finite values (NaN when none)."""
    finite = [v for v in per_class.values() if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


@dataclass
class Scores:
    """Mean Dice a class over the cases where the class is present, and their mean."""

    per_class: dict[str, float]
    mean: float
    per_case: dict[str, dict[str, float]] = field(default_factory=dict)


def score(maps: dict[str, np.ndarray], refs: dict[str, np.ndarray], classes: LabelSet) -> Scores:
    """Dice of label maps against the reference label maps: a class's mean over the cases
    that have it, and the mean over classes."""
    per_case = {cid: dice(pred, refs[cid], classes) for cid, pred in maps.items()}
    per_class = class_means(per_case)
    return Scores(per_class, mean_of(per_class), per_case)
