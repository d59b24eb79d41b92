"""voxjet's planner (`volumes.plan: voxjet`), after nnU-Net's rules: start from the resampled
median case, derive the topology for the patch, shrink the axis largest relative to the case
until a batch of 2 fits the GPU memory budget of the network actually built (its estimate:
voxjet.volumes.plan.memory), grow the batch while it fits and stays under 5% of the dataset;
where even the smallest patch does not fit, cut the network into pipeline stages. What an
experiment with `model: {name: dynunet}` trains."""

from __future__ import annotations

import math

import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.volumes.networks.models import build_dynunet
from voxjet.volumes.plan.memory import GIB, estimate_bytes
from voxjet.volumes.plan.plan_file import Plan
from voxjet.volumes.plan.topology import divisors, topology

DEFAULT_GPU_MEMORY_GB = 8.0  # volumes.gpu_memory_gb null with the voxjet planner (nnU-Net's 8)


def default_filters(levels: int) -> list[int]:
    """nnU-Net's widths: 32 doubling to at most 320, one a level."""
    return [min(32 * 2**i, 320) for i in range(levels)]


def level_filters(filters: list[int] | None, levels: int) -> list[int]:
    """The widths of a planned network of `levels` levels: the given ones (cut to the levels)
    or nnU-Net's."""
    if filters is None:
        return default_filters(levels)
    if len(filters) < levels:
        raise VoxjetError(
            f"volumes.plan_channels has {len(filters)} widths, but the planned network has "
            f"{levels} levels; give as many widths (or null for 32 doubling to 320)"
        )
    return list(filters[:levels])


def _planned_net(in_channels: int, out_channels: int, topo: dict, filters: list[int] | None):
    with torch.device("meta"):
        return build_dynunet(in_channels, out_channels, topo["kernels"], topo["strides"],
                             level_filters(filters, len(topo["strides"])))  # fmt: skip


def plan_patch_and_batch(
    spacing: list[float],
    median: list[float],
    dataset_voxels: float,
    in_channels: int,
    out_channels: int,
    budget_gb: float,
    max_levels: int,
    filters: list[int] | None = None,
    patch: list[int] | None = None,
) -> dict:
    """nnU-Net's way: start from the (resampled) median case, derive the topology for the
    patch, shrink the axis largest relative to the case until a batch of 2 fits the budget;
    then grow the batch while it fits and stays under 5% of the dataset's voxels. If even the
    smallest patch (or one the config fixed) does not fit, plan K pipeline stages."""
    budget = budget_gb * GIB
    median = np.maximum(np.asarray(median, float), 1)
    min_div = 2**max_levels

    def fit(p: list[int]) -> tuple[list[int], dict]:
        topo = topology(spacing, p, max_levels)
        div = divisors(topo["strides"], min_div)
        p = [int(max(d, math.ceil(pi / d) * d)) for pi, d in zip(p, div, strict=True)]
        return p, topology(spacing, p, max_levels)

    def est(p, topo, b) -> float:
        net = _planned_net(in_channels, out_channels, topo, filters)
        return estimate_bytes(net, in_channels, p, b)

    if patch is None:
        p, topo = fit([int(m) for m in median])
        while est(p, topo, 2) > budget:
            div = divisors(topo["strides"], min_div)
            ratios = [pi / mi if pi > d else 0 for pi, mi, d in zip(p, median, div, strict=True)]
            if max(ratios) == 0:
                break
            axis = int(np.argmax(ratios))
            p[axis] -= div[axis]
            p, topo = fit(p)
    else:
        # a given patch is only capped to the median case (then rounded to the divisors)
        p, topo = fit([int(min(pi, math.ceil(m))) for pi, m in zip(patch, median, strict=True)])
    batch = 2
    cap = max(2, int(0.05 * dataset_voxels / np.prod(p)))
    while batch < cap and est(p, topo, batch + 1) <= budget:
        batch += 1
    need = est(p, topo, batch)
    stages = max(1, math.ceil(need / budget))
    return {
        "patch_size": p,
        "batch_size": batch,
        "estimated_gpu_memory_gb": need / GIB,
        "pipeline_stages": stages,
        "micro_batches": 1 if stages == 1 else 4 * stages,
        "network": {**topo, "filters": level_filters(filters, len(topo["strides"]))},
    }


def check_model_against_plan(model_cfg: dict, plan: Plan, where: str) -> None:
    """A U-Net's depth must suit the plan's patch: every patch axis divisible by 2^levels (a
    2D configuration's slice axis, one voxel thick, aside)."""
    if model_cfg.get("name") != "unet":
        return
    levels = len(model_cfg["channels"]) - 1
    thin = plan.slice_axis
    bad = [p for a, p in enumerate(plan.patch_size) if a != thin and p % 2**levels]
    if bad:
        raise VoxjetError(
            f"{where}: a U-Net of {levels + 1} levels halves each axis {levels} times, but the "
            f"plan's patch {plan.patch_size} is not divisible by {2**levels}; give "
            f"model.channels {plan.network_depth + 1} entries (the dataset's "
            "volumes.network_depth + 1), or use model: {name: dynunet}, which follows the plan"
        )
