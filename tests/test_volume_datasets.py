"""nnU-Net v2 datasets end to end, on the MNI152 template nilearn ships: several channels with
their own normalisation, region-based labels (sigmoid outputs), NRRD/MHA files, the
cross-validation folds of splits_final.json and their ensemble; metrics in the original space
against an independent MONAI computation; and the bad inputs, each named with its fix."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import nibabel as nib
import numpy as np
import pytest
import torch
from conftest import mni_file

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.msd import load_dataset
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.preprocessing.preprocess import preprocess_dataset

STEP = 4  # the 1 mm template at 4 mm: ~50×59×48 voxels a case


def _mni(step: int = STEP) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(T1, grey-matter and white-matter probabilities, affine) of the template at `step` mm."""
    t1 = nib.load(mni_file("t1"))
    sl = (slice(None, None, step),) * 3
    gm, wm = (np.asarray(nib.load(mni_file(k)).dataobj, np.float32)[sl] for k in ("gm", "wm"))
    aff = t1.affine @ np.diag([step, step, step, 1])
    return np.asarray(t1.dataobj, np.float32)[sl], gm, wm, aff


def _variants(image: np.ndarray, label: np.ndarray, aff: np.ndarray, n: int):
    """n cases of the same anatomy stored differently: intensity scales, a left-right mirror
    (LAS), axes swapped (ARS), the rest as given."""
    flip = np.diag([-1.0, 1, 1, 1])
    flip[0, 3] = image.shape[0] - 1
    out = []
    for i in range(n):
        img, lbl, a = (1 + 0.15 * i) * image, label, aff
        if i % 3 == 1:
            img, lbl, a = img[::-1], lbl[::-1], aff @ flip
        elif i % 3 == 2:
            img, lbl = img.swapaxes(0, 1), lbl.swapaxes(0, 1)
            a = aff[:, [1, 0, 2, 3]]
        out.append((np.ascontiguousarray(img), np.ascontiguousarray(lbl), a))
    return out


def _write(path: Path, data: np.ndarray, affine: np.ndarray) -> None:
    from voxjet.volumes.dataset.images import write_image

    write_image(path, data, affine)


def v2_dataset(root: Path, cases, channel_names: dict, labels: dict, ending: str = ".nii.gz",
               order: list[int] | None = None, test_cases=()) -> Path:  # fmt: skip
    """An nnU-Net v2 dataset: cases of ([channel arrays], label, affine) as
    imagesTr/<id>_000k<ending> and labelsTr/<id><ending>; test cases in imagesTs/."""
    for sub in ("imagesTr", "labelsTr", "imagesTs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i, (channels, label, aff) in enumerate(cases):
        for k, ch in enumerate(channels):
            _write(root / "imagesTr" / f"case_{i:03d}_{k:04d}{ending}", ch, aff)
        _write(root / "labelsTr" / f"case_{i:03d}{ending}", label.astype(np.uint8), aff)
    for i, (channels, aff) in enumerate(test_cases):
        for k, ch in enumerate(channels):
            _write(root / "imagesTs" / f"new_{i:03d}_{k:04d}{ending}", ch, aff)
    meta = {"channel_names": channel_names, "labels": labels, "numTraining": len(cases),
            "file_ending": ending}  # fmt: skip
    if order is not None:
        meta["regions_class_order"] = order
    (root / "dataset.json").write_text(json.dumps(meta, indent=1))
    return root


def _gradient(t1: np.ndarray) -> np.ndarray:
    """A derived channel: the T1's gradient magnitude (edges), on another intensity scale."""
    return np.sqrt(sum(g**2 for g in np.gradient(t1))).astype(np.float32)


def _brain(gm: np.ndarray, wm: np.ndarray) -> np.ndarray:
    """0 outside the brain, 1 grey matter, 2 white matter."""
    return np.where(gm + wm > 127, np.where(wm > gm, 2, 1), 0).astype(np.uint8)


def _prepare(tmp_path: Path, root: Path, **cfg) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "m.json").write_text(json.dumps({"root": str(root)}))
    base = {"patch_size": [32, 32, 32], "network_depth": 3, "plan_channels": [8, 16, 32, 64],
            "val_fraction": 0.25, "test_fraction": 0.25}  # fmt: skip
    preprocess_dataset(tmp_path / "m.json", tmp_path / "cases", VolumePrepConfig(**{**base, **cfg}))
    return tmp_path / "cases"


