"""Segment NIfTI images a model never saw (nnU-Net's `nnUNetv2_predict`): each case goes
through the training cases' own preparation (RAS, crop, the plan's spacing and normalisation:
the plan travels in model.pt), sliding-window inference (optionally mirrored), and back onto
its original grid and affine. Cases are shared out over the job's processes; each output is
written whole or not at all.

Inputs: NIfTI files, folders of them (an MSD/nnU-Net `imagesTs/`), or a dataset folder whose
dataset.json lists `test` images. Channels of one case are files `<case>_0000.nii.gz`,
`<case>_0001.nii.gz`, … (nnU-Net's naming) or one 4-D image with channels last."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.cases import read_channel_files
from voxjet.volumes.dataset.geometry import (
    labels_to_original,
    probs_to_original,
    ras_spacing,
    to_ras,
)
from voxjet.volumes.dataset.images import ENDINGS, save_nifti
from voxjet.volumes.inference.cascade import cascade_input
from voxjet.volumes.inference.case_memory import check_prediction_memory
from voxjet.volumes.inference.probability_file import plan_space_buffer, stream_to_nifti, write_slab
from voxjet.volumes.inference.segment import Windows, segment_image, to_labels
from voxjet.volumes.networks.models import load_trained
from voxjet.volumes.plan.plan_file import Plan
from voxjet.volumes.postprocessing.connected_components import apply_postprocessing
from voxjet.volumes.preprocessing.preprocess import to_plan_space

NIFTI = ENDINGS  # every image format read (NIfTI, NRRD, MHA, …)
CHANNEL = re.compile(r"^(?P<case>.+)_(?P<ch>\d{4})$")


@dataclass(frozen=True)
class InputCase:
    """One case to segment: its id and its channel files, in channel order."""

    case_id: str
    files: tuple[Path, ...]


def _stem(path: Path) -> str | None:
    for ext in NIFTI:
        if path.name.endswith(ext):
            return path.name[: -len(ext)]
    return None


def _group(files: list[Path], where: str) -> list[InputCase]:
    """Files grouped into cases by nnU-Net's `_000N` channel suffix."""
    groups: dict[str, dict[int, Path]] = {}
    for f in files:
        stem = _stem(f)
        m = CHANNEL.match(stem)
        case, ch = (m["case"], int(m["ch"])) if m else (stem, 0)
        if ch in groups.setdefault(case, {}):
            raise VoxjetError(f"{where}: two files for channel {ch} of case {case!r}")
        groups[case][ch] = f
    cases = []
    for case, chans in sorted(groups.items()):
        if sorted(chans) != list(range(len(chans))):
            raise VoxjetError(
                f"{where}: case {case!r} has channel files {sorted(chans)}; channels must be "
                f"_0000 … _{len(chans) - 1:04d} with none missing"
            )
        cases.append(InputCase(case, tuple(chans[c] for c in sorted(chans))))
    return cases


def case_inputs(inputs: list[str]) -> list[InputCase]:
    """The cases the inputs name (files, folders, or a dataset folder's dataset.json test list)."""
    cases: list[InputCase] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir() and (p / "dataset.json").is_file():
            meta = json.loads((p / "dataset.json").read_text())
            if meta.get("test"):
                files = [p / (t if isinstance(t, str) else t["image"]) for t in meta["test"]]
            else:
                files = sorted(f for f in (p / "imagesTs").glob("*") if _stem(f))
            cases += _group(files, str(p / "dataset.json"))
        elif p.is_dir():
            cases += _group(sorted(f for f in p.iterdir() if _stem(f)), str(p))
        elif p.is_file() and _stem(p):
            cases += _group([p], str(p))
        else:
            raise VoxjetError(f"predict: input {item!r} is no NIfTI file, folder or dataset folder")
    if not cases:
        raise VoxjetError(f"predict: no NIfTI images in {inputs}")
    ids = [c.case_id for c in cases]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise VoxjetError(f"predict: case ids {dupes[:5]} appear twice in the inputs")
    missing = [f for c in cases for f in c.files if not f.is_file()]
    if missing:
        raise VoxjetError(f"predict: input files missing: {[str(m) for m in missing[:3]]}")
    return cases


