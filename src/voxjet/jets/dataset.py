"""Jet shards read into memory (validation, test and evaluation; training streams them with
voxjet.jets.stream)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import h5py
import hdf5plugin  # noqa: F401  (registers the LZ4 filter the shards are written with)
import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.integrity import corrupt_error
from voxjet.io.remote import ReadOptions, RemoteFiles, is_url, read_json_at
from voxjet.jets.data_config import FORMAT_VERSION
from voxjet.jets.jagged import offsets_of, pad_particles, ragged_arange
from voxjet.jets.shard_files import ChecksumMismatch, ShardChecks


@dataclass
class JetArrays:
    """One split's jets in memory: particles flat with offsets (as stored), padded per batch."""

    particles: torch.Tensor  # [M, F] float32, the jets' real particles
    offsets: np.ndarray  # [N + 1] int64
    jets: torch.Tensor  # [N, J] float32
    labels: torch.Tensor  # [N] int64
    max_particles: int
    targets: torch.Tensor | None = None  # [N, T] float32 regression targets, in their units
    # extra collections' rows: coll_<name> [N, L, F] and coll_<name>_count [N]
    extras: dict[str, torch.Tensor] | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, idx: np.ndarray) -> dict[str, torch.Tensor]:
        """A batch of the jets at `idx`, particles padded to max_particles with a mask."""
        counts = np.diff(self.offsets)[idx]
        contiguous = len(idx) > 0 and np.array_equal(idx, np.arange(idx[0], idx[0] + len(idx)))
        if contiguous:  # predict's batches: a view, nothing gathered
            flat = self.particles[self.offsets[idx[0]] : self.offsets[idx[0] + len(idx)]]
        else:
            flat = self.particles[torch.from_numpy(ragged_arange(self.offsets[idx], counts))]
        particles, mask = pad_particles(flat, torch.from_numpy(counts), self.max_particles)
        i = torch.from_numpy(idx)
        out = {"particles": particles, "mask": mask, "jets": self.jets[i], "labels": self.labels[i]}
        if self.targets is not None:
            out["targets"] = self.targets[i]
        for k, v in (self.extras or {}).items():
            out[k] = v[i]
        return out


def load_index(shard_dir: str | os.PathLike, opts: ReadOptions | None = None) -> dict:
    """The shard folder's (or URL's) index.json, refusing shards of another format version."""
    index = read_json_at(shard_dir, "index.json", opts or ReadOptions(),
                         "snakemake -R index_jets (in the workflow)")  # fmt: skip
    if index.get("format_version") != FORMAT_VERSION:
        raise VoxjetError(
            f"{shard_dir}/index.json: shards of format {index.get('format_version')}, this "
            f"voxjet reads format {FORMAT_VERSION}; rebuild them (snakemake -R shard_jets, or "
            f"delete {shard_dir})"
        )
    return index


def share(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous share [lo, hi) of n items split over `world` ranks."""
    return n * rank // world, n * (rank + 1) // world


def load_columns(
    shard_dir: str | os.PathLike,
    split: str,
    names: tuple[str, ...] = ("particles", "jets", "labels"),
    opts: ReadOptions | None = None,
    index: dict | None = None,
    rows: tuple[int, int] | None = None,
) -> dict[str, np.ndarray]:
    """The named datasets of every shard of `split`, concatenated (only those are read);
    "particles" brings its "offsets" along. `rows` = (lo, hi) reads only those jets of the
    split (in shard order): a rank's share. Shards at a URL are fetched whole, concurrently."""
    opts = opts or ReadOptions()
    index = index or load_index(shard_dir, opts)
    if split not in index["splits"] or not index["splits"][split]["shards"]:
        raise VoxjetError(
            f"{shard_dir}/index.json: split {split!r} has no shards; lower or raise "
            "the dataset's val_fraction/test_fraction"
        )
    keys = [*names, "offsets"] if "particles" in names else list(names)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    remote = RemoteFiles(str(shard_dir), opts) if is_url(shard_dir) else None
    lo, hi = rows if rows is not None else (0, None)
    start = 0  # the split's row where this shard begins
    try:
        for shard in index["splits"][split]["shards"]:
            n = shard["jets"]
            a, b = max(lo - start, 0), n if hi is None else min(hi - start, n)
            start += n
            if a >= b:
                continue
            path = f"{shard_dir}/{shard['file']}"
            try:
                with h5py.File(
                    remote.fetch(shard["file"], shard.get("bytes")) if remote else path, "r"
                ) as f:
                    checks = ShardChecks(f)
                    whole = f["offsets"][...]
                    checks.verify_offsets(whole)
                    off = whole[a : b + 1]
                    have = {}
                    for k in parts:
                        if k == "particles":
                            have[k] = f[k][int(off[0]) : int(off[-1])]
                        elif k != "offsets":
                            have[k] = f[k][a:b]
                    checks.verify({k: f[k] for k in ("offsets", *names)}, a, b, have, whole)
                    for k in parts:
                        parts[k].append(off if k == "offsets" else have[k])
            except (OSError, KeyError, ChecksumMismatch) as e:
                raise corrupt_error(path, f"{split} jets {a}-{b}", "shard_jets", e) from e
    finally:
        if remote:
            remote.close()
    out = {
        k: np.concatenate(v) if v else np.zeros((0,), np.float32)
        for k, v in parts.items()
        if k != "offsets"
    }
    if "offsets" in parts:
        counts = [np.diff(o) for o in parts["offsets"]]
        out["offsets"] = offsets_of(np.concatenate(counts) if counts else np.zeros(0, np.int64))
    return out


def load_split(
    shard_dir: str | os.PathLike,
    split: str,
    opts: ReadOptions | None = None,
    part: tuple[int, int] = (0, 1),
) -> JetArrays:
    """Every shard of `split` concatenated, as tensors; with `part` = (rank, world) only that
    rank's contiguous share of the split's jets."""
    index = load_index(shard_dir, opts)
    total = sum(s["jets"] for s in index["splits"].get(split, {}).get("shards", []))
    rows = share(total, *part) if part != (0, 1) else None
    extras = collection_keys(index)
    names = ("particles", "jets", "labels", *(("targets",) if index.get("targets") else ()),
             *extras)  # fmt: skip
    cat = load_columns(shard_dir, split, names, opts=opts, index=index, rows=rows)
    return JetArrays(
        torch.from_numpy(cat["particles"]),
        cat["offsets"],
        torch.from_numpy(cat["jets"]),
        torch.from_numpy(cat["labels"]).long(),
        int(index["max_particles"]),
        torch.from_numpy(cat["targets"]) if "targets" in cat else None,
        {k: torch.from_numpy(cat[k]) for k in extras},
    )


def collection_keys(index: dict) -> list[str]:
    """The shard datasets of the index's extra collections (padded objects, then counts)."""
    return [f"coll_{c['name']}{s}" for c in index.get("collections") or [] for s in ("", "_count")]
