"""Big volumes on an ordinary node: wall time and peak resident memory of preprocessing,
whole-case prediction and scoring of a whole-body-CT-like case with many classes, each variant
in its own process (its peak resident size less the resident size before the variant starts),
side by side in one run, repeats interleaved.

Peaks are the kernel's high-water mark of the resident size (VmHWM), reset when the variant
starts (so neither the parent's resident size at the fork nor the imports count).

The case: int16 CT-like intensities, `--shape` voxels (default 256 × 256 × 200; the issue's
512 × 512 × 800 with `--shape 512 512 800`), `--classes` labelled organs (default 14) as
ellipsoids of several sizes, some small; with `--mr`, an MR-like case instead (float32, four
channels of different contrasts with a bias field, default 320 × 320 × 200, z-scored). The
network: a narrow MONAI U-Net (4-8-16 channels, random weights) with the classes' outputs,
patch 64³, step 0.5, Gaussian weighting: what is measured is how the case is handled around
the network, not the network.

Variants (prediction at the case's own spacing, so no resampling enters):
- `voxjet`: the current path (voxjet.volumes.inference.segment.segment_image: MONAI's windows
  streamed slab by slab, each slab's labels from its logits; back onto the case's grid by
  voxjet.volumes.dataset.geometry.labels_to_original; with `--probabilities` the probabilities
  streamed to their 4-D NIfTI as `voxjet predict --probabilities` writes them);
- `nnunet`: nnU-Net 2.8.1's `nnUNetPredictor` (manual_initialization with the same network and
  weights, CPU), `predict_logits_from_preprocessed_data` and
  `convert_predicted_logits_to_segmentation_with_correct_shape` (the bench venv; with
  `--probabilities` also its probabilities, saved as its export saves them);
- `earlier`: the path before issue 45, re-created here: softmax probabilities of a whole-image
  pass a flip, summed into a second full-size buffer, then the arg-max (left out with
  `--mirror` or `--probabilities`, and where its buffers would not fit the machine);
- `network`: one forward pass of a batch of two windows alone, the activations every sliding
  window holds besides its buffers;
- `score`: voxjet.volumes.evaluation.metrics.seg_metrics of the prediction against the labels (Dice
  and HD95 of every class; `--no-score` leaves it out);
- with `--preprocess`, `preprocess_voxjet` (voxjet's preprocess_case job: read, crop, resample,
  normalise, write) and `preprocess_nnunet` (nnU-Net's DefaultPreprocessor.run_case_save) of
  the case from NIfTI at 0.8 × 0.8 × 1.5 mm to a 1.0 × 1.0 × 1.5 mm plan.
Both prediction sides are given the same preprocessed case. Each row prints the peak against
two references: the estimate `voxjet predict` checks before it starts
(voxjet.volumes.inference.case_memory.prediction_need) and a lower bound: the image as float32, one
label map, one window's depth of the classes' logits and weights (the least a Gaussian-blended
sliding window holds), the network's pass (`network`) and, with probabilities, one class's
probabilities on the case's grid (written a class at a time).

    .venv-bench/bin/python benchmarks/big_volumes.py [--shape 256 256 200] [--classes 14] \
        [--mirror] [--probabilities] [--preprocess] [--mr] [--no-score] [--repeats 3]
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
from functools import partial
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


def mr_case(shape: tuple[int, ...], classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(float32 image [4, X, Y, Z], uint8 label map) of an MR-like case: the CT-like organs,
    four channels of different contrasts (each organ brighter or darker in each), a smooth bias
    field and noise, in arbitrary units."""
    rng = np.random.default_rng(seed + 1)
    ct, label = ct_case(shape, classes, seed)
    body = ct > -500
    grids = np.ogrid[tuple(slice(0, n) for n in shape)]
    bias = 1 + 0.2 * sum(np.cos(np.pi * g / n) for g, n in zip(grids, shape, strict=True)) / 3
    image = np.empty((4, *shape), np.float32)
    for ch in range(4):
        contrast = rng.uniform(0.2, 2.0, classes + 1).astype(np.float32)
        image[ch] = np.where(body, 300 * contrast[label], 0) * bias
        image[ch] += rng.normal(0, 15, shape).astype(np.float32)
    return image, label


