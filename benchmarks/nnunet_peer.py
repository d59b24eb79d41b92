"""The real nnU-Net v2 on the same cases as voxjet, for benchmarks/volumes_io.py: its
preprocessing as its command line runs it (`nnUNetv2_preprocess`), and its training data loader
(`nnUNetDataLoader` over its blosc2 files) with and without its training augmentation.

nnU-Net is the `bench` extra (`pip install -e '.[bench]'`); it reads its folders from
environment variables at import, so everything here runs with them set first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DATASET_ID = 901
NAME = f"Dataset{DATASET_ID}_VoxjetBench"


def available() -> bool:
    """Whether nnU-Net v2 is installed."""
    import importlib.util

    return importlib.util.find_spec("nnunetv2") is not None


def env(root: Path) -> dict[str, str]:
    """nnU-Net's folders under `root`, and one thread a process as in its data loaders."""
    folders = {k: root / k for k in ("nnUNet_raw", "nnUNet_preprocessed", "nnUNet_results")}
    for p in folders.values():
        p.mkdir(parents=True, exist_ok=True)
    return {**os.environ, **{k: str(v) for k, v in folders.items()}}


def to_raw(msd: Path, root: Path, cases: list[str] | None = None) -> Path:
    """The MSD dataset as an nnU-Net v2 raw dataset (links to the same files); `cases`: only
    those (e.g. the training cases, so that nnU-Net's fingerprint never sees a test case)."""
    meta = json.loads((msd / "dataset.json").read_text())
    if cases is not None:
        meta["training"] = [t for t in meta["training"]
                            if Path(t["image"]).name[: -len(".nii.gz")] in set(cases)]  # fmt: skip
    raw = root / "nnUNet_raw" / NAME
    (raw / "imagesTr").mkdir(parents=True, exist_ok=True)
    (raw / "labelsTr").mkdir(exist_ok=True)
    for t in meta["training"]:
        cid = Path(t["image"]).name[: -len(".nii.gz")]
        (raw / "imagesTr" / f"{cid}_0000.nii.gz").symlink_to((msd / t["image"]).resolve())
        (raw / "labelsTr" / f"{cid}.nii.gz").symlink_to((msd / t["label"]).resolve())
    labels = {v: int(k) for k, v in meta["labels"].items()}
    (raw / "dataset.json").write_text(json.dumps({
        "channel_names": meta["modality"], "labels": labels,
        "numTraining": len(meta["training"]), "file_ending": ".nii.gz",
    }))  # fmt: skip
    return raw


def _cli(name: str, args: list[str], environ: dict[str, str]) -> float:
    """Seconds an nnU-Net command line takes."""
    exe = Path(sys.executable).parent / name
    t = time.perf_counter()
    subprocess.run([str(exe), *args], env=environ, check=True, capture_output=True)
    return time.perf_counter() - t


def plan_and_preprocess(msd: Path, root: Path, patch_xyz: list[int]) -> dict:
    """Fingerprint and plan (untimed), fix the 3d_fullres patch to voxjet's (nnU-Net orders
    axes z, y, x), then time `nnUNetv2_preprocess` on one process. Returns its seconds, the
    number of cases and the preprocessed folder."""
    environ = env(root)
    to_raw(msd, root)
    d = str(DATASET_ID)
    _cli("nnUNetv2_extract_fingerprint", ["-d", d, "-np", "1"], environ)
    _cli("nnUNetv2_plan_experiment", ["-d", d], environ)
    plans_path = root / "nnUNet_preprocessed" / NAME / "nnUNetPlans.json"
    plans = json.loads(plans_path.read_text())
    full = plans["configurations"]["3d_fullres"]
    full["patch_size"] = list(reversed(patch_xyz))
    plans_path.write_text(json.dumps(plans, indent=1))
    seconds = _cli("nnUNetv2_preprocess", ["-d", d, "-c", "3d_fullres", "-np", "1"], environ)
    folder = root / "nnUNet_preprocessed" / NAME / full["data_identifier"]
    cases = len(list(folder.glob("*.pkl")))
    return {"seconds": seconds, "cases": cases, "folder": folder, "plans": plans}


LOADER = """
import json, sys, time
import numpy as np, torch
from nnunetv2.training.dataloading.data_loader import nnUNetDataLoader
from nnunetv2.training.dataloading.nnunet_dataset import nnUNetDatasetBlosc2
from nnunetv2.utilities.plans_handling.plans_handler import PlansManager
from nnunetv2.training.nnUNetTrainer.nnUNetTrainer import nnUNetTrainer
from nnunetv2.training.data_augmentation.compute_initial_patch_size import get_patch_size
folder, plans_path, ds_json, patch, batch, n, augment, cold = json.loads(sys.argv[1])
torch.set_num_threads(1)
np.random.seed(0)
plans = PlansManager(plans_path)
labels = plans.get_label_manager(json.load(open(ds_json)))
data = nnUNetDatasetBlosc2(folder)
transforms, read = None, patch
if augment:
    # what nnUNetTrainer does for a 3-D patch: rotation ±30 deg, scaling, the larger patch
    # read before the spatial transform, then its whole training pipeline
    rot = (-30.0 / 360 * 2 * np.pi, 30.0 / 360 * 2 * np.pi)
    read = [int(x) for x in get_patch_size(patch, rot, rot, rot, (0.85, 1.25))]
    transforms = nnUNetTrainer.get_training_transforms(
        patch, rot, None, (0, 1, 2), False, [False], foreground_labels=labels.foreground_labels)
loader = nnUNetDataLoader(data, batch, read, patch, labels, oversample_foreground_percent=0.33,
                          transforms=transforms)
loader.generate_train_batch()
def evict():
    import os, pathlib
    for p in pathlib.Path(folder).rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
def disk_read():
    return int(open("/proc/self/io").read().split("read_bytes: ")[1].split()[0])
spent, read = 0.0, 0
for _ in range(n):
    if cold:
        evict()
    t, r = time.perf_counter(), disk_read()
    loader.generate_train_batch()
    spent += time.perf_counter() - t
    read += disk_read() - r
print(n * batch / spent, read / (n * batch))
"""


def loader_rate(prep: dict, patch_xyz: list[int], batch: int, n: int, augment: bool,
                root: Path, cold: bool = False) -> tuple[float, float]:  # fmt: skip
    """nnU-Net's training loader: (patches/s, bytes read from the disk a patch), one process
    (as the issue measured it); `cold`: its files dropped from the page cache before each
    batch."""
    name = prep["plans"]["dataset_name"]
    pre = root / "nnUNet_preprocessed" / name
    args = [str(prep["folder"]), str(pre / "nnUNetPlans.json"), str(pre / "dataset.json"),
            list(reversed(patch_xyz)), batch, n, augment, cold]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", LOADER, json.dumps(args)], env=env(root),
                         check=True, capture_output=True, text=True)  # fmt: skip
    rate, read = out.stdout.strip().splitlines()[-1].split()
    return float(rate), float(read)


def case_shapes(prep: dict) -> list[tuple[int, ...]]:
    """The preprocessed cases' shapes (z, y, x), to check both sides prepared alike."""
    import blosc2

    return [tuple(blosc2.open(str(p), mode="r").shape[1:]) for p in
            sorted(prep["folder"].glob("*_seg.b2nd"))]  # fmt: skip


def total_bytes(shapes: list[tuple[int, ...]]) -> int:
    """Decoded bytes of the images (float32) and labels (uint8) of these shapes."""
    return int(sum(np.prod(s) * 5 for s in shapes))
