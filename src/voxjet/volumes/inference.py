"""Whole-case prediction by sliding window (MONAI) with Gaussian weighting, optionally
mirrored; outputs as class probabilities (softmax) or region probabilities (sigmoid, for
region-based labels, composed into a label map in the dataset's regions_class_order, as nnU-Net
does); and the metrics, Dice and HD95 (in mm), per class or region."""

from __future__ import annotations

import itertools

import h5py
import numpy as np
import torch
from monai.inferers import sliding_window_inference
from monai.metrics import compute_dice, compute_hausdorff_distance
from torch import nn


@torch.no_grad()
def predict_probs(
    model: nn.Module,
    image: np.ndarray,
    patch_size: list[int],
    device: torch.device,
    overlap: float = 0.5,
    sw_batch_size: int = 2,
    mirror: bool = False,
    sigmoid: bool = False,
) -> torch.Tensor:
    """[C, X, Y, Z] probabilities of one preprocessed image [C, X, Y, Z] (on the CPU): MONAI's
    sliding window with Gaussian weighting; with `mirror`, averaged over all 8 axis flips
    (nnU-Net's test-time mirroring; 4 in-plane for a 2d configuration's one-voxel patches)."""
    model.eval()
    x = torch.from_numpy(np.ascontiguousarray(image)[None]).to(device)
    flips = [()]
    if mirror:  # not along a 2d configuration's slice axis (one voxel: nothing to mirror)
        axes = [2 + a for a, p in enumerate(patch_size) if p > 1]
        flips = [c for r in range(len(axes) + 1) for c in itertools.combinations(axes, r)]
    probs = None
    for axes in flips:
        xi = torch.flip(x, axes) if axes else x
        logits = sliding_window_inference(
            xi,
            roi_size=patch_size,
            sw_batch_size=sw_batch_size,
            predictor=model,
            overlap=overlap,
            mode="gaussian",
            padding_mode="constant",
        )
        p = torch.sigmoid(logits.float()) if sigmoid else torch.softmax(logits.float(), 1)
        p = torch.flip(p, axes) if axes else p
        probs = p if probs is None else probs + p
    return (probs / len(flips))[0].cpu()


def to_labels(probs: torch.Tensor, plan: dict) -> np.ndarray:
    """A label map [X, Y, Z] uint8: arg-max of class probabilities, or for regions each region
    above 0.5 written in regions_class_order (a later, smaller region overwrites)."""
    if plan.get("regions"):
        out = torch.zeros(probs.shape[1:], dtype=torch.uint8)
        for r, value in enumerate(plan["region_order"]):
            out[probs[r] > 0.5] = value
        return out.numpy()
    return probs.argmax(0).numpy().astype(np.uint8)


def predict_case(
    model: nn.Module,
    image: np.ndarray,
    patch_size: list[int],
    device: torch.device,
    overlap: float = 0.5,
    sw_batch_size: int = 2,
    mirror: bool = False,
    plan: dict | None = None,
) -> np.ndarray:
    """Label map [X, Y, Z] of one preprocessed image [C, X, Y, Z]."""
    plan = plan or {}
    probs = predict_probs(model, image, patch_size, device, overlap, sw_batch_size, mirror,
                          sigmoid=bool(plan.get("regions")))  # fmt: skip
    return to_labels(probs, plan)


def targets(label: np.ndarray, plan: dict) -> dict[str, np.ndarray]:
    """{class or region name: its mask} of a label map, the foreground ones."""
    if plan.get("regions"):
        return {name: np.isin(label, values) for name, values in plan["regions"].items()}
    names = {int(k): v for k, v in plan["labels"].items()}
    return {names[c]: label == c for c in range(1, plan["num_classes"]) if c in names}


def seg_metrics(
    pred: np.ndarray, label: np.ndarray, plan: dict, spacing: list[float] | None = None
) -> dict[str, dict[str, float]]:
    """Dice and HD95 (in mm when `spacing`, the voxel sizes along the arrays' axes, is given)
    per foreground class or region; `present`: the reference has it (Dice of an absent class
    is not counted, HD95 is NaN)."""
    pm, lm = targets(pred, plan), targets(label, plan)
    names = list(lm)
    p = torch.from_numpy(np.stack([pm[n] for n in names]))[None].float()
    y = torch.from_numpy(np.stack([lm[n] for n in names]))[None].float()
    dice = compute_dice(p, y, include_background=True, ignore_empty=True)[0]
    import warnings

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


def read_case_arrays(f: h5py.File) -> tuple[np.ndarray, np.ndarray]:
    """The whole preprocessed image and label of an open case file."""
    from voxjet.io.case_arrays import read_verified

    where = f.filename
    return read_verified(f, "image", 1, where), read_verified(f, "label", 0, where)
