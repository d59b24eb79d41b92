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
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path
from voxjet.volumes.images import ENDINGS

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
    from voxjet.volumes.geometry import refuse_shear, to_ras
    from voxjet.volumes.images import read_image

    arrays, affine, shape = [], None, None
    for f in case.files:
        data, aff = read_image(f)
        if data.ndim not in (3, 4):
            raise VoxjetError(f"{f}: an image of shape {data.shape}; expected 3-D or 4-D")
        refuse_shear(aff, f, case.case_id)
        if affine is None:
            affine, shape = aff, data.shape[:3]
        elif data.shape[:3] != shape or not np.allclose(aff, affine, atol=1e-3):
            raise VoxjetError(f"{f}: another grid than {case.files[0]} (shape or affine differs)")
        if not np.isfinite(data).all():
            raise VoxjetError(f"{f}: NaN/inf voxels; fix the image")
        arrays.append(data if data.ndim == 4 else data[..., None])
    image = np.concatenate(arrays, axis=-1)
    return np.moveaxis(to_ras(image, affine), -1, 0), affine


def segment(models: list, case: InputCase, cfg: dict, device: torch.device, overlap: float,
            mirror: bool, probabilities: bool = False,
            previous: np.ndarray | None = None) -> tuple:  # fmt: skip
    """(the case's label map on its original grid, its affine, and with `probabilities` the
    class or region probabilities there, channels last, else None); several models' outputs
    are averaged (the folds of a cross-validation). A cascade's models are fed `previous`, the
    3d_lowres stage's label map of the case on its original grid."""
    from voxjet.volumes.geometry import labels_to_original, probs_to_original, ras_spacing
    from voxjet.volumes.inference import predict_probs, to_labels
    from voxjet.volumes.preprocess import to_plan_space

    image, affine = load_channels(case)
    cascade = cfg["plan"].get("configuration") == "3d_cascade_fullres"
    want = int(cfg["in_channels"]) - (int(cfg["plan"]["num_classes"]) - 1 if cascade else 0)
    if image.shape[0] != want:
        raise VoxjetError(
            f"{case.files[0]}: case {case.case_id!r} has {image.shape[0]} channel(s), the model "
            f"was trained on {want}; give its channels as {case.case_id}_0000 … _{want - 1:04d}"
        )
    plan, fp = cfg["plan"], cfg["fingerprint"]
    prepared, box, shape = to_plan_space(image, ras_spacing(affine), plan, fp)
    if cascade:
        from voxjet.volumes.cascade import cascade_input

        where = {"crop_box": box, "original_affine": affine, "shape": shape}
        prepared = cascade_input(prepared, previous, where, plan)
    probs = None
    for model in models:
        p = predict_probs(model, prepared, plan["patch_size"], device, overlap, mirror=mirror,
                          sigmoid=bool(plan.get("regions")))  # fmt: skip
        probs = p if probs is None else probs + p
    probs = probs / len(models)
    pred = to_labels(probs, plan)
    attrs = {"crop_box": box, "ras_shape": image.shape[1:], "original_affine": affine}
    soft = None
    if probabilities:
        soft = probs_to_original(probs.numpy(), attrs, 0.0 if plan.get("regions") else 1.0)
    return labels_to_original(pred, attrs, plan["num_classes"]), affine, soft


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
    from voxjet.volumes.inference import to_labels

    soft = None
    for cfg, models in groups:
        _, affine, p = segment(models, case, cfg, device, overlap, mirror, True, previous)
        soft = p if soft is None else soft + p
    soft = soft / len(groups)
    plan = groups[0][0]["plan"]
    labels = to_labels(torch.from_numpy(np.moveaxis(soft, -1, 0)), plan)
    return labels, affine, soft if probabilities else None