def best_of(runs: list[dict]) -> dict:
    """A variant's repeats as one row: the fastest time, the lowest peak above start, and the
    highest peak above start (`worst`)."""
    grown = [r["peak"] - r["base"] for r in runs]
    best = min(runs, key=lambda r: r["peak"] - r["base"])
    return {"seconds": min(r["seconds"] for r in runs), "peak": best["peak"],
            "base": best["base"], "worst": max(grown)}  # fmt: skip


def _run(variant: str, args: argparse.Namespace, work: Path) -> dict:
    """One variant in a fresh process: its wall time and peak RSS."""
    cmd = [sys.executable, __file__, "--child", variant, "--work", str(work),
           "--classes", str(args.classes)] + (["--mirror"] if args.mirror else []) + (
               ["--probabilities"] if args.probabilities else [])  # fmt: skip
    # a failing side shows its own error, not only CalledProcessError's
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{variant} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def nnunet_plans(
    shape: tuple[int, ...], classes: int, spacing: list[float] = (1.0, 1.0, 1.0), channels: int = 1
) -> tuple[dict, dict]:
    """(plans, dataset.json) of nnU-Net 2.8.1 for the case: one 3d_fullres configuration at
    `spacing` (nnU-Net's axis order), the benchmark's patch, CT normalisation (one channel) or
    z-scoring (an MR-like case's channels)."""
    ct = channels == 1
    schemes = ["CTNormalization"] if ct else ["ZScoreNormalization"] * channels
    names = {"0": "CT"} if ct else {str(c): f"MR{c}" for c in range(channels)}
    resample = {"is_seg": False, "order": 1, "order_z": 0, "force_separate_z": None}
    fullres = {
        "data_identifier": "bench", "preprocessor_name": "DefaultPreprocessor", "batch_size": 2,
        "patch_size": PATCH, "median_image_size_in_voxels": list(shape), "spacing": list(spacing),
        "normalization_schemes": schemes, "use_mask_for_norm": [False] * channels,
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
        "foreground_intensity_properties_per_channel": {str(c): {
            "max": 3000.0, "mean": 100.0, "median": 100.0, "min": -1000.0,
            "percentile_00_5": -1000.0, "percentile_99_5": 300.0, "std": 50.0}
            for c in range(channels)},
    }  # fmt: skip
    labels = {"background": 0, **{f"organ{c}": c for c in range(1, classes + 1)}}
    return plans, {"channel_names": names, "labels": labels, "numTraining": 1,
                   "file_ending": ".nii.gz"}  # fmt: skip


def nnunet_prediction(model, image: np.ndarray, classes: int, mirror: bool, probabilities: bool):
    """nnU-Net 2.8.1's prediction of a preprocessed case with the same network and weights
    (nnUNetPredictor.manual_initialization), its logits to the label map on the case's grid
    (and with `probabilities`, (label map, probabilities) as its export asks for them)."""
    import torch
    from nnunetv2.inference.export_prediction import (
        convert_predicted_logits_to_segmentation_with_correct_shape,
    )
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    plans, dataset = nnunet_plans(image.shape[1:], classes, channels=image.shape[0])
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
        logits, pm, cm, predictor.label_manager, props, probabilities, 2
    )


SPACING = (0.8, 0.8, 1.5)  # the case's voxels (x, y, z), mm
TARGET = (1.0, 1.0, 1.5)  # the plan's
CASES = ("ct_a", "ct_b", "ct_c", "ct_d")


def write_msd(work: Path, image: np.ndarray, label: np.ndarray, classes: int) -> Path:
    """The case as an MSD dataset (linked under four names: the planner splits the cases); an
    MR-like case [4, X, Y, Z] as one 4-D image (channels last) for voxjet and one file a
    channel (nnU-Net's `_000N` naming) for nnU-Net."""
    import nibabel as nib

    root = work / "msd"
    (root / "imagesTr").mkdir(parents=True)
    (root / "labelsTr").mkdir()
    affine = np.diag([*SPACING, 1.0])
    mr = image.ndim == 4
    stored = np.moveaxis(image, 0, -1) if mr else image
    nib.save(nib.Nifti1Image(stored, affine), root / "imagesTr" / "ct_a.nii.gz")
    nib.save(nib.Nifti1Image(label, affine), root / "labelsTr" / "ct_a.nii.gz")
    if mr:
        (work / "channels").mkdir()
        for ch in range(image.shape[0]):
            nib.save(
                nib.Nifti1Image(image[ch], affine), work / "channels" / f"ct_a_{ch:04d}.nii.gz"
            )
    for case in CASES[1:]:  # the planner's splits want training, validation and test cases
        for sub in ("imagesTr", "labelsTr"):
            (root / sub / f"{case}.nii.gz").symlink_to(root / sub / "ct_a.nii.gz")
    labels = {"0": "background", **{str(c): f"organ{c}" for c in range(1, classes + 1)}}
    training = [{"image": f"./imagesTr/{c}.nii.gz", "label": f"./labelsTr/{c}.nii.gz"}
                for c in CASES]  # fmt: skip
    modality = {str(c): f"MR{c}" for c in range(image.shape[0])} if mr else {"0": "CT"}
    (root / "dataset.json").write_text(json.dumps({"modality": modality, "labels": labels,
                                                   "training": training}))  # fmt: skip
    return root


