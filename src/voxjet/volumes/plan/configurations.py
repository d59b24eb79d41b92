"""nnU-Net's configurations beside `3d_fullres`: `2d`, a 2D network trained on slices along the
plan's out-of-plane axis (the coarsest; for thick-slice data the one whose neighbours a 3D
kernel would blur), planned as nnU-Net plans it — the fullres spacing and median case without
that axis, the patch and batch sized to the same memory target by the dataset's planner.

A configuration is stored in plan.json under `configurations`, and `Plan.configured` gives the
plan a run of it trains and predicts with: the 2d patch is kept 3D, one voxel thick along the
slice axis, so sampling, sliding-window inference, evaluation and export stay those of the 3D
configuration, and the model (voxjet.volumes.networks.models.SliceWise) applies its 2D network a
slice at a time."""

from __future__ import annotations

import numpy as np

from voxjet.volumes.plan.resenc import permute_network, plan_resenc
from voxjet.volumes.plan.sizing import plan_patch_and_batch
from voxjet.volumes.plan.topology import nnunet_axes

LOWRES_THRESHOLD = 0.25  # nnU-Net's lowres_creation_threshold: patch / median case voxels
SPACING_STEP = 1.03  # nnU-Net's spacing_increase_factor


def slice_axis(spacing: list[float]) -> int:
    """The RAS axis a 2d configuration slices along: nnU-Net's first axis (the coarsest
    spacing, the first of equals in its z, y, x order)."""
    return nnunet_axes(list(spacing))[0]


def in_plane(axis: int) -> list[int]:
    """The two RAS axes of a slice, in order (the 2D network's u, v)."""
    return [a for a in range(3) if a != axis]


def _thicken(patch2d: list[int], axis: int) -> list[int]:
    patch = list(patch2d)
    patch.insert(axis, 1)
    return [int(p) for p in patch]


def _sized_2d_voxjet(sized: dict, dataset_voxels: float, in_channels: int, out_channels: int,
                     budget_gb: float, depth: int, filters: list[int] | None) -> dict:  # fmt: skip
    axis = slice_axis(sized["target_spacing"])
    uv = in_plane(axis)
    spacing = [sized["target_spacing"][a] for a in uv]
    median = [sized["median_shape_resampled"][a] for a in uv]
    out = plan_patch_and_batch(spacing, median, dataset_voxels, in_channels, out_channels,
                               budget_gb, depth, filters=filters)  # fmt: skip
    return {**out, "slice_axis": axis, "patch_size": _thicken(out["patch_size"], axis)}


def _sized_2d_resenc(sized: dict, dataset_voxels: float, in_channels: int, out_channels: int,
                     preset: str, gpu_memory_gb: float | None) -> dict:  # fmt: skip
    order = sized["nnunet_axes"]
    axis = order[0]
    # nnU-Net plans the slice in its own order of the two in-plane axes; voxjet's is RAS
    nn2d = order[1:]
    out = plan_resenc([sized["target_spacing"][a] for a in nn2d],
                      [sized["median_shape_resampled"][a] for a in nn2d], dataset_voxels,
                      in_channels, out_channels, preset, gpu_memory_gb)  # fmt: skip
    back = [nn2d.index(a) for a in in_plane(axis)]
    network = dict(out["network"])
    for key in ("kernels", "strides"):
        network[key] = [[row[i] for i in back] for row in network[key]]
    patch = [out["patch_size"][i] for i in back]
    return {**out, "network": network, "slice_axis": axis, "patch_size": _thicken(patch, axis),
            "nnunet_patch_size": out["patch_size"], "pipeline_stages": 1,
            "micro_batches": 1}  # fmt: skip


def plan_2d(sized: dict, dataset_voxels: float, in_channels: int, out_channels: int,
            planner: str, gpu_memory_gb: float, depth: int,
            filters: list[int] | None = None) -> dict:  # fmt: skip
    """The 2d configuration for a dataset whose 3d_fullres plan is `sized` (target spacing,
    resampled median case; for a ResEnc preset also nnU-Net's axis order): slice axis, patch
    (one voxel thick along it), batch and 2D network, sized by the same planner and memory."""
    if planner == "voxjet":
        return _sized_2d_voxjet(sized, dataset_voxels, in_channels, out_channels,
                                gpu_memory_gb, depth, filters)  # fmt: skip
    return _sized_2d_resenc(sized, dataset_voxels, in_channels, out_channels, planner,
                            gpu_memory_gb)  # fmt: skip


def _lowres_at(spacing: np.ndarray, median: list[int], voxels: float, in_channels: int,
               out_channels: int, planner: str, gpu_memory_gb: float, depth: int,
               filters: list[int] | None, patch: list[int] | None) -> dict:  # fmt: skip
    if planner == "voxjet":
        return plan_patch_and_batch(spacing.tolist(), median, voxels, in_channels, out_channels,
                                    gpu_memory_gb, depth, filters=filters, patch=patch)  # fmt: skip
    order = nnunet_axes(spacing.tolist())
    back = [order.index(a) for a in range(3)]
    out = plan_resenc([float(spacing[a]) for a in order], [median[a] for a in order], voxels,
                      in_channels, out_channels, planner, gpu_memory_gb)  # fmt: skip
    return {**out, "patch_size": [out["patch_size"][i] for i in back],
            "network": permute_network(out["network"], back), "nnunet_axes": order,
            "pipeline_stages": 1, "micro_batches": 1}  # fmt: skip


def plan_lowres(sized: dict, n_cases: int, in_channels: int, out_channels: int, planner: str,
                gpu_memory_gb: float, depth: int, filters: list[int] | None = None,
                patch: list[int] | None = None) -> dict | None:  # fmt: skip
    """nnU-Net's 3d_lowres rule: while the fullres patch covers less than a quarter of the
    median case, coarsen the spacing by 3% a step (the axes more than 2× finer than the
    coarsest first) and plan patch and batch again for the median case at that spacing; none
    when the patch already covers a quarter, or the low-resolution case has not half the
    voxels of the full-resolution one."""
    full = np.asarray(sized["target_spacing"], float)
    median = np.asarray(sized["median_shape_resampled"], float)
    spacing = full.copy()
    median_voxels = float(np.prod(median, dtype=np.float64))
    patch_voxels = float(np.prod(sized["patch_size"], dtype=np.float64))
    plan = shape = None
    while patch_voxels / median_voxels < LOWRES_THRESHOLD:
        finer = spacing.max() / spacing > 2
        if finer.any():
            spacing[finer] *= SPACING_STEP
        else:
            spacing *= SPACING_STEP
        scaled = full / spacing * median
        median_voxels = float(np.prod(scaled, dtype=np.float64))
        shape = [round(float(x)) for x in scaled]
        plan = _lowres_at(spacing, shape, median_voxels * n_cases, in_channels, out_channels,
                          planner, gpu_memory_gb, depth, filters, patch)  # fmt: skip
        patch_voxels = float(np.prod(plan["patch_size"], dtype=np.float64))
    if plan is None or np.prod(median, dtype=np.float64) / median_voxels < 2:
        return None
    return {**plan, "target_spacing": [float(x) for x in spacing],
            "median_shape_resampled": [float(x) for x in shape]}  # fmt: skip
