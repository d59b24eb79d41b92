"""Convert staged ROOT files into pre-shuffled HDF5 shards plus index.json (counts, class
histogram, per-feature mean/std on the training split)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import h5py
import numpy as np
import uproot
from tqdm import tqdm

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, read_json
from voxjet.jets.features import (
    branches_needed,
    compute_features,
    labels_from_onehot,
)

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")


@dataclass
class JetDataConfig:
    """How ROOT branches become model inputs (in the spirit of weaver's data config)."""

    tree: str = "tree"
    labels: list[str] = field(
        default_factory=lambda: ["label_QCD", "label_Hbb", "label_Wqq", "label_Tbqq"]
    )
    particle_features: list[str] = field(
        default_factory=lambda: [
            "part_deta",
            "part_dphi",
            "part_pt_log",
            "part_e_log",
            "part_logptrel",
            "part_logerel",
            "part_deltaR",
            "part_charge",
            "part_isChargedHadron",
            "part_isNeutralHadron",
            "part_isPhoton",
            "part_isElectron",
            "part_isMuon",
            "part_d0",
            "part_d0err",
            "part_dz",
            "part_dzerr",
        ]
    )
    jet_features: list[str] = field(
        default_factory=lambda: [
            "jet_pt",
            "jet_eta",
            "jet_sdmass",
            "jet_nparticles",
            "jet_tau21",
            "jet_tau32",
        ]
    )
    max_particles: int = 128
    jets_per_shard: int = 10000
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    step_size: int = 50000
    seed: int = 42

    def hash(self) -> str:
        """A short hash that changes whenever the shard contents would."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def _read_file(path: Path, cfg: JetDataConfig, branches: list[str]) -> dict[str, np.ndarray]:
    try:
        f = uproot.open(path)
    except Exception as e:
        raise VoxjetError(f"{path}: cannot open as ROOT ({e}); re-stage the dataset") from e
    with f:
        if cfg.tree not in f:
            raise VoxjetError(
                f"{path}: no tree {cfg.tree!r} (found {sorted(f.keys())}); set "
                "jets.tree in the config"
            )
        tree = f[cfg.tree]
        missing = [b for b in branches + cfg.labels if b not in tree]
        if missing:
            raise VoxjetError(
                f"{path}: missing branches {missing}; fix jets.labels / "
                "jets.particle_features / jets.jet_features in the config"
            )
        parts = []
        for arrays in tree.iterate(branches + cfg.labels, step_size=cfg.step_size, library="ak"):
            out = compute_features(
                arrays, cfg.particle_features, cfg.jet_features, cfg.max_particles
            )
            out["labels"] = labels_from_onehot(arrays, cfg.labels)
            parts.append(out)
    merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    keep = merged["labels"] >= 0
    return {k: v[keep] for k, v in merged.items()}


def _masked_stats(particles: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    real = particles[mask]
    mean = real.mean(0)
    std = real.std(0)
    return mean, np.where(std > 1e-6, std, 1.0)


def _write_shard(
    path: Path,
    data: dict[str, np.ndarray],
    cfg: JetDataConfig,
    classes: list[str],
    sources: list[str],
) -> None:
    n = len(data["labels"])
    chunk = max(1, min(n, 1024))
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "particles", data=data["particles"], chunks=(chunk,) + data["particles"].shape[1:]
        )
        f.create_dataset("mask", data=data["mask"], chunks=(chunk, data["mask"].shape[1]))
        f.create_dataset("jets", data=data["jets"], chunks=(chunk, data["jets"].shape[1]))
        f.create_dataset("labels", data=data["labels"], chunks=(chunk,))
        f.attrs["particle_features"] = cfg.particle_features
        f.attrs["jet_features"] = cfg.jet_features
        f.attrs["classes"] = classes
        f.attrs["source_files"] = sources
        f.attrs["config_hash"] = cfg.hash()
        f.attrs["format_version"] = FORMAT_VERSION


def class_names(labels: list[str]) -> list[str]:
    """Class names from label branch names (label_QCD → QCD)."""
    return [b.removeprefix("label_") for b in labels]


def shard_jets(
    manifest_path: str | os.PathLike, out_dir: str | os.PathLike, cfg: JetDataConfig
) -> dict:
    """Read every staged ROOT file, shuffle across files, split and write shards; returns index."""
    manifest = read_json(manifest_path)
    root = Path(manifest["root"])
    files = [root / f["path"] for f in manifest["files"] if f["path"].endswith(".root")]
    if not files:
        raise VoxjetError(f"{manifest_path}: lists no .root files; check the dataset's source")
    branches = branches_needed(cfg.particle_features, cfg.jet_features)
    per_file = [
        _read_file(p, cfg, branches)
        for p in tqdm(files, desc="shard-jets: read", unit="file", mininterval=1.0)
    ]
    data = {k: np.concatenate([d[k] for d in per_file]) for k in per_file[0]}
    n = len(data["labels"])
    if n == 0:
        raise VoxjetError(f"{manifest_path}: no jet has any of the labels {cfg.labels} set")
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(n)
    data = {k: v[perm] for k, v in data.items()}
    n_test, n_val = int(round(n * cfg.test_fraction)), int(round(n * cfg.val_fraction))
    bounds = {"test": (0, n_test), "val": (n_test, n_test + n_val), "train": (n_test + n_val, n)}
    classes = class_names(cfg.labels)
    sources = [str(p.name) for p in files]
    index: dict = {
        "format_version": FORMAT_VERSION,
        "config_hash": cfg.hash(),
        "config": asdict(cfg),
        "classes": classes,
        "particle_features": cfg.particle_features,
        "jet_features": cfg.jet_features,
        "max_particles": cfg.max_particles,
        "splits": {},
    }
    with atomic_path(out_dir, directory=True) as tmp:
        for split in SPLITS:
            lo, hi = bounds[split]
            part = {k: v[lo:hi] for k, v in data.items()}
            shards = []
            for i, start in enumerate(range(0, hi - lo, cfg.jets_per_shard)):
                name = f"{split}_{i:04d}.h5"
                chunk = {k: v[start : start + cfg.jets_per_shard] for k, v in part.items()}
                _write_shard(tmp / name, chunk, cfg, classes, sources)
                shards.append({"file": name, "jets": int(len(chunk["labels"]))})
            hist = np.bincount(part["labels"], minlength=len(classes)).tolist()
            index["splits"][split] = {
                "jets": int(hi - lo),
                "shards": shards,
                "class_counts": dict(zip(classes, hist, strict=True)),
            }
        train = {k: v[bounds["train"][0] : bounds["train"][1]] for k, v in data.items()}
        if len(train["labels"]) == 0:
            raise VoxjetError(
                "the training split is empty: lower val_fraction/test_fraction or add files"
            )
        pmean, pstd = _masked_stats(train["particles"], train["mask"])
        index["particle_mean"], index["particle_std"] = pmean.tolist(), pstd.tolist()
        index["jet_mean"] = train["jets"].mean(0).tolist()
        index["jet_std"] = np.where(train["jets"].std(0) > 1e-6, train["jets"].std(0), 1).tolist()
        (tmp / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return index
