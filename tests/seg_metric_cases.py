"""Label maps that exercise every branch of a segmentation metric's conventions, made without
randomness so a reference implementation (nnU-Net's compute_metrics, recorded by
benchmarks/metric_references.py) and voxjet score the same arrays: a missed lesion, a false
positive lesion on a lesion-free case, a class empty in both, partial overlaps, a region (organ
+ lesion) as nnU-Net's region-based datasets score it, and sparse annotations: the ignore label
(IGNORE) over voxels nobody annotated, where a prediction counts for nothing."""

from __future__ import annotations

import numpy as np

SHAPE = (24, 20, 16)
SPACING = (0.8, 1.0, 2.5)  # mm along the arrays' axes


def _organ(shift: int = 0) -> np.ndarray:
    m = np.zeros(SHAPE, np.uint8)
    m[4 + shift : 18 + shift, 3:15, 2:12] = 1
    return m


def cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{case: (reference, prediction)}; label 1 organ, 2 lesion."""
    out = {}
    # a lesion the prediction misses; the organ shifted by two voxels
    ref, pred = _organ(), _organ(2)
    ref[8:11, 6:9, 5:7] = 2
    out["missed_lesion"] = (ref, pred)
    # no lesion in the reference, a 32-voxel one predicted: Dice 0, a false detection
    ref, pred = _organ(), _organ()
    pred[10:14, 5:9, 4:6] = 2
    out["false_positive"] = (ref, pred)
    # no lesion in either: Dice NaN, left out of the means
    ref, pred = _organ(), _organ(1)
    out["both_empty"] = (ref, pred)
    # both found, overlapping in part
    ref, pred = _organ(), _organ()
    ref[6:12, 5:10, 4:8] = 2
    pred[8:14, 5:10, 5:9] = 2
    out["partial"] = (ref, pred)
    return out


LABELS = {0: "background", 1: "organ", 2: "lesion"}
REGIONS = {"whole": [1, 2], "lesion": [2]}
REGION_ORDER = [1, 2]


IGNORE = 3  # nnU-Net's ignore label: the highest value


def ignore_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{case: (reference, prediction)} of a sparsely annotated dataset: 1 organ, 2 lesion,
    IGNORE where nobody annotated."""
    out = {}
    # the organ annotated on half its slices; the prediction, whole, overlaps the rest
    ref, pred = _organ(), _organ(1)
    ref[:, :, 7:] = np.where(ref[:, :, 7:] == 1, IGNORE, 0)
    out["half_annotated"] = (ref, pred)
    # a lesion predicted where nobody looked: no false positive
    ref, pred = _organ(), _organ()
    ref[10:14, 5:9, 4:6] = IGNORE
    pred[10:14, 5:9, 4:6] = 2
    out["lesion_in_unannotated"] = (ref, pred)
    # a lesion predicted half inside an annotated background, half inside the unannotated
    ref, pred = _organ(), _organ()
    ref[8:12, 5:9, 4:6] = IGNORE
    pred[6:12, 5:9, 4:6] = 2
    out["lesion_half_seen"] = (ref, pred)
    return out
