"""Check, fingerprint, plan and preprocess a dataset (MSD or nnU-Net v2 layout) into one
chunked HDF5 file a case.

Per case: every channel read (NIfTI, NRRD, MHA, …), reoriented to RAS; cropped to the region
non-zero in any channel (nnU-Net's rule); resampled to the plan's spacing (image linear, label
by interpolated class indicators); each channel normalised by its scheme from dataset.json
(CT: clipped to the dataset's foreground 0.5-99.5 percentiles of that channel and z-scored with
its statistics; zscore: per case; rescale_to_0_1; none). Each file also keeps the original label
map on the original grid and the geometry to map predictions back, so evaluation measures in
the original space. The planning itself is voxjet.volumes.planning."""

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
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, read_json
from voxjet.io.integrity import checked_lz4
from voxjet.io.mapped import write_mapped
from voxjet.io.packed import write_packed
from voxjet.progress import progress
from voxjet.stage.transfer import name_sources
from voxjet.volumes.geometry import (
    as_tensor,
    corner_distance_mm,
    plan_shape,
    ras_spacing,
    refuse_shear,
    to_ras,
    zoom_labels,
    zoom_to,
)
from voxjet.volumes.images import read_image
from voxjet.volumes.msd import Case, MSDDataset, load_dataset
from voxjet.volumes.patches import CASE_FORMAT


@dataclass
class VolumePrepConfig:
    """Preprocessing and planning choices from the dataset's `volumes:` section."""

    target_spacing: list[float] | None = None
    patch_size: list[int] | None = None
    network_depth: int = 3
    plan_channels: list[int] | None = None
    plan: str = "voxjet"
    gpu_memory_gb: float | None = None
    val_fraction: float = 0.15
    test_fraction: float = 0.2
    foreground_samples: int = 10000
    on_bad_case: str = "fail"
    storage: str = "auto"
    node_memory_gb: float | None = None
    seed: int = 42


@dataclass
class LoadedCase:
    """One case checked and reoriented to RAS."""

    case_id: str
    image: np.ndarray  # [C, X, Y, Z] float32 (RAS)
    label: np.ndarray  # [X, Y, Z] uint8 (RAS)
    affine: np.ndarray  # the original image's
    spacing: np.ndarray  # along R, A, S
    original_label: np.ndarray  # as stored, on the original grid


def _label_values(label: np.ndarray) -> np.ndarray:
    """The distinct values of a label map: one comparison pass a value for a byte map with a
    handful of classes, a histogram otherwise (never a sort of every voxel)."""
    top = int(label.max())
    if label.dtype == np.uint8 and top < 32:
        return np.array([v for v in range(top + 1) if v == 0 or (label == v).any()])
    return np.flatnonzero(np.bincount(label.ravel(order="K")))


def _read_label(path: Path) -> tuple[np.ndarray, np.ndarray]:
    data, affine = read_image(path, np.float64)
    if data.ndim != 3:
        raise VoxjetError(f"{path}: label of shape {data.shape}; expected a 3-D label map")
    as_int = data.astype(np.int64)
    if (as_int != data).any() or as_int.min() < 0:
        raise VoxjetError(f"{path}: label values must be non-negative integers")
    if as_int.max() > 255:
        raise VoxjetError(f"{path}: label values above 255 (found {as_int.max()})")
    return as_int.astype(np.uint8), affine