def _lowres_stage(paths: list[str], rt) -> tuple[dict, list]:
    """A cascade's previous stage: the 3d_lowres fold models (one plan), averaged."""
    from voxjet.volumes.evaluate import load_trained

    cfg, models = None, []
    for path in paths:
        model, saved = load_trained(path)
        mc = saved["model_config"]
        if mc.get("plan", {}).get("configuration") != "3d_lowres":
            raise VoxjetError(f"{path}: --previous-model takes the 3d_lowres stage's models; "
                              "this one is not one")  # fmt: skip
        cfg = cfg or mc
        models.append(model.to(rt.device).eval())
    return cfg, models


def _save(target: Path, data: np.ndarray, affine: np.ndarray) -> None:
    with atomic_path(target) as tmp:
        nib.save(nib.Nifti1Image(data, affine), str(tmp) + ".nii.gz")
        os.replace(str(tmp) + ".nii.gz", tmp)


def run_volume_predict(
    model_paths: list[str], inputs: list[str], out: Path, rt, overlap: float = 0.5,
    mirror: bool = False, probabilities: bool = False, postprocessing: dict | None = None,
    previous_models: list[str] = (),
) -> list[Path]:  # fmt: skip
    """Segment this process's share of the cases into `<out>/<case>.nii.gz` (several models:
    their probabilities averaged); with `probabilities` also `<case>_probabilities.nii.gz`,
    4-D, one channel a class (softmax) or region (sigmoid), on the same grid."""
    from voxjet.volumes.evaluate import load_trained

    groups: dict[str, tuple[dict, list]] = {}  # models by the plan they predict in
    cfg = None
    for path in model_paths:
        model, saved = load_trained(path)
        mc = saved["model_config"]
        if "plan" not in mc:
            raise VoxjetError(
                f"{path}: this model does not record the plan it was trained with (an older "
                "voxjet); retrain it to predict on new images"
            )
        if mc["plan"].get("configuration") == "3d_cascade_fullres" and not previous_models:
            raise VoxjetError(
                f"{path}: a 3d_cascade_fullres model is fed its 3d_lowres stage's segmentation "
                "of each image; give that experiment's fold models (predict --previous-model; "
                "the workflow does)"
            )
        cfg = cfg or mc
        same = ("labels", "regions", "channels", "num_classes")
        if any(mc["plan"].get(k) != cfg["plan"].get(k) for k in same) or (
            mc["fingerprint"] != cfg["fingerprint"]
        ):
            raise VoxjetError(f"{path}: a model of another dataset than {model_paths[0]}; "
                              "models averaged must share their dataset")  # fmt: skip
        key = json.dumps(mc["plan"], sort_keys=True)
        groups.setdefault(key, (mc, []))[1].append(model.to(rt.device).eval())
    cascades = any(mc["plan"].get("configuration") == "3d_cascade_fullres"
                   for mc, _ in groups.values())  # fmt: skip
    low = _lowres_stage(previous_models, rt) if cascades else None
    cases = case_inputs(inputs)
    written = []
    for case in cases[rt.rank :: rt.world_size]:
        # nnU-Net's cascade: the lowres stage's ensemble first, its segmentation fed on
        previous = segment(low[1], case, low[0], rt.device, overlap, mirror)[0] if low else None
        if len(groups) == 1:
            seg, affine, soft = segment(groups[key][1], case, cfg, rt.device, overlap, mirror,
                                        probabilities, previous)  # fmt: skip
        else:
            seg, affine, soft = segment_ensemble(list(groups.values()), case, rt.device, overlap,
                                                 mirror, probabilities, previous)  # fmt: skip
        if postprocessing:  # the best configuration's (find-best), as validated
            from voxjet.volumes.best import apply_postprocessing

            seg = apply_postprocessing(seg, postprocessing, cfg["plan"])
        if soft is not None:  # before the label map: a case is done once its label map is
            _save(out / f"{case.case_id}_probabilities.nii.gz", soft.astype(np.float32), affine)
        target = out / f"{case.case_id}.nii.gz"
        _save(target, seg.astype(np.uint8), affine)
        written.append(target)
    print(f"predict: {len(written)} of {len(cases)} cases on rank {rt.rank}", file=sys.stderr)
    return written
