"""Experiment planning (voxjet.volumes.plan): target spacing, the resampled median shape,
the network topology, the memory estimate of the network trained, patch and batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.msd import Case, MSDDataset
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.plan.experiment import make_plan
from voxjet.volumes.plan.memory import estimate_bytes
from voxjet.volumes.plan.plan_file import Plan
from voxjet.volumes.plan.resenc import plan_resenc_dataset
from voxjet.volumes.plan.sizing import check_model_against_plan, plan_patch_and_batch
from voxjet.volumes.plan.spacing import target_spacing
from voxjet.volumes.plan.topology import topology


def _dataset(channels=("CT",), labels=None) -> MSDDataset:
    labels = labels or {0: "background", 1: "organ"}
    return MSDDataset(Path("/nowhere"), list(channels), labels, [Case("a", ("a.nii.gz",), "l")])


def _fingerprint(spacings, shapes) -> dict:
    return {"spacings": spacings, "shapes": shapes, "median_spacing": np.median(spacings, 0)}


def test_target_spacing_is_nnunets_rule_for_both_planners():
    """nnU-Net 2.8.1's determine_fullres_target_spacing (tests/data/nnunet_metrics.json,
    recorded by benchmarks/metric_references.py) on an isotropic dataset, thick slices with few
    and with many slices, and mixed spacings whose 10th percentile is finer than in-plane (with
    few slices: clamped to in-plane; with many: the median kept, where voxjet's first rule
    planned 0.4 mm): voxjet's rule gives the same, and the default planner and a ResEnc preset
    plan with it."""
    recorded = json.loads((Path(__file__).parent / "data" / "nnunet_metrics.json").read_text())
    for name, d in recorded["target_spacing"].items():
        got = target_spacing(d["spacings"], d["shapes"])
        assert got == pytest.approx(d["target_spacing"], abs=1e-9), name
        # the planners on cases a tenth the size (the rule compares shapes by ratio: the same
        # decision, a smaller patch to plan)
        small = [[max(1, s // 10) for s in shape] for shape in d["shapes"]]
        fp = _fingerprint(d["spacings"], small)
        default = make_plan(fp, _dataset(), VolumePrepConfig(network_depth=3))
        resenc = plan_resenc_dataset(d["spacings"], small, 1, 2, "resenc_m")
        assert default.target_spacing == pytest.approx(d["target_spacing"], abs=1e-9), name
        assert resenc["target_spacing"] == pytest.approx(d["target_spacing"], abs=1e-9), name
    assert recorded["target_spacing"]["mixed_many_slices"]["target_spacing"][2] == 2.0


def test_mixed_spacings_plan_the_resampled_median_with_anisotropic_strides():
    """Cases of one anatomy stored at 1, 2 and 3 mm slices: the plan's median shape is the
    median after resampling to the target spacing (not of the native voxel counts), and the
    network does not pool the thick axis until the spacings are comparable."""
    spacings = [[0.8, 0.8, 1.0], [0.8, 0.8, 1.0], [0.8, 0.8, 2.0], [0.8, 0.8, 2.0], [0.8, 0.8, 2.0]]
    extent_mm = [[160, 160, 150], [160, 160, 150], [160, 160, 120], [160, 160, 120],
                 [160, 160, 200]]  # fmt: skip
    shapes = np.round(np.array(extent_mm) / np.array(spacings)).astype(int).tolist()
    fp = _fingerprint(spacings, shapes)
    plan = make_plan(fp, _dataset(), VolumePrepConfig(network_depth=5, gpu_memory_gb=8)).to_dict()
    target = plan["target_spacing"]
    assert target == pytest.approx([0.8, 0.8, 2.0])
    want = np.median(np.round(np.array(shapes) * np.array(spacings) / np.array(target)), 0)
    assert plan["median_shape_resampled"] == want.tolist() == [200.0, 200.0, 75.0]
    assert np.median(shapes, 0)[2] == 100  # what the median of native voxel counts says
    strides = plan["network"]["strides"]
    assert strides[0] == [1, 1, 1]
    # 0.8 vs 2.0 mm: x and y pool first, z once their spacing has caught up (1.6 mm)
    assert strides[1] == [2, 2, 1] and strides[2] == [2, 2, 2]
    assert plan["network"]["kernels"][0] == [3, 3, 1]  # no 3-wide kernel across thick slices
    assert plan["network"]["kernels"][1] == [3, 3, 3]
    # the patch divides by each axis' product of strides, and the batch fits the budget
    for axis in range(3):
        assert plan["patch_size"][axis] % int(np.prod([s[axis] for s in strides])) == 0
    assert plan["estimated_gpu_memory_gb"] <= 8 and plan["batch_size"] >= 2


def test_topology_levels_come_from_the_patch():
    topo = topology([1.0, 1.0, 1.0], [64, 64, 16], max_levels=6)
    # z stops pooling at 4 voxels (16 → 8 → 4), x and y go on to 4 as well (64 → … → 4)
    assert topo["strides"] == [[1, 1, 1], [2, 2, 2], [2, 2, 2], [2, 2, 1], [2, 2, 1]]


def test_plan_shrinks_patch_to_budget_then_plans_pipeline_stages():
    sp, med = [1.0, 1.0, 1.0], [300, 300, 200]
    big = plan_patch_and_batch(sp, med, 1e10, 1, 2, 4.0, 4)
    small = plan_patch_and_batch(sp, med, 1e10, 1, 2, 12.0, 4)
    assert np.prod(big["patch_size"]) < np.prod(small["patch_size"])
    assert all(p % 16 == 0 for p in big["patch_size"]) and big["pipeline_stages"] == 1
    assert big["estimated_gpu_memory_gb"] <= 4.0
    # a fixed patch too large for one GPU: cut the model into stages
    fixed = plan_patch_and_batch([1.0] * 3, [512] * 3, 1e10, 1, 2, 8.0, 4, patch=[256] * 3)
    assert fixed["patch_size"] == [256, 256, 256] and fixed["pipeline_stages"] >= 2
    assert fixed["estimated_gpu_memory_gb"] / fixed["pipeline_stages"] <= 8.0
    # the batch stays under 5% of the dataset's voxels
    tiny = plan_patch_and_batch(
        [1.0] * 3, [32] * 3, 32**3 * 100, 1, 2, 80.0, 2, filters=[8, 16, 32]
    )
    assert tiny["batch_size"] * 32**3 <= 0.05 * 32**3 * 100


def test_plan_patch_fits_median_case_and_network():
    fp = _fingerprint([[1, 1, 1]] * 3, [[70, 50, 20]] * 3)
    cfg = VolumePrepConfig(patch_size=[64, 64, 64], network_depth=3)
    plan = make_plan(fp, _dataset(), cfg).to_dict()
    # capped to the median case, rounded up to what 3 isotropic levels divide
    assert plan["patch_size"] == [64, 56, 24] and plan["normalization"] == ["ct"]
    assert plan["batch_size"] >= 2 and plan["pipeline_stages"] == 1
    two = make_plan(fp, _dataset(("T1", "noNorm")), cfg).to_dict()
    assert two["normalization"] == ["zscore", "none"] and two["channels"] == ["T1", "noNorm"]


def test_plan_channels_are_the_estimated_network_and_must_cover_its_levels():
    fp = _fingerprint([[1, 1, 1]] * 3, [[64, 64, 64]] * 3)
    cfg = VolumePrepConfig(network_depth=3, plan_channels=[4, 8, 16, 32])
    narrow = make_plan(fp, _dataset(), cfg).to_dict()
    wide = make_plan(fp, _dataset(), VolumePrepConfig(network_depth=3)).to_dict()
    assert narrow["network"]["filters"] == [4, 8, 16, 32]
    assert narrow["estimated_gpu_memory_gb"] < wide["estimated_gpu_memory_gb"]
    with pytest.raises(VoxjetError, match="plan_channels has 2 widths, but the planned network"):
        make_plan(fp, _dataset(), VolumePrepConfig(network_depth=3, plan_channels=[4, 8]))


def test_a_unet_deeper_than_the_plan_is_refused_naming_the_fix():
    plan = Plan(labels={0: "background", 1: "organ"}, num_classes=2, channels=["CT"],
                normalization=["ct"], target_spacing=[1.0] * 3, patch_size=[64, 64, 24],
                batch_size=2, network_depth=3)  # fmt: skip
    check_model_against_plan({"name": "unet", "channels": [8, 16, 32, 64]}, plan, "plan.json")
    with pytest.raises(VoxjetError, match=r"plan.json: a U-Net of 5 levels .* not divisible by 16"):
        check_model_against_plan({"name": "unet", "channels": [8] * 5}, plan, "plan.json")


@pytest.mark.parametrize(
    "cfg,patch,batch",
    [
        # configurations the constant was not fitted on
        ({"name": "unet", "channels": [24, 48, 96], "num_res_units": 1}, [72, 72, 32], 2),
        (
            {
                "name": "dynunet",
                "network": {
                    "kernels": [[3, 3, 1], [3, 3, 3], [3, 3, 3]],
                    "strides": [[1, 1, 1], [2, 2, 1], [2, 2, 2]],
                    "filters": [16, 32, 64],
                },
            },
            [64, 64, 24],
            2,
        ),
        (
            {
                "name": "resenc",
                "network": {
                    "kernels": [[3, 3, 1], [3, 3, 3], [3, 3, 3]],
                    "strides": [[1, 1, 1], [2, 2, 1], [2, 2, 2]],
                    "filters": [16, 32, 64],
                    "blocks_per_stage": [1, 3, 4],
                    "decoder_convs": [1, 1],
                },
            },
            [64, 64, 24],
            2,
        ),
    ],  # fmt: skip
)
def test_memory_estimate_bounds_a_measured_peak_on_cpu(cfg, patch, batch):
    """The planner's estimate of the network it plans for, against the memory a forward and
    backward pass of that network really adds (CPU, a fresh process): never below it, and
    not so far above that the plan wastes half the GPU."""
    from memory_probe import measure_peak_bytes

    from voxjet.volumes.networks.models import build_seg_model

    cfg = {**cfg, "in_channels": 1, "out_channels": 3}
    measured = measure_peak_bytes(cfg, patch, batch)
    estimated = estimate_bytes(build_seg_model(cfg), 1, patch, batch, gpu=False)
    assert 1.0 <= estimated / measured < 1.8, (estimated, measured)


def test_auto_storage_maps_what_the_page_cache_holds_and_packs_the_rest():
    from voxjet.volumes.plan.memory import GIB
    from voxjet.volumes.plan.storage import choose_storage

    fits = choose_storage("auto", 10 * GIB, 64 * GIB)
    assert fits["store"] == "mapped" and "fit in 50%" in fits["reason"]
    big = choose_storage("auto", 40 * GIB, 64 * GIB)
    assert big["store"] == "blosc2" and "40.00 GiB" in big["reason"]
    assert big["decoded_dataset_gb"] == 40 and big["node_memory_gb"] == 64
    # a store the config names is kept, whatever the sizes
    assert choose_storage("mapped", 40 * GIB, 1 * GIB)["store"] == "mapped"
