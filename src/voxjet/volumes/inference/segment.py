"""Whole-case prediction by sliding window with Gaussian weighting (MONAI's windows, streamed
slab by slab: voxjet.volumes.inference.sliding_window), optionally mirrored window by window
(nnU-Net's way) and averaged over several models (a cross-validation's folds); label maps straight
from each finished slab's logits, class probabilities (softmax) or region probabilities (sigmoid,
for region-based labels, composed into a label map in the dataset's regions_class_order, as nnU-Net
does) only where asked for. No buffer of every class's logits for the whole case is held."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from voxjet.errors import VoxjetError
from voxjet.volumes.inference.sliding_window import stream_slabs
from voxjet.volumes.plan.plan_file import LabelSet, Plan


def mirror_axes(patch_size: list[int], mirror: bool) -> list[tuple[int, ...]]:
    """The flips test-time mirroring averages (dims of a [B, C, X, Y, Z] batch): all 8
    combinations of the spatial axes, none along a 2d configuration's one-voxel slice axis."""
    if not mirror:
        return [()]
    axes = [2 + a for a, p in enumerate(patch_size) if p > 1]
    return [c for r in range(len(axes) + 1) for c in itertools.combinations(axes, r)]


class MirroredWindows(nn.Module):
    """A window batch's logits averaged over the mirror flips and the models: the flips of the
    same windows run in the same forward passes, at most `batch` inputs a pass (nnU-Net's
    mirroring: per window, logits averaged; no whole-image pass a flip, no probability volume
    a flip). Averaging the folds window by window equals averaging their whole-case logits:
    the Gaussian blend is linear."""

    def __init__(self, models: list[nn.Module], flips: list[tuple[int, ...]], batch: int) -> None:
        super().__init__()
        self.models, self.flips, self.batch = nn.ModuleList(models), flips, batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C_out, ...] logits of [B, C_in, ...] windows."""
        n = x.shape[0]
        if self.flips == [()] and len(self.models) == 1 and n <= self.batch:
            return self.models[0](x).float()  # nothing to average: no second buffer
        flipped = x if self.flips == [()] else torch.cat([torch.flip(x, f) if f else x
                                                          for f in self.flips])  # fmt: skip
        total = None
        for model in self.models:
            for i in range(0, len(flipped), self.batch):  # one pass's outputs held at a time
                for j, out in enumerate(model(flipped[i : i + self.batch]).float(), i):
                    f = [d - 1 for d in self.flips[j // n]]  # the batch axis is gone
                    out = torch.flip(out, f) if f else out
                    if total is None:
                        total = torch.zeros((n, *out.shape), dtype=out.dtype, device=out.device)
                    total[j % n] += out
        return total / (len(self.flips) * len(self.models))


def window_batch(device: torch.device, plan_batch: int) -> int:
    """Network inputs a forward pass (windows and their flips): on a GPU twice the plan's
    training batch (whose backward pass needed more memory than inference does); on the CPU
    two, where a larger batch is no faster and only holds more activations."""
    return max(1, 2 * plan_batch) if device.type == "cuda" else 2


@dataclass(frozen=True)
class Windows:
    """How a case is cut into windows and what a window's logits average over: the plan's
    patch, the windows' overlap, network inputs a forward pass, test-time mirroring."""

    patch_size: list[int]
    overlap: float = 0.5
    batch: int = 2
    mirror: bool = False

    @classmethod
    def of_plan(cls, plan: Plan, device: torch.device, overlap: float = 0.5,
                mirror: bool = False) -> Windows:  # fmt: skip
        """The plan's windows, batched as the device allows (window_batch)."""
        return cls(list(plan.patch_size), overlap, window_batch(device, plan.batch_size), mirror)


def _as_models(model: nn.Module | list[nn.Module]) -> list[nn.Module]:
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    for m in models:
        m.eval()
    return models


