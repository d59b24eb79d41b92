"""nnU-Net's residual-encoder presets (`nnUNetPlannerResEncM/L/XL`, nnU-Net 2.8.1), planned as
nnU-Net plans them: the target spacing, the axis order (the coarsest axis first), a start patch of
256³ voxels' volume in the spacing's aspect ratio clipped to the median case, the topology of
`get_pool_and_conv_props` (pooling as deep as the patch allows), and a patch shrunk until the
network's feature maps — counted by MIC-DKFZ's dynamic-network-architectures, the package nnU-Net
builds its networks with — fit the preset's reference for its GPU memory target; the batch then
fills what is left (at least 2).

Everything here works in nnU-Net's axis order; `plan_resenc_dataset` maps voxjet's RAS axes
(x, y, z) to it and back, so a plan equals the one nnU-Net writes for the same fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.volumes.networks.models import BLOCKS_ENCODER, build_resenc_core
from voxjet.volumes.plan.spacing import target_spacing
from voxjet.volumes.plan.topology import nnunet_axes, pool_and_conv_props

BASE_FEATURES = 32
MAX_FEATURES = {2: 512, 3: 320}
MIN_BATCH = 2
REFERENCE_BATCH = {2: 12, 3: 2}
START_VOLUME = {2: 2048**2, 3: 256**3}


@dataclass(frozen=True)
class ResEncPreset:
    """One preset: its GPU memory target and the feature-map elements (dynamic-network-
    architectures' count for one sample) a reference batch may take at that target."""

    gpu_memory_gb: float
    reference_3d: float
    reference_2d: float
    max_dataset_covered: float = 1.0  # the presets do not cap the batch by the dataset's size

    def reference(self, dims: int, gpu_memory_gb: float) -> float:
        """The reference scaled to another memory target, as nnU-Net's -gpu_memory_target."""
        ref = self.reference_3d if dims == 3 else self.reference_2d
        return ref * gpu_memory_gb / self.gpu_memory_gb


PRESETS = {
    "resenc_m": ResEncPreset(8, 680_000_000, 135_000_000),
    "resenc_l": ResEncPreset(24, 2_100_000_000, 380_000_000),
    "resenc_xl": ResEncPreset(40, 3_600_000_000, 560_000_000),
}

# feature-map elements of the smallest network a 3D preset can plan (an 8³ patch, one pooling,
# one input channel, two outputs; tests/test_resenc.py counts it): a memory target whose
# reference is below it fits no patch, whatever the dataset
SMALLEST_3D = 111_616


def smallest_gpu_memory_gb(preset: str) -> float:
    """The memory target below which `preset` fits no 3D patch at all."""
    p = PRESETS[preset]
    return SMALLEST_3D / p.reference_3d * p.gpu_memory_gb


def features_per_stage(stages: int, dims: int) -> list[int]:
    """32 doubling to at most 320 (3D) or 512 (2D), one a stage."""
    return [min(MAX_FEATURES[dims], BASE_FEATURES * 2**i) for i in range(stages)]


def resenc_network(strides: list[list[int]], kernels: list[list[int]]) -> dict:
    """The plan's description of a residual-encoder U-Net for this topology."""
    n = len(strides)
    return {
        "kernels": kernels,
        "strides": strides,
        "filters": features_per_stage(n, len(strides[0])),
        "blocks_per_stage": list(BLOCKS_ENCODER[:n]),
        "decoder_convs": [1] * (n - 1),
    }


def feature_map_elements(network: dict, in_channels: int, out_channels: int,
                         patch: list[int]) -> int:  # fmt: skip
    """dynamic-network-architectures' count of the feature-map elements of one sample through
    the network (what nnU-Net's planners compare with their reference), built on the meta
    device."""
    with torch.device("meta"):
        net = build_resenc_core(in_channels, out_channels, network)
    return int(net.compute_conv_feature_map_size(list(patch)))


def plan_resenc(
    spacing: list[float],
    median: list[float],
    dataset_voxels: float,
    in_channels: int,
    out_channels: int,
    preset: str,
    gpu_memory_gb: float | None = None,
    patch: list[int] | None = None,
) -> dict:
    """A preset's patch, batch and network for the spacing and median shape (nnU-Net's axis
    order), as nnU-Net's `ResEncUNetPlanner.get_plans_for_configuration`. A given `patch` is
    capped to the median case and padded to the topology's divisors, not shrunk."""
    p = PRESETS[preset]
    target_gb = p.gpu_memory_gb if gpu_memory_gb is None else gpu_memory_gb
    dims = len(spacing)
    reference = p.reference(dims, target_gb)
    aspect = 1 / np.asarray(spacing, float)
    start = [round(a) for a in aspect * (START_VOLUME[dims] / np.prod(aspect)) ** (1 / dims)]
    fixed = patch is not None
    start = [min(s, m) for s, m in zip(patch if fixed else start, median, strict=True)]
    strides, kernels, patch, divisor = pool_and_conv_props(spacing, start)
    cache: dict[str, int] = {}

    def estimate(patch: list[int], strides, kernels) -> int:
        key = f"{patch}_{strides}"
        if key not in cache:
            cache[key] = feature_map_elements(resenc_network(strides, kernels), in_channels,
                                              out_channels, patch)  # fmt: skip
        return cache[key]

    est = estimate(patch, strides, kernels)
    while est > reference:
        # nnU-Net's step: the axis largest against the median case (the last of equals) loses
        # the divisor it will have once reduced, so no valid size is skipped
        axis = int(np.argsort([a / b for a, b in zip(patch, median, strict=True)])[-1])
        trial = list(patch)
        trial[axis] -= divisor[axis]
        if fixed or trial[axis] < 1 or len(strides) == 1:
            what = "volumes.patch_size's" if fixed else "even the smallest"
            raise VoxjetError(
                f"volumes.plan {preset}: {what} patch does not fit a {target_gb:g} GB memory "
                f"target: {'×'.join(map(str, patch))} voxels (nnU-Net's axis order) need "
                f"{est:.3g} feature-map elements against the target's {reference:.3g}; raise "
                f"volumes.gpu_memory_gb (the preset's own target is {p.gpu_memory_gb:g} GB)"
                + (
                    ", or give a smaller patch_size (null: planned)"
                    if fixed
                    else ", or choose the voxjet planner, which cuts the network across GPUs"
                )
            )
        *_, divisor = pool_and_conv_props(spacing, trial)
        patch = list(patch)
        patch[axis] -= divisor[axis]
        strides, kernels, patch, divisor = pool_and_conv_props(spacing, patch)
        est = estimate(patch, strides, kernels)
    ref_batch = REFERENCE_BATCH[dims]
    batch = round(reference / est * ref_batch)
    covered = round(dataset_voxels * p.max_dataset_covered / np.prod(patch, dtype=np.float64))
    batch = max(min(batch, covered), MIN_BATCH)
    return {
        "patch_size": [int(x) for x in patch],
        "batch_size": int(batch),
        "network": resenc_network(strides, kernels),
        "feature_map_elements": est,
        "reference_elements": reference,
        "gpu_memory_gb": target_gb,
    }


def permute_network(network: dict, back: list[int]) -> dict:
    per_axis = {k: [[row[i] for i in back] for row in network[k]] for k in ("kernels", "strides")}
    return {**network, **per_axis}


def plan_resenc_dataset(
    spacings: list[list[float]],
    shapes: list[list[int]],
    in_channels: int,
    out_channels: int,
    preset: str,
    gpu_memory_gb: float | None = None,
    spacing: list[float] | None = None,
    patch: list[int] | None = None,
) -> dict:
    """The preset's 3D plan for a dataset's cases (RAS spacings and cropped shapes): nnU-Net's
    target spacing (unless `spacing` is given), the resampled median case, and the patch,
    batch and network, all in voxjet's RAS axis order."""
    if preset not in PRESETS:
        raise VoxjetError(f"volumes.plan {preset!r}: choose one of {sorted(PRESETS)} or voxjet")
    target = np.asarray(spacing if spacing is not None else target_spacing(spacings, shapes))
    new_shapes = [np.round(np.asarray(sp) / target * np.asarray(sh)).astype(int)
                  for sp, sh in zip(spacings, shapes, strict=True)]  # fmt: skip
    median = np.median(new_shapes, 0)
    order = nnunet_axes(target.tolist())
    back = [order.index(a) for a in range(3)]
    voxels = float(np.prod(median[order], dtype=np.float64) * len(shapes))
    out = plan_resenc([float(target[a]) for a in order], [float(median[a]) for a in order],
                      voxels, in_channels, out_channels, preset, gpu_memory_gb,
                      None if patch is None else [patch[a] for a in order])  # fmt: skip
    return {
        **out,
        "target_spacing": [float(t) for t in target],
        "median_shape_resampled": median.tolist(),
        "patch_size": [out["patch_size"][i] for i in back],
        "network": permute_network(out["network"], back),
        "nnunet_axes": order,
    }
