"""Volumes: the toy MSD generator, dataset.json in both forms, preprocessing, patches, metrics."""

from __future__ import annotations

import json

import h5py
import nibabel as nib
import numpy as np
import pytest
from conftest import SHARED_DATA

from voxjet.errors import VoxjetError
from voxjet.volumes.inference import seg_metrics
from voxjet.volumes.msd import load_dataset
from voxjet.volumes.patches import CaseStore, PatchSampler, read_patch
from voxjet.volumes.preprocess import (
    VolumePrepConfig,
    make_plan,
    preprocess_dataset,
    resample,
    target_spacing,
)
from voxjet.volumes.synth import ToyVolumesConfig, generate_dataset

SMALL = ToyVolumesConfig(
    train_cases=5, test_cases=1, min_shape=(40, 40, 16), max_shape=(48, 48, 20)
)


@pytest.fixture(scope="module")
def toy_msd(tmp_path_factory):
    return generate_dataset(tmp_path_factory.mktemp("msd"), SMALL, progress=False)


@pytest.fixture(scope="module")
def cases(toy_msd, tmp_path_factory):
    out = tmp_path_factory.mktemp("prep")
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps({"root": str(toy_msd), "files": []}))
    preprocess_dataset(
        manifest, out / "cases", VolumePrepConfig(patch_size=[32, 32, 16], network_depth=2)
    )
    return out / "cases"


def test_toy_dataset_is_msd_layout_with_varied_geometry(toy_msd):
    meta = json.loads((toy_msd / "dataset.json").read_text())
    assert meta["modality"] == {"0": "CT"} and meta["numTraining"] == 5 and len(meta["test"]) == 1
    codes, shapes = set(), set()
    for t in meta["training"]:
        img = nib.load(toy_msd / t["image"])
        lbl = nib.load(toy_msd / t["label"])
        assert img.get_data_dtype() == np.int16 and np.allclose(img.affine, lbl.affine)
        data = np.asarray(img.dataobj)
        assert data.min() >= -1024 and -1100 < np.percentile(data, 1) < -900  # air in HU
        assert set(np.unique(np.asarray(lbl.dataobj))) <= {0, 1, 2}
        assert np.asarray(lbl.dataobj).any()
        codes.add("".join(nib.aff2axcodes(img.affine)))
        shapes.add(img.shape)
        zooms = img.header.get_zooms()
        assert zooms[2] > 2 * zooms[0]  # anisotropic: thick slices
    assert len(shapes) > 1 and codes != {"RAS"}


def test_dataset_json_both_forms(tmp_path, toy_msd):
    assert len(load_dataset(toy_msd).cases) == 5
    root = tmp_path / "v2"
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    for c in ("a_001", "a_002"):
        (root / "imagesTr" / f"{c}_0000.nii.gz").write_bytes(b"x")
        (root / "labelsTr" / f"{c}.nii.gz").write_bytes(b"x")
    (root / "dataset.json").write_text(
        json.dumps(
            {
                "channel_names": {"0": "CT"},
                "labels": {"background": 0, "spleen": 1},
                "numTraining": 2,
                "file_ending": ".nii.gz",
            }
        )
    )
    ds = load_dataset(root)
    assert ds.labels == {0: "background", 1: "spleen"} and ds.modality == "CT"
    assert [c.case_id for c in ds.cases] == ["a_001", "a_002"]
    assert ds.cases[0].label == "labelsTr/a_001.nii.gz"


def test_dataset_json_errors_name_the_problem(tmp_path):
    (tmp_path / "dataset.json").write_text(
        json.dumps(
            {
                "modality": {"0": "CT"},
                "labels": {"0": "bg", "1": "x"},
                "training": [{"image": "../../etc/passwd", "label": "./labelsTr/a.nii.gz"}],
            }
        )
    )
    with pytest.raises(VoxjetError, match="escapes the dataset folder"):
        load_dataset(tmp_path)
    (tmp_path / "dataset.json").write_text(
        json.dumps(
            {
                "modality": {"0": "CT"},
                "labels": {"0": "bg"},
                "training": [{"image": "./imagesTr/a.nii.gz", "label": "./labelsTr/a.nii.gz"}],
            }
        )
    )
    with pytest.raises(VoxjetError, match="referenced files are missing"):
        load_dataset(tmp_path)
    (tmp_path / "dataset.json").write_text("{}")
    with pytest.raises(VoxjetError, match="neither the MSD form"):
        load_dataset(tmp_path)


def test_target_spacing_follows_nnunet_rule():
    iso = [[1.0, 1.0, 1.0], [1.2, 1.2, 1.2], [0.8, 0.8, 0.8]]
    assert target_spacing(iso) == [1.0, 1.0, 1.0]
    thick = [[0.8, 0.8, 5.0], [0.8, 0.8, 4.0], [0.8, 0.8, 3.0], [0.8, 0.8, 5.0]]
    t = target_spacing(thick)
    assert t[:2] == [0.8, 0.8] and t[2] == pytest.approx(np.percentile([5, 4, 3, 5], 10))


def test_plan_patch_fits_median_case_and_network():
    fp = {
        "spacings": [[1, 1, 1]] * 3,
        "median_spacing": [1, 1, 1],
        "median_shape": [70, 50, 20],
        "labels": {0: "bg", 1: "x"},
        "modality": "CT",
    }
    plan = make_plan(fp, VolumePrepConfig(patch_size=[64, 64, 64], network_depth=3))
    assert plan["patch_size"] == [64, 48, 16] and plan["normalization"] == "ct"


def test_resample_shapes():
    a = np.zeros((10, 10, 4), np.float32)
    assert resample(a, np.array([1, 1, 3.0]), np.array([1, 1, 1.5]), 1).shape == (10, 10, 8)


