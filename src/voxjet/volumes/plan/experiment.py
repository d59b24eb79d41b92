"""The plan of a dataset assembled from its fingerprint: the 3d_fullres configuration sized by
the dataset's planner (voxjet's, or a ResEnc preset of nnU-Net's), the 2d and (where nnU-Net
would) 3d_lowres and cascade configurations beside it, the label set, each channel's
normalisation and the case store."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.msd import MSDDataset
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.networks.models import build_resenc
from voxjet.volumes.plan.configurations import plan_2d, plan_lowres
from voxjet.volumes.plan.memory import GIB, estimate_bytes
from voxjet.volumes.plan.plan_file import Plan
from voxjet.volumes.plan.resenc import plan_resenc_dataset
from voxjet.volumes.plan.sizing import DEFAULT_GPU_MEMORY_GB, plan_patch_and_batch
from voxjet.volumes.plan.spacing import dataset_voxels, resampled_shapes, target_spacing
from voxjet.volumes.plan.storage import choose_storage, node_memory_bytes


def _sized_by_voxjet(fp: dict, ds: MSDDataset, cfg: VolumePrepConfig) -> dict:
    spacing = cfg.target_spacing or target_spacing(fp["spacings"], fp["shapes"]).tolist()
    shapes = resampled_shapes(fp["shapes"], fp["spacings"], spacing)
    median = np.median(shapes, 0)
    if cfg.plan_channels is not None and len(cfg.plan_channels) < 2:
        raise VoxjetError("volumes.plan_channels: give at least two widths")
    budget = cfg.gpu_memory_gb or DEFAULT_GPU_MEMORY_GB
    sized = plan_patch_and_batch(
        spacing,
        median.tolist(),
        float(np.prod(shapes, axis=1).sum()),
        len(ds.channels),
        ds.num_outputs,
        budget,
        cfg.network_depth,
        filters=cfg.plan_channels,
        patch=cfg.patch_size,
    )
    return {
        "target_spacing": [float(s) for s in spacing],
        "median_shape_resampled": median.tolist(),
        **sized,
        "gpu_memory_gb": budget,
    }


def _sized_by_resenc(fp: dict, ds: MSDDataset, cfg: VolumePrepConfig) -> dict:
    sized = plan_resenc_dataset(fp["spacings"], fp["shapes"], len(ds.channels), ds.num_outputs,
                                cfg.plan, cfg.gpu_memory_gb, spacing=cfg.target_spacing,
                                patch=cfg.patch_size)  # fmt: skip

    with torch.device("meta"):
        net = build_resenc(len(ds.channels), ds.num_outputs, sized["network"])
    need = estimate_bytes(net, len(ds.channels), sized["patch_size"], sized["batch_size"])
    return {**sized, "estimated_gpu_memory_gb": need / GIB, "pipeline_stages": 1,
            "micro_batches": 1}  # fmt: skip


def make_plan(fp: dict, ds: MSDDataset, cfg: VolumePrepConfig) -> Plan:
    """Target spacing, the resampled median case, topology, patch, batch and pipeline stages
    (voxjet's planner, voxjet.volumes.plan.sizing, or a ResEnc preset of nnU-Net's,
    voxjet.volumes.plan.resenc), the other configurations beside
    (voxjet.volumes.plan.configurations), the label set and each channel's normalisation."""
    sized = (_sized_by_voxjet if cfg.plan == "voxjet" else _sized_by_resenc)(fp, ds, cfg)
    shapes = resampled_shapes(fp["shapes"], fp["spacings"], sized["target_spacing"])
    # nnU-Net sizes a ResEnc batch's dataset share by the median case times the cases
    voxels = (dataset_voxels(shapes) if cfg.plan == "voxjet"
              else float(np.prod(sized["median_shape_resampled"]) * len(shapes)))  # fmt: skip
    net = (len(ds.channels), ds.num_outputs, cfg.plan, sized["gpu_memory_gb"])
    configurations = {"2d": plan_2d(sized, voxels, *net, cfg.network_depth, cfg.plan_channels)}
    lowres = plan_lowres(sized, len(shapes), *net, cfg.network_depth, cfg.plan_channels,
                         patch=cfg.patch_size)  # fmt: skip
    if lowres is not None:  # cases several times the patch: nnU-Net's low-resolution stage
        configurations["3d_lowres"] = lowres
        # the full-resolution network fed the low-resolution one's segmentation
        configurations["3d_cascade_fullres"] = {"previous_stage": "3d_lowres"}
    # float32 a channel and a uint8 label a voxel, as training reads them
    decoded = float(np.prod(shapes, axis=1).sum()) * (4 * len(ds.channels) + 1)
    memory = cfg.node_memory_gb * GIB if cfg.node_memory_gb else node_memory_bytes()
    return Plan.from_dict({
        "planner": cfg.plan,
        **sized,
        "network_depth": cfg.network_depth,
        "num_classes": max(ds.labels) + 1,
        "num_outputs": ds.num_outputs,
        "labels": {int(k): v for k, v in ds.labels.items()},
        "ignore_label": ds.ignore,
        "regions": ds.regions,
        "region_order": ds.region_order,
        "channels": ds.channels,
        "modality": ds.modality,
        "normalization": ds.normalizations,
        "storage": choose_storage(cfg.storage, decoded, memory),
        "configurations": configurations,
        "config": asdict(cfg),
    })  # fmt: skip
