"""Whole-case prediction by sliding window (MONAI) with Gaussian weighting, and seg metrics."""

from __future__ import annotations

import h5py
import numpy as np
import torch
from monai.inferers import sliding_window_inference
from monai.metrics import compute_dice, compute_hausdorff_distance
from monai.networks.utils import one_hot
from torch import nn


@torch.no_grad()
def predict_case(
    model: nn.Module,
    image: np.ndarray,
    patch_size: list[int],
    device: torch.device,
    overlap: float = 0.5,
    sw_batch_size: int = 2,
    mirror: bool = False,
) -> np.ndarray:
    """Class map [X, Y, Z] of one preprocessed image [C, X, Y, Z]: MONAI's sliding window with
    Gaussian weighting; with `mirror`, the softmax averaged over all 8 axis flips (nnU-Net's
    test-time mirroring)."""
    import itertools

    model.eval()
    x = torch.from_numpy(np.ascontiguousarray(image)[None]).to(device)
    flips = [()]
    if mirror:
        flips = [c for r in range(4) for c in itertools.combinations((2, 3, 4), r)]
    probs = None
    with torch.no_grad():
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
            p = torch.softmax(logits.float(), 1)
            p = torch.flip(p, axes) if axes else p
            probs = p if probs is None else probs + p
    return probs.argmax(1)[0].cpu().numpy().astype(np.uint8)


def seg_metrics(
    pred: np.ndarray, label: np.ndarray, n_classes: int, spacing: list[float] | None = None
) -> dict[int, dict[str, float]]:
    """Dice and HD95 (in mm when `spacing` is given) per foreground class."""
    p = one_hot(torch.from_numpy(pred[None, None]).long(), n_classes)
    y = one_hot(torch.from_numpy(label[None, None]).long(), n_classes)
    dice = compute_dice(p, y, include_background=False, ignore_empty=True)[0]
    hd = compute_hausdorff_distance(p, y, include_background=False, percentile=95, spacing=spacing)[
        0
    ]
    out = {}
    for c in range(1, n_classes):
        out[c] = {
            "dice": float(dice[c - 1]),
            "hd95": float(hd[c - 1]),
            "present": bool((label == c).any()),
        }
    return out


def read_case_arrays(f: h5py.File) -> tuple[np.ndarray, np.ndarray]:
    """The whole preprocessed image and label of an open case file."""
    try:
        return f["image"][...], f["label"][...]
    except (OSError, RuntimeError, ValueError) as e:
        from voxjet.io.integrity import corrupt_error

        raise corrupt_error(f.filename, "the case's image or label", "preprocess_case", e) from e
