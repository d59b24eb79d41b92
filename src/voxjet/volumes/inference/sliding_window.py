"""MONAI's Gaussian sliding window, streamed: the same windows (MONAI's padding, scan interval
and window starts), the same importance map and the same weighted average, but the windows are
run in order along one axis and the accumulator holds only one window's depth of that axis. A
slab of planes no later window touches is finished: it is handed on (to an arg-max, a softmax,
a file) and its memory reused. A case's logits are never all held at once, so the memory a
case needs grows with its cross-section, not its volume.

The accumulator is float32 on the CPU (half precision is slow there) and float16 on a GPU, as
nnU-Net keeps its logits there; the finished slab is float32 either way."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from monai.data.utils import compute_importance_map, dense_patch_slices
from monai.inferers.utils import _get_scan_interval

SIGMA_SCALE = 0.125  # MONAI's and nnU-Net's Gaussian: sigma = patch / 8


@dataclass(frozen=True)
class WindowGrid:
    """Where MONAI's sliding window puts its windows on an image of `shape`."""

    shape: tuple[int, ...]  # the image's spatial size
    roi: tuple[int, ...]  # the window (the plan's patch)
    pad_lo: tuple[int, ...]  # MONAI's constant padding before each axis (image < window)
    padded: tuple[int, ...]  # the padded image's size
    starts: np.ndarray  # [windows, axes] window starts in the padded image

    @property
    def pad(self) -> list[int]:
        """F.pad's argument for this padding (last axis first)."""
        out = []
        for lo, n, p in reversed(list(zip(self.pad_lo, self.shape, self.padded, strict=True))):
            out += [lo, p - n - lo]
        return out


def window_grid(shape: tuple[int, ...], roi: list[int], overlap: float) -> WindowGrid:
    """MONAI's windows for an image of `shape` (sliding_window_inference's own rules)."""
    shape, roi = tuple(int(s) for s in shape), tuple(int(r) for r in roi)
    padded = tuple(max(s, r) for s, r in zip(shape, roi, strict=True))
    pad_lo = tuple((p - s) // 2 for s, p in zip(shape, padded, strict=True))
    interval = _get_scan_interval(padded, roi, len(roi), (overlap,) * len(roi))
    slices = dense_patch_slices(padded, roi, interval, return_slice=False)
    starts = np.array([[a for a, _ in s] for s in slices], dtype=np.int64)
    return WindowGrid(shape, roi, pad_lo, padded, starts)


def band_axis(grid: WindowGrid) -> int:
    """The axis to stream along: the one whose window depth is the smallest part of the image
    (the accumulator holds one window's depth of it)."""
    return int(np.argmin([r / p for r, p in zip(grid.roi, grid.padded, strict=True)]))


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """float16 on a GPU (nnU-Net's choice there), float32 on the CPU where half is slow."""
    return torch.float16 if device.type == "cuda" else torch.float32


def stream_slabs(
    predictor: Callable[[torch.Tensor], torch.Tensor],
    image: np.ndarray,
    roi: list[int],
    device: torch.device,
    overlap: float = 0.5,
    sw_batch_size: int = 2,
    axis: int | None = None,
    dtype: torch.dtype | None = None,
) -> Iterator[tuple[int, int, int, torch.Tensor]]:
    """(axis, first plane, end plane, float32 logits [C, …] of those planes) for each finished
    slab of `image` [C_in, …] in order along `axis` (by default band_axis), equal to MONAI's
    sliding_window_inference(mode="gaussian") of the same windows; `dtype` the accumulator's
    (by default accumulator_dtype's)."""
    grid = window_grid(image.shape[1:], roi, overlap)
    a = band_axis(grid) if axis is None else axis
    nd = len(grid.roi)
    x = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32))[None]
    if any(grid.pad):
        x = F.pad(x, grid.pad)
    weight = compute_importance_map(grid.roi, "gaussian", SIGMA_SCALE, device, torch.float32)
    acc_dtype = dtype or accumulator_dtype(device)
    # the band axis first: finished planes are a leading block, and the band shifts as one copy
    others = [d for d in range(nd) if d != a]
    perm = [1 + a, 0] + [1 + d for d in others]  # [C, *roi] window → [roi_a, C, *others]
    w_band = weight.permute([a] + others)
    w_count = w_band.unsqueeze(1)  # [roi_a, 1, *others]: broadcast over classes
    w_acc = w_count.to(acc_dtype)
    depth = grid.roi[a]
    acc = count = None
    lo = 0  # the padded plane the band's first row holds
    crop = [slice(grid.pad_lo[d], grid.pad_lo[d] + grid.shape[d]) for d in others]

    def finish(stop: int) -> Iterator[tuple[int, int, int, torch.Tensor]]:
        nonlocal acc, count, lo
        n = stop - lo
        if n <= 0:
            return
        # divided in place where the band is float32: the slab is a view, and the consumer is
        # done with it before the band moves on
        slab = (
            acc[:n].div_(count[:n]) if acc.dtype == torch.float32 else acc[:n].float() / count[:n]
        )
        # unpadded planes only, as MONAI crops its padding off
        first, last = max(lo, grid.pad_lo[a]), min(stop, grid.pad_lo[a] + grid.shape[a])
        if last > first:
            part = slab[first - lo : last - lo][(slice(None), slice(None), *crop)]
            yield a, first - grid.pad_lo[a], last - grid.pad_lo[a], part.movedim(0, 1 + a)
        _shift(acc, n)
        _shift(count, n)
        lo = stop

    for s in np.unique(grid.starts[:, a]):  # MONAI's first window starts at plane 0
        if acc is not None:
            yield from finish(int(s))
        group = grid.starts[grid.starts[:, a] == s]
        for b in range(0, len(group), sw_batch_size):
            batch = group[b : b + sw_batch_size]
            windows = torch.cat([x[_window(w, grid.roi)] for w in batch])
            out = predictor(windows.to(device))
            if acc is None:
                size = [depth, out.shape[1], *(grid.padded[d] for d in others)]
                acc = torch.zeros(size, dtype=acc_dtype, device=device)
                count = torch.zeros([depth, 1, *size[2:]], dtype=torch.float32, device=device)
            for w, o in zip(batch, out, strict=True):
                where = (slice(int(w[a]) - lo, int(w[a]) - lo + depth), slice(None),
                         *(slice(int(w[d]), int(w[d]) + grid.roi[d]) for d in others))  # fmt: skip
                # weighted and added in one pass, without a weighted copy of the window
                acc[where].addcmul_(o.to(acc_dtype).permute(perm), w_acc)
                count[where] += w_count
    yield from finish(grid.padded[a])


def _window(start: np.ndarray, roi: tuple[int, ...]) -> tuple[slice, ...]:
    """The index of the window at `start` in a [1, C, …] image."""
    spatial = (slice(int(s), int(s) + r) for s, r in zip(start, roi, strict=True))
    return (slice(None), slice(None), *spatial)


def _shift(band: torch.Tensor, n: int) -> None:
    """Move the band's rows n… to its front and zero the rest, in place: copied n rows at a
    time front to back, so no copy reads a row an earlier one wrote (no second band)."""
    keep = band.shape[0] - n
    for i in range(0, keep, n):
        m = min(n, keep - i)
        band[i : i + m].copy_(band[i + n : i + n + m])
    band[keep:].zero_()
