"""Big volumes on an ordinary node: wall time and peak resident memory of whole-case prediction
and scoring of a whole-body-CT-like case with many classes, each variant in its own process
(peak RSS from getrusage, less the resident size before the variant starts), side by side in
one run.

The case: int16 CT-like intensities, `--shape` voxels (default 256 × 256 × 200; the issue's
512 × 512 × 800 with `--shape 512 512 800`), `--classes` labelled organs (default 14) as
ellipsoids of several sizes, some small. The network: a narrow MONAI U-Net (4-8-16 channels,
random weights) with the classes' outputs, patch 64³, step 0.5, Gaussian weighting: what is
measured is how the case is handled around the network, not the network.

Variants (prediction at the case's own spacing, so no resampling enters):
- `voxjet`: the current path (voxjet.volumes.inference: one logits buffer, labels from logits,
  back onto the case's grid by voxjet.volumes.geometry.labels_to_original);
- `nnunet`: nnU-Net 2.8.1's `nnUNetPredictor` (manual_initialization with the same network and
  weights, CPU), `predict_logits_from_preprocessed_data` and
  `convert_predicted_logits_to_segmentation_with_correct_shape` (the bench venv);
- `earlier`: the path before it, re-created here: softmax probabilities of a whole-image pass
  a flip, summed into a second full-size buffer, then the arg-max;
- `score`: voxjet.volumes.metrics.seg_metrics of the prediction against the labels (Dice and
  HD95 of every class).
Both are given the same preprocessed case (preprocessing is not compared here). Each row prints
the peak against two references: the estimate `voxjet predict` checks before it
starts (voxjet.volumes.case_memory.prediction_need, without probabilities) and a lower bound
(the image as float32, one label map and the classes' logits in one buffer).

    .venv-bench/bin/python benchmarks/big_volumes.py [--shape 256 256 200] [--classes 14] [--mirror]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

GIB = 1024**3
PATCH = [64, 64, 64]
TARGETS = ("targets (issue 45): prediction peak ≤ 0.5× nnU-Net's and ≤ 2× the lower bound, time "
           "≤ 0.67× nnU-Net's; preprocessing peak ≤ 0.5× nnU-Net's at no more time")  # fmt: skip


def ct_case(shape: tuple[int, ...], classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(int16 image, uint8 label map) of a CT-like body with `classes` ellipsoid organs."""
    rng = np.random.default_rng(seed)
    grids = np.ogrid[tuple(slice(0, n) for n in shape)]
    label = np.zeros(shape, np.uint8)
    image = np.full(shape, -1000, np.int16)
    body = sum(((g - n / 2) / (0.45 * n)) ** 2 for g, n in zip(grids, shape, strict=True)) < 1
    image[body] = 40
    sizes = sorted((rng.uniform(0.03, 0.15) * np.array(shape) for _ in range(classes)),
                   key=lambda s: -np.prod(s))  # fmt: skip
    for c, size in enumerate(sizes, 1):  # some organs small, drawn last: none hidden
        centre = rng.uniform(0.3, 0.7) * np.array(shape)
        inside = sum(((g - m) / r) ** 2 for g, m, r in zip(grids, centre, size, strict=True)) < 1
        label[inside & body] = c
        image[inside & body] = 40 + 15 * c
    image += rng.normal(0, 20, shape).astype(np.int16)
    return image, label


def _run(variant: str, args: argparse.Namespace, work: Path) -> dict:
    """One variant in a fresh process: its wall time and peak RSS."""
    cmd = [sys.executable, __file__, "--child", variant, "--work", str(work),
           "--classes", str(args.classes)] + (["--mirror"] if args.mirror else [])  # fmt: skip
    # a failing side shows its own error, not only CalledProcessError's
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{variant} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def nnunet_plans(
    shape: tuple[int, ...], classes: int, spacing: list[float] = (1.0, 1.0, 1.0)
) -> tuple[dict, dict]:
    """(plans, dataset.json) of nnU-Net 2.8.1 for the case: one 3d_fullres configuration at
    `spacing` (nnU-Net's axis order), the benchmark's patch, CT normalisation."""
    resample = {"is_seg": False, "order": 1, "order_z": 0, "force_separate_z": None}
    fullres = {
        "data_identifier": "bench", "preprocessor_name": "DefaultPreprocessor", "batch_size": 2,
        "patch_size": PATCH, "median_image_size_in_voxels": list(shape), "spacing": list(spacing),
        "normalization_schemes": ["CTNormalization"], "use_mask_for_norm": [False],
        "resampling_fn_data": "resample_data_or_seg_to_shape",
        "resampling_fn_seg": "resample_data_or_seg_to_shape",
        "resampling_fn_data_kwargs": {**resample, "order": 3},
        "resampling_fn_seg_kwargs": {**resample, "is_seg": True},
        "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
        "resampling_fn_probabilities_kwargs": resample, "batch_dice": False,
        "architecture": {"network_class_name": "unused", "arch_kwargs": {},
                         "_kw_requires_import": []},
    }  # fmt: skip
    plans = {
        "dataset_name": "Dataset999_Bench", "plans_name": "nnUNetPlans",
        "original_median_spacing_after_transp": list(spacing),
        "original_median_shape_after_transp": list(shape), "image_reader_writer": "SimpleITKIO",
        "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2],
        "configurations": {"3d_fullres": fullres}, "experiment_planner_used": "bench",
        "label_manager": "LabelManager",
        "foreground_intensity_properties_per_channel": {"0": {
            "max": 3000.0, "mean": 100.0, "median": 100.0, "min": -1000.0,
            "percentile_00_5": -1000.0, "percentile_99_5": 300.0, "std": 50.0}},
    }  # fmt: skip
    labels = {"background": 0, **{f"organ{c}": c for c in range(1, classes + 1)}}
    return plans, {"channel_names": {"0": "CT"}, "labels": labels, "numTraining": 1,
                   "file_ending": ".nii.gz"}  # fmt: skip


