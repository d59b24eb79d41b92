"""Experiment planning after nnU-Net's rules (its experiment_planning, apart from the
preprocessing that applies the plan): target spacing, the median case shape after resampling to
it, a network topology derived from the patch and the spacing — per axis, pooling only while the
axis' spacing is within 2x of the finest and its feature map stays at least 4 voxels, kernel 1
along an axis still too coarse — and the patch and batch that fit the GPU memory budget for that
network, which is what an experiment with `model: {name: dynunet}` trains.

Memory is estimated for the network actually built, on the meta device (no memory used): the
elements its layers output in a forward pass — what autograd keeps for backward — plus weights,
gradients and the optimiser's moments; see `estimate_bytes`. Training records the estimate for
the network it trains (a `unet` of the experiment's widths, or the plan's `dynunet`)."""

from __future__ import annotations

import math

import numpy as np

from voxjet.errors import VoxjetError

GIB = 1024**3
DEFAULT_GPU_MEMORY_GB = 8.0  # volumes.gpu_memory_gb null with the voxjet planner (nnU-Net's 8)
MIN_FEATURE = 4  # nnU-Net stops pooling an axis before its feature map falls below this
# bytes a layer-output element costs in a training step: measured on CPU against the peak a
# forward and backward pass adds (tests/memory_probe.py; float32, InstanceNorm) it is 5.3-5.9
# for DynUNets and 4.3-7.1 for MONAI UNets of the sizes planned; the largest, so the estimate
# errs on the high side
BYTES_PER_OUTPUT = 7.0


def target_spacing(spacings: list[list[float]]) -> list[float]:
    """nnU-Net's rule: the median spacing, but the 10th percentile on an axis more than 3x
    coarser than the others (so thick-slice data is not upsampled in-plane)."""
    sp = np.asarray(spacings, float)
    target = np.median(sp, 0)
    worst = int(np.argmax(target))
    others = [i for i in range(3) if i != worst]
    if target[worst] > 3 * max(target[others]):
        target[worst] = np.percentile(sp[:, worst], 10)
    return target.tolist()


def resampled_shapes(shapes: list[list[int]], spacings: list[list[float]],
                     target: list[float]) -> np.ndarray:  # fmt: skip
    """Each case's (cropped) shape once resampled to `target`."""
    return np.maximum(1, np.round(np.asarray(shapes) * np.asarray(spacings) / np.asarray(target)))


def topology(spacing: list[float], patch: list[int], max_levels: int) -> dict:
    """Kernel sizes and strides a level (the first level's stride 1), nnU-Net's rule; as many
    axes as the spacing has (3D, or a 2D configuration's in-plane two)."""
    sp = np.asarray(spacing, float)
    size = np.asarray(patch, int)

    def kernel(s: np.ndarray) -> list[int]:
        return [3 if si <= 2 * s.min() else 1 for si in s]

    kernels, strides = [kernel(sp)], [[1] * len(sp)]
    for _ in range(max_levels):
        can = [bool(sp[i] <= 2 * sp.min() and size[i] // 2 >= MIN_FEATURE) for i in range(len(sp))]
        if not any(can):
            break
        st = [2 if c else 1 for c in can]
        sp, size = sp * st, size // st
        strides.append(st)
        kernels.append(kernel(sp))
    return {"kernels": kernels, "strides": strides}


def divisors(strides: list[list[int]], min_divisor: int = 1) -> list[int]:
    """What each axis of a patch must divide by: the product of its strides (and `min_divisor`,
    so the plan's patch also suits a U-Net of `network_depth` isotropic levels)."""
    prod = np.prod(np.asarray(strides), axis=0)
    return [int(math.lcm(int(p), min_divisor)) for p in prod]


def default_filters(levels: int) -> list[int]:
    """nnU-Net's widths: 32 doubling to at most 320, one a level."""
    return [min(32 * 2**i, 320) for i in range(levels)]


def layer_output_elements(model, in_channels: int, patch: list[int]) -> float:
    """Elements every leaf layer outputs in one forward pass of one sample (meta device), an
    in-place layer's output (the same memory as its input) not counted twice."""
    import copy

    import torch

    seen: list[int] = []

    def count(module, inputs, output) -> None:
        if getattr(module, "inplace", False):
            return
        for o in output if isinstance(output, tuple | list) else [output]:
            if torch.is_tensor(o):
                seen.append(o.numel())

    meta = copy.deepcopy(model).to("meta").train()
    hooks = [m.register_forward_hook(count) for m in meta.modules() if not list(m.children())]
    with torch.no_grad():
        meta(torch.empty(1, in_channels, *patch, device="meta"))
    for h in hooks:
        h.remove()
    return float(sum(seen))


def estimate_bytes(model, in_channels: int, patch: list[int], batch: int,
                   gpu: bool = True) -> float:  # fmt: skip
    """Peak bytes of a training step of `model` on `batch` patches: layer outputs kept for
    backward, 16 bytes a parameter (weights, gradients, Adam's two moments), and on a GPU about
    1 GiB of CUDA context and workspaces."""
    acts = batch * layer_output_elements(model, in_channels, patch) * BYTES_PER_OUTPUT
    params = sum(p.numel() for p in model.parameters()) * 16
    return acts + params + (GIB if gpu else 0)


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
    import torch

    from voxjet.volumes.models import build_dynunet

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


def check_model_against_plan(model_cfg: dict, plan: dict, where: str) -> None:
    """A U-Net's depth must suit the plan's patch: every patch axis divisible by 2^levels (a
    2D configuration's slice axis, one voxel thick, aside)."""
    if model_cfg.get("name") != "unet":
        return
    levels = len(model_cfg["channels"]) - 1
    thin = plan.get("slice_axis")
    bad = [p for a, p in enumerate(plan["patch_size"]) if a != thin and p % 2**levels]
    if bad:
        raise VoxjetError(
            f"{where}: a U-Net of {levels + 1} levels halves each axis {levels} times, but the "
            f"plan's patch {plan['patch_size']} is not divisible by {2**levels}; give "
            f"model.channels {plan['config']['network_depth'] + 1} entries (the dataset's "
            "volumes.network_depth + 1), or use model: {name: dynunet}, which follows the plan"
        )


# the page cache must hold a mapped dataset beside the training processes' own memory
MAPPED_SHARE = 0.5


def node_memory_bytes() -> int:
    """Physical memory of this machine."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_storage(requested: str, decoded_bytes: float, node_memory: float) -> dict:
    """The case store (`volumes.storage`) and why: `auto` takes `mapped` (the fastest while
    the page cache holds the data) when the training cases' decoded arrays fit in MAPPED_SHARE
    of a node's memory, else `blosc2` (the fewest bytes a patch from disk); benchmarks/README.md
    has the measurements behind the rule."""
    sizes = {"decoded_dataset_gb": decoded_bytes / GIB, "node_memory_gb": node_memory / GIB}
    if requested != "auto":
        return {"store": requested, "reason": "set by volumes.storage", **sizes}
    fits = decoded_bytes <= MAPPED_SHARE * node_memory
    reason = (
        f"the training cases' decoded arrays ({decoded_bytes / GIB:.2f} GiB) "
        + ("fit in" if fits else "exceed")
        + f" {MAPPED_SHARE:.0%} of a node's memory ({node_memory / GIB:.1f} GiB): "
        + (
            "mapped files are read from the page cache"
            if fits
            else "blosc2 files read the fewest bytes a patch from disk"
        )  # fmt: skip
    )
    return {"store": "mapped" if fits else "blosc2", "reason": reason, **sizes}
