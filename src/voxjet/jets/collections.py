"""Constituent collections beyond the particles (`jets.collections`): secondary vertices, tracks,
leptons — each its own jagged branches with its own count, ordering, length and
standardisation, as CMS's ParticleNet/DeepJet and ATLAS's GN2 are fed.

A shard holds each extra collection as two row-wise datasets — `coll_<name>` [N, length, F]
float32 (a jet's objects first, zeros after) and `coll_<name>_count` [N] int32 — beside the flat
particles: these collections are short (a jet's secondary vertices are clipped at a few to
ten), so a padded row costs little, and every reader (the loader's shuffle buffer, its shared
memory hand-over, the per-unit CRC32s, evaluation and predict) carries them as it carries a
jet's features. A model reads (particles, mask, <name>, <name>_mask, ...) in this order."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import awkward as ak
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.jets.features import compute_features

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


@dataclass(frozen=True)
class Collection:
    """One extra collection: its per-object features, kept length, order and count branch."""

    name: str
    features: list[str] = field(default_factory=list)
    length: int = 10
    sort_by: str | None = None
    count: str | None = None  # a branch holding each jet's number of objects, checked

    @property
    def key(self) -> str:
        """The shard dataset of its padded objects."""
        return f"coll_{self.name}"

    @property
    def count_key(self) -> str:
        """The shard dataset of each jet's number of objects."""
        return f"coll_{self.name}_count"


def parse_collections(spec: Mapping[str, Any] | None,
                      where: str = "jets.collections") -> list[Collection]:  # fmt: skip
    """`jets.collections` ({name: {features, length, sort_by, count}}) as Collections."""
    out = []
    for name, c in (spec or {}).items():
        c = dict(c or {})
        if not NAME.match(str(name)) or name == "particles":
            raise VoxjetError(f"config key '{where}.{name}': a collection's name is letters and "
                              "digits (e.g. sv), and not 'particles'")  # fmt: skip
        feats = c.get("features")
        if not feats or not all(isinstance(f, str) for f in feats):
            raise VoxjetError(
                f"config key '{where}.{name}.features': give the collection's "
                "per-object variables, e.g. [sv_pt, sv_mass, sv_ntracks]"
            )
        length = c.get("length", 10)
        if not isinstance(length, int) or length < 1:
            raise VoxjetError(f"config key '{where}.{name}.length': {length!r}; objects a jet, ≥ 1")
        out.append(Collection(str(name), list(feats), length, c.get("sort_by"), c.get("count")))
    return out


def collection_inputs(colls: list[Collection]) -> list[str]:
    """What a collection reads: its features and sort key (branches or variables)."""
    return [n for c in colls for n in (*c.features, *([c.sort_by] if c.sort_by else []))]


def collection_arrays(arrays, v, coll: Collection, entries: np.ndarray) -> dict[str, np.ndarray]:
    """The collection of every jet of `arrays`, ordered, clipped and padded: {key: [N, L, F]
    float32, count_key: [N] int32}. Refuses features of different counts, a count branch that
    disagrees with them, and NaN/inf, naming the collection and the entries."""
    where = f"jets.collections.{coll.name}.features"
    try:
        got = compute_features(arrays, v, coll.features, [], coll.length, coll.sort_by, where)
    except VoxjetError as e:
        raise VoxjetError(f"collection {coll.name!r}: {e}") from e
    kept = got["counts"]
    if coll.count is not None:
        stated = np.asarray(ak.to_numpy(arrays[coll.count]), np.int64)
        real = ak.to_numpy(ak.num(v.evaluate([coll.features[0]], arrays)[coll.features[0]], axis=1))
        bad = stated != real
        if bad.any():
            raise VoxjetError(
                f"collection {coll.name!r}: its count branch {coll.count!r} says "
                f"{stated[bad][:3].tolist()} objects but {coll.features[0]!r} holds "
                f"{real[bad][:3].tolist()} for {int(bad.sum())} jets (entries "
                f"{entries[bad][:5].tolist()}{', …' if bad.sum() > 5 else ''}): the file's "
                f"branches disagree. Fix the file, or the collection's `count` (or drop it)"
            )
    n, f = len(kept), len(coll.features)
    padded = np.zeros((n, coll.length, f), np.float32)
    mask = np.arange(coll.length) < kept[:, None]
    padded[mask] = got["particles"]  # row-major: jet by jet, object by object
    return {coll.key: padded, coll.count_key: kept.astype(np.int32)}


def masks(counts, length: int):
    """[B, length] bool masks of each jet's real objects from their counts (torch or numpy)."""
    import torch

    if isinstance(counts, torch.Tensor):
        return torch.arange(length, device=counts.device) < counts[:, None]
    return np.arange(length) < np.asarray(counts)[:, None]


def model_inputs(batch: Mapping[str, Any], colls: list[dict], device) -> tuple:
    """The model's extra inputs from a batch: (x, mask) of every collection in order."""
    out = []
    for c in colls:
        x = batch[f"coll_{c['name']}"].to(device, non_blocking=True)
        out += [x, masks(batch[f"coll_{c['name']}_count"].to(device), x.shape[1])]
    return tuple(out)


def collection_sums(data: Mapping[str, np.ndarray], colls: list[Collection]) -> dict:
    """Count, sum and sum of squares of each collection's real objects (training statistics)."""
    out: dict = {}
    for c in colls:
        real = data[c.key][masks(data[c.count_key], c.length)]
        out[f"{c.key}_n"] = int(len(real))
        out[f"{c.key}_sum"] = real.sum(0, dtype=np.float64)
        out[f"{c.key}_sumsq"] = np.einsum("nf,nf->f", real, real, dtype=np.float64)
    return out


def empty_in_every_jet(data: list[dict], colls: list[Collection]) -> list[str]:
    """The collections no jet of a file's chunks has any object of (none read: none)."""
    if not data or not sum(len(d["labels"]) for d in data):
        return []
    return [c.name for c in colls if not any(d[c.count_key].any() for d in data)]