def nnunet_prediction(model, image: np.ndarray, classes: int, mirror: bool) -> np.ndarray:
    """nnU-Net 2.8.1's prediction of a preprocessed case with the same network and weights
    (nnUNetPredictor.manual_initialization), its logits to the label map on the case's grid."""
    import torch
    from nnunetv2.inference.export_prediction import (
        convert_predicted_logits_to_segmentation_with_correct_shape,
    )
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    plans, dataset = nnunet_plans(image.shape[1:], classes)
    pm = PlansManager(plans)
    cm = pm.get_configuration("3d_fullres")
    predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=mirror,
                                perform_everything_on_device=False, device=torch.device("cpu"),
                                allow_tqdm=False)  # fmt: skip
    predictor.manual_initialization(model, pm, cm, [model.state_dict()], dataset, "bench",
                                    (0, 1, 2) if mirror else None)  # fmt: skip
    logits = predictor.predict_logits_from_preprocessed_data(torch.from_numpy(image))
    shape = list(image.shape[1:])
    props = {"spacing": [1.0] * 3, "shape_before_cropping": shape,
             "bbox_used_for_cropping": [[0, n] for n in shape],
             "shape_after_cropping_and_before_resampling": shape}  # fmt: skip
    return convert_predicted_logits_to_segmentation_with_correct_shape(
        logits, pm, cm, predictor.label_manager, props, False, 2
    )


SPACING = (0.8, 0.8, 1.5)  # the case's voxels (x, y, z), mm
TARGET = (1.0, 1.0, 1.5)  # the plan's
CASES = ("ct_a", "ct_b", "ct_c", "ct_d")


def write_msd(work: Path, image: np.ndarray, label: np.ndarray, classes: int) -> Path:
    """The case as an MSD dataset (linked under four names: the planner splits the cases)."""
    import nibabel as nib

    root = work / "msd"
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    affine = np.diag([*SPACING, 1.0])
    nib.save(nib.Nifti1Image(image, affine), root / "imagesTr" / "ct_a.nii.gz")
    nib.save(nib.Nifti1Image(label, affine), root / "labelsTr" / "ct_a.nii.gz")
    for case in CASES[1:]:  # the planner's splits want training, validation and test cases
        for sub in ("imagesTr", "labelsTr"):
            (root / sub / f"{case}.nii.gz").symlink_to(root / sub / "ct_a.nii.gz")
    labels = {"0": "background", **{str(c): f"organ{c}" for c in range(1, classes + 1)}}
    training = [{"image": f"./imagesTr/{c}.nii.gz", "label": f"./labelsTr/{c}.nii.gz"}
                for c in CASES]  # fmt: skip
    (root / "dataset.json").write_text(json.dumps({"modality": {"0": "CT"}, "labels": labels,
                                                   "training": training}))  # fmt: skip
    return root


def plan_voxjet(work: Path) -> None:
    """voxjet's plan of the dataset at TARGET (fingerprint included), pickled for the child."""
    import pickle

    from voxjet.volumes.msd import load_dataset
    from voxjet.volumes.plan.planning import plan_dataset
    from voxjet.volumes.settings import VolumePrepConfig

    cfg = VolumePrepConfig(target_spacing=list(TARGET), patch_size=PATCH, storage="mapped")
    planned = plan_dataset(load_dataset(work / "msd"), cfg)
    (work / "plan.pkl").write_bytes(pickle.dumps((planned["plan"], planned["fingerprint"], cfg)))


