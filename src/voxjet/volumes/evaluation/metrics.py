"""Segmentation metrics, the one place they are computed, by nnU-Net's conventions
(`nnunetv2.evaluation.evaluate_predictions.compute_metrics`): per case and class (or region)
the voxel counts tp, fp, fn — on the annotated voxels alone where the dataset has an ignore
label (`ignore_label`: sparse annotations); Dice = 2tp / (2tp + fp + fn) and IoU = tp / (tp +
fp + fn), NaN only when reference and prediction are both empty (so a prediction on a case
without the class scores 0); a class's mean is the nanmean over cases, the foreground mean the
mean over classes.

HD95 (in mm of the given voxel sizes) per case where both have the class; its aggregate follows
BraTS's convention, which punishes what a mean of finite values hides: a missed structure or a
false detection counts as the image's diagonal in mm, cases where both are empty are left out;
the counts of misses and false detections stand beside it. Validation, evaluation, find-best and
its post-processing all score through this module."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from monai.metrics import compute_hausdorff_distance

from voxjet.volumes.plan.plan_file import LabelSet, target_values


def _mask(label: np.ndarray, values: list[int]) -> np.ndarray:
    return label == values[0] if len(values) == 1 else np.isin(label, values)


def _box(mask: np.ndarray) -> tuple[slice, ...] | None:
    """The bounding box of a mask's voxels, one voxel wider where the image allows (so that
    a structure's surface is the same in the box as in the image); None when it is empty."""
    box = []
    for axis in range(mask.ndim):
        other = tuple(a for a in range(mask.ndim) if a != axis)
        hit = np.flatnonzero(mask.any(axis=other))
        if not len(hit):
            return None
        box.append(slice(max(int(hit[0]) - 1, 0), min(int(hit[-1]) + 2, mask.shape[axis])))
    return tuple(box)


def dice_of(tp: int, fp: int, fn: int) -> float:
    """2tp / (2tp + fp + fn); NaN when reference and prediction are both empty."""
    denominator = 2 * tp + fp + fn
    return float("nan") if denominator == 0 else 2 * tp / denominator


def iou_of(tp: int, fp: int, fn: int) -> float:
    """tp / (tp + fp + fn) (nnU-Net's IoU); NaN when reference and prediction are both empty."""
    denominator = tp + fp + fn
    return float("nan") if denominator == 0 else tp / denominator


def annotated(label: np.ndarray, classes: LabelSet) -> np.ndarray | None:
    """The voxels a reference labels (None: all): not the ignore label's (nnU-Net's
    compute_metrics counts tp, fp and fn on these alone)."""
    return None if classes.ignore is None else label != classes.ignore


def counts(pred: np.ndarray, ref: np.ndarray) -> dict[str, int]:
    """Voxel counts of two masks: tp, fp, fn, and each mask's size."""
    tp = int(np.count_nonzero(pred & ref))
    n_pred, n_ref = int(np.count_nonzero(pred)), int(np.count_nonzero(ref))
    return {"tp": tp, "fp": n_pred - tp, "fn": n_ref - tp, "n_pred": n_pred, "n_ref": n_ref}


def diagonal_mm(shape: Iterable[int], spacing: Iterable[float] | None) -> float:
    """The image's diagonal in mm (BraTS's HD95 for a missed or a false structure)."""
    sp = np.ones(len(tuple(shape))) if spacing is None else np.asarray(list(spacing), float)
    return float(np.sqrt(((np.asarray(list(shape), float) * sp) ** 2).sum()))


def _hd95(pred: np.ndarray, ref: np.ndarray, spacing: list[float] | None) -> float:
    p = torch.from_numpy(pred)[None, None].float()
    y = torch.from_numpy(ref)[None, None].float()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hd = compute_hausdorff_distance(p, y, include_background=True, percentile=95,
                                        spacing=spacing)  # fmt: skip
    return float(hd[0, 0])


