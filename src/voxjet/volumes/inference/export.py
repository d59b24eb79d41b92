"""A segmentation model exported for MONAI users: TorchScript, and a MONAI bundle whose
inference config prepares images as voxjet's training did (RAS, crop to the non-zero region,
the plan's spacing, the plan's normalisation), runs the sliding window and writes the label map
on each image's own grid — all with MONAI transforms, run by MONAI's own runner:

    python -m monai.bundle run --config_file configs/inference.json \\
        --meta_file configs/metadata.json --datalist "['case_0000.nii.gz']" --output_dir out
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, write_json
from voxjet.tracing import deviation, refuse_deviation, trace_saved
from voxjet.volumes.networks.models import load_trained
from voxjet.volumes.plan.plan_file import Plan


def _network_and_config(model_path) -> tuple[torch.nn.Module, dict, Plan]:
    model, saved = load_trained(model_path)
    cfg = saved["model_config"]
    plan = Plan.of_model(cfg, str(model_path))
    if plan is None:
        raise VoxjetError(f"{model_path}: this model does not record its plan (an older voxjet); "
                          "retrain it to export")  # fmt: skip
    return model.eval(), cfg, plan


def export_torchscript_unet(model, cfg: dict, path: Path) -> float:
    """The network traced to TorchScript on the plan's patch, checked on a second input size;
    the largest deviation from the eager network."""
    patch = [int(p) for p in Plan.from_dict(cfg["plan"]).patch_size]
    c = int(cfg["in_channels"])
    loaded = trace_saved(model, (torch.randn(1, c, *patch),), path)
    worst = 0.0
    with torch.no_grad():
        for shape in (patch, [2 * p for p in patch]):
            y = torch.randn(2, c, *shape)
            worst = max(worst, deviation(loaded(y).numpy(), model(y).numpy()))
    refuse_deviation("torchscript", worst)
    return worst


def _normalisation(plan: Plan, fp: dict, channels: int) -> list[dict]:
    """MONAI transforms for voxjet's normalisation, when every channel uses one scheme: CT
    clipped to the dataset's foreground percentiles and z-scored with its statistics
    (ScaleIntensityRanged with the matching target range); zscore per image and channel;
    rescale_to_0_1 per image; none."""
    schemes = plan.normalization
    if len(set(schemes)) > 1 or (schemes[0] == "ct" and channels > 1):
        raise VoxjetError(
            f"export bundle: channels normalised as {schemes}, which MONAI's transforms here "
            "cannot express channel by channel; export torchscript and prepare images with "
            "voxjet predict"
        )
    scheme = schemes[0]
    if scheme == "zscore":
        return [{"_target_": "NormalizeIntensityd", "keys": "image", "channel_wise": True}]
    if scheme == "rescale_to_0_1":
        return [{"_target_": "ScaleIntensityd", "keys": "image", "minv": 0.0, "maxv": 1.0}]
    if scheme == "none":
        return []
    st = (fp.get("foreground_intensity_per_channel") or [fp["foreground_intensity"]])[0]
    lo, hi = st["percentile_00_5"], st["percentile_99_5"]
    mean, std = st["mean"], max(st["std"], 1e-8)
    return [{"_target_": "ScaleIntensityRanged", "keys": "image", "a_min": lo, "a_max": hi,
             "b_min": (lo - mean) / std, "b_max": (hi - mean) / std, "clip": True}]  # fmt: skip


def inference_config(cfg: dict, overlap: float = 0.5) -> dict:
    """configs/inference.json for the model's plan."""
    plan, fp = Plan.from_dict(cfg["plan"]), cfg["fingerprint"]
    c = int(cfg["in_channels"])
    if plan.regions:
        raise VoxjetError(
            "export bundle: a region-based model (sigmoid outputs written in "
            "regions_class_order) has no arg-max label map for MONAI's post-processing here; "
            "export torchscript and predict with voxjet predict"
        )
    preprocessing = [
        {"_target_": "LoadImaged", "keys": "image", "image_only": True},
        {"_target_": "EnsureChannelFirstd", "keys": "image"},
        {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
        {"_target_": "CropForegroundd", "keys": "image", "source_key": "image",
         "select_fn": "$lambda x: x != 0", "allow_smaller": True},
        {"_target_": "Spacingd", "keys": "image", "pixdim": list(plan.target_spacing),
         "mode": "bilinear"},
        *_normalisation(plan, fp, c),
        {"_target_": "EnsureTyped", "keys": "image"},
    ]  # fmt: skip
    return {
        "imports": ["$import glob", "$import os", "$import numpy"],
        "bundle_root": ".",
        "output_dir": "$@bundle_root + '/eval'",
        "datalist": "$list(sorted(glob.glob(@bundle_root + '/images/*.nii*')))",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "network": "$torch.jit.load(@bundle_root + '/models/model.ts', map_location=@device)",
        "preprocessing": {"_target_": "Compose", "transforms": preprocessing},
        "dataset": {
            "_target_": "Dataset",
            "data": "$[{'image': i} for i in @datalist]",
            "transform": "@preprocessing",
        },  # fmt: skip
        "inferer": {
            "_target_": "SlidingWindowInferer",
            "roi_size": list(plan.patch_size),
            "sw_batch_size": 2,
            "overlap": overlap,
            "mode": "gaussian",
        },  # fmt: skip
        "postprocessing": {
            "_target_": "Compose",
            "transforms": [
                {"_target_": "Activationsd", "keys": "pred", "softmax": True},
                {
                    "_target_": "Invertd",
                    "keys": "pred",
                    "transform": "@preprocessing",
                    "orig_keys": "image",
                    "nearest_interp": False,
                    "to_tensor": True,
                },
                {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
                {
                    "_target_": "SaveImaged",
                    "keys": "pred",
                    "output_dir": "@output_dir",
                    "output_postfix": "seg",
                    "output_dtype": "$numpy.uint8",
                    "separate_folder": False,
                    "resample": False,
                },
            ],
        },  # fmt: skip
        # one image at a time: prepared, inferred on the device, written back on its grid
        "predict": "$torch.no_grad()(lambda d: dict(d, pred=@inferer(d['image'][None]"
        ".to(@device), @network)[0].cpu()))",
        "initialize": ["$@network.eval()"],
        "run": ["$[@postprocessing(@predict(d)) for d in @dataset]"],
    }


def metadata(cfg: dict) -> dict:
    """configs/metadata.json: what goes in and comes out, in MONAI's metadata form."""
    import monai

    plan = Plan.from_dict(cfg["plan"])
    labels = {str(k): v for k, v in plan.labels.items()}
    return {
        "version": "1.0.0",
        "monai_version": monai.__version__,
        "pytorch_version": torch.__version__.split("+")[0],
        "numpy_version": np.__version__,
        "task": "3D segmentation trained by voxjet",
        "description": "A U-Net trained by voxjet; inference prepares images as training did "
        f"(RAS, crop to the non-zero region, {plan.target_spacing} mm, "
        f"{plan.normalization} normalisation) and writes label maps on the images' grids",
        "authors": "voxjet",
        "copyright": "see the training data's licence",
        "network_data_format": {
            "inputs": {
                "image": {
                    "type": "image",
                    "format": "magnitude",
                    "modality": plan.modality,
                    "num_channels": int(cfg["in_channels"]),
                    "spatial_shape": list(plan.patch_size),
                    "dtype": "float32",
                    "is_patch_data": True,
                    "channel_def": {str(i): f"channel {i}" for i in range(int(cfg["in_channels"]))},
                }
            },
            "outputs": {
                "pred": {
                    "type": "image",
                    "format": "segmentation",
                    "num_channels": plan.outputs,
                    "spatial_shape": list(plan.patch_size),
                    "dtype": "float32",
                    "is_patch_data": True,
                    "channel_def": labels,
                }
            },
        },  # fmt: skip
    }


def export_volumes(model_path, fmt: str, out: Path) -> Path:
    """Export a segmentation model as torchscript (model.ts) or a MONAI bundle folder."""
    model, cfg, _ = _network_and_config(model_path)
    if fmt == "torchscript":
        target = out / "model.ts"
        worst = export_torchscript_unet(model, cfg, target)
        print(f"export: {target}, max deviation {worst:.2e}", file=sys.stderr)
        return target
    if fmt != "bundle":
        raise VoxjetError(f"export --format {fmt}: a segmentation model exports as "
                          "torchscript or bundle")  # fmt: skip
    target = out / "bundle"
    with atomic_path(target, directory=True) as tmp:
        (tmp / "configs").mkdir()
        (tmp / "models").mkdir()
        (tmp / "images").mkdir()  # where the default datalist looks
        export_torchscript_unet(model, cfg, tmp / "models" / "model.ts")
        (tmp / "configs" / "inference.json").write_text(
            json.dumps(inference_config(cfg), indent=2) + "\n"
        )
        (tmp / "configs" / "metadata.json").write_text(json.dumps(metadata(cfg), indent=2) + "\n")
    write_json(out / "export.json", {"format": "bundle", "folder": target.name,
                                     "source": str(model_path)})  # fmt: skip
    print(f"export: MONAI bundle in {target}", file=sys.stderr)
    return target


def run_bundle(bundle: str | os.PathLike, images: list[str], out_dir: str | os.PathLike) -> None:
    """MONAI's own runner on the bundle (what a MONAI user would type), for tests."""
    from monai.bundle import run

    b = Path(bundle)
    run(
        config_file=str(b / "configs" / "inference.json"),
        meta_file=str(b / "configs" / "metadata.json"),
        bundle_root=str(b),
        datalist=[str(i) for i in images],
        output_dir=str(out_dir),
    )
