"""Volume I/O, measured side by side in one run on the same synthetic CT cases:

1. patches/s of the voxjet patch loader (preprocessed HDF5 case files) ÷ a MONAI baseline
   (LoadImaged from .nii.gz, EnsureChannelFirstd, RandCropByPosNegLabeld, DataLoader);
   same patch size, batch size and workers. Target >= 10.
2. preprocessing throughput (RAS, crop, resample, normalise, write) ÷ nibabel loading the same
   files alone. Target >= 0.3.
3. a random patch read from a case file ÷ the same read from an uncompressed memory-mapped
   .npy of the same array. Target >= 0.5.
4. patches/s of the loader with the case files' checksums verified (fletcher32) ÷ the same case
   files written without checksums. Target >= 0.9.

    .venv/bin/python benchmarks/volumes_io.py [--cases 6] [--shape 192 192 96] [--patch 96 96 48]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import nibabel as nib
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
) -> tuple[float, float]:
    """(voxjet patches/s, MONAI patches/s or nan); `cache_bytes` 0 decodes on every read."""
    from monai.data import DataLoader, Dataset
    from monai.transforms import Compose, EnsureChannelFirstd, LoadImaged, RandCropByPosNegLabeld

    from voxjet.volumes.patches import CaseStore, PatchSampler

    store = CaseStore(cases_dir, case_ids, cache_bytes=cache_bytes)
    sampler = PatchSampler(store, patch, batch, 1 / 3, seed=0)
    sampler.batch(0, 0, 0)
    t = time.perf_counter()
    for i in range(n):
        sampler.batch(0, 0, i + 1)
    ours = n * batch / (time.perf_counter() - t)
    store.close()
    if not monai:
        return ours, float("nan")

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
    return ours, monai


def bench_preprocess(msd: Path, out: Path, patch: list[int]) -> tuple[float, float]:
    """(seconds to preprocess every case, seconds for nibabel to load them)."""
    from voxjet.volumes.msd import load_dataset
    from voxjet.volumes.preprocess import VolumePrepConfig, fingerprint, make_plan, preprocess_case

    ds = load_dataset(msd)
    cfg = VolumePrepConfig(patch_size=patch)  # chunks follow the patch, as in training
    fp = fingerprint(ds, [c.case_id for c in ds.cases], cfg)
    plan = make_plan(fp, cfg)
    t = time.perf_counter()
    for c in ds.cases:
        np.asarray(nib.load(ds.path(c.image)).dataobj)
        np.asarray(nib.load(ds.path(c.label)).dataobj)
    load = time.perf_counter() - t
    out.mkdir()
    t = time.perf_counter()
    for c in ds.cases:
        preprocess_case(ds, c, plan, fp, out / f"{c.case_id}.h5", cfg)
    return time.perf_counter() - t, load


def bench_patch_read(
    cases_dir: Path, case_id: str, tmp: Path, patch: list[int], n: int
) -> tuple[float, float]:
    """(seconds a random image+label patch through the loader's case store, seconds for the
    same from memory-mapped uncompressed .npy files)."""
    from voxjet.volumes.patches import CaseStore, read_patch

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


def main() -> None:
    from voxjet.volumes.synth import ToyVolumesConfig, generate_dataset

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--shape", type=int, nargs=3, default=[192, 192, 96])
    ap.add_argument("--patch", type=int, nargs=3, default=[96, 96, 48])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--batches", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        cfg = ToyVolumesConfig(
            train_cases=a.cases, test_cases=0, min_shape=tuple(a.shape), max_shape=tuple(a.shape)
        )
        msd = generate_dataset(d / "msd", cfg, progress=False)
        prep, load = bench_preprocess(msd, d / "cases", a.patch)
        ids = [
            c["image"].split("/")[-1][:-7]
            for c in json.loads((msd / "dataset.json").read_text())["training"]
        ]
        (d / "cases" / "plan.json").write_text("{}")
        ours, monai = bench_loader(d / "cases", msd, ids, a.patch, a.batch, a.batches)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from unchecked import copy_without_checksums

        plain = copy_without_checksums(d / "cases", d / "unchecked")
        # no decoded-chunk cache: every patch decodes (and verifies) what it reads
        same = {"monai": False, "cache_bytes": 0}
        checked = bench_loader(d / "cases", msd, ids, a.patch, a.batch, a.batches, **same)
        unchecked = bench_loader(plain, msd, ids, a.patch, a.batch, a.batches, **same)
        h5, npy = bench_patch_read(d / "cases", ids[0], d, a.patch, 50)
    rows = [
        (
            "loader patches/s: voxjet ÷ MONAI (LoadImaged + RandCropByPosNegLabeld)",
            ours / monai,
            10,
            f"{ours:.1f} vs {monai:.1f} patches/s",
        ),
        (
            "preprocessing ÷ nibabel load alone (throughput)",
            load / prep,
            0.3,
            f"{prep:.2f} s vs {load:.2f} s for {a.cases} cases",
        ),
        (
            "random patch read: case file ÷ memory-mapped .npy (speed)",
            npy / h5,
            0.5,
            f"{1000 * h5:.2f} ms vs {1000 * npy:.2f} ms",
        ),
        (
            "loader patches/s, no cache: checksums verified ÷ case files without them",
            checked[0] / unchecked[0],
            0.9,
            f"{checked[0]:.1f} vs {unchecked[0]:.1f} patches/s",
        ),
    ]
    print(f"cases {a.cases} of {a.shape}, patch {a.patch}, batch {a.batch}")
    for name, ratio, target, detail in rows:
        print(
            f"{name:<72} {ratio:7.2f} (target >= {target}) "
            f"{'PASS' if ratio >= target else 'FAIL'}  [{detail}]"
        )


if __name__ == "__main__":
    main()