def load_channels(case: InputCase) -> tuple[np.ndarray, np.ndarray]:
    """The case's image [C, X, Y, Z] in RAS, and its original affine (all channels on one
    grid)."""
    image, affine = read_channel_files(list(case.files), case.case_id)
    return np.moveaxis(to_ras(np.moveaxis(image, 0, -1), affine), -1, 0), affine


def segment(models: list, case: InputCase, cfg: dict, device: torch.device, overlap: float,
            mirror: bool, probabilities: bool = False, previous: np.ndarray | None = None,
            probabilities_to: Path | None = None) -> tuple:  # fmt: skip
    """(the case's label map on its original grid, its affine, and with `probabilities` the
    class or region probabilities there, channels last, else None); several models' outputs
    are averaged (the folds of a cross-validation). A cascade's models are fed `previous`, the
    3d_lowres stage's label map of the case on its original grid. With `probabilities_to`, the
    probabilities are written there as a 4-D NIfTI through a chunked file instead, never all
    classes in memory at once."""
    image, affine = load_channels(case)
    plan, fp = Plan.from_dict(cfg["plan"]), cfg["fingerprint"]
    cascade = plan.configuration == "3d_cascade_fullres"
    want = int(cfg["in_channels"]) - (plan.num_classes - 1 if cascade else 0)
    if image.shape[0] != want:
        raise VoxjetError(
            f"{case.files[0]}: case {case.case_id!r} has {image.shape[0]} channel(s), the model "
            f"was trained on {want}; give its channels as {case.case_id}_0000 … _{want - 1:04d}"
        )
    prepared, box, shape = to_plan_space(image, ras_spacing(affine), plan, fp)
    if cascade:
        where = {"crop_box": box, "original_affine": affine, "shape": shape}
        prepared = cascade_input(prepared, previous, where, plan)
    attrs = {"crop_box": box, "ras_shape": image.shape[1:], "original_affine": affine}
    del image  # the prepared copy is all that inference reads
    # the folds' logits averaged window by window, as nnU-Net's predictor averages them; each
    # slab reduced to labels (and probabilities) as it finishes
    windows = Windows.of_plan(plan, device, overlap, mirror)
    background = 0.0 if plan.regions else 1.0
    if probabilities_to is not None:
        where = probabilities_to.parent
        with plan_space_buffer(where, case.case_id, plan.outputs, prepared.shape[1:]) as buffer:
            pred, _ = segment_image(models, prepared, windows, device, classes=plan.label_set,
                                    probability_sink=partial(write_slab, buffer))  # fmt: skip
            del prepared
            stream_to_nifti(probabilities_to, buffer, attrs, background)
        return labels_to_original(pred, attrs, plan.num_classes), affine, None
    pred, probs = segment_image(models, prepared, windows, device, classes=plan.label_set,
                                probabilities=probabilities)  # fmt: skip
    del prepared
    soft = None if probs is None else probs_to_original(probs, attrs, background)
    del probs
    return labels_to_original(pred, attrs, plan.num_classes), affine, soft


def segment_ensemble(
    groups: list[tuple[dict, list]],
    case: InputCase,
    device: torch.device,
    overlap: float,
    mirror: bool,
    probabilities: bool = False,
    previous: np.ndarray | None = None,
) -> tuple:
    """`segment` for models of different configurations (nnU-Net's ensemble of, e.g., 2d and
    3d_fullres): each configuration's models averaged in its own plan space, then the
    configurations' probabilities averaged on the case's original grid (as find-best scored
    the ensemble), the label map their arg-max there."""
    soft = None
    for cfg, models in groups:
        _, affine, p = segment(models, case, cfg, device, overlap, mirror, True, previous)
        soft = p if soft is None else soft + p
    soft = soft / len(groups)
    plan = Plan.from_dict(groups[0][0]["plan"])
    labels = to_labels(torch.from_numpy(np.moveaxis(soft, -1, 0)), plan.label_set)
    return labels, affine, soft if probabilities else None


def _lowres_stage(paths: list[str], rt) -> tuple[dict, list]:
    """A cascade's previous stage: the 3d_lowres fold models (one plan), averaged."""
    cfg, models = None, []
    for path in paths:
        model, saved = load_trained(path)
        mc = saved["model_config"]
        plan = Plan.of_model(mc, path)
        if plan is None or plan.configuration != "3d_lowres":
            raise VoxjetError(f"{path}: --previous-model takes the 3d_lowres stage's models; "
                              "this one is not one")  # fmt: skip
        cfg = cfg or mc
        models.append(model.to(rt.device).eval())
    return cfg, models


