"""Fingerprint, plan and preprocess an MSD dataset into one chunked HDF5 file a case.

Per case: nibabel load; reorient to RAS; crop to the non-zero region (nnU-Net's rule); resample
to the plan's spacing (image linear, label nearest); normalise (CT: clip to the dataset's
foreground 0.5-99.5 percentiles and z-score with dataset statistics; other modalities: per-case
z-score). Each file keeps what is needed to map predictions back to the original image."""

from __future__ import annotations

import json
import os
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import h5py
import nibabel as nib
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, read_json
from voxjet.io.integrity import checked_lz4
from voxjet.progress import progress
from voxjet.stage.transfer import name_sources
from voxjet.volumes.geometry import (
    as_tensor,
    from_ras,
    plan_shape,
    ras_spacing,
    to_ras,
    zoom_labels,
    zoom_to,
)
from voxjet.volumes.memory import plan_patch_and_batch
from voxjet.volumes.msd import Case, MSDDataset, load_dataset
from voxjet.volumes.patches import CASE_FORMAT


@dataclass
class VolumePrepConfig:
    """Preprocessing and planning choices from the dataset's `volumes:` section."""

    target_spacing: list[float] | None = None
    patch_size: list[int] | None = None
    network_depth: int = 3
    plan_channels: list[int] | None = None
    gpu_memory_gb: float = 8.0
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    foreground_samples: int = 10000
    on_bad_case: str = "fail"
    seed: int = 42


@dataclass
class LoadedCase:
    """One case checked and reoriented to RAS."""

    case_id: str
    image: np.ndarray  # [C, X, Y, Z] float32
    label: np.ndarray  # [X, Y, Z] uint8
    affine: np.ndarray  # the original image's
    spacing: np.ndarray  # along R, A, S


def _load_nifti(path: Path) -> nib.Nifti1Image:
    try:
        img = nib.load(str(path))
        img.get_data_dtype()
        return img
    except Exception as e:
        raise VoxjetError(f"{path}: not a readable NIfTI image ({e})") from e


def _array(img: nib.Nifti1Image, path: Path, dtype) -> np.ndarray:
    try:
        return np.asarray(img.dataobj, dtype=dtype)
    except Exception as e:
        raise VoxjetError(f"{path}: NIfTI data cannot be read ({e}); re-stage the file") from e


def _label_array(lbl: nib.Nifti1Image, path: Path) -> np.ndarray:
    """The label map as stored when that is an unscaled integer type (no float copy of the
    volume), else read as float and checked to hold integers."""
    dtype = lbl.get_data_dtype()
    slope, inter = lbl.dataobj.slope, lbl.dataobj.inter
    if np.issubdtype(dtype, np.integer) and slope in (1, None) and inter in (0, None):
        data = _array(lbl, path, dtype)
        if np.issubdtype(dtype, np.signedinteger) and data.min() < 0:
            raise VoxjetError(f"{path}: label values must be non-negative integers")
        return data if data.dtype.itemsize == 1 else data.astype(np.int64)
    data = _array(lbl, path, np.float32)
    as_int = data.astype(np.int64)
    if (as_int != data).any() or as_int.min() < 0:
        raise VoxjetError(f"{path}: label values must be non-negative integers")
    return as_int


def _label_values(label: np.ndarray) -> np.ndarray:
    """The distinct values of a label map: one comparison pass a value for a byte map with a
    handful of classes, a histogram otherwise (never a sort of every voxel)."""
    top = int(label.max())
    if label.dtype == np.uint8 and top < 32:
        return np.array([v for v in range(top + 1) if v == 0 or (label == v).any()])
    return np.flatnonzero(np.bincount(label.ravel(order="K")))


