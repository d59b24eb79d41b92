"""Fingerprint, plan and preprocess an MSD dataset into one chunked HDF5 file a case.

Per case: nibabel load; reorient to RAS; crop to the non-zero region (nnU-Net's rule); resample
to the plan's spacing (image linear, label nearest); normalise (CT: clip to the dataset's
foreground 0.5-99.5 percentiles and z-score with dataset statistics; other modalities: per-case
z-score). Each file keeps what is needed to map predictions back to the original image."""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import h5py
import hdf5plugin
import nibabel as nib
import numpy as np
from scipy import ndimage
from tqdm import tqdm

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, read_json
from voxjet.volumes.msd import Case, MSDDataset, load_dataset

FORMAT_VERSION = 1


@dataclass
class VolumePrepConfig:
    """Preprocessing and planning choices from the dataset's `volumes:` section."""

    target_spacing: list[float] | None = None
    patch_size: list[int] = field(default_factory=lambda: [64, 64, 32])
    network_depth: int = 3
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    foreground_samples: int = 10000
    seed: int = 42


def load_ras(path: Path, dtype=np.float32) -> tuple[np.ndarray, nib.Nifti1Image]:
    """The array reoriented to RAS, and the original image (for its affine and header)."""
    try:
        img = nib.load(str(path))
        ras = nib.as_closest_canonical(img)
        return np.asarray(ras.dataobj, dtype=dtype), img
    except Exception as e:
        raise VoxjetError(f"{path}: not a readable NIfTI image ({e})") from e


def _check_pair(
    ds: MSDDataset,
    case: Case,
    image: nib.Nifti1Image,
    label: nib.Nifti1Image,
    label_arr: np.ndarray,
) -> None:
    if image.shape[:3] != label.shape[:3]:
        raise VoxjetError(
            f"{ds.path(case.label)}: shape {label.shape} differs from the image's "
            f"{image.shape}; fix or drop this case"
        )
    if not np.allclose(image.affine, label.affine, atol=1e-3, rtol=1e-3):
        raise VoxjetError(
            f"{ds.path(case.label)}: affine differs from the image's; the label is "
            "not in the image's space"
        )
    bad = sorted(set(np.unique(label_arr).astype(int).tolist()) - set(ds.labels))
    if bad:
        raise VoxjetError(
            f"{ds.path(case.label)}: label values {bad} are not declared in "
            f"dataset.json labels {sorted(ds.labels)}"
        )


def _ras_spacing(img: nib.Nifti1Image) -> np.ndarray:
    return np.array(nib.as_closest_canonical(img).header.get_zooms()[:3], float)


def _crop_box(image: np.ndarray) -> list[list[int]]:
    nz = np.argwhere(image != 0)
    if len(nz) == 0:
        return [[0, s] for s in image.shape]
    lo, hi = nz.min(0), nz.max(0) + 1
    return [[int(a), int(b)] for a, b in zip(lo, hi, strict=True)]


def fingerprint(ds: MSDDataset, case_ids: list[str], cfg: VolumePrepConfig) -> dict:
    """Spacings, shapes and foreground intensity statistics over the given cases."""
    rng = np.random.default_rng(cfg.seed)
    spacings, shapes, samples = [], [], []
    by_id = {c.case_id: c for c in ds.cases}
    for cid in tqdm(case_ids, desc="fingerprint", unit="case", mininterval=1.0):
        case = by_id[cid]
        image, img = load_ras(ds.path(case.image))
        label, _ = load_ras(ds.path(case.label), np.uint8)
        spacings.append(_ras_spacing(img).tolist())
        box = _crop_box(image)
        shapes.append([b - a for a, b in box])
        fg = image[label > 0]
        if len(fg):
            samples.append(rng.choice(fg, size=min(len(fg), cfg.foreground_samples), replace=False))
    fg = np.concatenate(samples) if samples else np.zeros(1)
    return {
        "cases": len(case_ids),
        "modality": ds.modality,
        "labels": ds.labels,
        "spacings": spacings,
        "shapes": shapes,
        "median_spacing": np.median(spacings, 0).tolist(),
        "median_shape": np.median(shapes, 0).tolist(),
        "foreground_intensity": {
            "mean": float(fg.mean()),
            "std": float(fg.std()),
            "percentile_00_5": float(np.percentile(fg, 0.5)),
            "percentile_99_5": float(np.percentile(fg, 99.5)),
        },
    }


def target_spacing(spacings: list[list[float]]) -> list[float]:
    """nnU-Net's rule: the median spacing, but the 10th percentile on an axis more than 3x
    coarser than the others (so thick-slice data is not upsampled in-plane)."""
    sp = np.asarray(spacings, float)
    target = np.median(sp, 0)
    worst = int(np.argmax(target))
    others = [i for i in range(3) if i != worst]
    if target[worst] > 3 * max(target[others]):
        target[worst] = np.percentile(sp[:, worst], 10)
    return target.tolist()


