"""Segmentation quality against nnU-Net itself: nnU-Net 2.8.1 (`nnUNetv2_train` with a trainer
shortened to the same number of iterations, on the CPU) and voxjet trained on the same cases, the
same train/validation split, the same patch, batch and number of iterations, over several seeds;
both predict the same held-out test cases without test-time mirroring, and voxjet's metrics
module (voxjet.volumes.evaluation.metrics, nnU-Net's conventions) scores both predictions against
the labels on the original grids.

What each side is given, the same: nnU-Net's raw dataset holds the training and validation cases
only (its fingerprint and normalisation never see a test case); both keep their final weights
(nnU-Net's checkpoint_final; voxjet validates once, at the last step, so its best checkpoint is
its last). Each trains with its own recipe: nnU-Net its PlainConvUNet (deep supervision, SGD 0.01
with Nesterov momentum, poly decay, its augmentation, 1/3 foreground oversampling); voxjet the
experiment given (default: `dynunet` with deep supervision, nnU-Net's network, under the demo's
`unet` training settings). nnU-Net's network is planned for the common patch with its own
topology rule.

Reported a seed: each class's Dice over the test cases that have it, and for classes some test
cases lack (the toy CT's lesion) the share of those cases where a structure was predicted all
the same (false detections) and its mean voxels there; then mean ± sd over the seeds.

The dataset: the demo's toy CT generator, with more cases than the demo (default 24) so that the
test split holds lesion-free cases too. (The MNI152 set of tests/mni_dataset.py is left out: its
four cases are one brain rescaled and mirrored, so a test case is a copy of a training case.)

    .venv-bench/bin/python benchmarks/seg_quality.py [--seeds 3] [--epochs 6] [--cases 24]

Fair to both: nnU-Net seeded, with its own recipe (SGD, poly decay, augmentation, 250
iterations an epoch) stopped after --epochs of its 1000, its schedule running over the 1000;
voxjet's schedule likewise over the same 250,000 steps, stopped at the same step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nibabel as nib
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

TRAINER = "nnUNetTrainer_voxjetBudget"
TRAINER_CODE = '''"""Written by voxjet's benchmarks/seg_quality.py: nnU-Net's trainer, seeded
(VOXJET_BENCH_SEED), stopped after VOXJET_BENCH_EPOCHS of its own epochs with its poly schedule
running over VOXJET_BENCH_FULL_EPOCHS (its 1000: the budget is a fraction of its recipe, not the
recipe squeezed), without the final validation pass."""
import os
import random

import numpy as np
import torch

from nnunetv2.training.lr_scheduler.polylr import PolyLRScheduler
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer


class nnUNetTrainer_voxjetBudget(nnUNetTrainer):
    def __init__(self, plans, configuration, fold, dataset_json, device=torch.device("cuda")):
        seed = int(os.environ["VOXJET_BENCH_SEED"])
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = int(os.environ["VOXJET_BENCH_EPOCHS"])
        self.num_iterations_per_epoch = int(os.environ["VOXJET_BENCH_ITERS"])
        self.num_val_iterations_per_epoch = 2

    def configure_optimizers(self):
        optimizer, _ = super().configure_optimizers()
        full = int(os.environ["VOXJET_BENCH_FULL_EPOCHS"])
        return optimizer, PolyLRScheduler(optimizer, self.initial_lr, full)

    def perform_actual_validation(self, save_probabilities=False):
        pass
'''


def install_trainer() -> None:
    """nnU-Net finds trainers by name in its own package: the shortened one goes there, at the
    top, which nnU-Net searches before its subpackages (its Primus trainers import timm, and
    with it torchvision, whose PyPI build does not load beside a CPU build of torch)."""
    import nnunetv2.training.nnUNetTrainer as trainers

    target = Path(trainers.__path__[0]) / "voxjet_bench.py"
    if not target.is_file() or target.read_text() != TRAINER_CODE:
        target.write_text(TRAINER_CODE)


def toy_ct(root: Path, cases: int) -> tuple[Path, list[int]]:
    """The demo's toy CT generator with `cases` labelled cases, and the demo's patch."""
    import yaml

    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset

    cfg = yaml.safe_load((ROOT / "config" / "demo-full.yaml").read_text())
    ds = cfg["datasets"]["toy_ct"]
    synth = {**ds["source"]["synthetic"], "train_cases": cases}
    msd = generate_dataset(root / "toy_ct", ToyVolumesConfig(**synth), progress=False)
    return msd, ds["volumes"]["patch_size"]


def score(pred_dir: Path, msd: Path, case_ids: list[str]) -> dict:
    """voxjet.volumes.evaluation.metrics on each test case's prediction (its original grid): a
    class's Dice over the cases that have it; over the cases that lack it, the share with a false
    detection and its mean voxels."""
    from voxjet.volumes.evaluation.metrics import seg_metrics
    from voxjet.volumes.plan.plan_file import LabelSet

    meta = json.loads((msd / "dataset.json").read_text())
    labels = {int(k): v for k, v in meta["labels"].items()}
    classes = LabelSet(labels, max(labels) + 1)
    per_case = {}
    for cid in case_ids:
        ref = np.asarray(nib.load(msd / "labelsTr" / f"{cid}.nii.gz").dataobj).astype(np.uint8)
        pred = np.asarray(nib.load(pred_dir / f"{cid}.nii.gz").dataobj).astype(np.uint8)
        assert pred.shape == ref.shape, (cid, pred.shape, ref.shape)
        per_case[cid] = seg_metrics(pred, ref, classes, hd95=False)
    out = {}
    for name in next(iter(per_case.values())):
        present = [m[name] for m in per_case.values() if m[name]["present"]]
        absent = [m[name] for m in per_case.values() if not m[name]["present"]]
        out[name] = {"dice": float(np.mean([r["dice"] for r in present])) if present else None,
                     "cases_with": len(present), "cases_without": len(absent),
                     "false_detection_rate": (float(np.mean([r["false_detection"] for r in absent]))
                                              if absent else None),
                     "false_voxels": (float(np.mean([r["n_pred"] for r in absent]))
                                      if absent else None)}  # fmt: skip
    return out


def prepare(msd: Path, work: Path, patch: list[int]) -> dict:
    """voxjet's preprocessing (and with it the split both sides use); the splits."""
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset

    manifest = work / "manifest.json"
    manifest.write_text(json.dumps({"root": str(msd), "files": []}))
    depth = 3 if min(patch) % 8 == 0 else 2
    prep = VolumePrepConfig(patch_size=patch, network_depth=depth, storage="mapped",
                            val_fraction=0.15, test_fraction=0.25)  # fmt: skip
    preprocess_dataset(manifest, work / "cases", prep)
    return json.loads((work / "cases" / "splits.json").read_text())


