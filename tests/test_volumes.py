"""Volumes: the toy MSD generator, dataset.json in both forms, preprocessing, patches, metrics."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import nibabel as nib
import numpy as np
import pytest
import torch
from mni_dataset import mni_brain_dataset

from voxjet.errors import VoxjetError
from voxjet.io.remote import ReadOptions
from voxjet.volumes.dataset.geometry import plan_shape, resample_slabs, zoom_to
from voxjet.volumes.dataset.msd import load_dataset
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset
from voxjet.volumes.evaluation.metrics import seg_metrics
from voxjet.volumes.networks.models import build_unet
from voxjet.volumes.plan.plan_file import LabelSet
from voxjet.volumes.preprocessing.preprocess import preprocess_dataset
from voxjet.volumes.preprocessing.store import CaseStore, case_sizes, read_case_arrays
from voxjet.volumes.training.patches import PatchSampler, read_patch

SMALL = ToyVolumesConfig(
    train_cases=5, test_cases=1, min_shape=(40, 40, 16), max_shape=(48, 48, 20)
)


@pytest.fixture(scope="module")
def toy_msd(tmp_path_factory):
    return generate_dataset(tmp_path_factory.mktemp("msd"), SMALL, progress=False)


def _prepared(toy_msd, out: Path, storage: str) -> Path:
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps({"root": str(toy_msd), "files": []}))
    cfg = VolumePrepConfig(patch_size=[32, 32, 16], network_depth=2, storage=storage)
    preprocess_dataset(manifest, out / "cases", cfg)
    return out / "cases"


@pytest.fixture(scope="module")
def cases(toy_msd, tmp_path_factory):
    return _prepared(toy_msd, tmp_path_factory.mktemp("prep"), "mapped")


@pytest.fixture(scope="module")
def compressed_cases(toy_msd, tmp_path_factory):
    return _prepared(toy_msd, tmp_path_factory.mktemp("prep_lz4"), "compressed")


@pytest.fixture(scope="module")
def blosc2_cases(toy_msd, tmp_path_factory):
    return _prepared(toy_msd, tmp_path_factory.mktemp("prep_b2"), "blosc2")


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


def test_resample_shapes():
    a = np.zeros((10, 10, 4), np.float32)
    shape = plan_shape(a.shape, np.array([1, 1, 3.0]), np.array([1, 1, 1.5]))
    assert zoom_to(a, shape, 1).shape == (10, 10, 8)


@pytest.mark.parametrize(
    ("shape", "out"),
    [((1, 40, 37, 23), (50, 30, 23)), ((2, 33, 20, 10), (20, 41, 37)), ((1, 9, 6, 1), (7, 3, 1))],
)
def test_slab_resampling_equals_whole_volume_trilinear(shape, out):
    """resample_slabs, a slab of planes at a time from a flipped int16 view, equals torch's
    trilinear interpolation of the whole float32 volume (up, down, one-plane)."""
    a = np.random.default_rng(0).integers(-1000, 1000, shape).astype(np.int16)
    view = a[:, ::-1]
    got = resample_slabs(view, out, slab=4)
    want = zoom_to(np.ascontiguousarray(view, dtype=np.float32), out, 1)
    assert got.dtype == np.float32 and got.shape == (shape[0], *out)
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)


def test_new_prediction_path_keeps_the_earlier_labels_on_demo_cases(cases, toy_msd):
    """The streamed sliding window and the slab-wise preprocessing against the earlier path
    (whole-volume trilinear resampling, MONAI's sliding window, arg-max of its logits) on the
    demo's cases, one random network: the same labels where nothing is resampled, ≥ 99.99% of
    the voxels after resampling."""
    from monai.inferers import sliding_window_inference

    from voxjet.volumes.dataset.cases import load_case
    from voxjet.volumes.inference.segment import Windows, segment_image
    from voxjet.volumes.plan.plan_file import read_plan
    from voxjet.volumes.preprocessing.preprocess import normalise, to_plan_space

    plan = read_plan(str(cases))
    fp = json.loads((cases / "fingerprint.json").read_text())
    torch.manual_seed(0)
    model = build_unet(1, plan.num_classes, [4, 8], num_res_units=1).eval()
    ds = load_dataset(toy_msd)
    agree, voxels = 0, 0
    for case in ds.cases[:3]:
        lc = load_case(ds, case)
        new, box, shape = to_plan_space(lc.image, lc.spacing, plan, fp)
        cropped = lc.image[(slice(None), *(slice(a, b) for a, b in box))]
        old = normalise(zoom_to(np.ascontiguousarray(cropped), shape, 1).copy(), plan, fp)
        with torch.no_grad():
            logits = sliding_window_inference(torch.from_numpy(old[None]), plan.patch_size, 2,
                                              model, 0.5, mode="gaussian")[0]  # fmt: skip
        before = logits.argmax(0).numpy()
        windows, cpu = Windows(plan.patch_size), torch.device("cpu")
        same_input = segment_image(model, old, windows, cpu, classes=plan.label_set)[0]
        np.testing.assert_array_equal(same_input, before)
        after = segment_image(model, new, windows, cpu, classes=plan.label_set)[0]
        agree, voxels = agree + int((after == before).sum()), voxels + before.size
    assert len(np.unique(before)) > 1  # the labels are not all one class: the test can fail
    assert agree / voxels >= 0.9999


def test_preprocessed_cases_keep_geometry_and_foreground(cases, toy_msd):
    plan = json.loads((cases / "plan.json").read_text())
    split = json.loads((cases / "splits.json").read_text())
    assert sorted(sum(split.values(), [])) == [f"toy_{i:03d}" for i in range(5)]
    with h5py.File(cases / "toy_000.h5") as f:
        img, lbl = f["image"], f["label"]
        assert img.shape[1:] == lbl.shape and img.dtype == np.float32
        # the default storage: uncompressed and contiguous (memory-mapped), a CRC32 a slab
        assert img.chunks is None and lbl.chunks is None
        assert f["image_crc32"].shape == (1, -(-lbl.shape[0] // 8))
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


@pytest.mark.parametrize("storage", ["mapped", "compressed", "blosc2"])
def test_read_patch_pads_outside_the_volume_and_matches_hdf5(storage, request):
    fixture = {"mapped": "cases", "compressed": "compressed_cases", "blosc2": "blosc2_cases"}
    cases = request.getfixturevalue(fixture[storage])
    case = sorted(cases.glob("toy_*.h5"))[0].stem
    if storage == "compressed":  # chunks of half a patch (capped by the volume)
        with h5py.File(cases / f"{case}.h5") as f:
            want = tuple(min(a, b) for a, b in zip((16, 16, 8), f["label"].shape, strict=True))
            assert f["image"].chunks[1:] == want and f["image"].compression
    store = CaseStore(cases, [case], cache_bytes=1 << 20)  # small: evictions happen
    image, label = store.volumes(case)
    with h5py.File(cases / f"{case}.h5") as f:
        full_img, full_lbl = read_case_arrays(f)
    if storage == "blosc2":  # the same case as the mapped store holds it, to 2^-11
        with h5py.File(request.getfixturevalue("cases") / f"{case}.h5") as f:
            exact = f["image"][...]
            assert np.array_equal(full_lbl, f["label"][...])
        assert 0 < np.abs(full_img - exact).max() <= 2.0**-11 * 1.01
        # chunks a patch, capped by the volume
        assert image.chunks[1:] == tuple(
            min(a, b) for a, b in zip(full_lbl.shape, (32, 32, 16), strict=True)
        )
    img, lbl = read_patch(image, label, np.array([0, 0, 0]), np.array([8, 8, 8]))
    assert img.shape == (1, 8, 8, 8) and (img[:, :4] == 0).all()
    assert np.array_equal(img[0, 4:, 4:, 4:], full_img[0, :4, :4, :4])
    rng = np.random.default_rng(0)
    p = np.array([32, 32, 16])
    for _ in range(20):  # random patches, across chunk borders, equal a plain HDF5 read
        c = rng.integers(0, np.array(full_lbl.shape))
        img, lbl = read_patch(image, label, c, p)
        lo = c - p // 2
        sl = tuple(
            slice(max(a, 0), min(b, s)) for a, b, s in zip(lo, lo + p, full_lbl.shape, strict=True)
        )
        d = tuple(
            slice(max(a, 0) - a, max(a, 0) - a + (s.stop - s.start))
            for a, s in zip(lo, sl, strict=True)
        )
        assert np.array_equal(lbl[d], full_lbl[sl])
        assert np.array_equal(img[(slice(None), *d)], full_img[(slice(None), *sl)])
    if storage == "compressed":
        assert store.cache.bytes <= 1 << 20 or len(store.cache._items) == 1
        assert store.cache.hits > 0
    elif storage == "blosc2":  # decoded on every read, each chunk verified once
        assert store.cache.bytes == 0 and image.verified.any() and label.verified.any()
    else:  # a memory map: nothing decoded, nothing cached, every slab verified once
        assert store.cache.bytes == 0 and image.verified.all() and label.verified.all()
    store.close()


def test_case_files_of_the_previous_format_stay_readable(cases, tmp_path):
    import shutil

    old = tmp_path / "cases"
    shutil.copytree(cases, old)
    case = sorted(old.glob("toy_*.h5"))[0]
    with h5py.File(case, "a") as f:  # what voxjet wrote before the blosc2 store: format 4
        f.attrs["format_version"] = 4
        want = f["label"][...]
    store = CaseStore(old, [case.stem])
    assert np.array_equal(store.volumes(case.stem)[1].whole(), want)
    store.close()
    with h5py.File(case, "a") as f:
        f.attrs["format_version"] = 3
    with pytest.raises(VoxjetError, match=r"a case file of format 3, this voxjet reads formats "
                       r"\(4, 5\); rerun preprocessing"):  # fmt: skip
        CaseStore(old, [case.stem]).file(case.stem)


def test_blosc2_cases_train_and_evaluate_as_the_mapped_ones(blosc2_cases, cases, tmp_path):
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.training.train import run

    cfg = {"model": {"name": "unet", "channels": [8, 16, 32], "num_res_units": 1},
           "train": {"steps": 4, "eval_every": 4, "iterations_per_epoch": 4}}  # fmt: skip
    metrics = {}
    for name, folder in (("mapped", cases), ("blosc2", blosc2_cases)):
        run(str(folder), cfg, str(tmp_path / name))
        metrics[name] = evaluate(str(folder), str(tmp_path / name / "model.pt"),
                                 str(tmp_path / name / "eval"))  # fmt: skip
    # the same seeds on images 2^-11 apart: the same few steps, the same scores to a hair
    for cls, m in metrics["mapped"]["per_class"].items():
        assert metrics["blosc2"]["per_class"][cls]["dice"] == pytest.approx(m["dice"], abs=0.01)


def test_seg_metrics_dice_and_hd95():
    label = np.zeros((20, 20, 20), np.uint8)
    label[5:15, 5:15, 5:15] = 1
    plan = LabelSet({0: "background", 1: "organ", 2: "lesion"}, 3)
    m = seg_metrics(label.copy(), label, plan)
    assert m["organ"]["dice"] == 1.0 and m["organ"]["hd95"] == 0.0
    assert not m["lesion"]["present"]
    shifted = np.roll(label, 2, axis=0)
    m = seg_metrics(shifted, label, plan, spacing=[2.0, 1.0, 1.0])
    assert m["organ"]["dice"] == pytest.approx(0.8) and m["organ"]["hd95"] == pytest.approx(4.0)
    # regions: overlapping masks of label values, each scored on its own
    regions = LabelSet(plan.labels, 3, {"whole": [1, 2], "core": [2]}, [1, 2])
    two = label.copy()
    two[8:12, 8:12, 8:12] = 2
    m = seg_metrics(label, two, regions)
    assert m["whole"]["dice"] == 1.0 and m["core"]["dice"] == 0.0


def test_preprocess_real_mni_template(tmp_path):
    """The MNI152 template (real data): T1 and its brain as the label, in the MSD layout."""
    root = mni_brain_dataset(tmp_path / "mni")
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"root": str(root)}))
    plan = preprocess_dataset(manifest, tmp_path / "cases", VolumePrepConfig(patch_size=[32] * 3))
    assert plan.normalization == ["zscore"] and plan.target_spacing == [3.0, 3.0, 3.0]
    with h5py.File(tmp_path / "cases" / "mni_0.h5") as f:
        assert abs(float(f["image"][...].mean())) < 1e-3  # per-case z-score
        mapped = read_case_arrays(f)
    # a node too small to hold the decoded cases: `auto` takes the blosc2 store, says why,
    # and the case reads back as the mapped one within half a fixed-point step
    assert plan.storage["store"] == "mapped"  # this machine holds a 3 mm MNI brain
    small = VolumePrepConfig(patch_size=[32] * 3, node_memory_gb=1e-3)
    plan = preprocess_dataset(manifest, tmp_path / "b2", small)
    assert plan.storage["store"] == "blosc2" and "exceed 50%" in plan.storage["reason"]
    with h5py.File(tmp_path / "b2" / "mni_0.h5") as f:
        packed = read_case_arrays(f)
        assert 0 < f.attrs["quantisation_error"] <= 2.0**-11 * 1.01
    assert np.array_equal(packed[1], mapped[1])
    assert np.abs(packed[0] - mapped[0]).max() <= 2.0**-11 * 1.01


def test_segmentation_trains_and_evaluates(cases, tmp_path):
    from voxjet.training.logger import read_metrics
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.training.train import run

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
    for cid in m["per_case"]:  # predictions land on the original image's grid
        pred = nib.load(tmp_path / "eval" / "predictions" / f"{cid}.nii.gz")
        with h5py.File(cases / f"{cid}.h5") as f:
            assert pred.shape == tuple(f.attrs["original_shape"])
            assert np.allclose(pred.affine, f.attrs["original_affine"])


def _msd(root, cases, labels=None, modality="CT"):
    """Write an MSD dataset of (image array, label array, affine) cases."""
    for sub in ("imagesTr", "labelsTr"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    training = []
    for i, (img, lbl, aff) in enumerate(cases):
        name = f"c_{i:03d}.nii.gz"
        nib.save(nib.Nifti1Image(img, aff), root / "imagesTr" / name)
        nib.save(nib.Nifti1Image(lbl, aff), root / "labelsTr" / name)
        training.append({"image": f"./imagesTr/{name}", "label": f"./labelsTr/{name}"})
    (root / "dataset.json").write_text(
        json.dumps(
            {
                "modality": {str(i): m for i, m in enumerate(modality.split(","))},
                "labels": labels or {"0": "bg", "1": "organ"},
                "training": training,
            }
        )
    )
    return root


def _blob_case(shape=(40, 36, 14), zooms=(0.9, 0.9, 2.5), flip=(True, False, True), seed=0):
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.arange(s) for s in shape], indexing="ij"), -1)
    centre = np.array(shape) / 2 + rng.uniform(-2, 2, 3)
    lbl = ((((grid - centre) * zooms) ** 2).sum(-1) < 8.0**2).astype(np.uint8)
    img = (rng.normal(0, 10, shape) + 80 * lbl - 500 * (lbl == 0)).astype(np.int16)
    aff = np.diag([*(np.array(zooms) * np.where(flip, -1, 1)), 1.0])
    return img, lbl, aff


def _manifest(tmp_path, root):
    m = tmp_path / "manifest.json"
    m.write_text(json.dumps({"root": str(root)}))
    return m


@pytest.mark.parametrize(
    "problem,match",
    [
        ("nan", r"c_001\.nii\.gz: 1 NaN/inf voxels"),
        ("2d", r"c_001\.nii\.gz: image of shape \(40, 36\)"),
        ("5d", r"c_001\.nii\.gz: image of shape \(40, 36, 14, 1, 2\)"),
        ("shape", r"labelsTr/c_001\.nii\.gz: shape .* differs from the image's"),
        (
            "affine",
            r"labelsTr/c_001\.nii\.gz: affine differs from the image's \(c_001\.nii"
            r"\.gz\) by up to 1\.5 mm at the grid's corners.*give the label the image's "
            r"affine",
        ),
        (
            "sheared",
            r"imagesTr/c_001\.nii\.gz: sheared affine \(voxel axes 0 and 1 meet at "
            r"7\d\.\d\d° instead of 90°; case c_001\).*orthogonal grid",
        ),
        ("values", r"labelsTr/c_001\.nii\.gz: label values \[7\] are not declared"),
        ("empty", r"labelsTr/c_001\.nii\.gz: no foreground"),
        ("notnifti", r"imagesTr/c_001\.nii\.gz: not a readable image"),
    ],
)
def test_bad_cases_fail_naming_file_and_problem_or_are_skipped(tmp_path, problem, match):
    from voxjet.errors import VoxjetError

    cases = [_blob_case(seed=i) for i in range(4)]
    img, lbl, aff = cases[1]
    if problem == "nan":
        img = img.astype(np.float32)
        img[3, 3, 3] = np.nan
    elif problem == "2d":
        img = img[..., 0]
        lbl = lbl[..., 0]
    elif problem == "5d":
        img = np.stack([img, img], -1)[..., None, :]
    elif problem == "shape":
        lbl = lbl[:-2]
    elif problem == "values":
        lbl = lbl.copy()
        lbl[0, 0, 0] = 7
    elif problem == "empty":
        lbl = np.zeros_like(lbl)
    cases[1] = (img, lbl, aff)
    root = _msd(tmp_path / "ds", cases)
    if problem == "affine":  # the label's grid 1.5 mm off the image's
        shifted = aff.copy()
        shifted[0, 3] += 1.5
        nib.save(nib.Nifti1Image(lbl, shifted), root / "labelsTr" / "c_001.nii.gz")
    if problem == "sheared":  # x grows with j as well: axes 0 and 1 not perpendicular
        sheared = aff.copy()
        sheared[0, 1] = 0.3
        for sub, arr in (("imagesTr", img), ("labelsTr", lbl)):
            nib.save(nib.Nifti1Image(arr, sheared), root / sub / "c_001.nii.gz")
    if problem == "notnifti":
        (root / "imagesTr" / "c_001.nii.gz").write_bytes(b"this is not a NIfTI file")
    if problem == "2d":  # the label is 2-D too: the image's dimension is what is reported
        nib.save(
            nib.Nifti1Image(np.zeros((40, 36, 14), np.uint8), aff),
            root / "labelsTr" / "c_001.nii.gz",
        )
    cfg = VolumePrepConfig(patch_size=[16, 16, 8], network_depth=2)
    with pytest.raises(VoxjetError, match=match):
        preprocess_dataset(_manifest(tmp_path, root), tmp_path / "out", cfg)
    assert not (tmp_path / "out").exists()  # no partial output
    cfg.on_bad_case = "skip"
    preprocess_dataset(_manifest(tmp_path, root), tmp_path / "out", cfg)
    skipped = json.loads((tmp_path / "out" / "skipped.json").read_text())
    assert list(skipped) == ["c_001"]
    assert not (tmp_path / "out" / "c_001.h5").exists() and (tmp_path / "out" / "c_000.h5").exists()
    splits = json.loads((tmp_path / "out" / "splits.json").read_text())
    assert "c_001" not in sum(splits.values(), [])


def test_two_cases_with_identical_images_are_refused_naming_both(tmp_path):
    """One case under two names (the stage's checksums show it): planning stops naming both
    cases and files; with on_duplicate: skip the later one is left out, saying why."""
    from voxjet.stage.transfer import stage
    from voxjet.volumes.plan.planning import plan_volumes

    cases = [_blob_case(seed=i) for i in range(4)]
    cases.append(cases[2])
    root = _msd(tmp_path / "ds", cases)
    stage(str(root), tmp_path / "staged", tmp_path / "m.json", on_duplicate="ignore")
    cfg = dict(patch_size=[16, 16, 8], network_depth=2, val_fraction=0.25, test_fraction=0.0)
    with pytest.raises(
        VoxjetError,
        match=r"cases 'c_002' \(\./imagesTr/c_002\.nii\.gz\) and "
        r"'c_004' \(\./imagesTr/c_004\.nii\.gz\) have identical images",
    ):
        plan_volumes(tmp_path / "m.json", tmp_path / "plan", VolumePrepConfig(**cfg))
    assert not (tmp_path / "plan").exists()
    plan_volumes(tmp_path / "m.json", tmp_path / "plan", VolumePrepConfig(**cfg), "skip")
    skipped = json.loads((tmp_path / "plan" / "skipped.json").read_text())
    assert skipped == {"c_004": "its images are identical to case 'c_002''s"}


def test_label_round_trip_through_plan_space_on_non_ras_anisotropic_input(tmp_path):
    from voxjet.volumes.dataset.geometry import labels_to_original

    cases = [_blob_case(seed=i, zooms=(0.8, 1.1, 3.0), flip=(True, True, False)) for i in range(3)]
    root = _msd(tmp_path / "ds", cases)
    assert nib.aff2axcodes(cases[0][2]) == ("L", "P", "S")
    cfg = VolumePrepConfig(patch_size=[16, 16, 8], network_depth=2, target_spacing=[1.0, 1.0, 1.5])
    preprocess_dataset(_manifest(tmp_path, root), tmp_path / "out", cfg)
    for i, (_, lbl, _) in enumerate(cases):
        with h5py.File(tmp_path / "out" / f"c_{i:03d}.h5") as f:
            assert f["label"].shape != lbl.shape  # really resampled
            back = labels_to_original(f["label"][...], f.attrs, 2)
        assert back.shape == lbl.shape
        inter = ((back == 1) & (lbl == 1)).sum()
        dice = 2 * inter / ((back == 1).sum() + (lbl == 1).sum())
        assert dice >= 0.99, dice


def test_multichannel_images_keep_channels(tmp_path):
    img, lbl, aff = _blob_case()
    two = np.stack([img, -img], -1).astype(np.float32)
    root = _msd(tmp_path / "ds", [(two, lbl, aff)] * 3, modality="MRI,MRI")
    preprocess_dataset(
        _manifest(tmp_path, root),
        tmp_path / "out",
        VolumePrepConfig(patch_size=[16, 16, 8], network_depth=2),
    )
    with h5py.File(tmp_path / "out" / "c_000.h5") as f:
        assert f["image"].shape[0] == 2
        np.testing.assert_allclose(f["image"][0].mean(), 0, atol=1e-4)  # z-scored per channel
    # an MSD 4-D image with more channels than `modality` declares: refused, not cut
    root = _msd(tmp_path / "ds1", [(two, lbl, aff)] * 3, modality="MRI")
    with pytest.raises(VoxjetError, match=r"c_000.nii.gz: case c_000 has 2 channel\(s\), "
                       r"dataset.json declares 1"):  # fmt: skip
        preprocess_dataset(_manifest(tmp_path, root), tmp_path / "out1",
                           VolumePrepConfig(patch_size=[16, 16, 8], network_depth=2))  # fmt: skip


def test_nibabel_shipped_nifti_files_load_and_reorient():
    from nibabel.testing import data_path

    from voxjet.volumes.dataset.geometry import from_ras, to_ras

    path = Path(data_path) / "anatomical.nii"
    img = nib.load(path)
    data = np.asarray(img.dataobj)
    ras = to_ras(data, img.affine)
    assert np.array_equal(from_ras(ras, img.affine), data)
    assert np.array_equal(ras, np.asarray(nib.as_closest_canonical(img).dataobj))


def test_augmentation_is_seeded_and_keeps_image_and_label_aligned(cases):
    split = json.loads((cases / "splits.json").read_text())
    store = CaseStore(cases, split["train"])
    plain = PatchSampler(store, [32, 32, 16], batch_size=3, seed=5)
    aug = PatchSampler(store, [32, 32, 16], batch_size=3, seed=5, augment=True)
    a, b = aug.batch(0, 1, 2), aug.batch(0, 1, 2)
    assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    changed = 0
    for i in range(8):
        p, q = plain.batch(0, 0, i), aug.batch(0, 0, i)
        assert q["image"].shape == p["image"].shape and q["label"].dtype == torch.uint8
        # geometry-only transforms move voxels, they do not invent labels
        assert sorted(q["label"].unique().tolist()) == sorted(p["label"].unique().tolist())
        changed += int(not torch.equal(p["image"], q["image"]))
    assert changed >= 6
    store.close()


def test_pipelined_segmentation_training_follows_the_single_process_run(cases, tmp_path):
    """`train.pipeline_stages: 2` under torchrun (2 CPU processes, gloo): the U-Net trains
    through the pipeline schedule and logs the same losses as one process training alone."""
    import subprocess

    from conftest import BIN, snakemake_env

    from voxjet.training.logger import read_metrics

    train = {
        "steps": 12,
        "lr": 5e-3,
        "batch_size": 2,
        "log_every": 3,
        "eval_every": 12,
        "iterations_per_epoch": 6,
    }
    model = {"name": "unet", "channels": [8, 16, 32], "num_res_units": 1}
    losses = {}
    for name, extra, launch in [
        ("single", {}, []),
        ("pipe", {"pipeline_stages": 2, "microbatches": 2}, ["--cpu-processes", "2"]),
    ]:
        cfg = {"model": model, "train": {**train, **extra}}
        cmd = [str(BIN / "voxjet"), "launch", "--gpus", "0", *launch, "--", "train-seg"]
        cmd += ["--cases", str(cases), "--run-config", json.dumps(cfg)]
        cmd += ["--out", str(tmp_path / name)]
        r = subprocess.run(cmd, env=snakemake_env(), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        recs = read_metrics(tmp_path / name / "metrics.jsonl")
        losses[name] = [x["loss"] for x in recs if "loss" in x]
        assert any(x.get("split") == "val" for x in recs)
    assert losses["pipe"] == pytest.approx(losses["single"], rel=1e-3)
    saved = torch.load(tmp_path / "pipe" / "model.pt", weights_only=True)
    assert saved["world_size"] == 2 and len(set(saved["rank_param_digests"])) == 1


def test_mirroring_makes_the_prediction_flip_equivariant():
    """Test-time mirroring averages all 8 flips: predicting a flipped image gives the flipped
    prediction (one window, so the sliding-window grid plays no part)."""
    from voxjet.volumes.inference.segment import Windows, segment_image
    from voxjet.volumes.networks.models import build_unet

    torch.manual_seed(0)
    model = build_unet(1, 3, [4, 8, 16], num_res_units=1)
    image = np.random.default_rng(0).normal(size=(1, 16, 16, 16)).astype(np.float32)
    dev = torch.device("cpu")
    three = LabelSet({0: "background", 1: "a", 2: "b"}, 3)
    plain = segment_image(model, image, Windows([16] * 3), dev, classes=three)[0]
    flipped = segment_image(model, image[:, ::-1], Windows([16] * 3), dev, classes=three)[0]
    assert not np.array_equal(flipped[::-1], plain)  # a random net is not symmetric itself
    mirrored = Windows([16] * 3, mirror=True)
    m = segment_image(model, image, mirrored, dev, classes=three)[0]
    mf = segment_image(model, image[:, ::-1], mirrored, dev, classes=three)[0]
    assert (mf[::-1] == m).mean() > 0.999


@pytest.mark.slow
def test_short_run_segments_the_mni_brain(tmp_path):
    """Real data: a short U-Net run segments the MNI152 brain with test Dice ≥ 0.9, and the
    prediction, written back as NIfTI, lies on the original (non-RAS) image grid."""
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.training.train import run

    root = mni_brain_dataset(tmp_path / "mni")
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"root": str(root), "files": []}))
    cfg = VolumePrepConfig(patch_size=[48, 48, 48], network_depth=3, val_fraction=0.25,
                           test_fraction=0.25)  # fmt: skip
    preprocess_dataset(manifest, tmp_path / "cases", cfg)
    run_cfg = {
        "model": {"name": "unet", "channels": [8, 16, 32, 64], "num_res_units": 1},
        "train": {
            "steps": 150,
            "lr": 3e-3,
            "batch_size": 2,
            "eval_every": 75,
            "iterations_per_epoch": 25,
        },  # fmt: skip
    }
    run(str(tmp_path / "cases"), run_cfg, str(tmp_path / "run"))
    # the cost record sets the process's peak beside the planner's estimate for this network
    # (the resident peak holds the libraries and the cases too: only its presence is checked)
    log = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    cost = json.loads(log[-1])["cost"]
    assert cost["memory_estimate_gib"] > 0
    assert cost["peak_over_estimate"] == pytest.approx(
        cost["peak_memory_gib"] / cost["memory_estimate_gib"]
    )
    m = evaluate(str(tmp_path / "cases"), str(tmp_path / "run" / "model.pt"), str(tmp_path / "e"))
    print(f"MNI brain test Dice {m['per_class']['brain']['dice']:.3f}")
    assert m["per_class"]["brain"]["dice"] >= 0.9, m["per_class"]
    for cid in m["per_case"]:
        pred = nib.load(tmp_path / "e" / "predictions" / f"{cid}.nii.gz")
        img = nib.load(root / "imagesTr" / f"{cid}.nii.gz")
        assert pred.shape == img.shape and np.allclose(pred.affine, img.affine)


def test_blosc2_case_files_from_a_url_give_the_local_batches(blosc2_cases):
    """A blosc2 case file fetched into memory decodes its frames there, as on disk."""
    import latency_fs  # noqa: F401  (registers latency://)

    ids = json.loads((blosc2_cases / "splits.json").read_text())["train"]
    local = PatchSampler(CaseStore(blosc2_cases, ids), [32, 32, 16], 2, 1 / 3, seed=5)
    store = CaseStore(f"latency://{blosc2_cases}", ids, storage_options={"delay_s": 0.0})
    remote = PatchSampler(store, [32, 32, 16], 2, 1 / 3, seed=5)
    for i in range(3):
        a, b = local.batch(0, 0, i), remote.batch(0, 0, i)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    store.close()


def test_patches_from_case_files_behind_a_slow_url_equal_the_local_ones(cases):
    """Case files behind 10 ms a request (latency://): fetched in concurrent ranges, the
    sampler draws exactly the local batches; a file that keeps failing names URL and bytes."""
    import latency_fs  # noqa: F401  (registers latency://)

    from voxjet.io.fetch import FetchConfig, FetchError

    ids = json.loads((cases / "splits.json").read_text())["train"]
    local = PatchSampler(CaseStore(cases, ids), [32, 32, 16], 2, 1 / 3, seed=5)
    url, opts = f"latency://{cases}", ReadOptions(storage_options={"delay_s": 0.01})
    sizes = case_sizes(url, opts)  # from cases.json: no size request a file
    assert all(sizes[c] == (cases / f"{c}.h5").stat().st_size for c in ids)
    assert case_sizes(f"latency://{cases}/nowhere", opts) == {}  # only a saving: none is fine
    store = CaseStore(url, ids, fetch=FetchConfig(threads=8, block_bytes=64 << 10), sizes=sizes,
                      storage_options=opts.storage_options)  # fmt: skip
    fetched: list[str] = []
    fetch = store._url_files.fetch
    store._url_files.fetch = lambda name, size=None: fetched.append(name) or fetch(name, size)
    remote = PatchSampler(store, [32, 32, 16], 2, 1 / 3, seed=5)
    for i in range(3):
        a, b = local.batch(0, 0, i), remote.batch(0, 0, i)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    # the background fetch starts with the case the first batch needs, not the first case id
    assert remote.cases(0, 0, 0)[0] != ids[0] and fetched[0] == f"{remote.cases(0, 0, 0)[0]}.h5"
    store.close()
    broken = CaseStore(f"latency://{cases}", ids, fetch=FetchConfig(retries=1),
                       storage_options={"delay_s": 0.0, "fail_every": 1})  # fmt: skip
    with pytest.raises(FetchError, match=rf"{ids[0]}\.h5: bytes \d+-\d+ unreadable after 2"):
        broken.file(ids[0])
