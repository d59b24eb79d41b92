"""Preprocess a dataset's cases with its plan into one chunked HDF5 file a case (nnU-Net's
preprocessing): every channel read and reoriented to RAS (voxjet.volumes.dataset.cases); cropped to
the region non-zero in any channel; resampled to the plan's spacing (image linear, label by
interpolated class indicators); each channel normalised by its scheme from dataset.json (CT:
clipped to the dataset's foreground 0.5-99.5 percentiles of that channel and z-scored with its
statistics; zscore: per case; rescale_to_0_1; none). Each file also keeps the original label
map on the original grid and the geometry to map predictions back, so evaluation measures in
the original space. Planning is voxjet.volumes.plan."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import h5py
import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, read_json
from voxjet.io.integrity import checked_lz4
from voxjet.io.mapped import write_mapped
from voxjet.io.packed import write_packed
from voxjet.progress import progress
from voxjet.volumes.dataset.cases import LoadedCase, crop_box, load_case
from voxjet.volumes.dataset.geometry import plan_shape, resample_slabs, zoom_labels
from voxjet.volumes.dataset.msd import Case, MSDDataset, case_id_of, load_dataset
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.plan.plan_file import Plan
from voxjet.volumes.plan.planning import naming_sources, plan_dataset, write_planned
from voxjet.volumes.preprocessing.plan_inputs import plan_inputs_digest, read_planning
from voxjet.volumes.preprocessing.store import CASE_FORMAT


def normalise(image: np.ndarray, plan: Plan, fp: dict) -> np.ndarray:
    """[C, X, Y, Z] float32 normalised in place, each channel by its scheme: CT clipped to the
    dataset's foreground 0.5-99.5 percentiles of that channel and z-scored with its
    statistics; zscore per case; rescale_to_0_1 per case; none."""
    schemes = plan.normalization
    stats = fp.get("foreground_intensity_per_channel") or [fp["foreground_intensity"]]
    data = torch.from_numpy(image)
    for c in range(image.shape[0]):
        ch = data[c]
        scheme = schemes[c] if c < len(schemes) else "zscore"
        if scheme == "ct":
            st = stats[c]
            ch.clamp_(st["percentile_00_5"], st["percentile_99_5"])
            ch.sub_(st["mean"]).div_(max(st["std"], 1e-8))
        elif scheme == "rescale_to_0_1":
            lo, hi = float(ch.min()), float(ch.max())
            ch.sub_(lo).div_(max(hi - lo, 1e-8))
        elif scheme != "none":
            mean, std = _mean_std(ch)
            ch.sub_(mean).div_(max(std, 1e-8))
    return image


def _mean_std(ch: torch.Tensor) -> tuple[float, float]:
    """Mean and population standard deviation in float64, summed slab by slab (two passes),
    without a float64 copy of the channel."""
    n, total = ch.numel(), 0.0
    for slab in ch.split(16, dim=-1):
        total += float(slab.sum(dtype=torch.float64))
    mean, squares = total / max(n, 1), 0.0
    for slab in ch.split(16, dim=-1):
        squares += float(((slab.double() - mean) ** 2).sum())
    return mean, (squares / max(n, 1)) ** 0.5


def to_plan_space(
    image_ras: np.ndarray, spacing: np.ndarray, plan: Plan, fp: dict
) -> tuple[np.ndarray, list[list[int]], tuple[int, ...]]:
    """A RAS image [C, X, Y, Z] as training sees it: cropped to its non-zero region,
    resampled to the plan's spacing, normalised; with the crop box and the plan-space shape
    (what labels_to_original needs to map a prediction back). Training cases and images to
    predict go through this one function."""
    box = crop_box(image_ras)
    sl = tuple(slice(a, b) for a, b in box)
    cropped = tuple(b - a for a, b in box)
    shape = plan_shape(cropped, spacing, np.array(plan.target_spacing))
    image = normalise(resample_slabs(image_ras[(slice(None), *sl)], shape), plan, fp)
    return image, box, shape


def _write_arrays(f: h5py.File, image: np.ndarray, label: np.ndarray, plan: Plan,
                  store: str) -> None:  # fmt: skip
    """The plan-space image and label in the case store's layout."""
    if store == "mapped":  # uncompressed, read through a memory map
        write_mapped(f, "image", image, axis=1)
        write_mapped(f, "label", label, axis=0)
    elif store == "blosc2":  # int16 codes in blosc2 blocks sized to the patch
        patch = tuple(plan.patch_size)
        f.attrs["quantisation_error"] = write_packed(f, "image", image, patch)
        write_packed(f, "label", label, patch)
    else:
        # Half-patch chunks: a random patch decodes 2-3 chunks an axis, about twice its own
        # size; patch-sized chunks decode up to 8 patches' worth (benchmarks/README.md)
        chunks = tuple(int(min(s, max(8, p // 2)))
                       for s, p in zip(label.shape, plan.patch_size, strict=True))  # fmt: skip
        f.create_dataset("image", data=image, chunks=(1, *chunks), **checked_lz4())
        f.create_dataset("label", data=label, chunks=chunks, **checked_lz4())


def _write_foreground(f: h5py.File, label: np.ndarray, classes: list[int], n: int,
                      rng: np.random.Generator) -> dict[int, int]:  # fmt: skip
    """Up to `n` voxel coordinates of each foreground class (what foreground-oversampled patch
    draws centre on); returns the voxels a class."""
    counts = {}
    for cls in classes:
        flat = np.flatnonzero(label == cls)  # flat indices: a third of argwhere's work
        counts[int(cls)] = int(len(flat))
        if len(flat) > n:
            flat = flat[rng.choice(len(flat), n, replace=False)]
        coords = np.stack(np.unravel_index(flat, label.shape), axis=1).astype(np.int32)
        checked = {"fletcher32": True, "chunks": True} if coords.size else {}
        f.create_dataset(f"foreground/{cls}", data=coords, **checked)
    return counts


def _geometry(lc: LoadedCase, box: list[list[int]], plan: Plan,
              shape: tuple[int, ...]) -> dict:  # fmt: skip
    """What maps a plan-space prediction back onto the case's original grid."""
    return {
        "original_affine": lc.affine,
        "original_shape": lc.original_label.shape,
        # voxel sizes along the stored array's own axes (HD95 in mm there)
        "original_voxel_size": np.sqrt((lc.affine[:3, :3] ** 2).sum(0)),
        "original_spacing_ras": lc.spacing,
        "ras_shape": lc.label.shape,
        "crop_box": np.array(box),
        "spacing": np.array(plan.target_spacing),
        "shape": shape,
    }


def preprocess_case(ds: MSDDataset, case: Case, plan: Plan, fp: dict, out_path: Path,
                    cfg: VolumePrepConfig, made_from: str = "") -> dict:  # fmt: skip
    """Write one case file (recording what it was made from: `made_from`, the workflow's
    digest of its sources, and the digest of what the plan gave it); returns its summary
    (shape, voxels a label value)."""
    lc = load_case(ds, case)
    image, box, shape = to_plan_space(lc.image, lc.spacing, plan, fp)
    # the ignore label (the highest value) resampled as one more class: unannotated stays so
    values = plan.num_classes + (plan.ignore_label is not None)
    label = zoom_labels(lc.label[tuple(slice(a, b) for a, b in box)], shape, values)
    rng = np.random.default_rng([cfg.seed, zlib.crc32(case.case_id.encode())])
    orig = lc.original_label
    # plans from before `auto` have no "storage": theirs is the config's
    store = plan.storage.get("store", cfg.storage)
    with atomic_path(out_path) as tmp, h5py.File(tmp, "w") as f:
        _write_arrays(f, image, label, plan, store)
        # the label as the user gave it, for metrics in the original space
        f.create_dataset("original_label", data=orig, chunks=_whole_chunks(orig.shape),
                         **checked_lz4())  # fmt: skip
        classes = [c for c in sorted(ds.labels) if c != 0]
        counts = _write_foreground(f, label, classes, cfg.foreground_samples, rng)
        f.attrs.update({"case_id": case.case_id, "format_version": CASE_FORMAT,
                        "plan_digest": plan_inputs_digest(plan, fp), "made_from": made_from,
                        **_geometry(lc, box, plan, shape)})  # fmt: skip
    return {
        "case_id": case.case_id,
        "shape": list(shape),
        "voxels_per_class": counts,
        "bytes": out_path.stat().st_size,  # spares a reader at a URL one request (size())
    }


def _whole_chunks(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(min(s, 64)) for s in shape)


def preprocess_dataset(
    manifest_path: str | os.PathLike, out_dir: str | os.PathLike, cfg: VolumePrepConfig
) -> Plan:
    """Plan, then preprocess every good case; the folder appears whole or not at all."""
    manifest = read_json(manifest_path)
    with naming_sources(manifest):
        ds = load_dataset(manifest["root"])
        planned = plan_dataset(ds, cfg, manifest)
        plan, fp = planned["plan"], planned["fingerprint"]
        good = [c for c in ds.cases if c.case_id not in planned["skipped"]]
        summaries = []
        with atomic_path(out_dir, directory=True) as tmp:
            for case in progress(good, "preprocess", "case"):
                out = tmp / f"{case.case_id}.h5"
                summaries.append(preprocess_case(ds, case, plan, fp, out, cfg))
            write_planned(tmp, {**planned, "cases": summaries})
    return plan


def preprocess_one(
    manifest_path: str | os.PathLike,
    plan_dir: str | os.PathLike,
    case_id: str,
    out_path: str | os.PathLike,
    configuration: str = "3d_fullres",
    made_from: str = "",
) -> dict:
    """The per-case job: preprocess one case with the dataset's plan, at the spacing of one of
    its configurations (a case the planning skipped as bad gets a file that says so, and
    why); `made_from`, what the workflow knows the case's sources as, is recorded in it."""
    manifest = read_json(manifest_path)
    ds = load_dataset(manifest["root"])
    plan, fp, skipped = read_planning(plan_dir, configuration)
    by_id = {c.case_id: c for c in ds.cases}
    if case_id not in by_id:
        raise VoxjetError(f"case {case_id!r} is not in {ds.root / 'dataset.json'}")
    if case_id in skipped:
        made_with = plan_inputs_digest(plan, fp, skipped[case_id])
        with atomic_path(out_path) as tmp, h5py.File(tmp, "w") as f:
            f.attrs.update({"case_id": case_id, "format_version": CASE_FORMAT,
                            "skipped": skipped[case_id], "made_from": made_from,
                            "plan_digest": made_with})  # fmt: skip
        return {"case_id": case_id, "skipped": skipped[case_id]}
    cfg = VolumePrepConfig(**plan.config)
    with naming_sources(manifest):
        return preprocess_case(ds, by_id[case_id], plan, fp, Path(out_path), cfg, made_from)


def gather_cases(plan_dir: str | os.PathLike, cases_dir: str | os.PathLike,
                 configuration: str = "3d_fullres") -> list[dict]:  # fmt: skip
    """After every case job: check that each case file was made with the plan as it is now,
    put the plan beside the case files and write cases.json last."""
    plan_dir, cases_dir = Path(plan_dir), Path(cases_dir)
    splits = read_json(plan_dir / "splits.json")
    plan, fp, skipped = read_planning(plan_dir, configuration)
    summaries, earlier = [], []
    used = {c for k in ("train", "val", "test") for c in splits[k]}
    used |= {c for f in splits.get("folds", []) for part in f.values() for c in part}
    for cid in sorted(used):
        path = cases_dir / f"{cid}.h5"
        try:
            with h5py.File(path, "r") as f:
                shape = [int(v) for v in f.attrs["shape"]]
                made_with = f.attrs.get("plan_digest")
            # its size spares a reader at a URL one request a case file (fsspec's size())
            summaries.append({"case_id": cid, "shape": shape, "bytes": path.stat().st_size})
        except (OSError, KeyError) as e:
            raise VoxjetError(
                f"{path}: missing or unreadable; rerun its preprocess_case job"
            ) from e
        if made_with != plan_inputs_digest(plan, fp, skipped.get(cid)):
            earlier.append(cid)
    if earlier:
        raise VoxjetError(
            f"{len(earlier)} of {len(used)} case files in {cases_dir} were made with an earlier "
            f"plan ({', '.join(earlier[:5])}{', ...' if len(earlier) > 5 else ''}): the "
            "planning changed with the cases that changed (its spacing, patch or the CT "
            "intensity statistics), which the dry run cannot know before the planning has run. "
            "Run snakemake again: it rebuilds them with the new plan, then trains"
        )
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
    return [case_id_of(t["image"]) for t in meta["training"]]