def _train(cases: Path, out: Path, model: dict, steps: int = 8, **train) -> Path:
    from voxjet.volumes.training.train import run

    cfg = {"model": model, "train": {"steps": steps, "lr": 3e-3, "batch_size": 2,
           "eval_every": steps, "iterations_per_epoch": steps, **train}}  # fmt: skip
    run(str(cases), cfg, str(out))
    return out / "model.pt"


def test_two_channel_dataset_trains_and_predicts_with_each_channels_normalisation(tmp_path):
    """T1 + its gradient magnitude (rescaled to 0-1): both channels reach the network (its first
    layer takes 2), each normalised by its own scheme, and new 2-channel cases segment onto
    their own grids."""
    from voxjet.predict import run_predict
    from voxjet.volumes.networks.models import load_trained

    t1, gm, wm, aff = _mni()
    label = (gm + wm > 127).astype(np.uint8)
    cases = [([img, _gradient(img)], lbl, a) for img, lbl, a in _variants(t1, label, aff, 4)]
    root = v2_dataset(tmp_path / "ds", cases, {"0": "T1", "1": "rescale_to_0_1"},
                      {"background": 0, "brain": 1},
                      test_cases=[([t1, _gradient(t1)], aff)])  # fmt: skip
    assert [len(c.images) for c in load_dataset(root).cases] == [2] * 4
    prepared = _prepare(tmp_path, root)
    plan = json.loads((prepared / "plan.json").read_text())
    assert plan["normalization"] == ["zscore", "rescale_to_0_1"]
    with h5py.File(prepared / "case_000.h5") as f:
        image = f["image"][...]
    assert image.shape[0] == 2
    assert abs(image[0].mean()) < 1e-3 and abs(image[0].std() - 1) < 1e-3  # z-scored
    assert image[1].min() >= -1e-6 and image[1].max() <= 1 + 1e-6  # rescaled to 0-1
    model_pt = _train(prepared, tmp_path / "run", {"name": "dynunet"})
    model, saved = load_trained(model_pt)
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Conv3d))
    assert first.in_channels == 2
    assert saved["model_config"]["network"] == plan["network"]  # the plan's topology
    out = run_predict(str(model_pt), [str(root / "imagesTs")], str(tmp_path / "pred"))
    seg = nib.load(out[0])
    assert seg.shape == t1.shape and np.allclose(seg.affine, aff)
    assert set(np.unique(np.asarray(seg.dataobj))) <= {0, 1}


def test_region_based_dataset_trains_with_sigmoid_outputs_and_predicts(tmp_path):
    """Regions (nnU-Net v2): "brain" = grey + white matter, "white_matter" inside it, trained
    with one sigmoid output a region and written back in regions_class_order."""
    from voxjet.predict import run_predict
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.networks.models import load_trained

    t1, gm, wm, aff = _mni()
    cases = [([img], lbl, a) for img, lbl, a in _variants(t1, _brain(gm, wm), aff, 4)]
    labels = {"background": 0, "brain": [1, 2], "white_matter": [2]}
    root = v2_dataset(tmp_path / "ds", cases, {"0": "T1"}, labels, order=[1, 2],
                      test_cases=[([t1], aff)])  # fmt: skip
    ds = load_dataset(root)
    assert ds.regions == {"brain": [1, 2], "white_matter": [2]} and ds.num_outputs == 2
    prepared = _prepare(tmp_path, root)
    model_pt = _train(prepared, tmp_path / "run", {"name": "unet", "channels": [8, 16, 32]})
    model, _ = load_trained(model_pt)
    assert model(torch.zeros(1, 1, 32, 32, 32)).shape[1] == 2  # one output a region
    m = evaluate(str(prepared), str(model_pt), str(tmp_path / "eval"))
    assert set(m["per_class"]) == {"brain", "white_matter"}
    (out,) = run_predict(str(model_pt), [str(root / "imagesTs")], str(tmp_path / "pred"),
                         probabilities=True)  # fmt: skip
    seg = np.asarray(nib.load(out).dataobj)
    assert seg.shape == t1.shape and set(np.unique(seg)) <= {0, 1, 2}
    # the regions' sigmoid outputs on the same grid: 0 outside the cropped image
    soft = nib.load(tmp_path / "pred" / "new_000_probabilities.nii.gz")
    p = np.asarray(soft.dataobj)
    assert p.shape == (*t1.shape, 2) and np.allclose(soft.affine, aff)
    assert p.min() >= 0 and p.max() <= 1


