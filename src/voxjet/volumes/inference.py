"""Whole-case prediction by sliding window (MONAI) with Gaussian weighting, optionally
mirrored; outputs as class probabilities (softmax) or region probabilities (sigmoid, for
region-based labels, composed into a label map in the dataset's regions_class_order, as nnU-Net
does)."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from monai.inferers import sliding_window_inference
from torch import nn

from voxjet.volumes.plan.plan_file import LabelSet


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


def to_labels(probs: torch.Tensor, classes: LabelSet) -> np.ndarray:
    """A label map [X, Y, Z] uint8: arg-max of class probabilities, or for regions each region
    above 0.5 written in regions_class_order (a later, smaller region overwrites)."""
    if classes.regions:
        out = torch.zeros(probs.shape[1:], dtype=torch.uint8)
        for r, value in enumerate(classes.region_order):
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
    *,
    classes: LabelSet,
) -> np.ndarray:
    """Label map [X, Y, Z] of one preprocessed image [C, X, Y, Z] (`classes`: its classes or
    regions)."""
    probs = predict_probs(model, image, patch_size, device, overlap, sw_batch_size, mirror,
                          sigmoid=bool(classes.regions))  # fmt: skip
    return to_labels(probs, classes)