def plan_voxjet(work: Path) -> None:
    """voxjet's plan of the dataset at TARGET (fingerprint included), pickled for the child."""
    import pickle

    from voxjet.volumes.dataset.msd import load_dataset
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.plan.planning import plan_dataset

    cfg = VolumePrepConfig(target_spacing=list(TARGET), patch_size=PATCH, storage="mapped")
    planned = plan_dataset(load_dataset(work / "msd"), cfg)
    (work / "plan.pkl").write_bytes(pickle.dumps((planned["plan"], planned["fingerprint"], cfg)))


def preprocess_voxjet(work: Path) -> None:
    """voxjet's preprocess_case job for one case: read, crop, resample, normalise, write."""
    import pickle

    from voxjet.volumes.dataset.msd import load_dataset
    from voxjet.volumes.preprocessing.preprocess import preprocess_case

    plan, fp, cfg = pickle.loads((work / "plan.pkl").read_bytes())
    ds = load_dataset(work / "msd")
    case = next(c for c in ds.cases if c.case_id == "ct_a")
    preprocess_case(ds, case, plan, fp, work / "voxjet_ct_a.h5", cfg)


def preprocess_nnunet(work: Path, classes: int) -> None:
    """nnU-Net 2.8.1's DefaultPreprocessor.run_case_save for the same case and spacing."""
    from nnunetv2.preprocessing.preprocessors.default_preprocessor import DefaultPreprocessor
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    label = work / "msd" / "labelsTr" / "ct_a.nii.gz"
    shape = np.load(work / "image.npy", mmap_mode="r").shape
    channels = 1 if len(shape) == 3 else shape[0]
    if channels == 1:
        images = [work / "msd" / "imagesTr" / "ct_a.nii.gz"]
    else:  # nnU-Net reads one file a channel
        images = sorted((work / "channels").glob("ct_a_*.nii.gz"))
    # SimpleITK's axis order (z, y, x), as nnU-Net reads the file
    plans, dataset = nnunet_plans(shape[-3:][::-1], classes, list(TARGET[::-1]), channels)
    pm = PlansManager(plans)
    for old in work.glob("nnunet_ct_a*"):  # blosc2 will not overwrite an earlier repeat's
        old.unlink()
    DefaultPreprocessor(verbose=False).run_case_save(
        str(work / "nnunet_ct_a"), [str(i) for i in images], str(label), pm,
        pm.get_configuration("3d_fullres"), dataset)  # fmt: skip


def load_image(work: Path) -> np.ndarray:
    """The stored case as the network's [C, X, Y, Z] float32 input, each channel z-scored in
    place (statistics summed a few planes at a time: no temporary copy of the case beyond the
    one float32 array each side is given)."""
    stored = np.load(work / "image.npy")
    image = stored.astype(np.float32, copy=False)
    image = image[None] if image.ndim == 3 else image
    del stored
    for ch in image:
        n, total, squares = ch.size, 0.0, 0.0
        for z in range(0, ch.shape[-1], 8):
            total += float(ch[..., z : z + 8].sum(dtype=np.float64))
        mean = total / n
        for z in range(0, ch.shape[-1], 8):
            squares += float(((ch[..., z : z + 8] - mean) ** 2).sum(dtype=np.float64))
        ch -= mean
        ch /= (squares / n) ** 0.5
    return image


def start_peak() -> int:
    """Reset the kernel's peak-RSS mark (VmHWM) to the resident size now, and return that size:
    getrusage's maximum would also hold the parent's resident size at the fork and the imports'
    transient peaks."""
    import psutil

    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux, or not allowed: the peak then counts from the process's start
        pass
    return psutil.Process().memory_info().rss