@pytest.mark.parametrize("ending", [".nrrd", ".mha"])
def test_nrrd_and_mha_datasets_preprocess_as_their_nifti_twins(tmp_path, ending):
    t1, gm, wm, aff = _mni(step=6)
    cases = [([img], lbl, a) for img, lbl, a in _variants(t1, _brain(gm, wm), aff, 4)]
    labels = {"background": 0, "grey_matter": 1, "white_matter": 2}
    twins = {}
    for e in (".nii.gz", ending):
        root = v2_dataset(tmp_path / e.strip("."), cases, {"0": "MRI"}, labels, ending=e)
        out = _prepare(tmp_path / f"p{e}", root, patch_size=[16, 16, 16], network_depth=2)
        with h5py.File(out / "case_002.h5") as f:  # the swapped-axes case
            twins[e] = (f["image"][...], f["label"][...], f.attrs["original_affine"])
    (ai, al, aa), (bi, bl, ba) = twins[".nii.gz"], twins[ending]
    assert np.allclose(aa, ba, atol=1e-4) and np.array_equal(al, bl)
    np.testing.assert_allclose(ai, bi, atol=1e-4)


def test_splits_final_folds_train_and_their_ensemble_predicts(tmp_path):
    """splits_final.json's folds decide each fold's training and validation cases; the cases
    no fold uses are the test set; predict averages the folds' models."""
    from voxjet.predict import choose_models, run_predict
    from voxjet.volumes.inference.predict import case_inputs, segment
    from voxjet.volumes.networks.models import load_trained

    t1, gm, wm, aff = _mni(step=6)
    label = (gm + wm > 127).astype(np.uint8)
    cases = [([img], lbl, a) for img, lbl, a in _variants(t1, label, aff, 5)]
    root = v2_dataset(tmp_path / "ds", cases, {"0": "T1"}, {"background": 0, "brain": 1},
                      test_cases=[([t1], aff)])  # fmt: skip
    folds = [
        {"train": ["case_000", "case_001"], "val": ["case_002"]},
        {"train": ["case_000", "case_002"], "val": ["case_001"]},
    ]
    (root / "splits_final.json").write_text(json.dumps(folds))
    prepared = _prepare(tmp_path, root, patch_size=[16, 16, 16], network_depth=2,
                        plan_channels=[8, 16, 32])  # fmt: skip
    splits = json.loads((prepared / "splits.json").read_text())
    assert splits["folds"] == folds and splits["test"] == ["case_003", "case_004"]
    models = []
    for k in range(2):
        pt = _train(prepared, tmp_path / f"fold{k}", {"name": "unet", "channels": [8, 16, 32]},
                    fold=k, folds=2)  # fmt: skip
        saved = load_trained(pt)[1]
        assert saved["model_config"]["cases"] == folds[k]
        models.append(str(pt))
    assert choose_models(models) == models  # folds: all of them, averaged
    (out,) = run_predict(models, [str(root / "imagesTs")], str(tmp_path / "pred"))
    # the ensemble is the arg-max of the folds' mean probabilities
    nets = [load_trained(p)[0].eval() for p in models]
    cfg = load_trained(models[0])[1]["model_config"]
    (case,) = case_inputs([str(root / "imagesTs")])
    ensemble, _, _ = segment(nets, case, cfg, torch.device("cpu"), 0.5, False)
    assert np.array_equal(np.asarray(nib.load(out).dataobj), ensemble)


