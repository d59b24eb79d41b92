"""Segmentation quality against nnU-Net itself: nnU-Net 2.8.1 (`nnUNetv2_train` with a trainer
shortened to the same number of iterations, on the CPU) and voxjet trained on the same cases, the
same train/validation split, the same patch, batch and number of iterations; both predict the same
held-out test cases without test-time mirroring, and one function scores both predictions
against the labels on the original grids (Dice a class).

Each trains with its own recipe: nnU-Net its PlainConvUNet (deep supervision, SGD 0.01 with
Nesterov momentum, poly decay, its augmentation, 1/3 foreground oversampling); voxjet the
experiment given (default: `dynunet` with deep supervision, nnU-Net's network, under the demo's
`unet` training settings). nnU-Net's network is planned for the common patch with its own
topology rule.

Datasets: the demo's toy CT set (`toy_ct`) and the MNI152 brain built from nilearn's template
(`mni`, tests/mni_dataset.py: four cases, one test case).

    .venv-bench/bin/python benchmarks/seg_quality.py [--datasets toy_ct mni] [--steps 1000]
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
TRAINER_CODE = '''"""Written by voxjet's benchmarks/seg_quality.py: nnU-Net's trainer for a given
number of iterations (VOXJET_BENCH_EPOCHS x VOXJET_BENCH_ITERS), without the final validation
pass."""
import os

import torch

from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer


class nnUNetTrainer_voxjetBudget(nnUNetTrainer):
    def __init__(self, plans, configuration, fold, dataset_json, device=torch.device("cuda")):
        super().__init__(plans, configuration, fold, dataset_json, device)
        self.num_epochs = int(os.environ["VOXJET_BENCH_EPOCHS"])
        self.num_iterations_per_epoch = int(os.environ["VOXJET_BENCH_ITERS"])
        self.num_val_iterations_per_epoch = 2

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


def datasets(root: Path, names: list[str], cases: int | None) -> dict[str, tuple[Path, list]]:
    """Each dataset's MSD folder and the patch both train on (RAS x, y, z)."""
    import yaml

    from voxjet.volumes.synth import ToyVolumesConfig, generate_dataset

    out = {}
    if "toy_ct" in names:
        cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
        ds = cfg["datasets"]["toy_ct"]
        synth = {**ds["source"]["synthetic"], **({"train_cases": cases} if cases else {})}
        msd = generate_dataset(root / "toy_ct", ToyVolumesConfig(**synth), progress=False)
        out["toy_ct"] = (msd, ds["volumes"]["patch_size"])
    if "mni" in names:
        from mni_dataset import mni_brain_dataset

        out["mni"] = (mni_brain_dataset(root / "mni"), [48, 48, 48])
    return out


def dice_per_class(pred_dir: Path, msd: Path, case_ids: list[str], labels: dict) -> dict:
    """Mean Dice a class over the cases (a class absent from both label and prediction: 1)."""
    scores: dict[str, list[float]] = {name: [] for v, name in labels.items() if int(v) > 0}
    for cid in case_ids:
        ref = np.asarray(nib.load(msd / "labelsTr" / f"{cid}.nii.gz").dataobj)
        pred = np.asarray(nib.load(pred_dir / f"{cid}.nii.gz").dataobj)
        assert pred.shape == ref.shape, (cid, pred.shape, ref.shape)
        for v, name in labels.items():
            if int(v) == 0:
                continue
            a, b = ref == int(v), pred == int(v)
            denom = a.sum() + b.sum()
            scores[name].append(1.0 if denom == 0 else 2 * (a & b).sum() / denom)
    return {k: float(np.mean(v)) for k, v in scores.items()}