def _model_groups(model_paths: list[str], rt, cascade_given: bool) -> dict[str, tuple]:
    """The models by the plan they predict in (a configuration's folds share one): each
    model's config and the models, on the device; models of another dataset refused."""
    groups: dict[str, tuple[dict, list]] = {}
    first = None
    for path in model_paths:
        model, saved = load_trained(path)
        mc = saved["model_config"]
        plan = Plan.of_model(mc, path)
        if plan is None:
            raise VoxjetError(
                f"{path}: this model does not record the plan it was trained with (an older "
                "voxjet); retrain it to predict on new images"
            )
        if plan.configuration == "3d_cascade_fullres" and not cascade_given:
            raise VoxjetError(
                f"{path}: a 3d_cascade_fullres model is fed its 3d_lowres stage's segmentation "
                "of each image; give that experiment's fold models (predict --previous-model; "
                "the workflow does)"
            )
        first = first or (plan, mc["fingerprint"])
        same = ("labels", "regions", "channels", "num_classes")
        if any(getattr(plan, k) != getattr(first[0], k) for k in same) or (
            mc["fingerprint"] != first[1]
        ):
            raise VoxjetError(f"{path}: a model of another dataset than {model_paths[0]}; "
                              "models averaged must share their dataset")  # fmt: skip
        key = json.dumps(mc["plan"], sort_keys=True)
        groups.setdefault(key, (mc, []))[1].append(model.to(rt.device).eval())
    return groups


def run_volume_predict(
    model_paths: list[str], inputs: list[str], out: Path, rt, overlap: float = 0.5,
    mirror: bool = False, probabilities: bool = False, postprocessing: dict | None = None,
    previous_models: list[str] = (),
) -> list[Path]:  # fmt: skip
    """Segment this process's share of the cases into `<out>/<case>.nii.gz` (several models:
    their probabilities averaged); with `probabilities` also `<case>_probabilities.nii.gz`,
    4-D, one channel a class (softmax) or region (sigmoid), on the same grid."""
    groups = _model_groups(model_paths, rt, bool(previous_models))
    configs = [mc for mc, _ in groups.values()]
    plan = Plan.from_dict(configs[0]["plan"])
    cascades = any(Plan.from_dict(mc["plan"]).configuration == "3d_cascade_fullres"
                   for mc in configs)  # fmt: skip
    low = _lowres_stage(previous_models, rt) if cascades else None
    cases = case_inputs(inputs)
    finest = min(configs, key=lambda mc: np.prod(Plan.from_dict(mc["plan"]).target_spacing))
    fine = Plan.from_dict(finest["plan"])
    check_prediction_memory([(c.case_id, list(c.files)) for c in cases[rt.rank :: rt.world_size]],
                            fine.target_spacing, fine.outputs, probabilities,
                            fine.patch_size, len(groups) > 1)  # fmt: skip
    written = []
    for case in cases[rt.rank :: rt.world_size]:
        # nnU-Net's cascade: the lowres stage's ensemble first, its segmentation fed on
        previous = segment(low[1], case, low[0], rt.device, overlap, mirror)[0] if low else None
        soft_path = out / f"{case.case_id}_probabilities.nii.gz"
        if len(groups) == 1:  # its probabilities streamed to their file, class by class
            mc, models = next(iter(groups.values()))
            seg, affine, soft = segment(models, case, mc, rt.device, overlap, mirror,
                                        probabilities_to=soft_path if probabilities else None,
                                        previous=previous)  # fmt: skip
        else:
            seg, affine, soft = segment_ensemble(list(groups.values()), case, rt.device, overlap,
                                                 mirror, probabilities, previous)  # fmt: skip
        if postprocessing:  # the best configuration's (find-best), as validated
            seg = apply_postprocessing(seg, postprocessing, plan.label_set)
        if soft is not None:  # before the label map: a case is done once its label map is
            save_nifti(soft_path, soft.astype(np.float32), affine)
        target = out / f"{case.case_id}.nii.gz"
        save_nifti(target, seg.astype(np.uint8), affine)
        written.append(target)
    print(f"predict: {len(written)} of {len(cases)} cases on rank {rt.rank}", file=sys.stderr)
    return written
