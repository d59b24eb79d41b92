"""Whole-case prediction by sliding window (MONAI) with Gaussian weighting, optionally
mirrored window by window (nnU-Net's way); label maps straight from the logits, class
probabilities (softmax) or region probabilities (sigmoid, for region-based labels, composed into
a label map in the dataset's regions_class_order, as nnU-Net does) only where asked for."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from monai.inferers import sliding_window_inference
from torch import nn

from voxjet.volumes.plan.plan_file import LabelSet


def mirror_axes(patch_size: list[int], mirror: bool) -> list[tuple[int, ...]]:
    """The flips test-time mirroring averages (dims of a [B, C, X, Y, Z] batch): all 8
    combinations of the spatial axes, none along a 2d configuration's one-voxel slice axis."""
    if not mirror:
        return [()]
    axes = [2 + a for a, p in enumerate(patch_size) if p > 1]
    return [c for r in range(len(axes) + 1) for c in itertools.combinations(axes, r)]


class MirroredWindows(nn.Module):
    """A window batch's logits averaged over the mirror flips, the flips of the same windows
    run as one batch (nnU-Net's mirroring: per window, logits averaged; no whole-image pass a
    flip, no probability volume a flip)."""

    def __init__(self, model: nn.Module, flips: list[tuple[int, ...]]) -> None:
        super().__init__()
        self.model, self.flips = model, flips

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C_out, ...] logits of [B, C_in, ...] windows."""
        if self.flips == [()]:
            return self.model(x).float()
        n = x.shape[0]
        batch = torch.cat([torch.flip(x, f) if f else x for f in self.flips])
        out = self.model(batch).float()
        total = None
        for i, f in enumerate(self.flips):
            part = out[i * n : (i + 1) * n]
            part = torch.flip(part, f) if f else part
            total = part if total is None else total + part
        return total / len(self.flips)


@torch.no_grad()
def predict_logits(
    model: nn.Module,
    image: np.ndarray,
    patch_size: list[int],
    device: torch.device,
    overlap: float = 0.5,
    sw_batch_size: int = 2,
    mirror: bool = False,
) -> torch.Tensor:
    """[C, X, Y, Z] float32 logits of one preprocessed image [C, X, Y, Z] (on the CPU): MONAI's
    sliding window with Gaussian weighting; with `mirror`, each window's logits averaged over
    all axis flips (nnU-Net's test-time mirroring). One buffer of the classes' logits is all
    the whole image holds: labels come from it without probabilities."""
    model.eval()
    x = torch.from_numpy(np.ascontiguousarray(image)[None]).to(device)
    logits = sliding_window_inference(
        x,
        roi_size=patch_size,
        sw_batch_size=sw_batch_size,
        predictor=MirroredWindows(model, mirror_axes(patch_size, mirror)),
        overlap=overlap,
        mode="gaussian",
        padding_mode="constant",
    )
    return logits[0].float().cpu()


def to_probs(logits: torch.Tensor, sigmoid: bool = False) -> torch.Tensor:
    """Class probabilities (softmax over dim 0) or region probabilities (sigmoid)."""
    return torch.sigmoid(logits) if sigmoid else torch.softmax(logits, 0)


def logits_to_labels(logits: torch.Tensor, classes: LabelSet) -> np.ndarray:
    """`to_labels` of the probabilities, from the logits (softmax keeps the arg-max, sigmoid >
    0.5 is logit > 0), without a probability volume."""
    if classes.regions:
        out = torch.zeros(logits.shape[1:], dtype=torch.uint8)
        for r, value in enumerate(classes.region_order):
            out[logits[r] > 0] = value
        return out.numpy()
    return logits.argmax(0).numpy().astype(np.uint8)


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
    logits = predict_logits(model, image, patch_size, device, overlap, sw_batch_size, mirror)
    return logits_to_labels(logits, classes)