@torch.no_grad()
def predict_slabs(
    model: nn.Module | list[nn.Module], image: np.ndarray, windows: Windows, device: torch.device
) -> Iterator[tuple[int, int, int, torch.Tensor]]:
    """(axis, first plane, end plane, float32 logits [C, …]) of each finished slab of one
    preprocessed image [C, X, Y, Z]: MONAI's Gaussian sliding window; with mirroring, each
    window's logits averaged over all axis flips (nnU-Net's test-time mirroring); several
    models' logits averaged."""
    flips = mirror_axes(windows.patch_size, windows.mirror)
    predictor = MirroredWindows(_as_models(model), flips, windows.batch)
    per_pass = max(1, windows.batch // len(flips))
    yield from stream_slabs(predictor, image, windows.patch_size, device, windows.overlap,
                            per_pass)  # fmt: skip


def _at(axis: int, lo: int, hi: int, lead: int = 1) -> tuple[slice, ...]:
    """The index of planes [lo, hi) along spatial `axis` of an array with `lead` leading axes."""
    return (slice(None),) * (lead + axis) + (slice(lo, hi),)


def predict_logits(
    model: nn.Module | list[nn.Module], image: np.ndarray, windows: Windows, device: torch.device
) -> torch.Tensor:
    """[C, X, Y, Z] float32 logits of one preprocessed image on the CPU (every class of the
    whole case in one buffer: for an ensemble's or a test's use; prediction itself reduces the
    slabs as they finish)."""
    out = None
    for axis, lo, hi, slab in predict_slabs(model, image, windows, device):
        if out is None:
            out = torch.empty((slab.shape[0], *image.shape[1:]), dtype=torch.float32)
        out[_at(axis, lo, hi)] = slab.cpu()
    return out


def to_probs(logits: torch.Tensor, sigmoid: bool = False) -> torch.Tensor:
    """Class probabilities (softmax over dim 0) or region probabilities (sigmoid)."""
    return torch.sigmoid(logits) if sigmoid else torch.softmax(logits, 0)


def logits_to_labels(logits: torch.Tensor, classes: LabelSet) -> np.ndarray:
    """`to_labels` of the probabilities, from the logits (softmax keeps the arg-max, sigmoid >
    0.5 is logit > 0), without a probability volume."""
    if classes.regions:
        out = torch.zeros(logits.shape[1:], dtype=torch.uint8, device=logits.device)
        for r, value in enumerate(classes.region_order):
            out[logits[r] > 0] = value
        return out.cpu().numpy()
    # a running maximum class by class: torch's arg-max over the leading axis of a slab view
    # is several times slower; `>` keeps the first of equal logits, as arg-max does
    best, out = logits[0].clone(), torch.zeros(logits.shape[1:], dtype=torch.uint8,
                                               device=logits.device)  # fmt: skip
    for c in range(1, logits.shape[0]):
        higher = logits[c] > best
        out[higher] = c
        torch.maximum(best, logits[c], out=best)
    if bool(torch.isnan(best).any()):
        raise VoxjetError(
            "the network's output holds NaN logits (its weights are broken, e.g. a training "
            "that diverged): evaluate or predict with another checkpoint, or retrain"
        )
    return out.cpu().numpy()


def to_labels(probs: torch.Tensor, classes: LabelSet) -> np.ndarray:
    """A label map [X, Y, Z] uint8: arg-max of class probabilities, or for regions each region
    above 0.5 written in regions_class_order (a later, smaller region overwrites)."""
    if classes.regions:
        out = torch.zeros(probs.shape[1:], dtype=torch.uint8)
        for r, value in enumerate(classes.region_order):
            out[probs[r] > 0.5] = value
        return out.numpy()
    return probs.argmax(0).numpy().astype(np.uint8)


@torch.no_grad()
def segment_image(
    model: nn.Module | list[nn.Module],
    image: np.ndarray,
    windows: Windows,
    device: torch.device,
    *,
    classes: LabelSet,
    probabilities: bool = False,
    probability_sink: Callable[[int, int, int, torch.Tensor], None] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(label map [X, Y, Z] uint8, and with `probabilities` the class or region probabilities
    [C, X, Y, Z] float32, else None) of one preprocessed image, each slab reduced as it
    finishes; `probability_sink` is handed each slab's probabilities instead (axis, first and
    end plane, [C, …]), to write them out without holding them."""
    labels = np.zeros(image.shape[1:], np.uint8)
    probs = None
    for axis, lo, hi, slab in predict_slabs(model, image, windows, device):
        labels[_at(axis, lo, hi, 0)] = logits_to_labels(slab, classes)
        if probability_sink is not None:
            probability_sink(axis, lo, hi, to_probs(slab, bool(classes.regions)))
        elif probabilities:
            if probs is None:
                probs = np.empty((slab.shape[0], *image.shape[1:]), np.float32)
            probs[_at(axis, lo, hi)] = to_probs(slab, bool(classes.regions)).cpu().numpy()
    return labels, probs