def read_channels(ds: MSDDataset, case: Case) -> tuple[np.ndarray, np.ndarray]:
    """The case's image [C, X, Y, Z] as stored (channels from one 4-D file or one file a
    channel, which must share one grid) and its affine."""
    arrays, affine, shape = [], None, None
    for rel in case.images:
        path = ds.path(rel)
        data, aff = read_image(path)
        if data.ndim not in (3, 4) or (data.ndim == 4 and data.shape[3] > 16):
            raise VoxjetError(
                f"{path}: image of shape {data.shape}; expected 3-D, or 4-D with channels last "
                f"(case {case.case_id})"
            )
        refuse_shear(aff, path, case.case_id)
        if affine is None:
            affine, shape = aff, data.shape[:3]
        elif data.shape[:3] != shape or not np.allclose(aff, affine, atol=1e-3, rtol=1e-3):
            raise VoxjetError(f"{path}: another grid than {ds.path(case.images[0])} (channels of "
                              f"case {case.case_id} must share shape and affine)")  # fmt: skip
        if not np.isfinite(data).all():
            raise VoxjetError(
                f"{path}: {int((~np.isfinite(data)).sum())} NaN/inf voxels; fix the "
                f"image or drop case {case.case_id}"
            )
        arrays.append(data if data.ndim == 4 else data[..., None])
    image = np.concatenate(arrays, axis=-1)
    if image.shape[-1] != len(ds.channels):
        raise VoxjetError(
            f"{ds.path(case.images[0])}: case {case.case_id} has {image.shape[-1]} channel(s), "
            f"dataset.json declares {len(ds.channels)} ({ds.channels})"
        )
    return np.moveaxis(image, -1, 0), affine


def load_case(ds: MSDDataset, case: Case) -> LoadedCase:
    """Load a case and check it: channels on one grid, a 3-D label on the same grid and
    affine, finite intensities, declared label values, some foreground."""
    image, affine = read_channels(ds, case)
    lpath = ds.path(case.label)
    label, laff = _read_label(lpath)
    if image.shape[1:] != label.shape:
        raise VoxjetError(
            f"{lpath}: shape {label.shape} differs from the image's {image.shape[1:]}; "
            "fix or drop this case"
        )
    if not np.allclose(affine, laff, atol=1e-3, rtol=1e-3):
        mm = corner_distance_mm(affine, laff, label.shape)
        raise VoxjetError(
            f"{lpath}: affine differs from the image's ({ds.path(case.images[0]).name}) by up "
            f"to {mm:.3g} mm at the grid's corners; the label is not in the image's space. "
            "If only its header is off (a tool that rewrote it), give the label the image's "
            "affine (nibabel: nib.save(nib.Nifti1Image(label, image.affine), path)); else "
            "export the label again on the image's grid, or drop the case"
        )
    values = _label_values(label)
    bad = sorted(set(values.tolist()) - set(ds.labels))
    if bad:
        raise VoxjetError(
            f"{lpath}: label values {bad} are not declared in dataset.json labels "
            f"{sorted(ds.labels)}"
        )
    if values.max() == 0:
        raise VoxjetError(f"{lpath}: no foreground (every voxel is 0) in case {case.case_id}")
    ras = to_ras(np.moveaxis(image, 0, -1), affine)
    return LoadedCase(
        case.case_id,
        np.moveaxis(ras, -1, 0),  # a view: resampling makes the one contiguous copy
        to_ras(label, affine),
        affine,
        ras_spacing(affine),
        label,
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
    """[C, k] intensities of up to n foreground voxels, every channel at the same voxels."""
    idx = np.flatnonzero(lc.label > 0)
    if len(idx) > n:
        idx = rng.choice(idx, size=n, replace=False)
    coords = np.unravel_index(idx, lc.label.shape)
    return np.stack([np.asarray(ch)[coords] for ch in lc.image])


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
            "spacing": lc.spacing.tolist(),
            "shape": [b - a for a, b in box],
            "fg": _foreground_sample(lc, cfg.foreground_samples, rng),
        }
    return stats, skipped


def fingerprint_from(stats: dict[str, dict], ds: MSDDataset) -> dict:
    """Spacings, shapes and per-channel foreground intensity statistics of the inspected
    cases."""
    spacings = [s["spacing"] for s in stats.values()]
    shapes = [s["shape"] for s in stats.values()]
    fg = np.concatenate([s["fg"] for s in stats.values()], axis=1)
    per_channel = [
        {
            "mean": float(c.mean()),
            "std": float(c.std()),
            "percentile_00_5": float(np.percentile(c, 0.5)),
            "percentile_99_5": float(np.percentile(c, 99.5)),
        }
        for c in fg
    ]
    return {
        "cases": len(stats),
        "channels": ds.channels,
        "labels": ds.labels,
        "regions": ds.regions,
        "spacings": spacings,
        "shapes": shapes,
        "median_spacing": np.median(spacings, 0).tolist(),
        "foreground_intensity_per_channel": per_channel,
        # the first channel's, where older code looks
        "foreground_intensity": per_channel[0],
    }