def test_hd95_in_the_original_space_equals_monai_on_the_users_files(tmp_path):
    """Cases of the 1 mm template (a region of it) stored RAS, LAS and ARS at 1 mm, and one at
    1×1×3 mm, planned at 2 mm: the reported Dice and HD95 of a prediction are MONAI's, computed
    here independently on the prediction written back and the user's own label file, with the
    voxel sizes of that file — not on the 2 mm planning grid."""
    from monai.metrics import compute_dice, compute_hausdorff_distance

    from voxjet.volumes.evaluation.evaluate import score_case
    from voxjet.volumes.plan.plan_file import Plan

    t1, gm, wm, aff = _mni(step=1)
    box = (slice(60, 124), slice(80, 150), slice(70, 120))
    t1, gm, wm = t1[box], gm[box], wm[box]
    aff = aff.copy()
    aff[:3, 3] += aff[:3, :3] @ np.array([60, 80, 70])
    label = (gm + wm > 127).astype(np.uint8)
    stored = _variants(t1, label, aff, 3)
    thick = aff @ np.diag([1, 1, 3, 1])
    stored.append((np.ascontiguousarray(t1[..., ::3]), np.ascontiguousarray(label[..., ::3]),
                   thick))  # fmt: skip
    root = v2_dataset(tmp_path / "ds", [([i], lbl, a) for i, lbl, a in stored], {"0": "T1"},
                      {"background": 0, "brain": 1})  # fmt: skip
    prepared = _prepare(tmp_path, root, target_spacing=[2.0, 2.0, 2.0], patch_size=[16] * 3,
                        network_depth=2, val_fraction=0.25, test_fraction=0.25)  # fmt: skip
    plan = Plan.from_dict(json.loads((prepared / "plan.json").read_text()))
    fine = []
    for i in range(4):
        user = nib.load(root / "labelsTr" / f"case_{i:03d}.nii.gz")
        ref = np.asarray(user.dataobj)
        zooms = [float(z) for z in user.header.get_zooms()[:3]]
        with h5py.File(prepared / f"case_{i:03d}.h5") as f:
            on_plan_grid = f["label"][...]
            # predictions on the planning grid: the label there, and one voxel off along x
            for pred in (on_plan_grid, np.roll(on_plan_grid, 1, axis=0)):
                original, metrics = score_case(f, pred, plan)
                assert original.shape == ref.shape
                p = torch.from_numpy(original == 1)[None, None].float()
                y = torch.from_numpy(ref == 1)[None, None].float()
                hd = float(compute_hausdorff_distance(p, y, percentile=95, spacing=zooms)[0, 0])
                dice = float(compute_dice(p, y)[0, 0])
                assert metrics["brain"]["hd95"] == pytest.approx(hd, rel=1e-6)
                assert metrics["brain"]["dice"] == pytest.approx(dice, rel=1e-6)
                if zooms == [1.0, 1.0, 1.0] and pred is on_plan_grid:
                    fine.append(hd)
    # measured on the 1 mm grids, the resampling error is under the 2 mm planning spacing
    # (on the planning grid it would read 0, and any error at least 2 mm)
    assert len(fine) == 3 and all(0 < hd < 2.0 for hd in fine), fine


# ---- bad inputs: each named with the file or key and the fix ----


def test_a_missing_channel_file_is_named(tmp_path):
    t1, gm, wm, aff = _mni(step=8)
    label = (gm + wm > 127).astype(np.uint8)
    root = v2_dataset(tmp_path / "ds", [([t1, t1], label, aff)] * 2,
                      {"0": "T1", "1": "T2"}, {"background": 0, "brain": 1})  # fmt: skip
    (root / "imagesTr" / "case_001_0001.nii.gz").unlink()
    want = r"case 'case_001' lacks its channel file\(s\) \['imagesTr/case_001_0001.nii.gz'\]"
    with pytest.raises(VoxjetError, match=want + ": channel_names declares 2"):
        load_dataset(root)


@pytest.mark.parametrize(
    "labels,order,match",
    [
        ({"background": 0, "brain": [1, 2], "white_matter": [2]}, [2, 1],
         r"gives region 'white_matter' the value 1, which it does not contain"),
        ({"background": 0, "white_matter": [2], "brain": [1, 2]}, [2, 1],
         r"label value 2 would come back as 1 .* order the regions from the largest"),
        ({"background": 0, "brain": [1, 2], "white_matter": [2]}, None,
         r"region-based labels need regions_class_order"),
        ({"background": 0, "brain": [0, 1]}, [1], r"regions \['brain'\] include 0"),
    ],
)  # fmt: skip
def test_regions_that_overlap_wrongly_are_refused(tmp_path, labels, order, match):
    t1, gm, wm, aff = _mni(step=8)
    root = v2_dataset(tmp_path / "ds", [([t1], _brain(gm, wm), aff)] * 2, {"0": "T1"}, labels,
                      order=order)  # fmt: skip
    with pytest.raises(VoxjetError, match=match):
        load_dataset(root)