def preprocess_voxjet(work: Path) -> None:
    """voxjet's preprocess_case job for one case: read, crop, resample, normalise, write."""
    import pickle

    from voxjet.volumes.msd import load_dataset
    from voxjet.volumes.preprocess import preprocess_case

    plan, fp, cfg = pickle.loads((work / "plan.pkl").read_bytes())
    ds = load_dataset(work / "msd")
    case = next(c for c in ds.cases if c.case_id == "ct_a")
    preprocess_case(ds, case, plan, fp, work / "voxjet_ct_a.h5", cfg)


def preprocess_nnunet(work: Path, classes: int) -> None:
    """nnU-Net 2.8.1's DefaultPreprocessor.run_case_save for the same case and spacing."""
    from nnunetv2.preprocessing.preprocessors.default_preprocessor import DefaultPreprocessor
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    image = work / "msd" / "imagesTr" / "ct_a.nii.gz"
    label = work / "msd" / "labelsTr" / "ct_a.nii.gz"
    shape = np.load(work / "image.npy", mmap_mode="r").shape
    # SimpleITK's axis order (z, y, x), as nnU-Net reads the file
    plans, dataset = nnunet_plans(shape[::-1], classes, list(TARGET[::-1]))
    pm = PlansManager(plans)
    for old in work.glob("nnunet_ct_a*"):  # blosc2 will not overwrite an earlier repeat's
        old.unlink()
    DefaultPreprocessor(verbose=False).run_case_save(
        str(work / "nnunet_ct_a"), [str(image)], str(label), pm,
        pm.get_configuration("3d_fullres"), dataset)  # fmt: skip


def child(variant: str, work: Path, classes: int, mirror: bool) -> None:
    """Run one variant on the stored case; print its time and peak RSS as JSON."""
    import torch
    from monai.inferers import sliding_window_inference

    from voxjet.volumes.geometry import labels_to_original
    from voxjet.volumes.inference import logits_to_labels, mirror_axes, predict_logits
    from voxjet.volumes.metrics import seg_metrics
    from voxjet.volumes.models import build_unet
    from voxjet.volumes.plan.plan_file import LabelSet

    if "nnunet" in variant:  # its imports before the baseline, as voxjet's are
        import nnunetv2.inference.predict_from_raw_data  # noqa: F401
        import nnunetv2.preprocessing.preprocessors.default_preprocessor  # noqa: F401
    else:
        import voxjet.volumes.preprocess  # noqa: F401
    torch.manual_seed(0)
    labels = {i: f"organ{i}" if i else "background" for i in range(classes + 1)}
    label_set = LabelSet(labels, classes + 1)
    import psutil

    # the resident size now, not the peak so far: an import's transient peak would hide what
    # the variant adds below it
    base = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    if variant == "preprocess_voxjet":
        preprocess_voxjet(work)
    elif variant == "preprocess_nnunet":
        preprocess_nnunet(work, classes)
    elif variant == "score":
        pred = np.load(work / "pred.npy")
        ref = np.load(work / "label.npy")
        seg_metrics(pred, ref, label_set, [1.0, 1.0, 1.0])
    else:
        model = build_unet(1, classes + 1, [4, 8, 16], num_res_units=1).eval()
        image = np.load(work / "image.npy").astype(np.float32)[None]
        image = (image - image.mean()) / image.std()
        dev = torch.device("cpu")
        if variant == "voxjet":
            logits = predict_logits(model, image, PATCH, dev, 0.5, 2, mirror)
            pred = logits_to_labels(logits, label_set)
            del logits
            attrs = {"crop_box": [[0, n] for n in pred.shape], "ras_shape": pred.shape,
                     "original_affine": np.eye(4)}  # fmt: skip
            pred = labels_to_original(pred, attrs, classes + 1)
        elif variant == "nnunet":
            pred = nnunet_prediction(model, image, classes, mirror)
        else:  # the earlier path: a whole-image pass a flip, probabilities summed
            x = torch.from_numpy(image[None])
            probs = None
            with torch.no_grad():
                for axes in mirror_axes(PATCH, mirror):
                    xi = torch.flip(x, axes) if axes else x
                    lg = sliding_window_inference(xi, PATCH, 2, model, 0.5, mode="gaussian",
                                                  padding_mode="constant")  # fmt: skip
                    p = torch.softmax(lg.float(), 1)
                    p = torch.flip(p, axes) if axes else p
                    probs = p if probs is None else probs + p
            pred = (probs / len(mirror_axes(PATCH, mirror)))[0].argmax(0).numpy().astype(np.uint8)
        np.save(work / f"pred_{variant}.npy", pred)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak": peak, "base": base}))


