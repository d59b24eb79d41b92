"""nnU-Net's ResEnc presets (volumes.plan: resenc_m|l|xl) and the residual-encoder U-Net
(model: resenc): plans equal to nnU-Net 2.8.1's for the same fingerprint, the network trains and
evaluates, memory targets that fit nothing are refused."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from voxjet.errors import VoxjetError
from voxjet.volumes.plan.resenc import (
    PRESETS,
    SMALLEST_3D,
    feature_map_elements,
    plan_resenc_dataset,
    resenc_network,
)
from voxjet.volumes.plan.topology import pool_and_conv_props

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "data" / "nnunet_resenc_toy_ct.json"
NNUNET = importlib.util.find_spec("nnunetv2") is not None
sys.path.insert(0, str(ROOT / "benchmarks"))
import resenc_plans  # noqa: E402  (benchmarks/resenc_plans.py: nnU-Net's side, and the axes)


@pytest.fixture(scope="module")
def nnunet_reference(tmp_path_factory) -> tuple[dict, str]:
    """nnU-Net's fingerprints and ResEnc plans of the demo's toy CT set (as is, and its cases
    six times larger on each axis): run live where nnU-Net is installed (the bench extra),
    else as benchmarks/resenc_plans.py --record wrote them from nnU-Net 2.8.1."""
    if not NNUNET:
        return json.loads(RECORD.read_text()), f"recorded from nnU-Net 2.8.1 ({RECORD.name})"
    tmp = tmp_path_factory.mktemp("nnunet")
    msd = resenc_plans.toy_ct(tmp)
    refs = {"toy_ct": resenc_plans.nnunet_plans(msd, tmp / "a"),
            "toy_ct_x6": resenc_plans.nnunet_plans(msd, tmp / "b", scale=6)}  # fmt: skip
    return refs, "nnU-Net's planner run live"


@pytest.mark.parametrize("cases", ["toy_ct", "toy_ct_x6"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_plan_what_nnunet_plans_for_the_same_fingerprint(nnunet_reference, cases, preset):
    """Patch, batch, spacing and topology equal nnU-Net's `nnUNetPlannerResEnc{M,L,XL}` for the
    toy CT set (patch = the median case, batch capped by the dataset) and for cases as large as
    a clinical CT (the patch shrunk to the preset's memory: a different patch each preset)."""
    refs, source = nnunet_reference
    ref = refs[cases]
    theirs = ref["plans"][preset]
    # nnU-Net's arrays are (z, y, x) as SimpleITK reads the files; voxjet's are RAS (x, y, z)
    spacings = [list(reversed(s)) for s in ref["fingerprint"]["spacings"]]
    shapes = [list(reversed(s)) for s in ref["fingerprint"]["shapes_after_crop"]]
    mine = resenc_plans.in_nnunet_axes(plan_resenc_dataset(spacings, shapes, 1, 3, preset))
    _same_plan(mine, theirs, source)


def _same_plan(mine: dict, theirs: dict, source: str) -> None:
    if "spacing" in mine:
        assert mine.pop("spacing") == pytest.approx(theirs["spacing"]), source
    for key in mine:
        assert mine[key] == theirs[key], (
            f"{key} ({source}): voxjet {mine[key]}, nnU-Net {theirs[key]}"
        )


@pytest.mark.parametrize("cases", ["toy_ct", "toy_ct_x6"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_2d_configurations_are_nnunets_for_the_same_fingerprint(nnunet_reference, cases, preset):
    """The 2d configuration each preset plans beside 3d_fullres: patch, batch, strides and
    kernels equal nnU-Net's (a whole slice and a batch of 316 for the toy set; 448² and the
    batch each memory target allows for the large cases)."""
    refs, source = nnunet_reference
    ref = refs[cases]
    theirs = ref["plans_2d"][preset]
    mine = resenc_plans.voxjet_2d_from(ref["fingerprint"], preset)
    assert mine.pop("slice_axis") == 2  # nnU-Net's first axis, z: the toy CT's thick one
    _same_plan(mine, theirs, source)


@pytest.mark.parametrize("cases", ["toy_ct", "toy_ct_x6"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_3d_lowres_is_planned_where_and_as_nnunet_plans_it(nnunet_reference, cases, preset):
    """nnU-Net's 3d_lowres rule: none for the toy set (the patch is the median case), and for
    the large cases one for ResEnc M only (L's and XL's larger patches cover a quarter of the
    case) — spacing, patch, batch and topology equal nnU-Net's."""
    refs, source = nnunet_reference
    ref = refs[cases]
    theirs = ref["plans_lowres"][preset]
    mine = resenc_plans.voxjet_lowres_from(ref["fingerprint"], preset)
    assert (mine is None) == (theirs is None), f"{source}: voxjet {mine}, nnU-Net {theirs}"
    if theirs is None:
        return
    keys = ("spacing", "patch_size", "batch_size", "strides", "kernels")
    _same_plan({k: mine[k] for k in keys}, theirs, source)


def test_the_large_cases_give_each_preset_its_own_patch(nnunet_reference):
    """The x6 case is where the memory target decides (so the test above can fail)."""
    plans = nnunet_reference[0]["toy_ct_x6"]["plans"]
    patches = {tuple(plans[p]["patch_size"]) for p in PRESETS}
    assert len(patches) == 3
    # and where a 3d_lowres stage is planned (so the test above compares one)
    assert nnunet_reference[0]["toy_ct_x6"]["plans_lowres"]["resenc_m"] is not None


def test_voxjets_own_fingerprint_of_the_toy_set_is_nnunets(nnunet_reference):
    """voxjet fingerprints the toy CT files (cropped RAS shapes, spacings) as nnU-Net did."""
    import tempfile

    import yaml

    from voxjet.volumes.dataset.msd import load_dataset
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset
    from voxjet.volumes.plan.fingerprint import inspect_cases

    synth = yaml.safe_load((ROOT / "config" / "demo-full.yaml").read_text())["datasets"]["toy_ct"]
    with tempfile.TemporaryDirectory() as tmp:
        msd = generate_dataset(Path(tmp), ToyVolumesConfig(**synth["source"]["synthetic"]),
                               progress=False)  # fmt: skip
        ds = load_dataset(msd)
        stats, _ = inspect_cases(ds, [c.case_id for c in ds.cases],
                                 VolumePrepConfig(foreground_samples=10))  # fmt: skip
    fp = nnunet_reference[0]["toy_ct"]["fingerprint"]
    # nnU-Net lists the cases sorted by file name, voxjet by dataset.json: compare as sets
    mine = sorted((tuple(s["shape"]), tuple(np.round(s["spacing"], 5))) for s in stats.values())
    pairs = zip(fp["shapes_after_crop"], fp["spacings"], strict=True)
    theirs = sorted((tuple(reversed(sh)), tuple(np.round(sp[::-1], 5))) for sh, sp in pairs)
    assert mine == theirs


def test_smallest_network_count_is_the_config_checks_floor():
    strides, kernels, patch, _ = pool_and_conv_props([1.0, 1.0, 1.0], [8, 8, 8])
    assert len(strides) == 2 and patch == [8, 8, 8]
    assert feature_map_elements(resenc_network(strides, kernels), 1, 2, patch) == SMALLEST_3D


def test_a_memory_target_no_patch_fits_is_refused_naming_the_fix():
    spacings, shapes = [[0.8, 0.8, 2.5]] * 4, [[200, 200, 60]] * 4
    with pytest.raises(
        VoxjetError, match=r"resenc_l: even the smallest patch .*raise volumes\.gpu_memory_gb"
    ):
        plan_resenc_dataset(spacings, shapes, 1, 3, "resenc_l", gpu_memory_gb=1e-5)
    with pytest.raises(VoxjetError, match=r"patch_size's patch does not fit .*smaller patch_size"):
        plan_resenc_dataset(spacings, shapes, 1, 3, "resenc_m", gpu_memory_gb=0.5,
                            patch=[192, 192, 48])  # fmt: skip
    # a smaller target: a smaller patch, never a smaller batch than 2
    big = plan_resenc_dataset(spacings, shapes, 1, 3, "resenc_l")
    small = plan_resenc_dataset(spacings, shapes, 1, 3, "resenc_l", gpu_memory_gb=6)
    assert np.prod(small["patch_size"]) < np.prod(big["patch_size"])
    assert small["batch_size"] >= 2 and small["gpu_memory_gb"] == 6 and big["gpu_memory_gb"] == 24


def test_config_check_refuses_a_target_below_the_presets_floor_at_the_dry_run():
    from voxjet.config import check_config

    cfg = {
        "datasets": {"ct": {"domain": "volumes", "source": {"synthetic": {}},
                            "volumes": {"plan": "resenc_l", "gpu_memory_gb": 0.001}}},
        "experiments": {"r": {"dataset": "ct", "model": {"name": "resenc"}}},
    }  # fmt: skip
    with pytest.raises(VoxjetError, match=r"datasets\.ct\.volumes\.gpu_memory_gb'.*resenc_l"):
        check_config(cfg, ROOT / "config" / "schema.yaml")
    cfg["datasets"]["ct"]["volumes"]["gpu_memory_gb"] = 4
    check_config(cfg, ROOT / "config" / "schema.yaml")


@pytest.fixture(scope="module")
def resenc_cases(tmp_path_factory) -> Path:
    """A small toy CT set preprocessed with the ResEnc M preset."""
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset

    tmp = tmp_path_factory.mktemp("resenc")
    small = ToyVolumesConfig(train_cases=5, test_cases=1, min_shape=(40, 40, 16),
                             max_shape=(48, 48, 20))  # fmt: skip
    msd = generate_dataset(tmp / "msd", small, progress=False)
    manifest = tmp / "manifest.json"
    manifest.write_text(json.dumps({"root": str(msd), "files": []}))
    preprocess_dataset(manifest, tmp / "cases", VolumePrepConfig(plan="resenc_m"))
    return tmp / "cases"


@pytest.mark.parametrize("deep_supervision", [False, True])
def test_resenc_trains_and_evaluates_on_its_plan(resenc_cases, tmp_path, deep_supervision):
    from voxjet.training.logger import read_metrics
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.training.train import run

    plan = json.loads((resenc_cases / "plan.json").read_text())
    assert plan["planner"] == "resenc_m" and plan["gpu_memory_gb"] == 8
    assert plan["network"]["blocks_per_stage"][:3] == [1, 3, 4]
    assert plan["estimated_gpu_memory_gb"] > 0 and plan["pipeline_stages"] == 1
    cfg = {
        "model": {"name": "resenc", "deep_supervision": deep_supervision},
        "train": {"steps": 4, "batch_size": 2, "lr": 1e-3, "log_every": 2, "eval_every": 4,
                  "checkpoint_every": 4, "iterations_per_epoch": 4},
    }  # fmt: skip
    run(str(resenc_cases), cfg, str(tmp_path / "run"))
    losses = [r["loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert losses and all(np.isfinite(losses))
    m = evaluate(str(resenc_cases), str(tmp_path / "run" / "model.pt"), str(tmp_path / "eval"))
    assert set(m["per_class"]) == {"organ", "lesion"} and 0 <= m["dice_mean"] <= 1
    if deep_supervision:
        return
    # exported (TorchScript) and applied to a new image as any other segmentation model
    from voxjet.distributed.runtime import init_runtime, shutdown
    from voxjet.volumes.inference.export import export_volumes
    from voxjet.volumes.inference.predict import run_volume_predict

    ts = export_volumes(tmp_path / "run" / "model.pt", "torchscript", tmp_path)
    assert ts.stat().st_size > 1e6
    image = sorted((resenc_cases.parent / "msd" / "imagesTs").glob("*.nii.gz"))[0]
    rt = init_runtime()
    try:
        (out,) = run_volume_predict([str(tmp_path / "run" / "model.pt")], [str(image)],
                                    tmp_path / "pred", rt)  # fmt: skip
    finally:
        shutdown(rt)
    assert nib.load(out).shape == nib.load(image).shape[:3]


def test_deep_supervision_heads_are_stacked_at_the_patch_and_dropped_in_evaluation():
    from voxjet.volumes.networks.models import build_resenc

    strides, kernels, patch, _ = pool_and_conv_props([1.0, 1.0, 2.0], [32, 32, 16])
    net = build_resenc(1, 3, resenc_network(strides, kernels), deep_supervision=True)
    x = torch.randn(1, 1, *patch)
    out = net.train()(x)
    assert out.shape == (1, len(strides) - 1, 3, *patch)
    assert net.eval()(x).shape == (1, 3, *patch)
