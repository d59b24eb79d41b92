"""`voxjet evaluate-seg`: sliding-window predictions on the held-out test cases, mapped back to
each case's original grid and scored there against the label as the user gave it (nnU-Net's
convention: Dice, and HD95 in mm of the original voxel sizes, per class or region and case, and
their means), and overlays of a few slices for a person to look at."""

from __future__ import annotations

import os
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

from voxjet.distributed import checkpoint
from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, write_json
from voxjet.io.node_local import localised
from voxjet.io.remote import ReadOptions, read_json_at
from voxjet.report.figures import pyplot, save_figure
from voxjet.volumes.best import PROBABILITIES, save_probabilities
from voxjet.volumes.geometry import labels_to_original, probs_to_original
from voxjet.volumes.inference import predict_probs, read_case_arrays, seg_metrics, to_labels
from voxjet.volumes.models import build_seg_model
from voxjet.volumes.patches import CaseStore, case_sizes


def load_trained(model_path: str | Path) -> tuple[torch.nn.Module, dict]:
    """Rebuild a trained segmentation model from model.pt."""
    saved = checkpoint.load_model_file(model_path, "volumes", "segmentation", "train-seg")
    model = build_seg_model(saved["model_config"])
    checkpoint.load_weights(model, saved["model"], model_path, "the model its config describes")
    return model, saved