def _sized_by_voxjet(fp: dict, ds: MSDDataset, cfg: VolumePrepConfig) -> dict:
    from voxjet.volumes.planning import (
        DEFAULT_GPU_MEMORY_GB,
        plan_patch_and_batch,
        resampled_shapes,
        target_spacing,
    )

    spacing = cfg.target_spacing or target_spacing(fp["spacings"])
    shapes = resampled_shapes(fp["shapes"], fp["spacings"], spacing)
    median = np.median(shapes, 0)
    if cfg.plan_channels is not None and len(cfg.plan_channels) < 2:
        raise VoxjetError("volumes.plan_channels: give at least two widths")
    budget = cfg.gpu_memory_gb or DEFAULT_GPU_MEMORY_GB
    sized = plan_patch_and_batch(
        spacing,
        median.tolist(),
        float(np.prod(shapes, axis=1).sum()),
        len(ds.channels),
        ds.num_outputs,
        budget,
        cfg.network_depth,
        filters=cfg.plan_channels,
        patch=cfg.patch_size,
    )
    return {
        "target_spacing": [float(s) for s in spacing],
        "median_shape_resampled": median.tolist(),
        **sized,
        "gpu_memory_gb": budget,
    }


def _sized_by_resenc(fp: dict, ds: MSDDataset, cfg: VolumePrepConfig) -> dict:
    import torch

    from voxjet.volumes.models import build_resenc
    from voxjet.volumes.planning import GIB, estimate_bytes
    from voxjet.volumes.resenc import plan_resenc_dataset

    sized = plan_resenc_dataset(fp["spacings"], fp["shapes"], len(ds.channels), ds.num_outputs,
                                cfg.plan, cfg.gpu_memory_gb, spacing=cfg.target_spacing,
                                patch=cfg.patch_size)  # fmt: skip

    with torch.device("meta"):
        net = build_resenc(len(ds.channels), ds.num_outputs, sized["network"])
    need = estimate_bytes(net, len(ds.channels), sized["patch_size"], sized["batch_size"])
    return {**sized, "estimated_gpu_memory_gb": need / GIB, "pipeline_stages": 1,
            "micro_batches": 1}  # fmt: skip


def make_plan(fp: dict, ds: MSDDataset, cfg: VolumePrepConfig) -> dict:
    """Target spacing, the resampled median case, topology, patch, batch and pipeline stages
    (voxjet's planner, voxjet.volumes.planning, or a ResEnc preset of nnU-Net's,
    voxjet.volumes.resenc), the 2d configuration beside (voxjet.volumes.configurations), the
    label set and each channel's normalisation."""
    from voxjet.volumes.configurations import dataset_voxels, plan_2d, plan_lowres
    from voxjet.volumes.planning import GIB, choose_storage, node_memory_bytes, resampled_shapes

    sized = (_sized_by_voxjet if cfg.plan == "voxjet" else _sized_by_resenc)(fp, ds, cfg)
    shapes = resampled_shapes(fp["shapes"], fp["spacings"], sized["target_spacing"])
    # nnU-Net sizes a ResEnc batch's dataset share by the median case times the cases
    voxels = (dataset_voxels(shapes) if cfg.plan == "voxjet"
              else float(np.prod(sized["median_shape_resampled"]) * len(shapes)))  # fmt: skip
    net = (len(ds.channels), ds.num_outputs, cfg.plan, sized["gpu_memory_gb"])
    configurations = {"2d": plan_2d(sized, voxels, *net, cfg.network_depth, cfg.plan_channels)}
    lowres = plan_lowres(sized, len(shapes), *net, cfg.network_depth, cfg.plan_channels,
                         patch=cfg.patch_size)  # fmt: skip
    if lowres is not None:  # cases several times the patch: nnU-Net's low-resolution stage
        configurations["3d_lowres"] = lowres
        # the full-resolution network fed the low-resolution one's segmentation
        configurations["3d_cascade_fullres"] = {"previous_stage": "3d_lowres"}
    # float32 a channel and a uint8 label a voxel, as training reads them
    decoded = float(np.prod(shapes, axis=1).sum()) * (4 * len(ds.channels) + 1)
    memory = cfg.node_memory_gb * GIB if cfg.node_memory_gb else node_memory_bytes()
    return {
        "planner": cfg.plan,
        **sized,
        "network_depth": cfg.network_depth,
        "num_classes": max(ds.labels) + 1,
        "num_outputs": ds.num_outputs,
        "labels": {int(k): v for k, v in ds.labels.items()},
        "regions": ds.regions,
        "region_order": ds.region_order,
        "channels": ds.channels,
        "modality": ds.modality,
        "normalization": ds.normalizations,
        "storage": choose_storage(cfg.storage, decoded, memory),
        "configurations": configurations,
    }


