"""nnU-Net's post-processing: keep only the largest connected component of the foreground
(all classes as one), then of each class — each step kept only where it raised the Dice of the
cross-validation's predictions (`choose_postprocessing`, what find-best runs), then applied to
new predictions as chosen (`apply_postprocessing`)."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from voxjet.volumes.metrics import Scores, class_values, score
from voxjet.volumes.plan.plan_file import LabelSet


def keep_largest(labels: np.ndarray, values: list[int]) -> np.ndarray:
    """The label map with voxels of `values` (taken together) outside their largest connected
    component (26-connected) set to background."""
    mask = np.isin(labels, values)
    comps, n = ndimage.label(mask, ndimage.generate_binary_structure(labels.ndim, labels.ndim))
    if n <= 1:
        return labels
    sizes = np.bincount(comps.ravel())
    sizes[0] = 0
    out = labels.copy()
    out[mask & (comps != int(np.argmax(sizes)))] = 0
    return out


def apply_postprocessing(labels: np.ndarray, post: dict, classes: LabelSet) -> np.ndarray:
    """A label map with the chosen post-processing applied."""
    values = class_values(classes)
    if post.get("foreground_largest_component"):
        labels = keep_largest(labels, sorted({v for vs in values.values() for v in vs}))
    for name in post.get("largest_component_classes", []):
        labels = keep_largest(labels, values[name])
    return labels


def choose_postprocessing(maps: dict[str, np.ndarray], refs: dict[str, np.ndarray],
                          classes: LabelSet, base: Scores) -> dict:  # fmt: skip
    """nnU-Net's two steps, each kept only where it raises Dice: the foreground's largest
    component (the mean over classes), then each class's own (that class's Dice)."""
    values = class_values(classes)
    fg = sorted({v for vs in values.values() for v in vs})
    trial = {cid: keep_largest(m, fg) for cid, m in maps.items()}
    s = score(trial, refs, classes)
    use_fg = s.mean > base.mean
    steps = [{"step": "foreground largest component", "dice_mean_before": base.mean,
              "dice_mean_after": s.mean, "kept": use_fg}]  # fmt: skip
    if use_fg:
        maps, base = trial, s
    kept = []
    for name, vals in values.items():
        if name not in base.per_class:
            continue
        trial = {cid: keep_largest(m, vals) for cid, m in maps.items()}
        s = score(trial, refs, classes)
        raised = s.per_class[name] > base.per_class[name]
        steps.append({"step": f"{name} largest component", "dice_before": base.per_class[name],
                      "dice_after": s.per_class[name], "kept": raised})  # fmt: skip
        if raised:
            maps, base = trial, s
            kept.append(name)
    return {"foreground_largest_component": use_fg, "largest_component_classes": kept,
            "dice_mean_after": base.mean, "per_class_after": base.per_class,
            "steps": steps}  # fmt: skip