def _plot_overlays(path: Path, rows: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(len(rows), 3, figsize=(8, 2.7 * len(rows)), squeeze=False)
    for r, (cid, image, label, pred) in enumerate(rows):
        z = int(np.argmax((label > 0).sum((0, 1)))) if label.any() else image.shape[-1] // 2
        for c, (title, over) in enumerate(
            (("image", None), ("label", label), ("prediction", pred))
        ):
            ax = axes[r, c]
            ax.imshow(image[0, :, :, z].T, cmap="gray", origin="lower")
            if over is not None:
                ax.imshow(
                    np.ma.masked_equal(over[:, :, z].T, 0),
                    cmap="autumn",
                    alpha=0.5,
                    origin="lower",
                    vmin=0,
                    vmax=max(2, int(over.max())),
                )
            ax.set_title(f"{cid}: {title} (z={z})", fontsize=8)
            ax.axis("off")
    save_figure(fig, path, dpi=100)


def score_case(f, pred: np.ndarray, plan: dict) -> tuple[np.ndarray, dict]:
    """(the prediction on the case's original grid, its metrics): a plan-space label map taken
    back through resampling, crop and reorientation, and scored against the label as the user
    gave it with the original voxel sizes (nnU-Net's convention)."""
    original = labels_to_original(pred, f.attrs, plan["num_classes"])
    try:
        reference = f["original_label"][...]
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        from voxjet.io.integrity import corrupt_error

        raise corrupt_error(f.filename, "the original label", "preprocess_case", e) from e
    voxel = [float(v) for v in f.attrs["original_voxel_size"]]
    return original, seg_metrics(original, reference, plan, voxel)


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
    from voxjet.distributed.runtime import init_runtime, shutdown

    rt = init_runtime()
    try:
        with localised(cases_dir, read) as where:  # read.node_local: a copy on this node
            return _evaluate(rt, where, model_path, out_dir, overlap, mirror, read, split,
                             probabilities, previous)  # fmt: skip
    finally:
        shutdown(rt)


def _cases_of(split_json: dict, split: str, saved: dict, plan: dict, where: str) -> list[str]:
    """The test split, or the validation cases of the run that made the model."""
    if split == "test":
        cases = split_json["test"]
        if not cases:
            raise VoxjetError(
                f"{where}/splits.json: the test split is empty (a model would be scored on "
                "cases it was selected on); raise the dataset's volumes.test_fraction"
            )
        return cases
    from voxjet.volumes.train import fold_splits

    s = saved.get("settings", {})
    seed = plan.get("config", {}).get("seed", 42)
    return fold_splits(split_json, s.get("fold"), s.get("folds"), seed, f"{where}/splits.json")[1]


def _evaluate(rt, cases_dir, model_path, out_dir, overlap, mirror, read, split="test",
              probabilities=False, previous=None) -> dict:  # fmt: skip
    import torch.distributed as dist

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    opts = ReadOptions.from_config(read)
    plan = read_json_at(cases_dir, "plan.json", opts)
    model, saved = load_trained(model_path)
    cases = _cases_of(read_json_at(cases_dir, "splits.json", opts), split, saved, plan, cases_dir)
    # the sliding window of the configuration the model trained (a 2d model's slices, a
    # 3d_lowres model's patch); models from before configurations recorded the plan as is
    plan = saved["model_config"].get("plan") or plan
    stage = None
    if plan.get("configuration") == "3d_cascade_fullres":
        from voxjet.volumes.cascade import PreviousStage

        if not previous:
            raise VoxjetError(f"{model_path}: a 3d_cascade_fullres model needs the 3d_lowres "
                              "stage's segmentations: give --previous-validations and "
                              "--previous-predictions")  # fmt: skip
        stage = PreviousStage(previous["validations"], previous.get("predictions", []), plan)
    store = CaseStore(
        cases_dir,
        cases,
        fetch=opts.fetch,
        storage_options=opts.storage_options,
        lookahead=opts.lookahead,
        sizes=case_sizes(cases_dir, opts),
    )
    device = rt.device
    model.to(device)
    per_case, rows = {}, []
    (out / "predictions").mkdir(exist_ok=True)
    for cid in cases[rt.rank :: rt.world_size]:
        f = store.file(cid)
        if not np.allclose(f.attrs["spacing"], plan["target_spacing"]):
            raise VoxjetError(
                f"{cases_dir}/{cid}.h5: preprocessed at {np.round(f.attrs['spacing'], 4).tolist()}"
                f" mm, but {model_path} was trained on cases at "
                f"{np.round(plan['target_spacing'], 4).tolist()} mm (its configuration "
                f"{plan.get('configuration', '3d_fullres')}); give the case files of that "
                "configuration (3d_lowres: results/<dataset>/cases_3d_lowres)"
            )
        image, label = read_case_arrays(f)
        net_input = image if stage is None else stage.with_image(image, cid, f.attrs)
        probs = predict_probs(model, net_input, plan["patch_size"], device, overlap, mirror=mirror,
                              sigmoid=bool(plan.get("regions")))  # fmt: skip
        pred = to_labels(probs, plan)
        if probabilities:
            background = 0.0 if plan.get("regions") else 1.0
            save_probabilities(out / PROBABILITIES, cid,
                               probs_to_original(probs.numpy(), f.attrs, background))  # fmt: skip
        original, per_case[cid] = score_case(f, pred, plan)
        nifti = nib.Nifti1Image(original, np.asarray(f.attrs["original_affine"]))
        with atomic_path(out / "predictions" / f"{cid}.nii.gz") as tmp:
            nib.save(nifti, str(tmp) + ".nii.gz")
            os.replace(str(tmp) + ".nii.gz", tmp)
        if len(rows) < 3:
            rows.append((cid, image, label, pred))
    store.close()
    if rt.distributed:
        parts = [None] * rt.world_size
        dist.all_gather_object(parts, per_case)
        per_case = {cid: m for part in parts for cid, m in part.items()}
    if not rt.is_main:
        return {}
    per_case = {cid: per_case[cid] for cid in cases}  # the split's order
    mean = {}
    names = list(next(iter(per_case.values())))
    for name in names:
        vals = [m[name] for m in per_case.values() if m[name]["present"]]
        dice = [v["dice"] for v in vals]
        hd = [v["hd95"] for v in vals if np.isfinite(v["hd95"])]
        mean[name] = {
            "dice": float(np.mean(dice)) if dice else float("nan"),
            "hd95": float(np.mean(hd)) if hd else float("nan"),
            "cases": len(vals),
        }
    dices = [v["dice"] for v in mean.values() if np.isfinite(v["dice"])]
    hds = [v["hd95"] for v in mean.values() if np.isfinite(v["hd95"])]
    metrics = {
        "domain": "volumes",
        "split": split,
        "space": "original",  # each case's own grid and voxel sizes, its own label
        "n_cases": len(cases),
        "dice_mean": float(np.mean(dices)) if dices else float("nan"),
        "hd95_mean": float(np.mean(hds)) if hds else float("nan"),
        "per_class": mean,
        "per_case": per_case,
        "best_step": saved["best_step"],
        "inference": {"overlap": overlap, "mirror": mirror, "patch_size": plan["patch_size"]},
    }
    if rows:
        _plot_overlays(out / "overlays.png", rows)
    write_json(out / "metrics.json", metrics)
    return metrics
