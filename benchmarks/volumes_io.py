"""Volume I/O, measured side by side in one run on the same synthetic CT cases:

1. patches/s of the voxjet patch loader (preprocessed HDF5 case files) ÷ the real nnU-Net v2
   loader (nnUNetDataLoader over its blosc2 files, `bench` extra), same patch, batch and
   foreground share, one process each: voxjet's default case files (uncompressed, memory-
   mapped), and LZ4-compressed ones (`storage: compressed`) with the decoded-chunk cache
   holding the whole dataset and holding 10% of it; and with each side's training
   augmentation on (nnU-Net's whole training pipeline; voxjet's spatial and intensity
   transforms). Target >= 2. And the blosc2 case files (`storage: blosc2`: 16-bit fixed
   point in blocks sized to the patch): with the page cache holding them (target >= 3) and,
   as every store, read from disk with the page cache dropped before each batch (target >= 2),
   with the bytes each side had read from the disk a patch and the disk each uses a case.
2. preprocessing, as each runs it, ÷ nnU-Net's: `voxjet preprocess-case` one process a case
   (what a workflow job runs, imports included) against `nnUNetv2_preprocess -np 1` over all
   cases, per case. Target >= 1.
3. patches/s of the voxjet loader ÷ a MONAI baseline (LoadImaged from .nii.gz,
   EnsureChannelFirstd, RandCropByPosNegLabeld, DataLoader). Target >= 10.
4. a random patch read from a case file ÷ the same read from an uncompressed memory-mapped
   .npy of the same array. Target >= 0.5.
5. patches/s of the loader with the case files' checksums verified (fletcher32) ÷ the same case
   files written without checksums, no cache. Target >= 0.9.

    .venv/bin/python benchmarks/volumes_io.py [--cases 6] [--shape 192 192 96] [--patch 128 128 64]

Without nnU-Net installed (`pip install -e '.[bench]'`) its rows say so and are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def bench_loader(
    cases_dir: Path,
    msd: Path,
    case_ids: list[str],
    patch: list[int],
    batch: int,
    n: int,
    monai: bool = True,
    cache_bytes: int = 512 << 20,
    augment: bool = False,
    cold: bool = False,
) -> tuple[float, float, float]:
    """(voxjet patches/s, MONAI patches/s or nan, bytes read from the disk a patch);
    `cache_bytes` 0 decodes on every read; `cold`: every batch starts with none of the case
    files in the page cache. The stores' checksums are verified first, untimed: a process
    verifies each slab or chunk once, so a long training reads as the timed loop does."""
    from monai.data import DataLoader, Dataset
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged, RandCropByPosNegLabeld

    from voxjet.volumes.preprocessing.store import CaseStore
    from voxjet.volumes.training.patches import PatchSampler

    store = CaseStore(cases_dir, case_ids, cache_bytes=cache_bytes)
    plan = cases_dir / "plan.json"
    spacing = json.loads(plan.read_text()).get("target_spacing") if plan.is_file() else None
    sampler = PatchSampler(store, patch, batch, 1 / 3, seed=0, augment=augment, spacing=spacing)
    sampler.batch(0, 0, 0)
    for c in case_ids:
        for a in store.volumes(c):
            if hasattr(a, "whole"):
                a.whole()
    spent, read = 0.0, 0
    for i in range(n):
        if cold:
            evict_pages(cases_dir, store)
        t, r = time.perf_counter(), disk_read()
        sampler.batch(0, 0, i + 1)
        spent += time.perf_counter() - t
        read += disk_read() - r
    ours = n * batch / spent
    store.close()
    if not monai:
        return ours, float("nan"), read / (n * batch)

    files = [
        {
            "image": str(msd / "imagesTr" / f"{c}.nii.gz"),
            "label": str(msd / "labelsTr" / f"{c}.nii.gz"),
        }
        for c in case_ids
    ]
    tf = Compose(
        [
            LoadImaged(keys=["image", "label"]),
            EnsureChannelFirstd(keys=["image", "label"]),
            RandCropByPosNegLabeld(
                keys=["image", "label"],
                label_key="label",
                spatial_size=patch,
                pos=1,
                neg=2,
                num_samples=1,
            ),
        ]
    )
    loader = DataLoader(
        Dataset(files * (n * batch // len(files) + 1), tf), batch_size=batch, num_workers=0
    )
    it = iter(loader)
    next(it)
    t = time.perf_counter()
    for _ in range(n):
        next(it)
    monai = n * batch / (time.perf_counter() - t)
    return ours, monai, read / (n * batch)


def disk_read() -> int:
    """Bytes this process has had read from the disk (not from the page cache)."""
    with open("/proc/self/io") as f:
        return int(f.read().split("read_bytes: ")[1].split()[0])


def evict_pages(folder: Path, store=None) -> None:
    """Drop `folder`'s files from the page cache (and a store's memory maps of them): the next
    reads come from the disk, as for a dataset many times the memory."""
    import mmap
    import os

    for arrays in store._volumes.values() if store is not None else ():
        for a in arrays:
            if getattr(a, "map", None) is not None:
                a.map._mmap.madvise(mmap.MADV_DONTNEED)
    for p in folder.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def bench_preprocess(msd: Path, out: Path, patch: list[int], spacing: list[float] | None,
                     storage: str = "mapped") -> tuple[float, int]:  # fmt: skip
    """(seconds of every `voxjet preprocess-case` job, cases): the workflow's per-case
    command, one process a case, after the (untimed) `voxjet plan-volumes`."""
    import subprocess

    exe = Path(sys.executable).parent / "voxjet"
    out.parent.mkdir(parents=True, exist_ok=True)
    manifest = out.parent / "manifest.json"
    manifest.write_text(json.dumps({"root": str(msd), "files": []}))
    cfg = {"patch_size": patch, "network_depth": 3, "target_spacing": spacing, "storage": storage}
    plan = out.parent / "plan"
    subprocess.run([str(exe), "plan-volumes", "--manifest", str(manifest), "--out", str(plan),
                    "--config", json.dumps(cfg)], check=True, capture_output=True)  # fmt: skip
    ids = sorted(json.loads((plan / "splits.json").read_text())[k] for k in ("train", "val",
                 "test"))  # fmt: skip
    ids = sorted(c for part in ids for c in part)
    out.mkdir()
    t = time.perf_counter()
    for c in ids:
        subprocess.run([str(exe), "preprocess-case", "--manifest", str(manifest), "--plan",
                        str(plan), "--case", c, "--out", str(out / f"{c}.h5")],
                       check=True, capture_output=True)  # fmt: skip
    seconds = time.perf_counter() - t
    subprocess.run([str(exe), "gather-cases", "--plan", str(plan), "--cases", str(out)],
                   check=True, capture_output=True)  # fmt: skip
    return seconds, len(ids)


def bench_patch_read(
    cases_dir: Path, case_id: str, tmp: Path, patch: list[int], n: int
) -> tuple[float, float]:
    """(seconds a random image+label patch through the loader's case store, seconds for the
    same from memory-mapped uncompressed .npy files)."""
    from voxjet.volumes.preprocessing.store import CaseStore
    from voxjet.volumes.training.patches import read_patch

    rng = np.random.default_rng(0)
    p = np.array(patch)
    store = CaseStore(cases_dir, [case_id])
    f = store.file(case_id)
    np.save(tmp / "image.npy", f["image"][...])
    np.save(tmp / "label.npy", f["label"][...])
    image, label = store.volumes(case_id)
    shape = np.array(label.shape)
    centres = [rng.integers(p // 2, np.maximum(shape - p // 2, p // 2 + 1)) for _ in range(n)]
    read_patch(image, label, centres[0], p)
    t = time.perf_counter()
    for c in centres:
        read_patch(image, label, c, p)
    h5 = (time.perf_counter() - t) / n
    store.close()
    img = np.load(tmp / "image.npy", mmap_mode="r")
    lbl = np.load(tmp / "label.npy", mmap_mode="r")
    t = time.perf_counter()
    for c in centres:
        lo = np.maximum(c - p // 2, 0)
        sl = tuple(slice(a, a + b) for a, b in zip(lo, p, strict=True))
        np.array(img[(slice(None), *sl)])
        np.array(lbl[sl])
    return h5, (time.perf_counter() - t) / n


def _decoded_bytes(cases_dir: Path, ids: list[str]) -> int:
    import h5py

    total = 0
    for c in ids:
        with h5py.File(cases_dir / f"{c}.h5") as f:
            total += f["image"].size * 4 + f["label"].size
    return total


def _row(name: str, ratio: float, target: float, detail: str) -> None:
    verdict = "PASS" if ratio >= target else "FAIL"
    print(f"{name:<78} {ratio:7.2f} (target >= {target}) {verdict}  [{detail}]")


def case_arguments(description: str) -> argparse.Namespace:
    """The synthetic CT set and loader settings the volume benchmarks share (their defaults:
    6 cases of 192×192×96, patch 128×128×64, batch 2, 30 batches)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--shape", type=int, nargs=3, default=[192, 192, 96])
    ap.add_argument("--patch", type=int, nargs=3, default=[128, 128, 64])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--batches", type=int, default=30)
    return ap.parse_args()