def test_a_split_that_leaves_no_validation_or_test_case_is_refused(tmp_path):
    from voxjet.volumes.dataset.splits import split_cases

    t1, gm, wm, aff = _mni(step=8)
    label = (gm + wm > 127).astype(np.uint8)
    root = v2_dataset(tmp_path / "ds", [([t1], label, aff)] * 3, {"0": "T1"},
                      {"background": 0, "brain": 1})  # fmt: skip
    ds = load_dataset(root)
    ids = [c.case_id for c in ds.cases]
    with pytest.raises(VoxjetError, match=r"volumes.val_fraction=0 leaves no validation case"):
        split_cases(ids, VolumePrepConfig(val_fraction=0), ds)
    with pytest.raises(VoxjetError, match=r"3 cases leave none for training"):
        split_cases(ids, VolumePrepConfig(val_fraction=0.5, test_fraction=0.5), ds)
    (root / "splits_final.json").write_text(json.dumps([{"train": ids[:2], "val": ids[2:]}]))
    with pytest.raises(VoxjetError, match=r"splits_final.json: its folds use every case"):
        split_cases(ids, VolumePrepConfig(), load_dataset(root))


def test_an_ignore_label_is_no_class_and_no_score(tmp_path):
    """nnU-Net v2's sparse annotations (`"ignore": 2`, the highest value): the plan has two
    classes and records the ignore label, the case files keep the unannotated voxels as 2,
    training leaves them out of the loss, predictions never write 2, and evaluate's
    metrics.json equals the metrics (nnU-Net's with ignore_label, tests/test_seg_metrics.py) of
    the predictions it wrote, on the annotated voxels alone. An ignore label that is not the
    highest value is refused, naming it."""
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.evaluation.metrics import seg_metrics
    from voxjet.volumes.plan.plan_file import read_plan

    t1, gm, wm, aff = _mni()
    brain = ((gm + wm) > 127).astype(np.uint8)
    cases = []
    for img, lbl, a in _variants(t1, brain, aff, 8):
        sparse = lbl.copy()
        sparse[:, :, sparse.shape[2] // 2 :] = 2  # only the lower half annotated
        cases.append(([img], sparse, a))
    root = v2_dataset(tmp_path / "raw", cases, {"0": "T1"},
                      {"background": 0, "brain": 1, "ignore": 2})  # fmt: skip
    prepared = _prepare(tmp_path / "prep", root)
    plan = read_plan(str(prepared))
    assert (plan.num_classes, plan.ignore_label) == (2, 2)
    assert plan.labels == {0: "background", 1: "brain"}
    model = _train(prepared, tmp_path / "run", {"name": "unet", "channels": [8, 16, 32, 64]},
                   steps=20)  # fmt: skip
    metrics = evaluate(str(prepared), str(model), str(tmp_path / "eval"))
    written = sorted((tmp_path / "eval" / "predictions").glob("*.nii.gz"))
    assert written and len(written) == metrics["n_cases"]
    for path in written:
        cid = path.name.removesuffix(".nii.gz")
        pred = np.asarray(nib.load(path).dataobj)
        assert 2 not in np.unique(pred)  # an ignore label is never predicted
        label = cases[int(cid.removeprefix("case_"))][1]
        want = seg_metrics(pred, label, plan.label_set, hd95=False)["brain"]
        got = metrics["per_case"][cid]["brain"]
        for k in ("tp", "fp", "fn"):
            assert got[k] == want[k], (cid, k)
        assert (got["iou"], got["dice"]) == pytest.approx((want["iou"], want["dice"]))
        # the unannotated half, whatever was predicted there, counts for nothing
        assert want["tp"] + want["fn"] == int((label == 1).sum())
    assert 0 < metrics["per_class"]["brain"]["iou"] <= metrics["per_class"]["brain"]["dice"]
    meta = json.loads((root / "dataset.json").read_text())
    meta["labels"] = {"background": 0, "ignore": 1, "brain": 2}
    (root / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(VoxjetError, match=r"labels\.ignore is 1, but the ignore label must be "
                       r"the highest value"):  # fmt: skip
        load_dataset(root)