def normalise(image: np.ndarray, plan: dict, fp: dict) -> np.ndarray:
    """[C, X, Y, Z], each channel by its scheme: CT clipped to the dataset's foreground
    0.5-99.5 percentiles of that channel and z-scored with its statistics; zscore per case;
    rescale_to_0_1 per case; none."""
    import torch

    schemes = plan["normalization"]
    if isinstance(schemes, str):  # a plan of one scheme for channel 0 (older plans)
        schemes = [schemes] + ["zscore"] * (image.shape[0] - 1)
    stats = fp.get("foreground_intensity_per_channel") or [fp["foreground_intensity"]]
    src = as_tensor(image)
    out = torch.empty(image.shape, dtype=torch.float32)
    for c in range(image.shape[0]):
        ch, dst = src[c], out[c]
        scheme = schemes[c] if c < len(schemes) else "zscore"
        if scheme == "ct":
            st = stats[c]
            torch.clamp(ch, st["percentile_00_5"], st["percentile_99_5"], out=dst)
            dst.sub_(st["mean"]).div_(max(st["std"], 1e-8))
        elif scheme == "rescale_to_0_1":
            lo, hi = float(ch.min()), float(ch.max())
            torch.sub(ch, lo, out=dst).div_(max(hi - lo, 1e-8))
        elif scheme == "none":
            dst.copy_(ch)
        else:
            d = ch.double()
            mean, std = float(d.mean()), float(d.std(correction=0))
            torch.sub(ch, mean, out=dst).div_(max(std, 1e-8))
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
    """Write one case file; returns its summary (shape, voxels a label value)."""
    lc = load_case(ds, case)
    image, box, shape = to_plan_space(lc.image, lc.spacing, plan, fp)
    sl = tuple(slice(a, b) for a, b in box)
    n_classes = max(ds.labels) + 1
    label = zoom_labels(lc.label[sl], shape, n_classes)
    rng = np.random.default_rng([cfg.seed, zlib.crc32(case.case_id.encode())])
    counts = {}
    orig = lc.original_label
    # plans from before `auto` have no "storage": theirs is the config's
    store = plan.get("storage", {}).get("store", cfg.storage)
    with atomic_path(out_path) as tmp, h5py.File(tmp, "w") as f:
        if store == "mapped":  # uncompressed, read through a memory map
            write_mapped(f, "image", image, axis=1)
            write_mapped(f, "label", label, axis=0)
        elif store == "blosc2":  # int16 codes in blosc2 blocks sized to the patch
            patch = tuple(plan["patch_size"])
            f.attrs["quantisation_error"] = write_packed(f, "image", image, patch)
            write_packed(f, "label", label, patch)
        else:
            # Half-patch chunks: a random patch decodes 2-3 chunks an axis, about twice its
            # own size; patch-sized chunks decode up to 8 patches' worth (benchmarks/README.md)
            chunks = tuple(int(min(s, max(8, p // 2)))
                           for s, p in zip(shape, plan["patch_size"], strict=True))  # fmt: skip
            f.create_dataset("image", data=image, chunks=(1, *chunks), **checked_lz4())
            f.create_dataset("label", data=label, chunks=chunks, **checked_lz4())
        # the label as the user gave it, for metrics in the original space
        f.create_dataset("original_label", data=orig, chunks=_whole_chunks(orig.shape),
                         **checked_lz4())  # fmt: skip
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
                "original_shape": orig.shape,
                # voxel sizes along the stored array's own axes (HD95 in mm there)
                "original_voxel_size": np.sqrt((lc.affine[:3, :3] ** 2).sum(0)),
                "original_spacing_ras": lc.spacing,
                "ras_shape": lc.label.shape,
                "crop_box": np.array(box),
                "spacing": np.array(plan["target_spacing"]),
                "shape": shape,
            }
        )
    return {
        "case_id": case.case_id,
        "shape": list(shape),
        "voxels_per_class": counts,
        "bytes": out_path.stat().st_size,  # spares a reader at a URL one request (size())
    }


def _whole_chunks(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(min(s, 64)) for s in shape)


def split_cases(case_ids: list[str], cfg: VolumePrepConfig, ds: MSDDataset) -> dict:
    """The splits: dataset.json's folds (splits_final.json) when it has them — then the test
    split is whatever labelled case no fold uses — else a seeded train/val/test split. An
    empty split is an error naming the fraction to change."""
    ids = sorted(case_ids)
    if ds.folds:
        in_folds = {c for f in ds.folds for part in f.values() for c in part}
        folds = [{k: [c for c in f[k] if c in ids] for k in ("train", "val")} for f in ds.folds]
        test = [c for c in ids if c not in in_folds]
        if not test:
            raise VoxjetError(
                f"{ds.root / 'splits_final.json'}: its folds use every case, which leaves none "
                "for the test set the evaluation reports on; leave some cases out of every fold"
            )
        return {"test": test, **folds[0], "folds": folds}
    perm = [ids[i] for i in np.random.default_rng(cfg.seed).permutation(len(ids))]
    n_test = int(round(len(ids) * cfg.test_fraction))
    n_val = int(round(len(ids) * cfg.val_fraction))
    n_test = max(n_test, 1) if cfg.test_fraction > 0 else 0
    n_val = max(n_val, 1) if cfg.val_fraction > 0 else 0
    split = {
        "test": perm[:n_test],
        "val": perm[n_test : n_test + n_val],
        "train": perm[n_test + n_val :],
    }
    if not split["train"]:
        raise VoxjetError(
            f"{len(ids)} cases leave none for training: lower volumes.val_fraction / "
            "volumes.test_fraction or add cases"
        )
    if not split["val"]:
        raise VoxjetError(
            f"volumes.val_fraction={cfg.val_fraction} leaves no validation case of {len(ids)}; "
            "raise it (the best checkpoint is picked on validation cases)"
        )
    return split


def kfold(case_ids: list[str], k: int, seed: int) -> list[dict[str, list[str]]]:
    """k folds of the cases (seeded): each case is validated in exactly one."""
    ids = sorted(case_ids)
    if len(ids) < k:
        raise VoxjetError(f"{k} folds need at least {k} training cases; there are {len(ids)}")
    perm = [ids[i] for i in np.random.default_rng([seed, k]).permutation(len(ids))]
    parts = [perm[i::k] for i in range(k)]
    return [
        {
            "train": sorted(c for j, p in enumerate(parts) if j != i for c in p),
            "val": sorted(parts[i]),
        }
        for i in range(k)
    ]


def duplicate_cases(ds: MSDDataset, manifest: dict, on_duplicate: str) -> dict[str, str]:
    """Cases whose images are byte for byte another case's (the stage's checksums): with
    on_duplicate "fail" the first pair stops planning naming both; with "skip" the later case
    by id is returned with the reason it is left out."""
    sums = {os.path.normpath(f["path"]): tuple(sorted(f["checksum"].items()))
            for f in manifest.get("files", [])}  # fmt: skip
    first: dict[tuple, Case] = {}
    dropped = {}
    for case in sorted(ds.cases, key=lambda c: c.case_id):
        key = tuple(sums.get(os.path.normpath(i)) for i in case.images)
        if None in key:  # a file the stage did not check (not staged): nothing to compare
            continue
        if key not in first:
            first[key] = case
            continue
        other = first[key]
        if on_duplicate != "skip":
            raise VoxjetError(
                f"cases {other.case_id!r} ({', '.join(other.images)}) and {case.case_id!r} "
                f"({', '.join(case.images)}) have identical images: one case under two names "
                "can land in the training and the test split. Remove one from the dataset "
                "(and dataset.json), or set the dataset's source.on_duplicate: skip"
            )
        dropped[case.case_id] = f"its images are identical to case {other.case_id!r}'s"
    return dropped


def plan_dataset(ds: MSDDataset, cfg: VolumePrepConfig, manifest: dict | None = None,
                 on_duplicate: str = "fail") -> dict:  # fmt: skip
    """Check every case, split the good ones, fingerprint the training cases and plan (cases
    identical to another, found through the `manifest`'s checksums, are refused or skipped:
    the source's on_duplicate)."""
    duplicates = duplicate_cases(ds, manifest, on_duplicate) if manifest else {}
    if duplicates:
        print(f"{len(duplicates)} cases left out as duplicates: {sorted(duplicates)}",
              file=sys.stderr)  # fmt: skip
    ids = [c.case_id for c in ds.cases if c.case_id not in duplicates]
    stats, skipped = inspect_cases(ds, ids, cfg)
    skipped.update(duplicates)
    split = split_cases(list(stats), cfg, ds)
    training = split["train"] + split["val"] if ds.folds else split["train"]
    fp = fingerprint_from({c: stats[c] for c in training}, ds)
    plan = make_plan(fp, ds, cfg)
    plan["config"] = asdict(cfg)
    print(f"volumes.storage: {plan['storage']['store']} ({plan['storage']['reason']})",
          file=sys.stderr)  # fmt: skip
    return {"fingerprint": fp, "plan": plan, "splits": split, "skipped": skipped}


def _write_json_files(folder: Path, objs: dict[str, object]) -> None:
    for name, obj in objs.items():
        (folder / f"{name}.json").write_text(json.dumps(obj, indent=2) + "\n")


def preprocess_dataset(
    manifest_path: str | os.PathLike, out_dir: str | os.PathLike, cfg: VolumePrepConfig
) -> dict:
    """Plan, then preprocess every good case; the folder appears whole or not at all."""
    manifest = read_json(manifest_path)
    with _naming_sources(manifest):
        ds = load_dataset(manifest["root"])
        planned = plan_dataset(ds, cfg, manifest)
        plan, fp = planned["plan"], planned["fingerprint"]
        good = [c for c in ds.cases if c.case_id not in planned["skipped"]]
        summaries = []
        with atomic_path(out_dir, directory=True) as tmp:
            for case in progress(good, "preprocess", "case"):
                out = tmp / f"{case.case_id}.h5"
                summaries.append(preprocess_case(ds, case, plan, fp, out, cfg))
            _write_json_files(tmp, {**planned, "cases": summaries})
    return plan


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
    manifest_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: VolumePrepConfig,
    on_duplicate: str = "fail",
) -> dict:
    """The planning job: check every case, fingerprint, plan, split; one folder, atomically."""
    manifest = read_json(manifest_path)
    with _naming_sources(manifest):
        ds = load_dataset(manifest["root"])
        planned = plan_dataset(ds, cfg, manifest, on_duplicate)
    with atomic_path(out_dir, directory=True) as tmp:
        _write_json_files(tmp, planned)
    return planned["plan"]


