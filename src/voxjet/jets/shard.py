"""Convert staged ROOT files into pre-shuffled HDF5 shards plus index.json (counts, class
histogram, per-feature mean/std on the training split).

Scatter, then gather: shard job k of n reads the k-th n-th of every file's entries (uproot
reads only those baskets), so n jobs share the I/O evenly and every shard mixes every file;
each jet's split comes from a hash of (file name, entry), so it never changes on a rerun or when
files are added. `index_shards` then adds up the parts' counts and feature sums."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import awkward as ak
import h5py
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, read_json
from voxjet.io.parquet_files import SUFFIX, is_parquet
from voxjet.io.trees import branch_type, open_tree, table_words
from voxjet.jets import reweight
from voxjet.jets.branch_reads import Reads, missing_message, needed, reads_of, tree_key
from voxjet.jets.collections import (
    collection_arrays,
    collection_sums,
    empty_in_every_jet,
    masks,
    parse_collections,
)
from voxjet.jets.data_config import FORMAT_VERSION, SHARD_KEYS, SPLITS, JetDataConfig
from voxjet.jets.expressions import Variables
from voxjet.jets.features import (
    TEST_SELECTION,
    all_finite,
    compute_features,
    labels_from_onehot,
    select,
)
from voxjet.jets.jagged import offsets_of, take_from_chunks
from voxjet.jets.leakage import class_names, label_branches, reweight_labels
from voxjet.jets.robust import (
    CLIP,
    Sample,
    add_outliers,
    centre_and_spread,
    describe_outliers,
    describe_sentinels,
    merge_outliers,
    missing_values,
    outliers,
    sentinels,
    with_sentinels,
)
from voxjet.jets.robust import DESCRIPTION as ROBUST
from voxjet.jets.shard_files import STORAGES, write_shard_arrays
from voxjet.jets.targets import check_values, parse_targets, variable_name
from voxjet.jets.weaver_config import auto_variables, standardise
from voxjet.progress import progress


def _file_class(labels: dict, name: str) -> int:
    hits = [i for i, g in enumerate(labels["by_file"].values()) if fnmatch.fnmatch(name, g)]
    if len(hits) != 1:
        raise VoxjetError(
            f"{name}: matches {len(hits)} of the jets.labels.by_file patterns "
            f"{labels['by_file']}; each file must match exactly one"
        )
    return hits[0]


def jet_labels(arrays, labels: list[str] | dict, file_name: str) -> tuple[np.ndarray, dict]:
    """(class index of each jet, -1 where it has none; {problem: mask} of the jets whose
    labels are not exactly one class: `none` set, `several` set, `out_of_range`)."""
    if isinstance(labels, list):
        return labels_from_onehot(arrays, labels)
    if "branch" in labels:
        raw = np.asarray(ak.to_numpy(arrays[labels["branch"]]))
        out = raw.astype(np.int64)
        bad = (raw != out) | (out < 0) | (out >= len(labels["classes"]))
        out[bad] = -1
        return out, {"out_of_range": bad}
    return np.full(len(arrays), _file_class(labels, file_name), np.int64), {}


def _bad_label_message(problems: dict, entries: np.ndarray, labels) -> str:
    what = {
        "none": "no label set",
        "several": "more than one label set",
        "out_of_range": "a class index outside jets.labels.classes",
    }
    parts = [
        f"{int(m.sum())} jets with {what[k]} (entries {entries[m][:5].tolist()}"
        f"{', …' if m.sum() > 5 else ''})"
        for k, m in problems.items()
        if m.any()
    ]
    return (
        f"{'; '.join(parts)} among the label branches {label_branches(labels) or labels}: "
        "a jet's class would be a guess. Fix the files, or set jets.bad_labels: drop to leave "
        "such jets out (counted in index.json), e.g. when the files hold classes not listed"
    )


def split_of(file_name: str, entries: np.ndarray, cfg: JetDataConfig) -> np.ndarray:
    """0 train, 1 val, 2 test for each entry, from a keyed hash of (seed, file name, entry):
    the same on every rerun, unchanged for existing files when new ones are added, and for
    two seeds two independent splits (the seed keys the hash, as splitmix64's state)."""
    key = hashlib.blake2b(f"{cfg.seed}\0{file_name}".encode(), digest_size=8).digest()
    with np.errstate(over="ignore"):
        # splitmix64: the (seed, file) key as its state, one golden-ratio step an entry,
        # then its finaliser: consecutive entries become independent uniforms
        x = np.uint64(int.from_bytes(key, "little")) + entries.astype(np.uint64) * np.uint64(
            0x9E3779B97F4A7C15
        )
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    u = (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    out = np.zeros(len(u), np.int8)
    out[u < cfg.test_fraction + cfg.val_fraction] = 1
    out[u < cfg.test_fraction] = 2
    return out


def split_name(file_name: str) -> str:
    """The name a file's jets are split by: a Parquet copy's that of the ROOT file it was made
    from (`QCD_000.parquet` splits as `QCD_000.root`), so converting files moves no jet
    between train, val and test."""
    return file_name[: -len(SUFFIX)] + ".root" if is_parquet(file_name) else file_name


def jet_files(listed: list[dict], manifest_path: str | os.PathLike,
              cfg: JetDataConfig) -> list[dict]:  # fmt: skip
    """The manifest's ROOT or Parquet files: one format a dataset (both: an error), and no
    `tree` for Parquet."""
    root = [f for f in listed if f["path"].lower().endswith(".root")]
    parquet = [f for f in listed if is_parquet(f["path"])]
    if root and parquet:
        raise VoxjetError(
            f"{manifest_path}: the dataset holds {len(root)} ROOT files ({root[0]['path']}, …) "
            f"and {len(parquet)} Parquet files ({parquet[0]['path']}, …); one dataset reads one "
            "format (their branch types and splits must agree): make them two datasets, or set "
            "source.patterns to one format"
        )
    if parquet and cfg.tree is not None and not cfg.weaver_config:
        raise VoxjetError(
            f"{manifest_path}: jets.tree is {cfg.tree!r}, but the dataset's files are Parquet "
            f"({parquet[0]['path']}, …), which have no trees: remove jets.tree"
        )
    if not root + parquet:
        raise VoxjetError(f"{manifest_path}: lists no .root or .parquet files; check the "
                          "dataset's source and source.patterns")  # fmt: skip
    return root + parquet


def file_split(rel_path: str, cfg: JetDataConfig) -> int | None:
    """The split code (0 train, 1 val, 2 test) every jet of a file takes from
    jets.split_files, or None without predefined splits."""
    if not cfg.split_files:
        return None
    hits = [
        code
        for code, split in enumerate(SPLITS)
        for pattern in _as_list(cfg.split_files.get(split))
        if fnmatch.fnmatch(rel_path, pattern) or fnmatch.fnmatch(Path(rel_path).name, pattern)
    ]
    if len(set(hits)) != 1:
        raise VoxjetError(
            f"{rel_path}: matches {'none' if not hits else 'more than one'} of the "
            f"jets.split_files {cfg.split_files}; every file must belong to exactly one split"
        )
    return hits[0]


def _as_list(v) -> list[str]:
    return [] if v is None else [v] if isinstance(v, str) else list(v)


class BadFile(VoxjetError):
    """A file (or entry range) that cannot be used; skipped with on_bad_file: skip."""


def _open_tree(path: Path, cfg: JetDataConfig):
    try:
        return open_tree(path, cfg.tree_name, f"set {tree_key(cfg)}")
    except VoxjetError as e:
        raise BadFile(str(e)) from e


def _check_branches(path: Path, tree, job: ShardJob) -> None:
    cfg, types = job.cfg, job.types
    reads = Reads(job.v, job.branches, job.targets, job.colls, job.rw)
    need = needed(cfg, reads)
    missing = [b for b in need if b not in tree]
    if missing:
        raise BadFile(missing_message(path, tree, cfg, reads, missing))
    for b in need:
        t = branch_type(tree, b)  # a TTree's branch or an RNTuple's field alike
        if types.setdefault(b, (t, path))[0] != t:
            first_t, first_path = types[b]
            table, column = table_words(path, cfg.tree_name)
            raise BadFile(
                f"{path}: {column} {b!r} of {table} is {t}, but {first_t} in "
                f"{first_path.name}; the files of one dataset must agree"
            )


def _check_finite(arrays, entries: np.ndarray) -> None:
    """Refuse NaN/inf in any branch read, naming the branch and the first bad entry."""
    for name in arrays.fields:
        col = arrays[name]
        flat = ak.to_numpy(ak.flatten(col)) if col.ndim > 1 else ak.to_numpy(col)
        if all_finite(flat):
            continue
        per_jet = (
            ak.to_numpy(ak.any(~np.isfinite(col), axis=1)) if col.ndim > 1 else ~np.isfinite(flat)
        )
        raise VoxjetError(
            f"branch {name!r} holds NaN/inf at entry {int(entries[np.argmax(per_jet)])}"
        )


def _split_codes(path: Path, rel: str | None, entries: np.ndarray,
                 cfg: JetDataConfig) -> np.ndarray:  # fmt: skip
    """Each entry's split: its file's (jets.split_files), else the hash of (file, entry)."""
    fixed = file_split(rel, cfg) if rel is not None else None
    if fixed is None:
        return split_of(split_name(path.name), entries, cfg)
    return np.full(len(entries), fixed, np.int8)


def _kept(arrays, entries: np.ndarray, split: np.ndarray, v: Variables, cfg: JetDataConfig,
          path: Path, dropped: dict) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(which jets pass the selection with one class, each jet's class): jets whose labels
    are not one class stop the job naming the entries, or are counted into `dropped`
    (jets.bad_labels: drop)."""
    keep = select(arrays, v)
    if TEST_SELECTION in v.exprs:  # test jets pass the test split's own selection
        passed = np.ones(len(entries), bool) if keep is None else keep
        keep = np.where(split == 2, select(arrays, v, test=True), passed)
    labels, problems = jet_labels(arrays, cfg.labels, path.name)
    # judged on the selected jets only: a selection may remove the ones in question
    sel = np.ones(len(labels), bool) if keep is None else keep
    problems = {k: m & sel for k, m in problems.items()}
    if any(m.any() for m in problems.values()):
        if cfg.bad_labels != "drop":
            raise VoxjetError(_bad_label_message(problems, entries, cfg.labels))
        for k, m in problems.items():
            if m.any():
                dropped[k] = dropped.get(k, 0) + int(m.sum())
    keep = labels >= 0 if keep is None else keep & (labels >= 0)
    return keep, labels


def _jet_arrays(arrays, v: Variables, cfg: JetDataConfig, entries: np.ndarray,
                rw: dict | None) -> dict[str, np.ndarray]:  # fmt: skip
    """The selected jets' features, collections, reweighting values and targets."""
    out = compute_features(
        arrays, v, cfg.particle_features, cfg.jet_features, cfg.max_particles, cfg.sort_by
    )
    out["offsets"] = offsets_of(out.pop("counts"))
    for c in parse_collections(cfg.collections):
        out.update(collection_arrays(arrays, v, c, entries))
    if rw is not None:
        out["reweight"] = reweight_values(arrays, v, rw)
        if rw.get("by_branches") and (out["reweight"][:, -1] < 0).any():
            bad = entries[out["reweight"][:, -1] < 0]
            raise VoxjetError(
                f"{len(bad)} selected, labelled jets (entries {bad[:5].tolist()}) are in "
                f"none of jets.weights.reweight_classes {rw['classes']}: weaver would "
                "never train on them. Add their class, or leave them out with "
                "jets.selection"
            )
    if cfg.targets:
        out["targets"] = target_values(arrays, v, cfg, entries)
    return out


def _read_range(
    path: Path,
    tree,
    v: Variables,
    cfg: JetDataConfig,
    branches: list[str],
    start: int,
    stop: int,
    file_number: int = 0,
    dropped: dict | None = None,
    rel: str | None = None,
    rw: dict | None = None,
) -> list[dict[str, np.ndarray]]:
    """Chunks of features, labels, split and entry of the selected, labelled jets in
    [start, stop) (kept as read: concatenating padded particle arrays is the costly part);
    jets dropped for their labels (bad_labels: drop) are counted into `dropped`."""
    parts = []
    dropped = dropped if dropped is not None else {}
    need = branches + label_branches(cfg.labels)
    table = table_words(path, cfg.tree_name)[0]
    try:
        for arrays, report in tree.iterate(need, entry_start=start, entry_stop=stop,
                                           step_size=cfg.step_size, library="ak",
                                           report=True):  # fmt: skip
            entries = np.arange(report.tree_entry_start, report.tree_entry_stop)
            _check_finite(arrays, entries)
            split = _split_codes(path, rel, entries, cfg)
            keep, labels = _kept(arrays, entries, split, v, cfg, path, dropped)
            # unselected and unlabelled jets go before any feature is computed
            if not keep.all():
                arrays, entries, labels = arrays[keep], entries[keep], labels[keep]
                split = split[keep]
            if len(arrays) == 0:
                continue
            out = _jet_arrays(arrays, v, cfg, entries, rw)
            out["labels"] = labels
            out["entry"] = entries
            out["file"] = np.full(len(entries), file_number, np.int32)
            out["split"] = split
            parts.append(out)
    except VoxjetError as e:
        raise BadFile(f"{path}, {table}, entries {start}-{stop}: {e}") from e
    except Exception as e:  # a truncated basket, a decompression error
        raise BadFile(
            f"{path}, {table}, entries {start}-{stop}: cannot read ({type(e).__name__}: "
            f"{e}); the file may be truncated or corrupt: re-stage it"
        ) from e
    return parts


def target_values(arrays, v: Variables, cfg: JetDataConfig, entries: np.ndarray) -> np.ndarray:
    """Each jet's targets [N, T] float32, refusing NaN/inf, per-particle values and
    classification values that are no class number."""
    targets = parse_targets(cfg.targets)
    names = [t.name for t in targets]
    vals = v.evaluate([variable_name(n) for n in names], arrays)
    out = np.empty((len(arrays), len(names)), np.float64)
    for i, name in enumerate(names):
        x = vals[variable_name(name)]
        if isinstance(x, ak.Array) and x.ndim > 1:
            raise VoxjetError(f"jets.targets.{name}: {cfg.targets[name]} has one value a "
                              "particle; a target is one number a jet")  # fmt: skip
        out[:, i] = np.asarray(x, np.float64)  # a constant broadcasts
    check_values(out, targets, entries)
    return out.astype(np.float32)


def reweight_values(arrays, v: Variables, rw: dict) -> np.ndarray:
    """Each jet's values of the reweighting variables (or weight branches), [N, k] float64."""
    vals = v.evaluate(rw["vars"], arrays)
    out = np.empty((len(arrays), len(rw["vars"])), np.float64)
    for i, name in enumerate(rw["vars"]):
        if isinstance(vals[name], ak.Array) and vals[name].ndim > 1:
            raise VoxjetError(f"jets.weights: {name!r} has one value a particle; reweighting "
                              "variables are per jet")  # fmt: skip
        out[:, i] = np.asarray(vals[name], np.float64)  # a constant broadcasts
    if rw.get("by_branches"):  # each jet's reweight class, from its 0/1 class branches
        ind = v.evaluate(rw["classes"], arrays)
        cols = [np.broadcast_to(np.asarray(ind[c], np.float64), len(arrays)) for c in rw["classes"]]
        cls = reweight.reweight_class(np.stack(cols, 1))
        out = np.concatenate([out, cls[:, None].astype(np.float64)], 1)
    return out


def _entries(path: Path, tree, manifest_entry: dict) -> int:
    return int(manifest_entry.get("entries") or tree.num_entries)


def _write_shard(path: Path, data: dict[str, np.ndarray], cfg: JetDataConfig) -> None:
    """One shard: particles [M, F] (the jets' real particles, flat), offsets [N + 1] into them,
    jets [N, J], labels [N], and each jet's source (`file`: its number in index.json's
    source_files, `entry`: its entry in the tree), checksummed, laid out as `jets.storage`
    says (voxjet.jets.shard_files)."""
    with h5py.File(path, "w") as f:
        write_shard_arrays(f, data, cfg.storage)
        f.attrs["particle_features"] = cfg.particle_features
        f.attrs["jet_features"] = cfg.jet_features
        f.attrs["classes"] = class_names(cfg.labels)
        f.attrs["config_hash"] = cfg.hash()
        f.attrs["format_version"] = FORMAT_VERSION


def _sums(data: dict[str, np.ndarray], colls: list = ()) -> dict[str, np.ndarray | int]:
    """Counts, sums and sums of squares (float64) of the particles' and jets' features."""
    p, j = data["particles"], data["jets"]
    return {
        "particles_n": int(len(p)),
        "particles_sum": np.einsum("nf->f", p, dtype=np.float64),
        "particles_sumsq": np.einsum("nf,nf->f", p, p, dtype=np.float64),
        "jets_n": int(len(j)),
        "jets_sum": np.einsum("nf->f", j, dtype=np.float64),
        "jets_sumsq": np.einsum("nf,nf->f", j, j, dtype=np.float64),
        **collection_sums(data, colls),
        **(_target_sums(data["targets"]) if "targets" in data else {}),
    }


def _target_sums(t: np.ndarray) -> dict[str, np.ndarray | int]:
    return {"targets_n": int(len(t)), "targets_sum": t.sum(0, dtype=np.float64),
            "targets_sumsq": np.einsum("nf,nf->f", t, t, dtype=np.float64)}  # fmt: skip


def _samples_and_outliers(job: ShardJob, chunks: list[dict], train_jet: np.ndarray) -> tuple:
    """A sample of the training split's particles, jets and collection objects (each input's
    percentiles come from it: voxjet.jets.robust), and the values of every split that lie far
    outside the job's own percentiles, with their file and entries."""
    cfg, seed = job.cfg, [cfg_seed(job.cfg), job.part]
    kinds = {"particles": cfg.particle_features, "jets": cfg.jet_features,
             **{c.key: c.features for c in job.colls},
             **({"targets": target_names(cfg)} if job.targets else {})}  # fmt: skip
    missing = {k: missing_values(names, cfg.missing) for k, names in kinds.items()}
    rows = {k: [] for k in kinds}  # each chunk's rows of each input, and their entries
    for c, keep in zip(chunks, train_jet, strict=True):
        counts = np.diff(c["offsets"])
        rows["particles"].append((c["particles"], np.repeat(c["entry"], counts),
                                  np.repeat(keep, counts)))  # fmt: skip
        rows["jets"].append((c["jets"], c["entry"], keep))
        if job.targets:
            rows["targets"].append((c["targets"], c["entry"], keep))
        for coll in job.colls:
            real = masks(c[coll.count_key], coll.length)
            n = real.sum(1)
            entries, train = np.repeat(c["entry"], n), np.repeat(keep, n)
            rows[coll.key].append((c[coll.key][real], entries, train))
    samples, report, totals = {}, {}, {}
    for k, names in kinds.items():
        total = int(sum(int(t.sum()) for _, _, t in rows[k]))
        sample = Sample(total, [*seed, len(samples)])
        for values, _, train in rows[k]:
            sample.add(values[train])
        samples[k] = sample.array(len(names))
        missing[k] = with_sentinels(names, missing[k], _sentinels_of(cfg, samples[k], names,
                                                                     missing[k], k))  # fmt: skip
        centre, spread = centre_and_spread(samples[k], missing[k])
        totals[k] = int(sum(len(v) for v, _, _ in rows[k]))
        for (values, entries, _), c in zip(rows[k], chunks, strict=True):
            far = outliers(values, centre, spread, missing[k])
            if far.any():
                file = job.files[int(c["file"][0])]["path"] if len(c["file"]) else "?"
                add_outliers(report, k, names, values, far, entries, file)
    return samples, report, totals


def target_names(cfg: JetDataConfig) -> list[str]:
    """The targets' columns, in the shards' order."""
    return [t.name for t in parse_targets(cfg.targets)]


def _sentinels_of(cfg: JetDataConfig, sample: np.ndarray, names: list[str],
                  declared: list[float | None], kind: str) -> dict[str, dict]:  # fmt: skip
    """The undeclared sentinels of an input's sample (none for targets, which are never given
    a centre in place of a value, and none with jets.sentinels: keep)."""
    if cfg.sentinels == "keep" or kind == "targets":
        return {}
    return sentinels(sample, names, declared, kind)


def cfg_seed(cfg: JetDataConfig) -> int:
    """The data config's seed (the samples' random streams start from it)."""
    return int(cfg.seed)


def _sample_of(parts: list[tuple[Path, dict]], kind: str, width: int) -> np.ndarray:
    """The parts' samples of one input (particles, jets or a collection's objects)."""
    found = [np.load(d / p["samples"][kind]) for d, p in parts if kind in p.get("samples", {})]
    return np.concatenate(found) if found else np.zeros((0, width), np.float32)


def _auto_inputs(parts: list[tuple[Path, dict]], groups: dict, cfg: JetDataConfig) -> dict:
    """The weaver input groups with their "auto" centres and scales from the parts' samples."""
    names = auto_variables(groups)
    sample = _sample_of(parts, "particles", len(cfg.particle_features))
    if not len(sample):
        raise VoxjetError("weaver_config: no training particle to compute the automatic "
                          f"standardisation of {names} from")  # fmt: skip
    cols = {n: sample[:, cfg.particle_features.index(n)] for n in names}
    return standardise(groups, cols)


def _add_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, n in c.items():
            out[k] = out.get(k, 0) + int(n)
    return out


def _add_sums(sums: list[dict]) -> dict[str, list[float] | int]:
    return {k: (sum(s[k] for s in sums) if k.endswith("_n") else
                np.sum([s[k] for s in sums], axis=0).tolist()) for k in sums[0]}  # fmt: skip


@dataclass
class ShardJob:
    """One shard job (`part` of `parts`): what it reads, and what it has read so far."""

    cfg: JetDataConfig
    part: int
    parts: int
    root: Path
    files: list[dict]  # the manifest's ROOT files
    v: Variables
    branches: list[str]
    targets: list
    colls: list
    rw: dict | None
    types: dict = field(default_factory=dict)  # each branch's type, the same in every file
    chunks: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    per_file: dict[str, int] = field(default_factory=dict)  # selected jets
    entries_per_file: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)  # jets of no class, by label
    empties: dict[str, list[str]] = field(default_factory=dict)  # files, collections empty


def _shard_job(manifest_path: str | os.PathLike, cfg: JetDataConfig, part: int,
               parts: int) -> ShardJob:  # fmt: skip
    """The job's settings checked, its files listed (each in exactly one split) and the
    branches its features, targets, collections and weights read."""
    if cfg.on_bad_file not in ("fail", "skip"):
        raise VoxjetError(f"jets.on_bad_file {cfg.on_bad_file!r}: use fail or skip")
    if cfg.storage not in STORAGES:
        raise VoxjetError(f"jets.storage {cfg.storage!r}: use one of {', '.join(STORAGES)}")
    manifest = read_json(manifest_path)
    files = jet_files(manifest["files"], manifest_path, cfg)
    if cfg.bad_labels not in ("fail", "drop"):
        raise VoxjetError(f"jets.bad_labels {cfg.bad_labels!r}: use fail or drop")
    for f in files:  # a file in no split (or two) stops the job before any reading
        file_split(f["path"], cfg)
    r = reads_of(cfg)
    return ShardJob(cfg, part, parts, Path(manifest["root"]), files, r.v, r.branches, r.targets,
                    r.colls, r.rw)  # fmt: skip


def _read_file(job: ShardJob, number: int, entry: dict) -> None:
    """The job's share of one file's entries, selected and computed, kept as chunks (a bad
    file stops the job, or is listed as skipped: jets.on_bad_file)."""
    cfg, path = job.cfg, job.root / entry["path"]
    try:
        if "unreadable" in entry:  # found so by the stage job
            raise BadFile(entry["unreadable"])
        f, tree = _open_tree(path, cfg)
        with f:
            _check_branches(path, tree, job)
            n = _entries(path, tree, entry)
            if n == 0:
                raise BadFile(f"{path}: {table_words(path, cfg.tree_name)[0]} has 0 entries "
                              "(an empty file); re-make or drop it")  # fmt: skip
            lo, hi = n * job.part // job.parts, n * (job.part + 1) // job.parts
            data = _read_range(path, tree, job.v, cfg, job.branches, lo, hi, number,
                               job.dropped, entry["path"], job.rw)  # fmt: skip
            empty = empty_in_every_jet(data, job.colls)
            if empty:  # light-quark jets often have no vertex; misnamed branches neither
                job.empties[entry["path"]] = empty
                print(f"warning: {path}: no object of the collections {empty} in any of its "
                      f"{sum(len(d['labels']) for d in data)} selected jets (entries "
                      f"{lo}-{hi}); check jets.collections if that is not expected",
                      file=sys.stderr)  # fmt: skip
    except BadFile as e:
        source = entry.get("source", "")
        if source and source.removeprefix("file://") != str(path):
            e = BadFile(f"{e} [the staged copy of your file {source}]")  # noqa: PLW2901
        if cfg.on_bad_file == "fail":
            if "on_bad_file" not in str(e):
                e = BadFile(f"{e}; or, to shard the other files without this one, set "  # noqa: PLW2901
                            "jets.on_bad_file: skip")  # fmt: skip
            raise e from e.__cause__
        print(f"skipping: {e}", file=sys.stderr)
        job.skipped.append({"file": entry["path"], "reason": str(e)})
        return
    job.per_file[entry["path"]] = int(sum(len(c["labels"]) for c in data))
    job.entries_per_file[entry["path"]] = hi - lo
    job.chunks += data


def _write_splits(job: ShardJob, tmp: Path) -> dict:
    """The chunks' jets shuffled together into each split's shards (taken straight from the
    chunks: no joined copy of everything); the part's summary: counts, training-split sums,
    the reweighting plane's counts, a sample for weaver's `auto` standardisation."""
    cfg, rw, colls = job.cfg, job.rw, job.colls
    classes = class_names(cfg.labels)
    keys = (*SHARD_KEYS, "offsets", "split", *(("reweight",) if rw is not None else ()),
            *(("targets",) if job.targets else ()),
            *(k for c in colls for k in (c.key, c.count_key)))  # fmt: skip
    chunks = [{k: c[k] for k in keys} for c in job.chunks]
    none = [np.zeros(0, np.int64)]
    chunk_of = np.repeat(np.arange(len(chunks)), [len(c["labels"]) for c in chunks])
    row_in = np.concatenate([np.arange(len(c["labels"])) for c in chunks] or none)
    split_code = np.concatenate([c.pop("split") for c in chunks] or none)
    all_labels = np.concatenate([c["labels"] for c in chunks] or none)
    order = np.random.default_rng([cfg.seed, job.part]).permutation(len(split_code))
    summary: dict = {"part": job.part, "parts": job.parts, "selected_per_file": job.per_file,
                     "entries_per_file": job.entries_per_file, "dropped_labels": job.dropped,
                     "skipped": job.skipped, "splits": {}, "empty_collections": job.empties,
                     "source_files": [f["path"] for f in job.files]}  # fmt: skip
    train_jet = np.split(split_code == 0, np.cumsum([len(c["labels"]) for c in chunks])[:-1])
    samples, far, totals = _samples_and_outliers(job, chunks, train_jet if chunks else [])
    plane = None
    if rw is not None and not rw["precomputed"]:
        plane = reweight.empty_counts(rw, len(classes))
    for code, split in enumerate(SPLITS):
        rows = order[split_code[order] == code]
        shards, sums = [], []
        for i, start in enumerate(range(0, len(rows), cfg.jets_per_shard)):
            name = f"{split}_{i:03d}.h5"
            mine = rows[start : start + cfg.jets_per_shard]
            piece = take_from_chunks(chunks, chunk_of[mine], row_in[mine])
            _write_shard(tmp / name, piece, cfg)
            # its size spares a reader at a URL one request a file (fsspec's size())
            size = (tmp / name).stat().st_size
            shards.append({"file": name, "jets": int(len(piece["labels"])), "bytes": size})
            if split == "train":
                sums.append(_sums(piece, colls))
                if plane is not None:  # the reweighting plane's counts, for the index job
                    plane += reweight.histograms(piece["reweight"], piece["labels"], rw,
                                                 len(classes))  # fmt: skip
        hist = np.bincount(all_labels[rows], minlength=len(classes)).tolist()
        summary["splits"][split] = {
            "jets": int(len(rows)),
            "shards": shards,
            "class_counts": dict(zip(classes, hist, strict=True)),
            **({"sums": _add_sums(sums)} if sums else {}),
        }
    if plane is not None:
        summary["reweight_counts"] = plane.tolist()
    summary["samples"] = {}
    for kind, values in samples.items():
        np.save(tmp / f"sample_{kind}.npy", values)
        summary["samples"][kind] = f"sample_{kind}.npy"
    summary["outliers"], summary["values"] = far, totals
    for line in describe_outliers(far, totals):
        print(f"warning: {line}", file=sys.stderr)
    return summary


def shard_part(
    manifest_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: JetDataConfig,
    part: int = 0,
    parts: int = 1,
) -> dict:
    """Shard job `part` of `parts`: its share of every file's entries, shuffled together, into
    shards of at most jets_per_shard per split, plus part.json (counts and feature sums)."""
    job = _shard_job(manifest_path, cfg, part, parts)
    for number, entry in enumerate(progress(job.files, f"shard-jets part {part}", "file")):
        _read_file(job, number, entry)
    with atomic_path(out_dir, directory=True) as tmp:
        summary = _write_splits(job, tmp)
        (tmp / "part.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _index_of(parts: list[tuple[Path, dict]], cfg: JetDataConfig) -> dict:
    """What index.json says of the config and of every part: the classes, features, targets
    and collections, what was skipped or dropped, the source files."""
    return {
        "format_version": FORMAT_VERSION,
        "config_hash": cfg.hash(),
        "config": cfg.record(),
        "classes": class_names(cfg.labels),
        "background": cfg.background_class,
        "particle_features": cfg.particle_features,
        "jet_features": cfg.jet_features,
        "max_particles": cfg.max_particles,
        "targets": target_names(cfg),
        "collections": [
            {"name": c.name, "features": c.features, "length": c.length}
            for c in parse_collections(cfg.collections)
        ],
        "skipped": [s for _, p in parts for s in p["skipped"]],
        "dropped_labels": _add_counts([p.get("dropped_labels", {}) for _, p in parts]),
        # files (a part's share of each) whose selected jets hold no object of a collection
        "empty_collections": sorted({f for _, p in parts for f in p.get("empty_collections", {})}),
        # shards' `file` numbers index this list (every part reads the same manifest)
        "source_files": parts[0][1].get("source_files", []),
        "splits": {},
    }


def _check_selected(parts: list[tuple[Path, dict]], cfg: JetDataConfig) -> None:
    """A file none of whose jets passes the selection with a label stops the job (or is
    warned about: on_bad_file: skip)."""
    per_file: dict[str, int] = {}
    for _, p in parts:
        for name, count in p["selected_per_file"].items():
            per_file[name] = per_file.get(name, 0) + count
    empty = sorted(name for name, c in per_file.items() if c == 0)
    if not empty:
        return
    msg = (
        f"{empty}: no jet passes the selection {cfg.selection!r} with a label; "
        "check jets.selection and jets.labels"
    )
    if cfg.on_bad_file == "fail":
        raise VoxjetError(msg)
    print(f"warning: {msg}", file=sys.stderr)


def _gather_splits(index: dict, parts: list[tuple[Path, dict]]) -> None:
    """Each split's shards and class counts over the parts; a class without any jet, or an
    empty training split, stops the job."""
    classes = index["classes"]
    for split in SPLITS:
        shards, counts = [], np.zeros(len(classes), np.int64)
        for d, p in parts:
            info = p["splits"][split]
            shards += [{**s, "file": f"{d.name}/{s['file']}"} for s in info["shards"]]
            counts += np.array([info["class_counts"][c] for c in classes])
        index["splits"][split] = {
            "jets": int(sum(s["jets"] for s in shards)),
            "shards": shards,
            "class_counts": dict(zip(classes, counts.tolist(), strict=True)),
        }
    total = {c: sum(index["splits"][s]["class_counts"][c] for s in SPLITS) for c in classes}
    empty = [c for c, n in total.items() if n == 0]
    if empty:
        gone = (
            f"; skipped files: {[s['file'] for s in index['skipped']]}" if index["skipped"] else ""
        )
        raise VoxjetError(
            f"classes {empty} have no jets at all{gone}: a tagger cannot learn or be scored on "
            "them. Fix or add their files, or remove them from jets.labels"
        )
    if index["splits"]["train"]["jets"] == 0:
        raise VoxjetError(
            "the training split is empty (no selected, labelled jet): check the files, "
            "jets.selection and jets.labels, or lower val_fraction/test_fraction"
        )


def _robust_standardisation(index: dict, parts: list[tuple[Path, dict]],
                            cfg: JetDataConfig) -> None:  # fmt: skip
    """Each model input's centre and scale (voxjet.jets.robust) from the parts' samples of the
    training split, under the keys the models read (`particle_mean`/`particle_std`: the centre
    and the scale), the clip and the declared missing values; the values far outside, listed
    (an error with jets.outliers: fail)."""
    kinds = {"particles": ("particle", cfg.particle_features), "jets": ("jet", cfg.jet_features)}
    kinds |= {c.key: (c.key, c.features) for c in parse_collections(cfg.collections)}
    if cfg.targets:
        kinds["targets"] = ("target", target_names(cfg))
    found: dict[str, dict] = {}
    for kind, (key, names) in kinds.items():
        sample = _sample_of(parts, kind, len(names))
        if kind == "targets" and not len(sample):
            continue  # shards from before targets were sampled keep their mean and std
        declared = missing_values(names, cfg.missing)
        mine = _sentinels_of(cfg, sample, names, declared, kind)
        found |= mine
        missing = with_sentinels(names, declared, mine)
        centre, spread = centre_and_spread(sample, missing)
        index[f"{key}_mean"], index[f"{key}_std"] = centre.tolist(), spread.tolist()
        if kind == "particles":
            index["particle_missing"] = missing
    index["standardisation"] = ROBUST
    index["input_clip"] = CLIP
    index["sentinels"] = found
    said = describe_sentinels(found, cfg.sentinels)
    if said and cfg.sentinels == "fail":
        raise VoxjetError("features holding a sentinel value (jets.sentinels: fail):\n  "
                          + "\n  ".join(said) + "\ndeclare each in jets.missing ({feature: "
                          "value}) to train with it given the feature's centre, or fix the "
                          "files")  # fmt: skip
    for line in said:
        print(f"sentinel: {line}", file=sys.stderr)
    far = merge_outliers([p.get("outliers", {}) for _, p in parts])
    totals = _add_counts([p.get("values", {}) for _, p in parts])
    index["outliers"] = far
    lines = describe_outliers(far, totals)
    if lines and cfg.outliers == "fail":
        raise VoxjetError("values far outside their features' percentiles (a sentinel such as "
                          "-999 or an overflow?):\n  " + "\n  ".join(lines) + "\ndeclare a "
                          "sentinel in jets.missing ({feature: value}), or set jets.outliers: "
                          "warn to train with them clipped")  # fmt: skip
    for line in lines:
        print(f"warning: {line} (clipped to ±{CLIP:g} after standardisation; declare a "
              "sentinel in jets.missing)", file=sys.stderr)  # fmt: skip


def _standardisation(index: dict, parts: list[tuple[Path, dict]], cfg: JetDataConfig) -> None:
    """Each input's mean and std over the training split (from the parts' sums); the model
    inputs' are replaced by their robust centre and scale (_robust_standardisation)."""
    sums = [p["splits"]["train"]["sums"] for _, p in parts if "sums" in p["splits"]["train"]]
    colls = parse_collections(cfg.collections)
    kinds = ("particles", "jets", *(("targets",) if cfg.targets else ()), *(c.key for c in colls))
    for kind in kinds:
        n = sum(s[f"{kind}_n"] for s in sums)
        total = np.sum([s[f"{kind}_sum"] for s in sums], axis=0)
        sq = np.sum([s[f"{kind}_sumsq"] for s in sums], axis=0)
        mean = total / max(n, 1)
        std = np.sqrt(np.maximum(sq / max(n, 1) - mean**2, 0))
        key = kind if kind.startswith("coll_") else kind.removesuffix("s")
        index[f"{key}_mean"] = np.atleast_1d(mean).tolist()
        index[f"{key}_std"] = np.where(np.atleast_1d(std) > 1e-6, std, 1.0).tolist()


def index_shards(
    part_dirs: list[str | os.PathLike], out: str | os.PathLike, cfg: JetDataConfig
) -> dict:
    """index.json beside the part folders: every shard, counts, class histograms, skipped files
    and the training split's per-feature mean/std (from the parts' sums)."""
    parts = [(Path(d), read_json(Path(d) / "part.json")) for d in part_dirs]
    index = _index_of(parts, cfg)
    if any(p.get("source_files") != index["source_files"] for _, p in parts):
        raise VoxjetError(f"{[str(d) for d, _ in parts]}: the parts were made from different "
                          "file lists; rerun the shard stage")  # fmt: skip
    _check_selected(parts, cfg)
    _gather_splits(index, parts)
    if auto_variables(cfg.weaver_inputs):
        index["weaver_inputs"] = _auto_inputs(parts, cfg.weaver_inputs, cfg)
    rw = reweight.parse(cfg.weights, reweight_labels(cfg.labels), "jets.weights")
    if rw is not None:
        index["reweight"] = _reweight_index(rw, [p for _, p in parts], reweight_labels(cfg.labels))
    _standardisation(index, parts, cfg)
    _robust_standardisation(index, parts, cfg)
    with atomic_path(Path(out)) as tmp:
        tmp.write_text(json.dumps(index, indent=2) + "\n")
    return index


def _reweight_index(rw: dict, parts: list[dict], label_names: list[str]) -> dict:
    """The reweighting the training stream applies: the settings, and (histogram form) the
    weight tables from the parts' summed counts, with each class's weighted share."""
    if rw["precomputed"]:
        return rw
    counts = np.sum([p["reweight_counts"] for p in parts if "reweight_counts" in p], axis=0)
    tables = reweight.tables_of(rw, counts, label_names)
    label_names = reweight.class_names(rw, label_names)
    weighted = (counts * tables).sum(axis=(1, 2))
    print("reweighting: training jets inside the plane a class "
          f"{dict(zip(label_names, counts.sum(axis=(1, 2)).astype(int).tolist(), strict=True))}, "
          f"sampled shares {np.round(weighted / weighted.sum(), 3).tolist()}",
          file=sys.stderr)  # fmt: skip
    return {**rw, "counts": counts.tolist(), "tables": tables.tolist(),
            "shares": (weighted / weighted.sum()).tolist()}  # fmt: skip


def shard_jets(
    manifest_path: str | os.PathLike, out_dir: str | os.PathLike, cfg: JetDataConfig
) -> dict:
    """All shard parts in this process, then the index: the scatter/gather of the workflow
    run locally (tests, benchmarks, small datasets)."""
    with atomic_path(out_dir, directory=True) as tmp:
        dirs = []
        for k in range(cfg.shard_jobs):
            shard_part(manifest_path, tmp / f"part_{k:04d}", cfg, k, cfg.shard_jobs)
            dirs.append(tmp / f"part_{k:04d}")
        return index_shards(dirs, tmp / "index.json", cfg)
