"""`voxjet evaluate-jets`: predictions on the test split, metrics and ROC curves."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.distributed as dist

from voxjet.distributed.runtime import init_runtime, shutdown
from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, write_json
from voxjet.io.integrity import checked_lz4
from voxjet.io.node_local import localised
from voxjet.io.remote import ReadOptions
from voxjet.jets.baseline import MASS_BINS, mass_counts, mass_probabilities, mass_table
from voxjet.jets.data_config import JetDataConfig, index_config
from voxjet.jets.dataset import collection_keys, load_columns, load_index, share
from voxjet.jets.figures import (
    confusion,
    mass_sculpting,
    roc_in_pt_bins,
    roc_overlay,
    score_distributions,
)
from voxjet.jets.metrics import jet_metrics, shown_signals
from voxjet.jets.tagger import Tagger, infer, inference_batch, load_trained
from voxjet.jets.targets import parse_targets, regression_columns, regression_figure, target_metrics
from voxjet.progress import Progress


def _check_compatible(saved: dict, index: dict, model_path: str, shard_dir: str) -> None:
    cfg = saved["model_config"]
    if list(cfg["classes"]) != list(index["classes"]) or cfg["n_features"] != len(
        index["particle_features"]
    ):
        raise VoxjetError(
            f"{model_path}: trained for classes {cfg['classes']} with {cfg['n_features']} particle "
            f"features, but {shard_dir} has {index['classes']} with "
            f"{len(index['particle_features'])}; retrain on these shards"
        )
    trained = list((cfg.get("targets") or {}).get("names") or [])
    if trained != list(index.get("targets") or []):
        raise VoxjetError(
            f"{model_path}: trained for the targets {trained}, but {shard_dir} "
            f"holds {index.get('targets') or []}; retrain on these shards"
        )


def _chunks(lo: int, hi: int, size: int) -> Iterator[tuple[int, int]]:
    for a in range(lo, hi, size):
        yield a, min(a + size, hi)


def _mass_table(shard_dir: str, index: dict, opts: ReadOptions, rt, chunk: int):
    """The jet-mass reference's histograms, from the training split read in chunks (each rank
    its share, summed): None without jet_sdmass among the jet features."""
    if "jet_sdmass" not in index["jet_features"]:
        return None
    col = index["jet_features"].index("jet_sdmass")
    total = index["splits"]["train"]["jets"]
    counts = np.zeros((len(index["classes"]), MASS_BINS))
    lo, hi = share(total, rt.rank, rt.world_size)
    for a, b in _chunks(lo, hi, chunk):
        part = load_columns(shard_dir, "train", ("jets", "labels"), opts, index, rows=(a, b))
        counts += mass_counts(part["jets"][:, col], part["labels"], len(index["classes"]))
    if rt.distributed:
        t = torch.from_numpy(counts).to(rt.device)
        dist.all_reduce(t)
        counts = t.cpu().numpy()
    return col, mass_table(counts)


PARTS = "predictions.part-{rank}.h5"


def _append(f: h5py.File, cols: dict[str, np.ndarray]) -> None:
    for k, v in cols.items():
        if k not in f:
            rows = (max(1, min(len(v), 8192)), *v.shape[1:])
            f.create_dataset(k, data=v, maxshape=(None, *v.shape[1:]), chunks=rows, **checked_lz4())
        else:
            d = f[k]
            d.resize(d.shape[0] + len(v), axis=0)
            d[-len(v) :] = v


def score_share(
    shard_dir: str, model, saved: dict, index: dict, opts: ReadOptions, rt, part: Path,
    mass, chunk: int,
) -> int:  # fmt: skip
    """Score this rank's contiguous share of the test split, chunk after chunk, appending
    scores, labels, each jet's source (file, entry) and the jet-mass reference to `part`."""
    total = index["splits"]["test"]["jets"]
    lo, hi = share(total, rt.rank, rt.world_size)
    record = saved["model_config"].get("data")
    data = (JetDataConfig.from_record(record, "model.pt (its jets config)") if record
            else index_config(index, f"{shard_dir}/index.json"))  # fmt: skip
    tagger = Tagger(model, list(index["classes"]), data, rt.device, "", inference_batch(saved),
                    saved["model_config"].get("targets"),
                    saved["model_config"].get("collections"))  # fmt: skip
    names = ("particles", "jets", "labels", "file", "entry",
             *(("targets",) if tagger.target_names else ()), *collection_keys(index))  # fmt: skip
    # the main process's share stands for the job's: the shares are equal
    bar = Progress(hi - lo, f"evaluate {part.parent.parent.name}", "jet", disable=not rt.is_main)
    with atomic_path(part) as tmp, h5py.File(tmp, "w") as f:
        for a, b in _chunks(lo, hi, chunk):
            c = load_columns(shard_dir, "test", names, opts, index, rows=(a, b))
            feats = {k: v for k, v in c.items() if k.startswith("coll_")}
            feats.update(particles=c["particles"], counts=np.diff(c["offsets"]))
            probs, regressed = infer(tagger, feats)
            cols = {"probs": probs, "labels": c["labels"].astype(np.int64),
                    "file": c["file"], "entry": c["entry"]}  # fmt: skip
            if tagger.target_names:  # in the targets' units
                cols["targets_pred"], cols["targets_true"] = regressed, c["targets"]
            if mass is not None:
                col, (edges, table) = mass
                cols["baseline_probs"] = mass_probabilities(c["jets"][:, col], edges, table)
                cols["jet_sdmass"] = c["jets"][:, col].astype(np.float32)
            if "jet_pt" in index["jet_features"]:  # for the ROC in pT bins
                cols["jet_pt"] = c["jets"][:, index["jet_features"].index("jet_pt")]
            _append(f, cols)
            bar.update(b - a)
        f.attrs["rows"] = [lo, hi]
    bar.close()
    return hi - lo