def test_preprocessed_cases_keep_geometry_and_foreground(cases, toy_msd):
    plan = json.loads((cases / "plan.json").read_text())
    split = json.loads((cases / "splits.json").read_text())
    assert sorted(sum(split.values(), [])) == [f"toy_{i:03d}" for i in range(5)]
    with h5py.File(cases / "toy_000.h5") as f:
        img, lbl = f["image"], f["label"]
        assert img.shape[1:] == lbl.shape and img.dtype == np.float32
        assert img.chunks[1:] == (16, 16, 8)  # half a patch
        assert np.allclose(f.attrs["spacing"], plan["target_spacing"])
        orig = nib.load(toy_msd / "imagesTr" / "toy_000.nii.gz")
        assert np.allclose(f.attrs["original_affine"], orig.affine)
        fg = f["foreground/1"][...]
        assert len(fg) and (lbl[...][tuple(fg.T)] == 1).all()
        # CT normalisation: z-scored foreground intensities
        assert abs(float(np.mean(img[0][lbl[...] > 0]))) < 2


def test_patch_sampler_oversamples_foreground_and_is_deterministic(cases):
    split = json.loads((cases / "splits.json").read_text())
    store = CaseStore(cases, split["train"])
    sampler = PatchSampler(store, [32, 32, 16], batch_size=3, fg_fraction=1 / 3, seed=1)
    hits = []
    for i in range(10):
        b = sampler.batch(0, 0, i)
        assert b["image"].shape == (3, 1, 32, 32, 16) and b["label"].shape == (3, 1, 32, 32, 16)
        hits.append(bool(b["label"][2].any()))
    assert all(hits)  # the last third of each batch always has foreground
    a, b = sampler.batch(0, 3, 7), sampler.batch(0, 3, 7)
    assert (a["image"] == b["image"]).all()
    store.close()


def test_read_patch_pads_outside_the_volume(cases):
    with h5py.File(next(cases.glob("*.h5"))) as f:
        img, lbl = read_patch(f, np.array([0, 0, 0]), np.array([8, 8, 8]))
        assert img.shape == (1, 8, 8, 8) and (img[:, :4] == 0).all()
        assert np.array_equal(img[0, 4:, 4:, 4:], f["image"][0, :4, :4, :4])


def test_seg_metrics_dice_and_hd95():
    label = np.zeros((20, 20, 20), np.uint8)
    label[5:15, 5:15, 5:15] = 1
    m = seg_metrics(label.copy(), label, 3)
    assert m[1]["dice"] == 1.0 and m[1]["hd95"] == 0.0 and not m[2]["present"]
    shifted = np.roll(label, 2, axis=0)
    m = seg_metrics(shifted, label, 2, spacing=[2.0, 1.0, 1.0])
    assert m[1]["dice"] == pytest.approx(0.8) and m[1]["hd95"] == pytest.approx(4.0)


@pytest.mark.skipif(not (SHARED_DATA / "nifti").is_dir(), reason="shared/data not present")
def test_preprocess_real_mni_template(tmp_path):
    """The MNI152 template (real data): T1 and a brain mask label in the MSD layout."""
    src = SHARED_DATA / "nifti" / "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz"
    img = nib.load(src)
    t1 = np.asarray(img.dataobj)[::4, ::4, ::4]
    aff = img.affine @ np.diag([4, 4, 4, 1])
    root = tmp_path / "mni"
    for sub in ("imagesTr", "labelsTr"):
        (root / sub).mkdir(parents=True)
    for i in range(3):
        nib.save(nib.Nifti1Image(t1, aff), root / "imagesTr" / f"mni_{i}.nii.gz")
        mask = (t1 > 0.2 * t1.max()).astype(np.uint8)
        nib.save(nib.Nifti1Image(mask, aff), root / "labelsTr" / f"mni_{i}.nii.gz")
    (root / "dataset.json").write_text(
        json.dumps(
            {
                "modality": {"0": "MRI"},
                "labels": {"0": "background", "1": "brain"},
                "training": [
                    {"image": f"./imagesTr/mni_{i}.nii.gz", "label": f"./labelsTr/mni_{i}.nii.gz"}
                    for i in range(3)
                ],
            }
        )
    )
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"root": str(root)}))
    plan = preprocess_dataset(manifest, tmp_path / "cases", VolumePrepConfig(patch_size=[32] * 3))
    assert plan["normalization"] == "zscore" and plan["target_spacing"] == [4.0, 4.0, 4.0]
    with h5py.File(tmp_path / "cases" / "mni_0.h5") as f:
        assert abs(float(f["image"][...].mean())) < 1e-3  # per-case z-score


def test_segmentation_trains_and_evaluates(cases, tmp_path):
    from voxjet.training.logger import read_metrics
    from voxjet.volumes.evaluate import evaluate
    from voxjet.volumes.train import run

    cfg = {
        "model": {"name": "unet", "channels": [8, 16, 32], "num_res_units": 1},
        "train": {
            "steps": 30,
            "lr": 5e-3,
            "log_every": 5,
            "eval_every": 15,
            "checkpoint_every": 15,
            "iterations_per_epoch": 10,
        },
    }
    run(str(cases), cfg, str(tmp_path / "run"))
    lines = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in lines if r.get("split") == "val"] == [15, 30]
    assert all("patches_per_s" in r for r in lines if "loss" in r)
    m = evaluate(str(cases), str(tmp_path / "run" / "model.pt"), str(tmp_path / "eval"))
    assert set(m["per_class"]) == {"organ", "lesion"} and m["n_cases"] >= 1
    assert 0 <= m["dice_mean"] <= 1
    assert (tmp_path / "eval" / "overlays.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert saved["per_case"].keys() == m["per_case"].keys()
