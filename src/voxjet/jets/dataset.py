"""Jet shards read into memory (validation, test and evaluation; training streams them with
voxjet.jets.stream)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401  (registers the LZ4 filter the shards are written with)
import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.atomic import read_json


@dataclass
class JetArrays:
    """One split's arrays as tensors."""

    particles: torch.Tensor  # [N, P, F] float32
    mask: torch.Tensor  # [N, P] bool
    jets: torch.Tensor  # [N, J] float32
    labels: torch.Tensor  # [N] int64

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, idx: np.ndarray) -> dict[str, torch.Tensor]:
        """A batch of the rows at `idx`."""
        i = torch.from_numpy(idx)
        return {
            "particles": self.particles[i],
            "mask": self.mask[i],
            "jets": self.jets[i],
            "labels": self.labels[i],
        }


def load_index(shard_dir: str | os.PathLike) -> dict:
    """The shard folder's index.json."""
    return read_json(Path(shard_dir) / "index.json")


def load_columns(
    shard_dir: str | os.PathLike,
    split: str,
    names: tuple[str, ...] = ("particles", "mask", "jets", "labels"),
) -> dict[str, np.ndarray]:
    """The named datasets of every shard of `split`, concatenated (only those are read)."""
    shard_dir = Path(shard_dir)
    index = load_index(shard_dir)
    if split not in index["splits"] or not index["splits"][split]["shards"]:
        raise VoxjetError(
            f"{shard_dir}/index.json: split {split!r} has no shards; lower or raise "
            "the dataset's val_fraction/test_fraction"
        )
    parts: dict[str, list[np.ndarray]] = {k: [] for k in names}
    for shard in index["splits"][split]["shards"]:
        path = shard_dir / shard["file"]
        try:
            with h5py.File(path, "r") as f:
                for k in parts:
                    parts[k].append(f[k][...])
        except (OSError, KeyError) as e:
            raise VoxjetError(f"{path}: unreadable shard ({e}); rerun the shard stage") from e
    return {k: np.concatenate(v) for k, v in parts.items()}


def load_split(shard_dir: str | os.PathLike, split: str) -> JetArrays:
    """Every shard of `split` concatenated, as tensors."""
    cat = load_columns(shard_dir, split)
    return JetArrays(
        torch.from_numpy(cat["particles"]),
        torch.from_numpy(cat["mask"]),
        torch.from_numpy(cat["jets"]),
        torch.from_numpy(cat["labels"]).long(),
    )


def row_index(chunks: list[dict[str, np.ndarray]]) -> np.ndarray:
    """[n, 2] (chunk number, row) of every row of the chunks, in order (for gather_rows)."""
    sizes = [len(c["labels"]) for c in chunks]
    if not sizes:
        return np.zeros((0, 2), np.int64)
    return np.stack(
        [np.repeat(np.arange(len(sizes)), sizes), np.concatenate([np.arange(n) for n in sizes])], 1
    )


def gather_rows(
    chunks: list[dict[str, np.ndarray]], where: np.ndarray, keys: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """Rows `where` ([n, 2]: chunk number, row) of a list of same-keyed chunks, in that order,
    copied once into new arrays (no concatenation of the chunks first)."""
    out = {k: np.empty((len(where), *chunks[0][k].shape[1:]), chunks[0][k].dtype) for k in keys}
    for i, c in enumerate(chunks):
        sel = np.flatnonzero(where[:, 0] == i)
        if len(sel):
            rows = where[sel, 1]
            for k in keys:
                out[k][sel] = c[k][rows]
    return out
