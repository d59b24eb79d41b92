"""Reference values the metric tests compare with, recorded from the field's own code where it
is installed (the bench venv): nnU-Net 2.8.1's `compute_metrics_on_folder` on the label maps of
tests/seg_metric_cases.py (labels, regions as nnU-Net scores region-based datasets, and a
sparsely annotated dataset scored with its `ignore_label`), Dice and IoU, and its
`determine_fullres_target_spacing` on four kinds of dataset (isotropic, thick slices with few
slices, thick slices with many, mixed spacings whose 10th percentile is finer than in-plane).
`--record` writes them to tests/data/nnunet_metrics.json; without it, they are printed.

    .venv-bench/bin/python benchmarks/metric_references.py [--record]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
RECORD = ROOT / "tests" / "data" / "nnunet_metrics.json"

# (spacings, shapes) a case: the four kinds of dataset the spacing rule distinguishes
SPACING_DATASETS = {
    "isotropic": ([[1.0, 1.0, 1.0]] * 4, [[120, 130, 110]] * 4),
    # z 5 mm, 3× coarser, and few slices: the 10th percentile of z
    "thick_few_slices": (
        [[0.7, 0.7, 5.0], [0.8, 0.8, 5.0], [0.7, 0.7, 6.0], [0.75, 0.75, 4.0]],
        [[512, 512, 40], [480, 480, 36], [512, 512, 30], [500, 500, 50]],
    ),
    # z 5 mm but as many slices as in-plane voxels: the median stays
    "thick_many_slices": ([[0.7, 0.7, 5.0]] * 4, [[160, 160, 150]] * 4),
    # 7 cases at 2.0 mm slices, 3 at 0.4 mm (in-plane 0.5 mm): the 10th percentile (0.4) is
    # finer than in-plane, so z is clamped to in-plane + 1e-5
    "mixed_finer_than_in_plane": (
        [[0.5, 0.5, 2.0]] * 7 + [[0.5, 0.5, 0.4]] * 3,
        [[400, 400, 60]] * 7 + [[400, 400, 300]] * 3,
    ),
    # the same spacings with as many slices as in-plane voxels: nnU-Net keeps the median, 2.0
    # (voxjet's first rule, without the voxel condition and the clamp, planned 0.4)
    "mixed_many_slices": (
        [[0.5, 0.5, 2.0]] * 7 + [[0.5, 0.5, 0.4]] * 3,
        [[400, 400, 150]] * 7 + [[400, 400, 750]] * 3,
    ),
}


def _write(folder: Path, name: str, arr: np.ndarray, spacing) -> None:
    import nibabel as nib

    folder.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(arr, np.diag([*spacing, 1.0])), str(folder / f"{name}.nii.gz"))


def nnunet_metrics() -> dict:
    """nnU-Net's per-case metrics, means and foreground means for labels, for regions, and
    for labels with an ignore label."""
    from nnunetv2.evaluation.evaluate_predictions import compute_metrics_on_folder
    from nnunetv2.imageio.simpleitk_reader_writer import SimpleITKIO
    from seg_metric_cases import IGNORE, REGIONS, SPACING, cases, ignore_cases

    out = {}
    runs = (("labels", cases(), [1, 2], None),
            ("regions", cases(), [tuple(v) for v in REGIONS.values()], None),
            ("ignore", ignore_cases(), [1, 2], IGNORE))  # fmt: skip
    for kind, maps, wanted, ignore in runs:
        with tempfile.TemporaryDirectory() as tmp:
            ref_dir, pred_dir = Path(tmp) / "ref", Path(tmp) / "pred"
            for name, (ref, pred) in maps.items():
                _write(ref_dir, name, ref, SPACING)
                _write(pred_dir, name, pred, SPACING)
            res = compute_metrics_on_folder(str(ref_dir), str(pred_dir), None, SimpleITKIO(),
                                            ".nii.gz", wanted, ignore_label=ignore,
                                            num_processes=1)  # fmt: skip
        keys = ("Dice", "IoU", "TP", "FP", "FN", "n_ref", "n_pred")
        per_case = {Path(r["reference_file"]).name.removesuffix(".nii.gz"):
                    {str(k): {m: r["metrics"][k][m] for m in keys} for k in wanted}
                    for r in res["metric_per_case"]}  # fmt: skip
        out[kind] = {"per_case": per_case,
                     "mean": {str(k): res["mean"][k]["Dice"] for k in wanted},
                     "mean_iou": {str(k): res["mean"][k]["IoU"] for k in wanted},
                     "foreground_mean": res["foreground_mean"]["Dice"]}  # fmt: skip
    return json.loads(json.dumps(out, default=float).replace("NaN", "null"))


def nnunet_spacings() -> dict:
    """nnU-Net's 3d_fullres target spacing of each dataset (its axis order is the array's:
    the same rule on every axis, so voxjet's RAS order needs no turning here)."""
    from nnunetv2.experiment_planning.experiment_planners.default_experiment_planner import (
        ExperimentPlanner,
    )

    out = {}
    for name, (spacings, shapes) in SPACING_DATASETS.items():
        planner = ExperimentPlanner.__new__(ExperimentPlanner)
        planner.dataset_fingerprint = {"spacings": spacings, "shapes_after_crop": shapes}
        planner.anisotropy_threshold = 3
        planner.overwrite_target_spacing = None
        target = planner.determine_fullres_target_spacing()
        out[name] = {"spacings": spacings, "shapes": shapes,
                     "target_spacing": [float(t) for t in target]}  # fmt: skip
    return out


def main() -> None:
    """Record (or print) nnU-Net's metrics and target spacings."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--record", action="store_true", help=f"write {RECORD.name}")
    a = ap.parse_args()
    from importlib.metadata import version

    data = {"source": f"nnunetv2 {version('nnunetv2')} (benchmarks/metric_references.py)",
            "metrics": nnunet_metrics(), "target_spacing": nnunet_spacings()}  # fmt: skip
    text = json.dumps(data, indent=1) + "\n"
    if a.record:
        RECORD.write_text(text)
        print(f"wrote {RECORD}")
    else:
        print(text)


if __name__ == "__main__":
    main()
