"""`voxjet evaluate-seg`: sliding-window predictions on the held-out test cases (or a fold's
validation cases), mapped back to each case's original grid and scored there against the label
as the user gave it (nnU-Net's convention: voxjet.volumes.evaluation.metrics, per class or region
and case, and their means), and overlays of a few slices for a person to look at."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from voxjet.distributed.runtime import Runtime, init_runtime, shutdown
from voxjet.errors import VoxjetError
from voxjet.io.atomic import write_json
from voxjet.io.integrity import corrupt_error
from voxjet.io.node_local import localised
from voxjet.io.remote import ReadOptions, read_json_at
from voxjet.progress import progress
from voxjet.volumes.dataset.geometry import labels_to_original, probs_to_original
from voxjet.volumes.dataset.images import save_nifti
from voxjet.volumes.dataset.settings import CASE_FOLDERS
from voxjet.volumes.dataset.splits import evaluation_cases
from voxjet.volumes.evaluation.figures import overlays
from voxjet.volumes.evaluation.metrics import (
    class_summary,
    diagonal_mm,
    mean_of,
    nanmean,
    seg_metrics,
)
from voxjet.volumes.inference.cascade import PreviousStage
from voxjet.volumes.inference.probabilities import PROBABILITIES, save_probabilities
from voxjet.volumes.inference.segment import Windows, segment_image
from voxjet.volumes.networks.models import load_trained
from voxjet.volumes.plan.plan_file import Plan
from voxjet.volumes.preprocessing.store import CaseStore, case_sizes, read_case_arrays

OVERLAY_CASES = 3  # cases drawn in overlays.png


def score_case(f, pred: np.ndarray, plan: Plan) -> tuple[np.ndarray, dict]:
    """(the prediction on the case's original grid, its metrics): a plan-space label map taken
    back through resampling, crop and reorientation, and scored against the label as the user
    gave it with the original voxel sizes (nnU-Net's convention)."""
    original = labels_to_original(pred, f.attrs, plan.num_classes)
    try:
        reference = f["original_label"][...]
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        raise corrupt_error(f.filename, "the original label", "preprocess_case", e) from e
    return original, seg_metrics(original, reference, plan.label_set, original_voxel_size(f))


def original_voxel_size(f) -> list[float]:
    """A case file's voxel sizes along its original array's axes (mm)."""
    return [float(v) for v in f.attrs["original_voxel_size"]]


@dataclass
class Evaluation:
    """What an evaluation job works with: the model, the plan it trained with, the cases it
    scores and where, and what it has found so far."""

    cases_dir: str
    model_path: str
    out: Path
    model: torch.nn.Module
    saved: dict
    plan: Plan
    cases: list[str]
    store: CaseStore
    stage: PreviousStage | None = None
    per_case: dict[str, dict] = field(default_factory=dict)
    diagonals: dict[str, float] = field(default_factory=dict)  # each case's image, in mm
    shown: list[tuple] = field(default_factory=list)  # (case, image, label, prediction)


def evaluate(
    cases_dir: str,
    model_path: str,
    out_dir: str,
    overlap: float = 0.5,
    mirror: bool = False,
    read: dict | None = None,
    split: str = "test",
    probabilities: bool = False,
    previous: dict[str, list[str]] | None = None,
) -> dict:
    """Score the test cases (shared over the job's processes: case i on rank i mod world);
    write metrics.json (per case and mean per class), overlays.png and each prediction as
    NIfTI on the original image's grid (predictions/<case>.nii.gz). `split="val"` scores the
    cases the run validated on (its fold's); `probabilities` also writes each case's
    probabilities on its original grid (probabilities/<case>.npz, what find-best combines);
    `previous`: a cascade's 3d_lowres segmentations (validation and prediction folders)."""
    rt = init_runtime()
    try:
        with localised(cases_dir, read) as where:  # read.node_local: a copy on this node
            ev = open_evaluation(where, model_path, out_dir, read, split, previous)
            ev.model.to(rt.device)
            try:
                mine = ev.cases[rt.rank :: rt.world_size]
                name = f"evaluate {Path(model_path).parent.name}"
                for cid in progress(mine, name, "case", disable=not rt.is_main):
                    evaluate_case(ev, cid, rt, overlap, mirror, probabilities)
            finally:
                ev.store.close()
            return write_metrics(ev, rt, split, overlap, mirror)
    finally:
        shutdown(rt)


def open_evaluation(cases_dir: str, model_path: str, out_dir: str, read: dict | None,
                    split: str, previous: dict[str, list[str]] | None) -> Evaluation:  # fmt: skip
    """The model, its plan (the sliding window of the configuration it trained: a 2d model's
    slices, a 3d_lowres model's patch), the cases of the split and their store."""
    out = Path(out_dir)
    (out / "predictions").mkdir(parents=True, exist_ok=True)
    opts = ReadOptions.from_config(read)
    model, saved = load_trained(model_path)
    where = f"{cases_dir}/plan.json"
    plan = Plan.of_model(saved["model_config"], str(model_path)) or Plan.from_dict(
        read_json_at(cases_dir, "plan.json", opts), where)  # fmt: skip
    splits = read_json_at(cases_dir, "splits.json", opts)
    cases = evaluation_cases(splits, split, saved.get("settings", {}), plan.seed,
                             f"{cases_dir}/splits.json")  # fmt: skip
    stage = None
    if plan.configuration == "3d_cascade_fullres":
        if not previous:
            raise VoxjetError(f"{model_path}: a 3d_cascade_fullres model needs the 3d_lowres "
                              "stage's segmentations: give --previous-validations and "
                              "--previous-predictions")  # fmt: skip
        stage = PreviousStage(previous["validations"], previous.get("predictions", []), plan)
    store = CaseStore(cases_dir, cases, fetch=opts.fetch, storage_options=opts.storage_options,
                      lookahead=opts.lookahead, sizes=case_sizes(cases_dir, opts))  # fmt: skip
    return Evaluation(cases_dir, str(model_path), out, model, saved, plan, cases, store, stage)


def _check_spacing(ev: Evaluation, f, cid: str) -> None:
    """Case files preprocessed at another spacing than the model's are refused."""
    if not np.allclose(f.attrs["spacing"], ev.plan.target_spacing):
        raise VoxjetError(
            f"{ev.cases_dir}/{cid}.h5: preprocessed at "
            f"{np.round(f.attrs['spacing'], 4).tolist()} mm, but {ev.model_path} was trained on "
            f"cases at {np.round(ev.plan.target_spacing, 4).tolist()} mm (its configuration "
            f"{ev.plan.configuration}); give the case files of that configuration (3d_lowres: "
            f"results/<dataset>/{CASE_FOLDERS['3d_lowres']})"
        )


def evaluate_case(ev: Evaluation, cid: str, rt: Runtime, overlap: float, mirror: bool,
                  probabilities: bool) -> None:  # fmt: skip
    """Predict one case, write its prediction (and probabilities) on its original grid and
    keep its metrics."""
    f = ev.store.file(cid)
    _check_spacing(ev, f, cid)
    image, label = read_case_arrays(f)
    net_input = image if ev.stage is None else ev.stage.with_image(image, cid, f.attrs)
    windows = Windows.of_plan(ev.plan, rt.device, overlap, mirror)
    pred, probs = segment_image(ev.model, net_input, windows, rt.device,
                                classes=ev.plan.label_set, probabilities=probabilities)  # fmt: skip
    if probs is not None:
        background = 0.0 if ev.plan.regions else 1.0
        save_probabilities(ev.out / PROBABILITIES, cid,
                           probs_to_original(probs, f.attrs, background))  # fmt: skip
        del probs
    original, ev.per_case[cid] = score_case(f, pred, ev.plan)
    ev.diagonals[cid] = diagonal_mm(f.attrs["original_shape"], original_voxel_size(f))
    save_nifti(ev.out / "predictions" / f"{cid}.nii.gz", original,
                np.asarray(f.attrs["original_affine"]))  # fmt: skip
    if len(ev.shown) < OVERLAY_CASES:
        ev.shown.append((cid, image, label, pred))


def write_metrics(ev: Evaluation, rt: Runtime, split: str, overlap: float,
                  mirror: bool) -> dict:  # fmt: skip
    """Every rank's cases gathered; metrics.json and overlays.png by the main process."""
    per_case, diagonals = ev.per_case, ev.diagonals
    if rt.distributed:
        parts = [None] * rt.world_size
        dist.all_gather_object(parts, (per_case, diagonals))
        per_case = {cid: m for part in parts for cid, m in part[0].items()}
        diagonals = {cid: d for part in parts for cid, d in part[1].items()}
    if not rt.is_main:
        return {}
    per_case = {cid: per_case[cid] for cid in ev.cases}  # the split's order
    per_class = class_summary(per_case, diagonals)
    metrics = {
        "domain": "volumes",
        "split": split,
        "space": "original",  # each case's own grid and voxel sizes, its own label
        "n_cases": len(ev.cases),
        # nnU-Net's: Dice a class the nanmean over cases, then the mean over classes
        "dice_mean": mean_of({c: v["dice"] for c, v in per_class.items()}),
        "iou_mean": mean_of({c: v["iou"] for c, v in per_class.items()}),
        # BraTS's: a missed or falsely detected structure counts the image's diagonal
        "hd95_mean": nanmean(v["hd95"] for v in per_class.values()),
        "misses": sum(v["misses"] for v in per_class.values()),
        "false_detections": sum(v["false_detections"] for v in per_class.values()),
        "conventions": {
            "dice": "nnU-Net: 2tp/(2tp+fp+fn) a case, NaN only where reference and prediction "
            "are both empty; a class's mean over the cases where it is finite; dice_mean over "
            "classes; tp, fp, fn on the annotated voxels alone where the dataset has an ignore "
            "label",
            "iou": "nnU-Net: tp/(tp+fp+fn), with the same means",
            "hd95": "BraTS: a missed or falsely detected structure scores the case's image "
            "diagonal (mm); cases where both are empty left out; hd95_mean over classes",
        },
        "per_class": per_class,
        "per_case": per_case,
        "case_diagonal_mm": diagonals,
        "best_step": ev.saved["best_step"],
        "inference": {"overlap": overlap, "mirror": mirror, "patch_size": ev.plan.patch_size},
    }
    if ev.shown:
        overlays(ev.out / "overlays.png", ev.shown)
    write_json(ev.out / "metrics.json", metrics)
    return metrics