def load_case(ds: MSDDataset, case: Case) -> LoadedCase:
    """Load a case and check it: 3-D (or 4-D, channels last) image, a 3-D label on the same
    grid and affine, finite intensities, declared label values, some foreground."""
    ipath, lpath = ds.path(case.image), ds.path(case.label)
    img, lbl = _load_nifti(ipath), _load_nifti(lpath)
    if len(img.shape) not in (3, 4) or (len(img.shape) == 4 and img.shape[3] > 16):
        raise VoxjetError(
            f"{ipath}: image of shape {img.shape}; expected 3-D, or 4-D with "
            "channels last (case {case.case_id})"
        )
    if len(lbl.shape) != 3:
        raise VoxjetError(f"{lpath}: label of shape {lbl.shape}; expected a 3-D label map")
    if img.shape[:3] != lbl.shape:
        raise VoxjetError(
            f"{lpath}: shape {lbl.shape} differs from the image's {img.shape[:3]}; "
            "fix or drop this case"
        )
    if not np.allclose(img.affine, lbl.affine, atol=1e-3, rtol=1e-3):
        raise VoxjetError(
            f"{lpath}: affine differs from the image's; the label is not in the image's space"
        )
    data = _array(img, ipath, np.float32)
    if not np.isfinite(data).all():
        raise VoxjetError(
            f"{ipath}: {int((~np.isfinite(data)).sum())} NaN/inf voxels; fix the "
            "image or drop case " + case.case_id
        )
    as_int = _label_array(lbl, lpath)
    values = _label_values(as_int)
    bad = sorted(set(values.tolist()) - set(ds.labels))
    if bad:
        raise VoxjetError(
            f"{lpath}: label values {bad} are not declared in dataset.json labels "
            f"{sorted(ds.labels)}"
        )
    if values.max() == 0:
        raise VoxjetError(f"{lpath}: no foreground (every voxel is 0) in case {case.case_id}")
    image = to_ras(data if data.ndim == 4 else data[..., None], img.affine)
    return LoadedCase(
        case.case_id,
        np.moveaxis(image, -1, 0),  # a view: resampling makes the one contiguous copy
        to_ras(as_int, img.affine).astype(np.uint8, copy=False),
        img.affine,
        ras_spacing(img.affine),
    )


def _crop_box(image: np.ndarray) -> list[list[int]]:
    """nnU-Net's crop: the bounding box of voxels non-zero in any channel ([C, X, Y, Z]);
    found per axis, without listing the coordinates of every voxel."""
    nonzero = (image != 0).any(0)
    box = []
    for axis in range(3):
        hit = np.flatnonzero(nonzero.any(axis=tuple(a for a in range(3) if a != axis)))
        box.append([int(hit[0]), int(hit[-1]) + 1] if len(hit) else [0, nonzero.shape[axis]])
    return box


def _foreground_sample(lc: LoadedCase, n: int, rng: np.random.Generator) -> np.ndarray:
    fg = lc.image[0][lc.label > 0]
    return rng.choice(fg, size=min(len(fg), n), replace=False) if len(fg) else fg


def inspect_cases(
    ds: MSDDataset, case_ids: list[str], cfg: VolumePrepConfig
) -> tuple[dict[str, dict], dict[str, str]]:
    """Load and check each case once: spacing, cropped shape and a foreground intensity sample
    of the good ones; the bad ones fail the run, or are returned with their reason when
    on_bad_case is 'skip'."""
    rng = np.random.default_rng(cfg.seed)
    by_id = {c.case_id: c for c in ds.cases}
    stats, skipped = {}, {}
    for cid in progress(case_ids, "fingerprint", "case"):
        try:
            lc = load_case(ds, by_id[cid])
        except VoxjetError as e:
            if cfg.on_bad_case != "skip":
                raise
            skipped[cid] = str(e)
            print(f"skipping case {cid}: {e}", file=sys.stderr)
            continue
        box = _crop_box(lc.image)
        stats[cid] = {
            "channels": int(lc.image.shape[0]),
            "spacing": lc.spacing.tolist(),
            "shape": [b - a for a, b in box],
            "fg": _foreground_sample(lc, cfg.foreground_samples, rng),
        }
    return stats, skipped