def preprocess_one(
    manifest_path: str | os.PathLike,
    plan_dir: str | os.PathLike,
    case_id: str,
    out_path: str | os.PathLike,
    configuration: str = "3d_fullres",
) -> dict:
    """The per-case job: preprocess one case with the dataset's plan, at the spacing of one of
    its configurations (a case the planning skipped as bad gets a file that says so, and
    why)."""
    from voxjet.volumes.configurations import effective_plan

    plan_dir = Path(plan_dir)
    manifest = read_json(manifest_path)
    ds = load_dataset(manifest["root"])
    plan = effective_plan(read_json(plan_dir / "plan.json"), configuration,
                          str(plan_dir / "plan.json"))  # fmt: skip
    fp = read_json(plan_dir / "fingerprint.json")
    skipped = read_json(plan_dir / "skipped.json")
    by_id = {c.case_id: c for c in ds.cases}
    if case_id not in by_id:
        raise VoxjetError(f"case {case_id!r} is not in {ds.root / 'dataset.json'}")
    if case_id in skipped:
        with atomic_path(out_path) as tmp, h5py.File(tmp, "w") as f:
            f.attrs.update({"case_id": case_id, "format_version": CASE_FORMAT,
                            "skipped": skipped[case_id]})  # fmt: skip
        return {"case_id": case_id, "skipped": skipped[case_id]}
    cfg = VolumePrepConfig(**plan["config"])
    with _naming_sources(manifest):
        return preprocess_case(ds, by_id[case_id], plan, fp, Path(out_path), cfg)