def run_voxjet(msd: Path, work: Path, steps: int, batch: int, run_cfg: dict, seed: int,
               splits: dict, schedule_steps: int) -> tuple[dict, float]:  # fmt: skip
    """voxjet's training (validated once, at its last step: it keeps its final weights, as
    nnU-Net's checkpoint_final; its schedule over `schedule_steps`, the full recipe's length,
    stopped after `steps`) and test predictions; (scores, seconds)."""
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.training.train import run

    cfg = json.loads(json.dumps(run_cfg))
    cfg["train"].update(steps=steps, batch_size=batch, eval_every=steps, checkpoint_every=steps,
                        seed=seed, schedule_steps=schedule_steps)  # fmt: skip
    out = work / f"run_{seed}"
    t = time.perf_counter()
    run(str(work / "cases"), cfg, str(out))
    evaluate(str(work / "cases"), str(out / "model.pt"), str(out / "eval"))
    seconds = time.perf_counter() - t
    return score(out / "eval" / "predictions", msd, splits["test"]), seconds


def run_nnunet(msd: Path, work: Path, patch: list[int], steps: int, batch: int,
               splits: dict, epochs: int, seed: int,
               full_epochs: int) -> tuple[dict, dict, float]:  # fmt: skip
    """nnU-Net's fingerprint of the training and validation cases, plan (its 3d_fullres with
    the common patch and batch and its own topology for that patch), preprocessing, training
    on voxjet's split (its fold 0) and test predictions with its final weights."""
    import nnunet_peer

    from voxjet.volumes.plan.topology import pool_and_conv_props

    budget = {
        "VOXJET_BENCH_EPOCHS": str(epochs),
        "VOXJET_BENCH_ITERS": str(steps // epochs),
        "VOXJET_BENCH_SEED": str(seed),
        "VOXJET_BENCH_FULL_EPOCHS": str(full_epochs),
    }
    environ = {**nnunet_peer.env(work), "nnUNet_n_proc_DA": "2", "nnUNet_compile": "f", **budget}
    nnunet_peer.to_raw(msd, work, splits["train"] + splits["val"])
    d = str(nnunet_peer.DATASET_ID)
    exe = Path(sys.executable).parent

    def cli(*args: str) -> None:
        r = subprocess.run([str(exe / args[0]), *args[1:]], env=environ, capture_output=True,
                           text=True)  # fmt: skip
        if r.returncode:
            raise RuntimeError(f"{args[0]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")

    cli("nnUNetv2_extract_fingerprint", "-d", d, "-np", "1")
    cli("nnUNetv2_plan_experiment", "-d", d)
    prep = work / "nnUNet_preprocessed" / nnunet_peer.NAME
    plans_path = prep / "nnUNetPlans.json"
    plans = json.loads(plans_path.read_text())
    full = plans["configurations"]["3d_fullres"]
    order = plans["transpose_forward"]
    zyx = list(reversed(patch))
    p = [zyx[i] for i in order]
    strides, kernels, padded, _ = pool_and_conv_props(full["spacing"], p)
    assert padded == p, f"nnU-Net's topology pads the patch {p} to {padded}"
    n = len(strides)
    full["patch_size"], full["batch_size"] = p, batch
    full["architecture"]["arch_kwargs"].update(
        n_stages=n, features_per_stage=[min(320, 32 * 2**i) for i in range(n)],
        kernel_sizes=kernels, strides=strides, n_conv_per_stage=[2] * n,
        n_conv_per_stage_decoder=[2] * (n - 1),
    )  # fmt: skip
    plans_path.write_text(json.dumps(plans, indent=1))
    cli("nnUNetv2_preprocess", "-d", d, "-c", "3d_fullres", "-np", "1")
    (prep / "splits_final.json").write_text(json.dumps([{k: splits[k] for k in ("train", "val")}]))
    t = time.perf_counter()
    cli("nnUNetv2_train", d, "3d_fullres", "0", "-tr", TRAINER, "-device", "cpu")
    images = work / "test_images"
    images.mkdir()
    for cid in splits["test"]:
        shutil.copy(msd / "imagesTr" / f"{cid}.nii.gz", images / f"{cid}_0000.nii.gz")
    cli("nnUNetv2_predict", "-i", str(images), "-o", str(work / "pred"), "-d", d, "-c",
        "3d_fullres", "-f", "0", "-tr", TRAINER, "-chk", "checkpoint_final.pth", "-device",
        "cpu", "--disable_tta", "-npp", "1", "-nps", "1")  # fmt: skip
    seconds = time.perf_counter() - t
    return {"patch": p, "stages": n}, score(work / "pred", msd, splits["test"]), seconds


def _mean_sd(values: list[float | None]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "–"
    return f"{np.mean(v):.4f} ± {np.std(v, ddof=1):.4f}" if len(v) > 1 else f"{v[0]:.4f}"


def report(rows: list[dict], steps: int, batch: int, threads: str, model: str) -> None:
    """The seeds' rows as one table: mean ± sd (sample) over seeds, each side."""
    print(f"\n{steps} iterations of batch {batch} (both schedules over 1000 epochs of 250), "
          f"{threads} threads, {len(rows)} seeds; voxjet "
          f"model {model}; test cases: {rows[0]['test_cases']} (training {rows[0]['train_cases']}"
          f", validation {rows[0]['val_cases']})\n")  # fmt: skip
    print("| class | measure | nnU-Net 2.8.1 | voxjet |")
    print("|---|---|---|---|")
    for c, first in rows[0]["nnunet"].items():
        measures = [("dice", f"Dice over the {first['cases_with']} test cases with it")]
        if first["cases_without"]:
            measures += [("false_detection_rate",
                          f"share of the {first['cases_without']} cases without it where some "
                          "is predicted"),
                         ("false_voxels", "voxels predicted there (mean)")]  # fmt: skip
        for key, what in measures:
            nnu = _mean_sd([r["nnunet"][c][key] for r in rows])
            vox = _mean_sd([r["voxjet"][c][key] for r in rows])
            print(f"| {c} | {what} | {nnu} | {vox} |")
    found = {side: all(((r[side].get("lesion") or {}).get("dice") or 0) > 0 for r in rows)
             for side in ("nnunet", "voxjet")}  # fmt: skip
    print(
        f"\nboth found the lesion in every seed: {found['nnunet'] and found['voxjet']} "
        f"(nnU-Net {found['nnunet']}, voxjet {found['voxjet']}); a comparison counts only "
        "where both trained"
    )
    print(f"\nseconds (training + test prediction), mean: nnU-Net "
          f"{np.mean([r['nnunet_s'] for r in rows]):.0f}, voxjet "
          f"{np.mean([r['voxjet_s'] for r in rows]):.0f}")  # fmt: skip


def previous_rows(path: Path) -> list[dict]:
    """The rows an interrupted run printed (one JSON object a line; other lines skipped)."""
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith('{"seed"')]


def main() -> None:
    """Both sides trained and scored for each seed; the table of means ± sd."""
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="training runs a side (voxjet: seeds)")
    ap.add_argument("--epochs", type=int, default=6,
                    help="nnU-Net epochs of --iters iterations both sides train (a fraction of "
                         "--full-epochs, the recipe's length both schedules run over)")  # fmt: skip
    ap.add_argument("--iters", type=int, default=250, help="iterations an epoch (nnU-Net's 250)")
    ap.add_argument("--full-epochs", type=int, default=1000, help="nnU-Net's recipe: 1000")
    ap.add_argument("--patch", type=int, nargs=3, default=None,
                    help="the patch (x y z) both train on; default the demo's")  # fmt: skip
    ap.add_argument("--batch", type=int, default=2, help="patches a batch, both")
    ap.add_argument("--cases", type=int, default=24, help="toy CT labelled cases")
    ap.add_argument(
        "--model",
        default='{"name": "dynunet", "deep_supervision": true}',
        help="voxjet's model section (JSON)",
    )
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--first-seed", type=int, default=0, help="seed of the first run (to resume)")
    ap.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="rows of earlier seeds (the JSON lines this script printed) to include in the table",
    )
    args = ap.parse_args()
    args.steps = args.epochs * args.iters
    threads = os.environ.setdefault("OMP_NUM_THREADS", "2")
    install_trainer()
    demo = yaml.safe_load((ROOT / "config" / "demo-full.yaml").read_text())["experiments"]["unet"]
    train = {**demo["train"], "iterations_per_epoch": args.iters}
    run_cfg = {"model": json.loads(args.model), "train": train}
    rows = previous_rows(args.previous) if args.previous else []
    with tempfile.TemporaryDirectory() as tmp:
        msd, patch = toy_ct(Path(tmp), args.cases)
        patch = args.patch or patch
        (Path(tmp) / "voxjet").mkdir()
        splits = prepare(msd, Path(tmp) / "voxjet", patch)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            vox, vs = run_voxjet(msd, Path(tmp) / "voxjet", args.steps, args.batch, run_cfg,
                                 seed, splits, args.full_epochs * args.iters)  # fmt: skip
            info, nnu, ns = run_nnunet(msd, Path(tmp) / f"nnunet_{seed}", patch, args.steps,
                                       args.batch, splits, args.epochs, seed,
                                       args.full_epochs)  # fmt: skip
            rows.append({"seed": seed, "patch_xyz": patch, "nnunet": nnu, "voxjet": vox,
                         "voxjet_s": vs, "nnunet_s": ns, "test_cases": len(splits["test"]),
                         "train_cases": len(splits["train"]), "val_cases": len(splits["val"]),
                         **info})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    report(rows, args.steps, args.batch, threads, args.model)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