def fingerprint_from(stats: dict[str, dict], ds: MSDDataset) -> dict:
    """Spacings, shapes and foreground intensity statistics of the inspected cases."""
    spacings = [s["spacing"] for s in stats.values()]
    shapes = [s["shape"] for s in stats.values()]
    fg = np.concatenate([s["fg"] for s in stats.values()] or [np.zeros(1)])
    return {
        "cases": len(stats),
        "channels": max([s["channels"] for s in stats.values()] or [1]),
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


def fingerprint(ds: MSDDataset, case_ids: list[str], cfg: VolumePrepConfig) -> dict:
    """The dataset fingerprint over the given cases."""
    return fingerprint_from(inspect_cases(ds, case_ids, cfg)[0], ds)


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


def plan_channels(cfg: VolumePrepConfig) -> list[int]:
    """U-Net widths the plan is made for: given, or nnU-Net's 32 doubling to at most 320."""
    if cfg.plan_channels:
        if len(cfg.plan_channels) != cfg.network_depth + 1:
            raise VoxjetError(
                f"volumes.plan_channels has {len(cfg.plan_channels)} levels but "
                f"network_depth {cfg.network_depth} needs {cfg.network_depth + 1}"
            )
        return list(cfg.plan_channels)
    return [min(32 * 2**i, 320) for i in range(cfg.network_depth + 1)]


def make_plan(fp: dict, cfg: VolumePrepConfig) -> dict:
    """Target spacing by nnU-Net's rule, then patch size, batch size and pipeline stages from
    the GPU memory budget (voxjet.volumes.memory explains the estimate)."""
    spacing = cfg.target_spacing or target_spacing(fp["spacings"])
    scale = np.array(fp["median_spacing"]) / np.array(spacing)
    median = (np.array(fp["median_shape"]) * scale).tolist()
    dataset_voxels = float(sum(np.prod(np.array(s) * scale) for s in fp["shapes"]))
    channels = plan_channels(cfg)
    n_classes = max(int(k) for k in fp["labels"]) + 1
    sized = plan_patch_and_batch(
        median,
        channels,
        cfg.gpu_memory_gb,
        fp.get("channels", 1),
        n_classes,
        dataset_voxels,
        patch=cfg.patch_size,
    )
    return {
        "target_spacing": [float(s) for s in spacing],
        **sized,
        "network_depth": cfg.network_depth,
        "plan_channels": channels,
        "gpu_memory_gb": cfg.gpu_memory_gb,
        "num_classes": n_classes,
        "labels": fp["labels"],
        "modality": fp["modality"],
        "normalization": "ct" if fp["modality"].upper() == "CT" else "zscore",
    }


def normalise(image: np.ndarray, plan: dict, fp: dict) -> np.ndarray:
    """[C, X, Y, Z]. CT (channel 0): clip to the dataset's foreground percentiles and z-score
    with dataset statistics; other channels and modalities: z-score per case."""
    import torch

    src = as_tensor(image)
    out = torch.empty(image.shape, dtype=torch.float32)
    for c in range(image.shape[0]):
        ch, dst = src[c], out[c]
        if plan["normalization"] == "ct" and c == 0:
            st = fp["foreground_intensity"]
            torch.clamp(ch, st["percentile_00_5"], st["percentile_99_5"], out=dst)
            dst.sub_(st["mean"]).div_(max(st["std"], 1e-8))
        else:
            ch = ch.double()
            mean, std = float(ch.mean()), float(ch.std(correction=0))
            torch.sub(src[c], mean, out=dst).div_(max(std, 1e-8))
    return out.numpy()


def to_plan_space(
    image_ras: np.ndarray, spacing: np.ndarray, plan: dict, fp: dict
) -> tuple[np.ndarray, list[list[int]], tuple[int, ...]]:
    """A RAS image [C, X, Y, Z] as training sees it: cropped to its non-zero region,
    resampled to the plan's spacing, normalised; with the crop box and the plan-space shape
    (what labels_to_original needs to map a prediction back). Training cases and images to
    predict go through this one function."""
    box = _crop_box(image_ras)
    sl = tuple(slice(a, b) for a, b in box)
    cropped = tuple(b - a for a, b in box)
    shape = plan_shape(cropped, spacing, np.array(plan["target_spacing"]))
    image = normalise(zoom_to(image_ras[(slice(None), *sl)], shape, order=1), plan, fp)
    return image, box, shape


def preprocess_case(
    ds: MSDDataset, case: Case, plan: dict, fp: dict, out_path: Path, cfg: VolumePrepConfig
) -> dict:
    """Write one case file; returns its summary (shape, class voxel counts)."""
    lc = load_case(ds, case)
    image, box, shape = to_plan_space(lc.image, lc.spacing, plan, fp)
    sl = tuple(slice(a, b) for a, b in box)
    target = np.array(plan["target_spacing"])
    n_classes = max(ds.labels) + 1
    label = zoom_labels(lc.label[sl], shape, n_classes)
    # Chunks of one patch: patches are assembled from decoded chunks (voxjet.io.chunks), and a
    # random patch then touches at most 8 of them (27 with half-patch chunks).
    chunks = tuple(int(min(s, max(8, p))) for s, p in zip(shape, plan["patch_size"], strict=True))
    rng = np.random.default_rng([cfg.seed, zlib.crc32(case.case_id.encode())])
    counts = {}
    with atomic_path(out_path) as tmp, h5py.File(tmp, "w") as f:
        f.create_dataset("image", data=image, chunks=(1, *chunks), **checked_lz4())
        f.create_dataset("label", data=label, chunks=chunks, **checked_lz4())
        for cls in sorted(ds.labels):
            if cls == 0:
                continue
            flat = np.flatnonzero(label == cls)  # flat indices: a third of argwhere's work
            counts[int(cls)] = int(len(flat))
            if len(flat) > cfg.foreground_samples:
                flat = flat[rng.choice(len(flat), cfg.foreground_samples, replace=False)]
            coords = np.stack(np.unravel_index(flat, label.shape), axis=1).astype(np.int32)
            checked = {"fletcher32": True, "chunks": True} if coords.size else {}
            f.create_dataset(f"foreground/{cls}", data=coords, **checked)
        f.attrs.update(
            {
                "case_id": case.case_id,
                "format_version": CASE_FORMAT,
                "original_affine": lc.affine,
                "original_shape": from_ras(lc.label, lc.affine).shape,
                "original_spacing_ras": lc.spacing,
                "ras_orientation_of_original": "".join(nib.aff2axcodes(lc.affine)),
                "ras_shape": lc.label.shape,
                "crop_box": np.array(box),
                "spacing": target,
                "shape": shape,
            }
        )
    return {
        "case_id": case.case_id,
        "shape": list(shape),
        "voxels_per_class": counts,
        "bytes": out_path.stat().st_size,  # spares a reader at a URL one request (size())
    }


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


def plan_dataset(ds: MSDDataset, cfg: VolumePrepConfig) -> dict:
    """Check every case, split the good ones, fingerprint the training cases and plan."""
    stats, skipped = inspect_cases(ds, [c.case_id for c in ds.cases], cfg)
    split = split_cases(list(stats), cfg)
    fp = fingerprint_from({c: stats[c] for c in split["train"]}, ds)
    plan = make_plan(fp, cfg)
    plan["config"] = asdict(cfg)
    return {"fingerprint": fp, "plan": plan, "splits": split, "skipped": skipped}


def preprocess_dataset(
    manifest_path: str | os.PathLike, out_dir: str | os.PathLike, cfg: VolumePrepConfig
) -> dict:
    """Plan, then preprocess every good case; the folder appears whole or not at all."""
    manifest = read_json(manifest_path)
    ds = load_dataset(manifest["root"])
    planned = plan_dataset(ds, cfg)
    plan, fp, split = planned["plan"], planned["fingerprint"], planned["splits"]
    good = [c for c in ds.cases if c.case_id not in planned["skipped"]]
    summaries = []
    with atomic_path(out_dir, directory=True) as tmp:
        for case in progress(good, "preprocess", "case"):
            summaries.append(preprocess_case(ds, case, plan, fp, tmp / f"{case.case_id}.h5", cfg))
        for name, obj in (
            ("fingerprint", fp),
            ("plan", plan),
            ("splits", split),
            ("cases", summaries),
            ("skipped", planned["skipped"]),
        ):
            (tmp / f"{name}.json").write_text(json.dumps(obj, indent=2) + "\n")
    return plan


def _write_json_files(folder: Path, objs: dict[str, object]) -> None:
    for name, obj in objs.items():
        (folder / f"{name}.json").write_text(json.dumps(obj, indent=2) + "\n")


@contextmanager
def _naming_sources(manifest: dict) -> Iterator[None]:
    """Errors about staged files also name the user's own files."""
    try:
        yield
    except VoxjetError as e:
        renamed = name_sources(str(e), manifest)
        if renamed == str(e):
            raise
        raise VoxjetError(renamed) from e


def plan_volumes(
    manifest_path: str | os.PathLike, out_dir: str | os.PathLike, cfg: VolumePrepConfig
) -> dict:
    """The planning job: check every case, fingerprint, plan, split; one folder, atomically."""
    manifest = read_json(manifest_path)
    with _naming_sources(manifest):
        ds = load_dataset(manifest["root"])
        planned = plan_dataset(ds, cfg)
    with atomic_path(out_dir, directory=True) as tmp:
        _write_json_files(tmp, planned)
    return planned["plan"]


def preprocess_one(
    manifest_path: str | os.PathLike,
    plan_dir: str | os.PathLike,
    case_id: str,
    out_path: str | os.PathLike,
) -> dict:
    """The per-case job: preprocess one case with the dataset's plan."""
    plan_dir = Path(plan_dir)
    manifest = read_json(manifest_path)
    ds = load_dataset(manifest["root"])
    plan = read_json(plan_dir / "plan.json")
    fp = read_json(plan_dir / "fingerprint.json")
    by_id = {c.case_id: c for c in ds.cases}
    if case_id not in by_id:
        raise VoxjetError(f"case {case_id!r} is not in {ds.root / 'dataset.json'}")
    cfg = VolumePrepConfig(**plan["config"])
    with _naming_sources(manifest):
        return preprocess_case(ds, by_id[case_id], plan, fp, Path(out_path), cfg)


def gather_cases(plan_dir: str | os.PathLike, cases_dir: str | os.PathLike) -> list[dict]:
    """After every case job: put the plan beside the case files and write cases.json last."""
    plan_dir, cases_dir = Path(plan_dir), Path(cases_dir)
    splits = read_json(plan_dir / "splits.json")
    summaries = []
    for cid in sorted(sum(splits.values(), [])):
        path = cases_dir / f"{cid}.h5"
        try:
            with h5py.File(path, "r") as f:
                shape = [int(v) for v in f.attrs["shape"]]
            # its size spares a reader at a URL one request a case file (fsspec's size())
            summaries.append({"case_id": cid, "shape": shape, "bytes": path.stat().st_size})
        except OSError as e:
            raise VoxjetError(
                f"{path}: missing or unreadable; rerun its preprocess_case job"
            ) from e
    for name in ("plan", "fingerprint", "splits", "skipped"):
        with atomic_path(cases_dir / f"{name}.json") as tmp:
            tmp.write_text((plan_dir / f"{name}.json").read_text())
    with atomic_path(cases_dir / "cases.json") as tmp:
        tmp.write_text(json.dumps(summaries, indent=2) + "\n")
    return summaries