def main() -> None:
    import nnunet_peer

    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset

    a = case_arguments(__doc__)
    # one thread on both sides: nnU-Net's loader runs under threadpool_limits(1) (and its
    # training runs loaders in worker processes, as voxjet's loader_workers)
    import torch

    torch.set_num_threads(1)
    peer = nnunet_peer.available()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        cfg = ToyVolumesConfig(
            train_cases=a.cases, test_cases=0, min_shape=tuple(a.shape), max_shape=tuple(a.shape)
        )
        msd = generate_dataset(d / "msd", cfg, progress=False)
        spacing = nn = None
        if peer:
            nn = nnunet_peer.plan_and_preprocess(msd, d / "nnunet", a.patch)
            # the same target spacing on both sides (nnU-Net's is z, y, x)
            spacing = list(reversed(nn["plans"]["configurations"]["3d_fullres"]["spacing"]))
        prep, n_cases = bench_preprocess(msd, d / "cases", a.patch, spacing)
        # the same cases LZ4-compressed in half-patch chunks (`volumes.storage: compressed`)
        bench_preprocess(msd, d / "lz4" / "cases", a.patch, spacing, "compressed")
        lz4 = d / "lz4" / "cases"
        # and as blosc2 frames of 16-bit fixed point (`volumes.storage: blosc2`)
        bench_preprocess(msd, d / "b2" / "cases", a.patch, spacing, "blosc2")
        b2 = d / "b2" / "cases"
        ids = sorted(p.stem for p in (d / "cases").glob("*.h5"))
        total = _decoded_bytes(d / "cases", ids)
        print(f"cases {a.cases} of {a.shape}, patch {a.patch}, batch {a.batch}; decoded dataset "
              f"{total / 2**20:.0f} MiB")  # fmt: skip
        rates = {}
        for name, folder, cache, augment in (
            ("mapped", d / "cases", 0, False),
            ("all", lz4, 2 * total, False),
            ("10%", lz4, total // 10, False),
            ("aug", d / "cases", 0, True),
            ("cold", d / "cases", 0, False),
            ("cold-lz4", lz4, 0, False),
            ("blosc2", b2, 0, False),
            ("cold-b2", b2, 0, False),
        ):
            rates[name] = bench_loader(folder, msd, ids, a.patch, a.batch, a.batches,
                                       monai=(name == "mapped"), cache_bytes=cache,
                                       augment=augment, cold=name.startswith("cold"))  # fmt: skip
        if peer:
            theirs = nnunet_peer.loader_rate(nn, a.patch, a.batch, a.batches, False,
                                             d / "nnunet")[0]  # fmt: skip
            aug = nnunet_peer.loader_rate(nn, a.patch, a.batch, max(10, a.batches // 2), True,
                                          d / "nnunet")[0]  # fmt: skip
            cold, cold_read = nnunet_peer.loader_rate(nn, a.patch, a.batch, a.batches, False,
                                                      d / "nnunet", cold=True)  # fmt: skip
            theirs_disk = sum(p.stat().st_size for p in nn["folder"].iterdir() if p.is_file())
            print(f"preprocessed shapes (x, y, z): voxjet {_shapes(d / 'cases', ids)}, nnU-Net "
                  f"{[tuple(reversed(s)) for s in nnunet_peer.case_shapes(nn)]}")  # fmt: skip
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from unchecked import copy_without_checksums

        plain = copy_without_checksums(lz4, d / "unchecked")
        # no decoded-chunk cache: every patch decodes (and verifies) what it reads
        same = {"monai": False, "cache_bytes": 0}
        checked = bench_loader(lz4, msd, ids, a.patch, a.batch, a.batches, **same)
        unchecked = bench_loader(plain, msd, ids, a.patch, a.batch, a.batches, **same)
        h5, npy = bench_patch_read(d / "cases", ids[0], d, a.patch, 50)
        disk = sum(p.stat().st_size for p in (d / "cases").glob("*.h5"))
        disk_lz4 = sum(p.stat().st_size for p in lz4.glob("*.h5"))
        disk_b2 = sum(p.stat().st_size for p in b2.glob("*.h5"))
    print(f"case files on disk: mapped {disk / 2**20:.0f} MiB, compressed {disk_lz4 / 2**20:.0f} "
          f"MiB, blosc2 {disk_b2 / 2**20:.1f} MiB")  # fmt: skip
    if peer:
        for name, label in (
            ("mapped", "storage mapped (the page cache holds the files)"),
            ("all", "compressed, decoded-chunk cache holds the dataset"),
            ("10%", "compressed, decoded-chunk cache holds 10% of it"),
        ):
            _row(f"loader patches/s ÷ nnU-Net's nnUNetDataLoader, {label}", rates[name][0] / theirs,
                 2, f"{rates[name][0]:.1f} vs {theirs:.1f} patches/s")  # fmt: skip
        _row("loader patches/s ÷ nnU-Net's, storage blosc2 (the page cache holds the files)",
             rates["blosc2"][0] / theirs, 3,
             f"{rates['blosc2'][0]:.1f} vs {theirs:.1f} patches/s")  # fmt: skip
        for name, label in (("cold", "mapped"), ("cold-lz4", "compressed, no cache"),
                            ("cold-b2", "blosc2")):  # fmt: skip
            _row(f"loader patches/s ÷ nnU-Net's, both reading from disk (page cache dropped "
                 f"before each batch): {label}", rates[name][0] / cold, 2,
                 f"{rates[name][0]:.1f} vs {cold:.1f} patches/s; disk read a patch "
                 f"{rates[name][2] / 2**20:.2f} vs {cold_read / 2**20:.2f} MiB")  # fmt: skip
        _row("disk use: nnU-Net's preprocessed files ÷ voxjet's blosc2 case files", theirs_disk
             / disk_b2, 1, f"{disk_b2 / 2**20 / n_cases:.2f} vs {theirs_disk / 2**20 / n_cases:.2f}"
             " MiB a case")  # fmt: skip
        _row("loader patches/s ÷ nnU-Net's, both with training augmentation (mapped)",
             rates["aug"][0] / aug, 2, f"{rates['aug'][0]:.1f} vs {aug:.1f} patches/s")  # fmt: skip
        mine, theirs_case = prep / n_cases, nn["seconds"] / nn["cases"]
        _row("preprocessing a case (voxjet preprocess-case jobs) ÷ nnUNetv2_preprocess -np 1",
             theirs_case / mine, 1.0, f"{mine:.2f} s vs {theirs_case:.2f} s a case")  # fmt: skip
    else:
        print("nnU-Net rows left out: nnunetv2 is not installed (pip install -e '.[bench]')")
    ours, monai = rates["mapped"][:2]
    _row("loader patches/s: voxjet ÷ MONAI (LoadImaged + RandCropByPosNegLabeld)", ours / monai,
         10, f"{ours:.1f} vs {monai:.1f} patches/s")  # fmt: skip
    _row("random patch read: mapped case file ÷ memory-mapped .npy (speed)", npy / h5, 0.5,
         f"{1000 * h5:.2f} ms vs {1000 * npy:.2f} ms")  # fmt: skip
    _row("loader patches/s, compressed, no cache: checksums verified ÷ without them",
         checked[0] / unchecked[0], 0.9,
         f"{checked[0]:.1f} vs {unchecked[0]:.1f} patches/s")  # fmt: skip


def _shapes(cases_dir: Path, ids: list[str]) -> list[tuple[int, ...]]:
    import h5py

    out = []
    for c in ids:
        with h5py.File(cases_dir / f"{c}.h5") as f:
            out.append(tuple(int(x) for x in f["label"].shape))
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
