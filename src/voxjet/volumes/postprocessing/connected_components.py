"""nnU-Net's post-processing: keep only the largest connected component of the foreground
(all classes as one), then of each class, as find-best chose it from the cross-validation's
predictions (voxjet.volumes.evaluation.find_best), applied to new predictions."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from voxjet.volumes.plan.plan_file import LabelSet, class_values


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
