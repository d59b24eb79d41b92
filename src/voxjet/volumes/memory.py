"""How much memory a training step of MONAI's 3D U-Net takes, for planning patch size, batch
size and pipeline stages from a per-GPU budget.

The model: activations kept for the backward pass scale with the feature maps of every
resolution level, S = sum_l c_l * V_l (c_l channels, V_l = voxels of the patch / 8**l), plus
full-resolution tensors of few channels (input, output, decoder concatenations, loss terms),
V_0. Per sample, elements = a * S + b * V_0 with a = 0.616 + 0.375 r and b = 52.6 + 29.5 r,
r = num_res_units. The constants were fitted to the peak resident memory that a forward and
backward pass adds on CPU (float32, InstanceNorm; measured in tests/memory_probe.py) for
patches 64x64x32 to 96x96x48 and channels (16..128) to (32..256); the estimate lands within
about 30% of the measurement and errs on the high side. Weights, gradients and Adam's two
moments add 16 bytes a parameter. On a GPU the CUDA context and cuDNN workspaces take about
1 GiB more; activations are still counted at 4 bytes there, since autocast keeps normalisation
layers and many saved tensors in float32.
"""

from __future__ import annotations

import math

import numpy as np

GIB = 1024**3


def unet_parameters(
    channels: list[int], in_channels: int, out_channels: int, num_res_units: int = 1
) -> int:
    """Parameters of MONAI's UNet with these widths (3x3x3 convolutions), counted exactly by
    building it on the meta device (no memory used)."""
    import torch

    from voxjet.volumes.models import build_unet

    with torch.device("meta"):
        model = build_unet(in_channels, out_channels, channels, num_res_units)
    return sum(p.numel() for p in model.parameters())


def activation_elements(patch: list[int], channels: list[int], num_res_units: int = 1) -> float:
    """Activation elements kept for backward, per sample (see the module docstring)."""
    v0 = float(np.prod(patch))
    s = sum(c * v0 / 8**level for level, c in enumerate(channels))
    a = 0.616 + 0.375 * num_res_units
    b = 52.6 + 29.5 * num_res_units
    return a * s + b * v0


def estimate_bytes(
    patch: list[int],
    channels: list[int],
    batch: int,
    in_channels: int = 1,
    out_channels: int = 2,
    num_res_units: int = 1,
    gpu: bool = True,
) -> float:
    """Peak bytes of one training step: activations, weights, gradients, optimiser state."""
    # 4 bytes on GPU too: autocast keeps normalisation and many saved tensors in float32
    per_element = 4
    acts = batch * activation_elements(patch, channels, num_res_units) * per_element
    params = unet_parameters(channels, in_channels, out_channels, num_res_units) * 16
    return acts + params + (GIB if gpu else 0)


def plan_patch_and_batch(
    median_shape: list[float],
    channels: list[int],
    budget_gb: float,
    in_channels: int,
    out_channels: int,
    dataset_voxels: float,
    patch: list[int] | None = None,
    num_res_units: int = 1,
) -> dict:
    """nnU-Net's way, with our estimate: start from the median case (a multiple of 2**depth),
    shrink the axis that is largest relative to the case until a batch of 2 fits the budget;
    then grow the batch while it fits and its voxels stay under 5% of the dataset's. If even
    the smallest patch (or a patch the config fixed) does not fit, plan K pipeline stages."""
    div = 2 ** (len(channels) - 1)
    median = np.maximum(np.asarray(median_shape, float), div)
    budget = budget_gb * GIB

    def est(p: list[int], b: int) -> float:
        return estimate_bytes(p, channels, b, in_channels, out_channels, num_res_units)

    if patch is None:
        p = [int(max(div, math.ceil(m / div) * div)) for m in median]
        while est(p, 2) > budget and max(p) > div:
            ratios = [pi / mi if pi > div else 0 for pi, mi in zip(p, median, strict=True)]
            p[int(np.argmax(ratios))] -= div
    else:
        p = [
            int(max(div, min(pi, math.ceil(m / div) * div)))
            for pi, m in zip(patch, median, strict=True)
        ]
    batch = 2
    cap = max(2, int(0.05 * dataset_voxels / np.prod(p)))
    while batch < cap and est(p, batch + 1) <= budget:
        batch += 1
    need = est(p, batch)
    stages = max(1, math.ceil(need / budget))
    return {
        "patch_size": p,
        "batch_size": batch,
        "estimated_gpu_memory_gb": need / GIB,
        "pipeline_stages": stages,
        "micro_batches": 1 if stages == 1 else 4 * stages,
    }