def run_voxjet(msd: Path, work: Path, patch: list[int], steps: int, batch: int,
               run_cfg: dict) -> tuple[dict, dict, float]:  # fmt: skip
    """voxjet's preprocessing, training and test predictions; (splits, Dice a class, s)."""
    from voxjet.volumes.evaluate import evaluate
    from voxjet.volumes.preprocess import preprocess_dataset
    from voxjet.volumes.settings import VolumePrepConfig
    from voxjet.volumes.train import run

    manifest = work / "manifest.json"
    manifest.write_text(json.dumps({"root": str(msd), "files": []}))
    depth = 3 if min(patch) % 8 == 0 else 2
    prep = VolumePrepConfig(patch_size=patch, network_depth=depth, storage="mapped")
    if len(json.loads((msd / "dataset.json").read_text())["training"]) < 8:
        prep.val_fraction, prep.test_fraction = 0.25, 0.25
    preprocess_dataset(manifest, work / "cases", prep)
    splits = json.loads((work / "cases" / "splits.json").read_text())
    cfg = json.loads(json.dumps(run_cfg))
    cfg["train"].update(steps=steps, batch_size=batch)
    t = time.perf_counter()
    run(str(work / "cases"), cfg, str(work / "run"))
    evaluate(str(work / "cases"), str(work / "run" / "model.pt"), str(work / "eval"))
    seconds = time.perf_counter() - t
    labels = json.loads((msd / "dataset.json").read_text())["labels"]
    return (
        splits,
        dice_per_class(work / "eval" / "predictions", msd, splits["test"], labels),
        seconds,
    )


def run_nnunet(msd: Path, work: Path, patch: list[int], steps: int, batch: int,
               splits: dict, epochs: int) -> tuple[dict, dict, float]:  # fmt: skip
    """nnU-Net's fingerprint, plan (its 3d_fullres with the common patch and batch and its own
    topology for that patch), preprocessing, training on voxjet's fold 0 and test predictions."""
    import nnunet_peer

    from voxjet.volumes.plan.topology import pool_and_conv_props

    budget = {"VOXJET_BENCH_EPOCHS": str(epochs), "VOXJET_BENCH_ITERS": str(steps // epochs)}
    environ = {**nnunet_peer.env(work), "nnUNet_n_proc_DA": "2", "nnUNet_compile": "f", **budget}
    nnunet_peer.to_raw(msd, work)
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
    labels = json.loads((msd / "dataset.json").read_text())["labels"]
    return {"patch": p, "stages": n}, dice_per_class(work / "pred", msd, splits["test"],
                                                     labels), seconds  # fmt: skip


def main() -> None:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--datasets", nargs="+", default=["toy_ct", "mni"])
    ap.add_argument("--steps", type=int, default=1000, help="training iterations, both")
    ap.add_argument("--epochs", type=int, default=20, help="nnU-Net's epochs (steps a multiple)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--cases", type=int, default=None, help="toy CT training cases (demo's: 16)")
    ap.add_argument("--model", default='{"name": "dynunet", "deep_supervision": true}')
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    if args.steps % args.epochs:
        ap.error("--steps must be a multiple of --epochs")
    torch_threads = os.environ.setdefault("OMP_NUM_THREADS", "2")
    install_trainer()
    demo = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["experiments"]["unet"]
    train = {**demo["train"], "iterations_per_epoch": args.steps // args.epochs}
    run_cfg = {"model": json.loads(args.model), "train": train}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (msd, patch) in datasets(Path(tmp), args.datasets, args.cases).items():
            work = Path(tmp) / f"{name}_work"
            (work / "voxjet").mkdir(parents=True)
            splits, vox, vs = run_voxjet(msd, work / "voxjet", patch, args.steps, args.batch,
                                         run_cfg)  # fmt: skip
            info, nnu, ns = run_nnunet(msd, work / "nnunet", patch, args.steps, args.batch,
                                       splits, args.epochs)  # fmt: skip
            rows.append({"dataset": name, "patch_xyz": patch, "nnunet": nnu, "voxjet": vox,
                         "voxjet_s": vs, "nnunet_s": ns, "test_cases": len(splits["test"]),
                         "train_cases": len(splits["train"]), **info})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    print(
        f"\n{args.steps} iterations of batch {args.batch}, {torch_threads} threads; "
        f"voxjet model {args.model}\n"
    )
    print("| dataset | class | nnU-Net 2.8.1 Dice | voxjet Dice | voxjet − nnU-Net |")
    print("|---|---|---|---|---|")
    for r in rows:
        for c in r["nnunet"]:
            print(f"| {r['dataset']} | {c} | {r['nnunet'][c]:.4f} | {r['voxjet'][c]:.4f} | "
                  f"{r['voxjet'][c] - r['nnunet'][c]:+.4f} |")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
