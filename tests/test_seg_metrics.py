"""Segmentation metrics by nnU-Net's conventions (voxjet.volumes.evaluation.metrics), against
nnU-Net 2.8.1's compute_metrics on the same label maps (tests/seg_metric_cases.py; its values
recorded in tests/data/nnunet_metrics.json by benchmarks/metric_references.py, so this runs without
nnU-Net): a missed lesion, a false positive on a lesion-free case, a class empty in both, a
partial overlap, and regions. HD95's aggregate and the miss / false-detection counts against a
hand computation of BraTS's convention."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from seg_metric_cases import (
    IGNORE,
    LABELS,
    REGION_ORDER,
    REGIONS,
    SHAPE,
    SPACING,
    cases,
    ignore_cases,
)

from voxjet.volumes.evaluation.metrics import (
    class_means,
    class_summary,
    diagonal_mm,
    dice,
    mean_of,
    seg_metrics,
)
from voxjet.volumes.plan.plan_file import LabelSet

RECORDED = json.loads((Path(__file__).parent / "data" / "nnunet_metrics.json").read_text())
CLASSES = LabelSet(LABELS, 3)
REGION_SET = LabelSet(LABELS, 3, REGIONS, REGION_ORDER)
SPARSE = LabelSet(LABELS, 3, ignore=IGNORE)


def _same(got: float, want: float | None) -> bool:
    return math.isnan(got) if want is None else got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("kind,labels,keys", [
    ("labels", CLASSES, {"organ": "1", "lesion": "2"}),
    ("regions", REGION_SET, {"whole": "(1, 2)", "lesion": "(2,)"}),
    ("ignore", SPARSE, {"organ": "1", "lesion": "2"}),
])  # fmt: skip
def test_dice_iou_and_counts_equal_nnunet_compute_metrics(kind, labels, keys):
    """With an ignore label, only annotated voxels count (a lesion predicted where nobody
    looked is no false positive), as compute_metrics with ignore_label counts them."""
    recorded = RECORDED["metrics"][kind]
    per_case, ious = {}, {}
    for cid, (ref, pred) in (ignore_cases() if kind == "ignore" else cases()).items():
        m = seg_metrics(pred, ref, labels, SPACING)
        per_case[cid] = {name: r["dice"] for name, r in m.items()}
        ious[cid] = {name: r["iou"] for name, r in m.items()}
        assert dice(pred, ref, labels) == pytest.approx(per_case[cid], nan_ok=True)
        for name, key in keys.items():
            want = recorded["per_case"][cid][key]
            assert _same(m[name]["dice"], want["Dice"]), (cid, name)
            assert _same(m[name]["iou"], want["IoU"]), (cid, name)
            for ours, theirs in (("tp", "TP"), ("fp", "FP"), ("fn", "FN"), ("n_ref", "n_ref"),
                                 ("n_pred", "n_pred")):  # fmt: skip
                assert m[name][ours] == want[theirs], (cid, name, ours)
    # a class's mean: the nanmean over cases (the false positive's 0 in, both-empty out)
    means = class_means(per_case)
    for name, key in keys.items():
        assert means[name] == pytest.approx(recorded["mean"][key], abs=1e-12), name
    assert mean_of(means) == pytest.approx(recorded["foreground_mean"], abs=1e-12)
    iou_means = class_means(ious)
    for name, key in keys.items():
        assert iou_means[name] == pytest.approx(recorded["mean_iou"][key], abs=1e-12), name
    if kind != "ignore":
        # what the first version reported: the lesion averaged over the one case that has it
        # alone, 0.0 from the missed one left at NaN: a better number than nnU-Net's
        assert recorded["mean"][keys["lesion"]] == pytest.approx(1 / 6)
    else:  # the lesion predicted in the unannotated region alone: not scored at all
        assert recorded["per_case"]["lesion_in_unannotated"]["2"]["Dice"] is None


def test_hd95_aggregate_punishes_misses_and_false_detections():
    """BraTS's convention: a missed structure and a false detection each count as the image's
    diagonal in mm; a case where both are empty is left out; the counts stand beside."""
    per_case = {
        cid: seg_metrics(pred, ref, CLASSES, SPACING) for cid, (ref, pred) in cases().items()
    }
    diagonal = diagonal_mm(SHAPE, SPACING)
    assert diagonal == pytest.approx(np.sqrt((24 * 0.8) ** 2 + 20**2 + (16 * 2.5) ** 2))
    lesion = {cid: m["lesion"] for cid, m in per_case.items()}
    assert lesion["missed_lesion"]["miss"] and np.isnan(lesion["missed_lesion"]["hd95"])
    assert lesion["false_positive"]["false_detection"]
    assert not lesion["both_empty"]["miss"] and not lesion["both_empty"]["false_detection"]
    partial = lesion["partial"]["hd95"]
    assert np.isfinite(partial) and partial > 0
    summary = class_summary(per_case, {cid: diagonal for cid in per_case})
    assert summary["lesion"]["hd95"] == pytest.approx((diagonal + diagonal + partial) / 3)
    assert summary["lesion"]["misses"] == 1 and summary["lesion"]["false_detections"] == 1
    assert summary["lesion"]["cases"] == 3 and summary["lesion"]["present"] == 2
    # the organ is in every case and every prediction: its HD95 the plain mean
    organ = [per_case[c]["organ"]["hd95"] for c in per_case]
    assert summary["organ"]["hd95"] == pytest.approx(np.mean(organ))
    assert summary["organ"]["misses"] == summary["organ"]["false_detections"] == 0
    # a mean of finite values alone would have reported the one partial lesion's distance
    assert summary["lesion"]["hd95"] > partial


def test_scoring_in_each_structures_box_equals_monai_on_the_whole_image():
    """seg_metrics works in each class's bounding box (bounded memory for many classes): its
    counts and HD95 equal MONAI's on the whole image, for structures inside the image, at its
    border and far apart (prediction and reference in different corners)."""
    import torch
    from monai.metrics import compute_hausdorff_distance

    rng = np.random.default_rng(3)
    shape, spacing = (40, 36, 24), [0.8, 1.1, 2.5]
    ref = np.zeros(shape, np.uint8)
    pred = np.zeros(shape, np.uint8)
    ref[5:15, 6:20, 3:10], pred[6:16, 5:19, 3:11] = 1, 1  # overlapping, inside
    ref[30:40, 0:10, 14:24], pred[28:40, 0:8, 16:24] = 2, 2  # at the image's border
    ref[2:5, 2:5, 2:5], pred[35:38, 30:34, 18:22] = 3, 3  # far apart
    noise = rng.random(shape) < 0.01
    pred[noise & (pred == 0)] = 1
    classes = LabelSet({0: "background", 1: "a", 2: "b", 3: "c"}, 4)
    got = seg_metrics(pred, ref, classes, spacing)
    for c, name in ((1, "a"), (2, "b"), (3, "c")):
        p, r = pred == c, ref == c
        assert got[name]["tp"] == int((p & r).sum()) and got[name]["fp"] == int((p & ~r).sum())
        assert got[name]["fn"] == int((~p & r).sum())
        whole = compute_hausdorff_distance(torch.from_numpy(p)[None, None].float(),
                                           torch.from_numpy(r)[None, None].float(),
                                           include_background=True, percentile=95,
                                           spacing=spacing)  # fmt: skip
        assert got[name]["hd95"] == pytest.approx(float(whole[0, 0]), abs=1e-6), name