def peak_rss() -> int:
    """The peak resident size since start_peak (VmHWM), else getrusage's."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(variant: str, work: Path, classes: int, mirror: bool, probabilities: bool) -> None:
    """Run one variant on the stored case; print its time and peak RSS as JSON."""
    import torch
    from monai.inferers import sliding_window_inference

    from voxjet.volumes.dataset.geometry import labels_to_original
    from voxjet.volumes.evaluation.metrics import seg_metrics
    from voxjet.volumes.inference.probability_file import (
        plan_space_buffer,
        stream_to_nifti,
        write_slab,
    )
    from voxjet.volumes.inference.segment import Windows, mirror_axes, segment_image
    from voxjet.volumes.networks.models import build_unet
    from voxjet.volumes.plan.plan_file import LabelSet

    if "nnunet" in variant:  # its imports before the baseline, as voxjet's are
        import nnunetv2.inference.predict_from_raw_data  # noqa: F401
        import nnunetv2.preprocessing.preprocessors.default_preprocessor  # noqa: F401
    else:
        import voxjet.volumes.preprocessing.preprocess  # noqa: F401
    torch.manual_seed(0)
    labels = {i: f"organ{i}" if i else "background" for i in range(classes + 1)}
    label_set = LabelSet(labels, classes + 1)
    base = start_peak()
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
        image = load_image(work)
        model = build_unet(image.shape[0], classes + 1, [4, 8, 16], num_res_units=1).eval()
        dev = torch.device("cpu")
        attrs = {"crop_box": [[0, n] for n in image.shape[1:]], "ras_shape": image.shape[1:],
                 "original_affine": np.eye(4)}  # fmt: skip
        if variant == "network":  # one forward pass of the window batch alone
            windows = torch.randn(2, image.shape[0], *PATCH)  # a batch of two whole windows
            del image
            base = start_peak()  # the network's own, not the image's
            with torch.no_grad():
                model(windows)
            pred = None
        elif variant == "voxjet" and probabilities:  # as predict writes them: streamed
            with plan_space_buffer(work, "voxjet", classes + 1, image.shape[1:]) as buffer:
                pred, _ = segment_image(model, image, Windows(PATCH, mirror=mirror), dev,
                                        classes=label_set,
                                        probability_sink=partial(write_slab, buffer))  # fmt: skip
                stream_to_nifti(work / "voxjet_probabilities.nii.gz", buffer, attrs, 1.0)
            pred = labels_to_original(pred, attrs, classes + 1)
        elif variant == "voxjet":
            windows = Windows(PATCH, 0.5, 2, mirror)
            pred, _ = segment_image(model, image, windows, dev, classes=label_set)
            pred = labels_to_original(pred, attrs, classes + 1)
        elif variant == "nnunet":
            pred = nnunet_prediction(model, image, classes, mirror, probabilities)
            if probabilities:  # as nnU-Net's export_prediction_from_logits writes them
                pred, soft = pred
                np.savez_compressed(work / "nnunet_probabilities.npz", probabilities=soft)
                del soft
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
        if pred is not None:
            np.save(work / f"pred_{variant}.npy", pred)
    seconds = time.perf_counter() - t0
    peak = peak_rss()
    print(json.dumps({"seconds": seconds, "peak": peak, "base": base}))


def main() -> None:
    """Every variant measured in its own process; the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", type=int, nargs=3, default=None,
                    help="voxels (default 256 256 200; with --mr 320 320 200)")  # fmt: skip
    ap.add_argument("--mr", action="store_true", help="the MR-like 4-channel float32 case")
    ap.add_argument("--classes", type=int, default=14)
    ap.add_argument("--mirror", action="store_true", help="test-time mirroring (8 flips)")
    ap.add_argument("--probabilities", action="store_true",
                    help="also the probabilities, on the case's grid")  # fmt: skip
    ap.add_argument("--preprocess", action="store_true", help="also preprocessing, both sides")
    ap.add_argument("--no-score", action="store_true", help="leave scoring out")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs a variant: the fastest time, the lowest peak kept")  # fmt: skip
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    args.shape = args.shape or ([320, 320, 200] if args.mr else [256, 256, 200])
    if args.child:
        child(args.child, args.work, args.classes, args.mirror, args.probabilities)
        return
    import tempfile

    from voxjet.volumes.inference.case_memory import OVERHEAD, Header, prediction_need

    nnunet = importlib.util.find_spec("nnunetv2") is not None
    if not nnunet:
        print("nnU-Net is not installed here (the bench venv has it: make bench-venv); its rows "
              "are left out")  # fmt: skip
    predict_sides = ("voxjet", "nnunet") if nnunet else ("voxjet",)
    import psutil

    # the earlier path holds two float32 volumes of every class: measured where that fits
    earlier_need = 2 * 4 * (args.classes + 1) * int(np.prod(args.shape))
    if args.mirror or args.probabilities:
        pass  # its whole-image pass a flip would take most of the run; no probabilities path
    elif earlier_need > 0.8 * psutil.virtual_memory().available:
        print(f"the earlier path left out: it would hold {earlier_need / GIB:.1f} GiB")
    else:
        predict_sides += ("earlier",)
    pre_sides = ("preprocess_voxjet", "preprocess_nnunet") if nnunet else ("preprocess_voxjet",)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        case = mr_case if args.mr else ct_case
        image, label = case(tuple(args.shape), args.classes)
        np.save(work / "image.npy", image)
        np.save(work / "label.npy", label)
        if args.preprocess:
            write_msd(work, image, label, args.classes)
            plan_voxjet(work)
            pre = [(v, _run(v, args, work)) for _ in range(args.repeats)
                   for v in pre_sides]  # fmt: skip
            pre_rows = {v: best_of([r for n, r in pre if n == v]) for v in pre_sides}
        # each variant `repeats` times, interleaved (a shared machine's load drifts): the
        # fastest time and the lowest peak of each (the allocator's fragmentation varies the
        # peak from run to run), the highest beside it
        runs = [(v, _run(v, args, work)) for _ in range(args.repeats)
                for v in predict_sides]  # fmt: skip
        rows = {v: best_of([r for n, r in runs if n == v]) for v in predict_sides}
        rows["network"] = _run("network", args, work)
        ours = np.load(work / "pred_voxjet.npy")
        same = (ours == np.load(work / "pred_earlier.npy")).mean() if "earlier" in rows else np.nan
        same_nnunet = (ours == np.load(work / "pred_nnunet.npy")).mean() if nnunet else np.nan
        np.save(work / "pred.npy", np.load(work / "pred_voxjet.npy"))
        if not args.no_score:
            rows["score"] = _run("score", args, work)
    voxels = int(np.prod(args.shape))
    channels = 4 if args.mr else 1
    head = Header(tuple(args.shape), channels, (1.0, 1.0, 1.0), (0, 1, 2))
    outputs = args.classes + 1
    estimate = prediction_need(head, [1.0] * 3, outputs, args.probabilities, PATCH) - OVERHEAD
    band = voxels * min(p / n for p, n in zip(PATCH, args.shape, strict=True))
    net = rows["network"]["peak"] - rows["network"]["base"]
    lower = voxels * (4 * channels + 1) + 4 * (outputs + 1) * band + net
    lower += 4 * voxels if args.probabilities else 0  # one class on the case's grid at a time
    kind = "MR-like, 4 channels" if args.mr else "CT-like"
    print(f"\n{kind} case {'×'.join(map(str, args.shape))}, {args.classes} classes, patch 64³, "
          f"mirroring {'on' if args.mirror else 'off'}, probabilities "
          f"{'on' if args.probabilities else 'off'}, {os.environ['OMP_NUM_THREADS']} threads; "
          f"lower bound {lower / GIB:.2f} GiB, the predict check's estimate "
          f"{estimate / GIB:.2f} GiB (+{OVERHEAD / GIB:.0f} GiB overhead); voxjet's labels agree "
          f"with the earlier path's on {same:.6f} of the voxels, with nnU-Net's on "
          f"{same_nnunet:.6f}\n")  # fmt: skip
    print(f"{args.repeats} runs a variant: the fastest time, the lowest peak (the highest in "
          "brackets)\n")  # fmt: skip
    print("| variant | seconds | peak RSS GiB | above start GiB | that ÷ lower bound |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        grown = (r["peak"] - r["base"]) / GIB
        worst = f" ({r['worst'] / GIB:.2f})" if "worst" in r else ""
        print(f"| {name} | {r['seconds']:.1f} | {r['peak'] / GIB:.2f} | {grown:.2f}{worst} | "
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