def main() -> None:
    """Every variant measured in its own process; the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=int, nargs=3, default=[256, 256, 200])
    ap.add_argument("--classes", type=int, default=14)
    ap.add_argument("--mirror", action="store_true", help="test-time mirroring (8 flips)")
    ap.add_argument("--preprocess", action="store_true", help="also preprocessing, both sides")
    ap.add_argument("--repeats", type=int, default=2, help="runs a variant; the fastest kept")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    if args.child:
        child(args.child, args.work, args.classes, args.mirror)
        return
    import tempfile

    from voxjet.volumes.case_memory import OVERHEAD, Header, prediction_need

    nnunet = importlib.util.find_spec("nnunetv2") is not None
    if not nnunet:
        print("nnU-Net is not installed here (the bench venv has it: make bench-venv); its rows "
              "are left out")  # fmt: skip
    predict_sides = ("voxjet", "nnunet", "earlier") if nnunet else ("voxjet", "earlier")
    pre_sides = ("preprocess_voxjet", "preprocess_nnunet") if nnunet else ("preprocess_voxjet",)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        image, label = ct_case(tuple(args.shape), args.classes)
        np.save(work / "image.npy", image)
        np.save(work / "label.npy", label)
        if args.preprocess:
            write_msd(work, image, label, args.classes)
            plan_voxjet(work)
            pre = [(v, _run(v, args, work)) for _ in range(args.repeats)
                   for v in pre_sides]  # fmt: skip
            pre_rows = {v: min((r for n, r in pre if n == v), key=lambda r: r["seconds"])
                        for v in pre_sides}  # fmt: skip
        # each variant twice, interleaved (a shared machine's load drifts): the faster run
        runs = [(v, _run(v, args, work)) for _ in range(args.repeats)
                for v in predict_sides]  # fmt: skip
        rows = {v: min((r for n, r in runs if n == v), key=lambda r: r["seconds"])
                for v in predict_sides}  # fmt: skip
        ours = np.load(work / "pred_voxjet.npy")
        same = (ours == np.load(work / "pred_earlier.npy")).mean()
        same_nnunet = (ours == np.load(work / "pred_nnunet.npy")).mean() if nnunet else np.nan
        np.save(work / "pred.npy", np.load(work / "pred_voxjet.npy"))
        rows["score"] = _run("score", args, work)
    voxels = int(np.prod(args.shape))
    head = Header(tuple(args.shape), 1, (1.0, 1.0, 1.0), (0, 1, 2))
    estimate = prediction_need(head, [1.0, 1.0, 1.0], args.classes + 1, False, PATCH) - OVERHEAD
    lower = voxels * (4 + 1 + 4 * (args.classes + 1))
    print(f"\ncase {'×'.join(map(str, args.shape))}, {args.classes} classes, patch 64³, "
          f"mirroring {'on' if args.mirror else 'off'}, {os.environ['OMP_NUM_THREADS']} threads; "
          f"lower bound {lower / GIB:.2f} GiB, the predict check's estimate "
          f"{estimate / GIB:.2f} GiB (+{OVERHEAD / GIB:.0f} GiB overhead); voxjet's labels agree "
          f"with the earlier path's on {same:.6f} of the voxels, with nnU-Net's on "
          f"{same_nnunet:.6f}\n")  # fmt: skip
    print("| variant | seconds | peak RSS GiB | above start GiB | that ÷ lower bound |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        grown = (r["peak"] - r["base"]) / GIB
        print(f"| {name} | {r['seconds']:.1f} | {r['peak'] / GIB:.2f} | {grown:.2f} | "
              f"{grown * GIB / lower:.2f} |")  # fmt: skip
    if args.preprocess:
        print(f"\npreprocessing one case from NIfTI ({SPACING} mm to the plan's {TARGET} mm; "
              "voxjet resamples trilinearly, nnU-Net with its order-3 spline), read to "
              "written:\n")  # fmt: skip
        print("| variant | seconds | peak RSS GiB | above start GiB |")
        print("|---|---|---|---|")
        for name, r in pre_rows.items():
            print(f"| {name} | {r['seconds']:.1f} | {r['peak'] / GIB:.2f} | "
                  f"{(r['peak'] - r['base']) / GIB:.2f} |")  # fmt: skip
        if nnunet:
            v, o = pre_rows["preprocess_voxjet"], pre_rows["preprocess_nnunet"]
            print(f"voxjet ÷ nnU-Net preprocessing: time {v['seconds'] / o['seconds']:.2f}, "
                  f"peak above start "
                  f"{(v['peak'] - v['base']) / max(o['peak'] - o['base'], 1):.2f}\n")  # fmt: skip
    v = rows["voxjet"]
    for other in [side for side in predict_sides if side != "voxjet"]:
        o = rows[other]
        print(f"voxjet ÷ {other}: time {v['seconds'] / o['seconds']:.2f}, peak above start "
              f"{(v['peak'] - v['base']) / max(o['peak'] - o['base'], 1):.2f}")  # fmt: skip
    print(TARGETS)


if __name__ == "__main__":
    main()