def make_plan(fp: dict, cfg: VolumePrepConfig) -> dict:
    """Target spacing and the patch size (no larger than the median resampled case, divisible
    by 2**depth so the U-Net's down/up-sampling lines up)."""
    spacing = cfg.target_spacing or target_spacing(fp["spacings"])
    med_shape = np.array(fp["median_shape"]) * np.array(fp["median_spacing"]) / np.array(spacing)
    div = 2**cfg.network_depth
    patch = [
        int(max(div, min(p, (int(m) // div) * div)))
        for p, m in zip(cfg.patch_size, med_shape, strict=True)
    ]
    return {
        "target_spacing": [float(s) for s in spacing],
        "patch_size": patch,
        "network_depth": cfg.network_depth,
        "num_classes": len(fp["labels"]),
        "labels": fp["labels"],
        "modality": fp["modality"],
        "normalization": "ct" if fp["modality"].upper() == "CT" else "zscore",
    }


def normalise(image: np.ndarray, plan: dict, fp: dict) -> np.ndarray:
    """CT: clip to dataset foreground percentiles and z-score with dataset stats; else per case."""
    if plan["normalization"] == "ct":
        st = fp["foreground_intensity"]
        clipped = np.clip(image, st["percentile_00_5"], st["percentile_99_5"])
        return ((clipped - st["mean"]) / max(st["std"], 1e-8)).astype(np.float32)
    return ((image - image.mean()) / max(float(image.std()), 1e-8)).astype(np.float32)


def resample(arr: np.ndarray, spacing: np.ndarray, target: np.ndarray, order: int) -> np.ndarray:
    """Resample to `target` spacing (order 1 linear for images, 0 nearest for labels)."""
    new_shape = np.maximum(1, np.round(np.array(arr.shape) * spacing / target)).astype(int)
    if tuple(new_shape) == arr.shape:
        return arr
    zoom = new_shape / np.array(arr.shape)
    return ndimage.zoom(arr, zoom, order=order, mode="nearest", grid_mode=True)


def preprocess_case(
    ds: MSDDataset, case: Case, plan: dict, fp: dict, out_path: Path, cfg: VolumePrepConfig
) -> dict:
    """Write one case file; returns its summary (shape, class voxel counts)."""
    image, img = load_ras(ds.path(case.image))
    label, lbl = load_ras(ds.path(case.label), np.uint8)
    _check_pair(ds, case, img, lbl, label)
    spacing = _ras_spacing(img)
    box = _crop_box(image)
    sl = tuple(slice(a, b) for a, b in box)
    target = np.array(plan["target_spacing"])
    image = normalise(resample(image[sl], spacing, target, order=1), plan, fp)
    label = resample(label[sl], spacing, target, order=0).astype(np.uint8)
    chunks = tuple(
        int(min(s, max(8, p // 2))) for s, p in zip(image.shape, plan["patch_size"], strict=True)
    )
    rng = np.random.default_rng([cfg.seed, zlib.crc32(case.case_id.encode())])
    counts = {}
    with atomic_path(out_path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("image", data=image[None], chunks=(1, *chunks), **hdf5plugin.LZ4())
        f.create_dataset("label", data=label, chunks=chunks, **hdf5plugin.LZ4())
        for cls in sorted(ds.labels):
            if cls == 0:
                continue
            coords = np.argwhere(label == cls).astype(np.int32)
            counts[int(cls)] = int(len(coords))
            if len(coords) > cfg.foreground_samples:
                coords = coords[rng.choice(len(coords), cfg.foreground_samples, replace=False)]
            f.create_dataset(f"foreground/{cls}", data=coords)
        f.attrs.update(
            {
                "case_id": case.case_id,
                "format_version": FORMAT_VERSION,
                "original_affine": img.affine,
                "original_shape": img.shape[:3],
                "original_spacing_ras": spacing,
                "ras_orientation_of_original": "".join(nib.aff2axcodes(img.affine)),
                "crop_box": np.array(box),
                "spacing": target,
                "shape": image.shape,
            }
        )
    return {"case_id": case.case_id, "shape": list(image.shape), "voxels_per_class": counts}


def split_cases(case_ids: list[str], cfg: VolumePrepConfig) -> dict[str, list[str]]:
    """A seeded train/val/test split of case ids (at least one case each where possible)."""
    ids = sorted(case_ids)
    perm = [ids[i] for i in np.random.default_rng(cfg.seed).permutation(len(ids))]
    n_test = max(1, int(round(len(ids) * cfg.test_fraction))) if len(ids) >= 3 else 0
    n_val = max(1, int(round(len(ids) * cfg.val_fraction))) if len(ids) >= 3 else 0
    split = {
        "test": perm[:n_test],
        "val": perm[n_test : n_test + n_val],
        "train": perm[n_test + n_val :],
    }
    if not split["train"]:
        raise VoxjetError(
            f"{len(ids)} cases leave none for training: lower val_fraction / "
            "test_fraction or add cases"
        )
    return split


def preprocess_dataset(
    manifest_path: str | os.PathLike, out_dir: str | os.PathLike, cfg: VolumePrepConfig
) -> dict:
    """Fingerprint on the training cases, plan, preprocess every case; the folder appears whole."""
    manifest = read_json(manifest_path)
    ds = load_dataset(manifest["root"])
    split = split_cases([c.case_id for c in ds.cases], cfg)
    fp = fingerprint(ds, split["train"], cfg)
    plan = make_plan(fp, cfg)
    summaries = []
    with atomic_path(out_dir, directory=True) as tmp:
        for case in tqdm(ds.cases, desc="preprocess", unit="case", mininterval=1.0):
            summaries.append(preprocess_case(ds, case, plan, fp, tmp / f"{case.case_id}.h5", cfg))
        plan["config"] = asdict(cfg)
        (tmp / "fingerprint.json").write_text(json.dumps(fp, indent=2) + "\n")
        (tmp / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")
        (tmp / "splits.json").write_text(json.dumps(split, indent=2) + "\n")
        (tmp / "cases.json").write_text(json.dumps(summaries, indent=2) + "\n")
    return plan