def _gather(out: Path, world: int, index: dict) -> Path:
    """The ranks' parts, in rank order (the split's order), into predictions.h5."""
    final = out / "predictions.h5"
    with atomic_path(final) as tmp, h5py.File(tmp, "w") as f:
        for r in range(world):
            path = out / PARTS.format(rank=r)
            with h5py.File(path, "r") as part:
                n = part["labels"].shape[0] if "labels" in part else 0  # a rank with no rows
                for lo in range(0, n, 65536):
                    _append(f, {k: part[k][lo : lo + 65536] for k in part})
            path.unlink()
        f.attrs["classes"] = index["classes"]
        f.attrs["targets"] = list(index.get("targets") or [])
        f.attrs["source_files"] = index.get("source_files", [])
    return final


READ_BYTES = 16 << 20  # particle data read at a time: enough to amortise a read, not more


def rows_per_read(index: dict, batch: int, read_bytes: int = READ_BYTES) -> int:
    """Jets read from the shards at a time: `read_bytes` of padded particles, at least a batch."""
    per_jet = int(index["max_particles"]) * len(index["particle_features"]) * 4
    return max(batch, read_bytes // max(per_jet, 1))


def evaluate(
    shard_dir: str, model_path: str, out_dir: str, read: dict | None = None,
    chunk: int | None = None,
) -> dict:  # fmt: skip
    """Score the test split (and the jet-mass reference), streamed in chunks by every process
    of the job (each its contiguous share), into predictions.h5; then metrics.json from the
    stored scores, roc.png and confusion.png. Memory does not grow with the split's size (a
    read of `rows_per_read` jets, a forward pass of the run's training batch) but for the
    final metrics, which hold the scores: a few numbers a jet."""
    rt = init_runtime()
    try:
        # read.node_local: the node's processes read one copy in node-local storage
        with localised(shard_dir, read) as shard_dir:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            opts = ReadOptions.from_config(read)
            index = load_index(shard_dir, opts)
            if not index["splits"]["test"]["shards"]:
                raise VoxjetError(
                    f"{shard_dir}/index.json: the test split is empty; raise the dataset's "
                    "jets.test_fraction"
                )
            model, saved = load_trained(model_path)
            _check_compatible(saved, index, model_path, shard_dir)
            model.to(rt.device).eval()
            chunk = chunk or rows_per_read(index, inference_batch(saved))
            mass = _mass_table(shard_dir, index, opts, rt, chunk)
            score_share(shard_dir, model, saved, index, opts, rt, out / PARTS.format(rank=rt.rank),
                        mass, chunk)  # fmt: skip
            if rt.distributed:
                dist.barrier()
            if not rt.is_main:
                return {}
            median = _train_median(shard_dir, index, opts) if index.get("targets") else None
            return _metrics_from_predictions(_gather(out, rt.world_size, index), out, index, saved,
                                             median)  # fmt: skip
    finally:
        shutdown(rt)


def _train_median(shard_dir: str, index: dict, opts: ReadOptions) -> list[float]:
    """Each regression target's median over the training split: the constant prediction a
    regression must beat (a few bytes a jet, read once)."""
    t = load_columns(shard_dir, "train", ("targets",), opts, index)["targets"]
    return np.median(t, axis=0).astype(float).tolist()


def _metrics_from_predictions(path: Path, out: Path, index: dict, saved: dict,
                              train_median: list[float] | None = None) -> dict:  # fmt: skip
    classes = index["classes"]
    background = index.get("background") or classes[0]
    with h5py.File(path, "r") as f:
        labels = f["labels"][...]
        probs = f["probs"][...]
        base = f["baseline_probs"][...] if "baseline_probs" in f else None
        jet_pt = f["jet_pt"][...].astype(np.float64) if "jet_pt" in f else None
        jet_mass = f["jet_sdmass"][...].astype(np.float64) if "jet_sdmass" in f else None
        regressed = None
        if "targets_pred" in f:
            regressed = (f["targets_pred"][...], f["targets_true"][...])
    metrics = jet_metrics(probs, labels, classes, background)
    if regressed is not None:
        targets = parse_targets(index_config(index, "index.json").targets)
        metrics.update(target_metrics(*regressed, targets, train_median, jet_pt))
        if "regression" in metrics:
            reg = [i for i, t in enumerate(targets) if not t.classes]
            regression_figure(out / "regression.png", regressed[0][:, regression_columns(targets)],
                              regressed[1][:, reg], [targets[i].name for i in reg],
                              metrics["regression"])  # fmt: skip
    metrics.update(
        {"domain": "jets", "split": "test", "best_step": saved["best_step"], "classes": classes}
    )
    # what the shards left out, so the summary says it beside the numbers it shaped
    metrics["data"] = {"skipped_files": index.get("skipped", []),
                       "dropped_labels": index.get("dropped_labels", {}),
                       "no_collection_objects": index.get("empty_collections", [])}  # fmt: skip
    if base is not None:
        bm = jet_metrics(base, labels, classes, background)
        metrics["baseline_jet_mass"] = {k: bm[k] for k in ("accuracy", "auc_macro", "rej50_mean")}
    shown = shown_signals(metrics)  # JetClass-II's 187 signal classes: the hardest few
    roc_overlay(out / "roc.png", "ROC curves on the test split",
                {"this model": (probs, labels, classes)}, background, shown)  # fmt: skip
    confusion(out / "confusion.png", probs, labels, classes)
    score_distributions(out / "scores.png", probs, labels, classes, background, shown)
    if jet_pt is not None:
        roc_in_pt_bins(out / "roc_pt_bins.png", probs, labels, classes, background, jet_pt,
                       shown=shown)  # fmt: skip
    if jet_mass is not None:
        mass_sculpting(out / "mass_sculpting.png", probs, labels, classes, background, jet_mass,
                       shown=shown)  # fmt: skip
    write_json(out / "metrics.json", metrics)
    print(f"test accuracy {metrics['accuracy']:.4f}, macro AUC {metrics['auc_macro']:.4f}",
          file=sys.stderr)  # fmt: skip
    for name, m in (metrics.get("regression") or {}).items():
        print(
            f"test {name}: response {m['response']:.4f}, resolution {m['resolution']:.4f} "
            f"(training median: {m['median_baseline']['resolution']:.4f})",
            file=sys.stderr,
        )
    return metrics