def gather_cases(plan_dir: str | os.PathLike, cases_dir: str | os.PathLike) -> list[dict]:
    """After every case job: put the plan beside the case files and write cases.json last."""
    plan_dir, cases_dir = Path(plan_dir), Path(cases_dir)
    splits = read_json(plan_dir / "splits.json")
    summaries = []
    used = {c for k in ("train", "val", "test") for c in splits[k]}
    used |= {c for f in splits.get("folds", []) for part in f.values() for c in part}
    for cid in sorted(used):
        path = cases_dir / f"{cid}.h5"
        try:
            with h5py.File(path, "r") as f:
                shape = [int(v) for v in f.attrs["shape"]]
            # its size spares a reader at a URL one request a case file (fsspec's size())
            summaries.append({"case_id": cid, "shape": shape, "bytes": path.stat().st_size})
        except (OSError, KeyError) as e:
            raise VoxjetError(
                f"{path}: missing or unreadable; rerun its preprocess_case job"
            ) from e
    for name in ("plan", "fingerprint", "splits", "skipped"):
        with atomic_path(cases_dir / f"{name}.json") as tmp:
            tmp.write_text((plan_dir / f"{name}.json").read_text())
    with atomic_path(cases_dir / "cases.json") as tmp:
        tmp.write_text(json.dumps(summaries, indent=2) + "\n")
    return summaries


def dataset_case_ids(source: str) -> list[str]:
    """The training cases' ids of a dataset folder or URL, from its dataset.json (read at the
    dry run, so the one-job-a-case preprocessing is in the DAG from the start)."""
    if "://" not in source:
        return [c.case_id for c in load_dataset(source).cases]
    import fsspec

    fs, root = fsspec.core.url_to_fs(source.rstrip("/"))
    try:
        meta = json.loads(fs.cat_file(f"{root}/dataset.json"))
    except (OSError, ValueError) as e:
        raise VoxjetError(f"{source}/dataset.json: cannot read it ({e})") from e
    if "channel_names" in meta:
        ending = meta.get("file_ending", ".nii.gz")
        found = fs.glob(f"{root}/imagesTr/*_0000{ending}")
        return sorted(Path(p).name[: -len(ending) - 5] for p in found)
    from voxjet.volumes.msd import _case_id

    return [_case_id(t["image"]) for t in meta["training"]]