def seg_metrics(
    pred: np.ndarray,
    label: np.ndarray,
    classes: LabelSet,
    spacing: list[float] | None = None,
    hd95: bool = True,
) -> dict[str, dict[str, float]]:
    """Per foreground class or region of one case: tp, fp, fn (and the masks' sizes; on the
    annotated voxels alone where the dataset has an ignore label), Dice and IoU (nnU-Net's: NaN
    only when both are empty), HD95 in mm where both have it (NaN else; not
    computed with `hd95` False), and whether the reference has it (`present`) and the
    prediction misses it (`miss`) or has it where the reference does not
    (`false_detection`)."""
    out = {}
    seen = annotated(label, classes)
    # a class at a time, in its bounding box: never a stack of every class's masks, and the
    # distance transforms over the structure's box, not the image (MONAI crops the same way)
    for name, values in target_values(classes).items():
        p, r = _mask(pred, values), _mask(label, values)
        if seen is not None:
            p &= seen  # a prediction where nobody annotated is neither right nor wrong
        box = _box(p | r)
        if box is not None:
            p, r = p[box], r[box]
        c = counts(p, r)
        both = c["n_pred"] > 0 and c["n_ref"] > 0
        out[name] = {
            **c,
            "dice": dice_of(c["tp"], c["fp"], c["fn"]),
            "iou": iou_of(c["tp"], c["fp"], c["fn"]),
            "hd95": _hd95(p, r, spacing) if hd95 and both else float("nan"),
            "present": c["n_ref"] > 0,
            "miss": c["n_ref"] > 0 and c["n_pred"] == 0,
            "false_detection": c["n_ref"] == 0 and c["n_pred"] > 0,
        }
    return out


def nanmean(values: Iterable[float]) -> float:
    """The mean of the finite values (NaN when there are none), as nnU-Net's np.nanmean."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def class_means(per_case: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each class's mean Dice over the cases (nnU-Net's nanmean: a case where both are empty
    does not count, one with a false positive counts 0); `per_case`: {case: {class: Dice}}."""
    names = sorted({c for d in per_case.values() for c in d})
    return {c: nanmean(d[c] for d in per_case.values() if c in d) for c in names}


def mean_of(per_class: dict[str, float]) -> float:
    """The foreground mean: the mean over classes (nnU-Net's np.mean: NaN when a class has no
    finite value in any case, i.e. no case has it in reference or prediction)."""
    return float(np.mean(list(per_class.values()))) if per_class else float("nan")


def class_summary(per_case: dict[str, dict[str, dict]], diagonals: dict[str, float]) -> dict:
    """Each class over the cases of `per_case` (seg_metrics' records): mean Dice (nanmean),
    the cases it counts, HD95's mean by BraTS's convention (`diagonals`: each case's image
    diagonal in mm, for a miss or a false detection; cases where both are empty left out),
    the misses and false detections, and the summed tp, fp, fn."""
    out = {}
    for name in next(iter(per_case.values())):
        records = {cid: m[name] for cid, m in per_case.items()}
        dice = [r["dice"] for r in records.values()]
        hd = [diagonals[cid] if r["miss"] or r["false_detection"] else r["hd95"]
              for cid, r in records.items() if r["present"] or r["false_detection"]]  # fmt: skip
        out[name] = {
            "dice": nanmean(dice),
            "iou": nanmean(r.get("iou", float("nan")) for r in records.values()),
            "hd95": nanmean(hd),
            "cases": int(np.isfinite(dice).sum()),
            "present": sum(r["present"] for r in records.values()),
            "misses": sum(r["miss"] for r in records.values()),
            "false_detections": sum(r["false_detection"] for r in records.values()),
            **{k: int(sum(r[k] for r in records.values())) for k in ("tp", "fp", "fn")},
        }
    return out


@dataclass
class Scores:
    """Mean Dice a class over the cases (nnU-Net's nanmean), and their mean."""

    per_class: dict[str, float]
    mean: float
    per_case: dict[str, dict[str, float]] = field(default_factory=dict)


def dice(pred: np.ndarray, ref: np.ndarray, classes: LabelSet) -> dict[str, float]:
    """Dice of each foreground class or region of one case (NaN where both are empty)."""
    out = {}
    seen = annotated(ref, classes)
    for name, values in target_values(classes).items():  # a class's masks at a time
        p = _mask(pred, values)
        c = counts(p if seen is None else p & seen, _mask(ref, values))
        out[name] = dice_of(c["tp"], c["fp"], c["fn"])
    return out


def score(maps: dict[str, np.ndarray], refs: dict[str, np.ndarray], classes: LabelSet) -> Scores:
    """Dice of label maps against the reference label maps: each class's nanmean over the
    cases, and the foreground mean."""
    per_case = {cid: dice(pred, refs[cid], classes) for cid, pred in maps.items()}
    per_class = class_means(per_case)
    return Scores(per_class, mean_of(per_class), per_case)
