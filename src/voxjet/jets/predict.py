"""Apply a trained tagger to ROOT files it has never seen (weaver's `--predict`): one output
file a input file, the same tree with the same entries in the same order, branches
`score_<class>` and a flag, plus observer branches copied through. The features and their
standardisation come from the model (model.pt carries the jets config it was trained with), so
files that were never sharded — without label branches — can be scored. Files are read in
steps of `step_size` entries: memory does not grow with the file.

A jet that fails the model's selection, or whose input branches hold NaN/inf, keeps its row:
its scores are SCORE_NOT_SCORED and `selected` says why (SELECTED / FAILED_SELECTION /
NOT_FINITE); no row is ever dropped or shifted."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import awkward as ak
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path
from voxjet.jets.features import branches_needed, compute_features, select, variables
from voxjet.jets.tagger import Tagger, score

SCORE_NOT_SCORED = -1.0
SELECTED, FAILED_SELECTION, NOT_FINITE = 1, 0, -1


def _finite_jets(arrays: ak.Array) -> np.ndarray:
    """Per jet: every branch read is finite."""
    ok = np.ones(len(arrays), bool)
    for name in arrays.fields:
        col = arrays[name]
        if col.ndim > 1:
            bad = ak.to_numpy(ak.any(~np.isfinite(col), axis=1))
        else:
            vals = ak.to_numpy(col)
            bad = ~np.isfinite(vals) if vals.dtype.kind == "f" else np.zeros(len(vals), bool)
        ok &= ~np.asarray(bad, bool)
    return ok


def _observer(arrays: ak.Array, name: str, path: Path) -> np.ndarray:
    col = arrays[name]
    if col.ndim > 1:
        raise VoxjetError(f"{path}: observer {name!r} has one value a particle; observers are "
                          "per-jet branches")  # fmt: skip
    return np.asarray(ak.to_numpy(col))


def scored_chunks(
    tagger: Tagger, path: Path, observers: list[str], step_size: int, batch: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """The output columns of a ROOT file, step by step, every entry in order."""
    import uproot

    cfg = tagger.data
    # new data is selected as the test split was (weaver's test_time_selection, if given)
    v = variables(cfg["new_variables"], cfg.get("test_time_selection") or cfg["selection"])
    need = branches_needed(v, cfg["particle_features"], cfg["jet_features"], cfg["sort_by"])
    try:
        f = uproot.open(path)
    except Exception as e:
        raise VoxjetError(f"{path}: cannot open as ROOT ({e})") from e
    with f:
        if cfg["tree"] not in f:
            found = sorted({k.split(";")[0] for k in f.keys()})
            raise VoxjetError(f"{path}: no tree {cfg['tree']!r} (found {found}); the model "
                              f"{tagger.path} was trained on tree {cfg['tree']!r}")  # fmt: skip
        tree = f[cfg["tree"]]
        missing = [b for b in [*need, *observers] if b not in tree]
        if missing:
            raise VoxjetError(
                f"{path}: tree {cfg['tree']!r} lacks the branches {missing} that the model's "
                f"features (or the observers asked for) need; the model {tagger.path} reads "
                f"{need}"
            )
        for arrays in tree.iterate([*need, *observers], step_size=step_size, library="ak"):
            n = len(arrays)
            flag = np.full(n, FAILED_SELECTION, np.int8)
            keep = select(arrays[need] if need else arrays, v)
            keep = np.ones(n, bool) if keep is None else np.asarray(keep, bool)
            finite = _finite_jets(arrays[need])
            flag[keep & finite] = SELECTED
            flag[keep & ~finite] = NOT_FINITE
            scores = np.full((n, len(tagger.classes)), SCORE_NOT_SCORED, np.float32)
            chosen = flag == SELECTED
            if chosen.any():
                feats = compute_features(arrays[need][chosen], v, cfg["particle_features"],
                                         cfg["jet_features"], cfg["max_particles"],
                                         cfg["sort_by"])  # fmt: skip
                scores[chosen] = score(tagger, feats, batch)
            out = {f"score_{c}": scores[:, i] for i, c in enumerate(tagger.classes)}
            out["selected"] = flag
            for name in observers:
                out[name] = _observer(arrays, name, path)
            yield out


def predict_file(
    tagger: Tagger,
    path: str | os.PathLike,
    out_path: str | os.PathLike,
    observers: list[str] = (),
    step_size: int = 50_000,
    batch: int | None = None,
) -> dict[str, int]:
    """Score one ROOT file into `out_path` (same tree name, entries and order); written under a
    temporary name, so a killed job leaves no output that looks complete."""
    import uproot

    path, out_path = Path(path), Path(out_path)
    counts = {"entries": 0, "scored": 0, "failed_selection": 0, "not_finite": 0}
    # the dataset's observers (a weaver config's) first, then the ones asked for here
    observers = list(dict.fromkeys([*(tagger.data.get("observers") or []), *observers]))
    with atomic_path(out_path) as tmp:
        with uproot.recreate(tmp) as fout:
            tree = None
            for cols in scored_chunks(tagger, path, observers, step_size, batch):
                if tree is None:
                    tree = fout.mktree(tagger.tree, {k: v.dtype for k, v in cols.items()})
                tree.extend(cols)
                flag = cols["selected"]
                counts["entries"] += len(flag)
                counts["scored"] += int((flag == SELECTED).sum())
                counts["failed_selection"] += int((flag == FAILED_SELECTION).sum())
                counts["not_finite"] += int((flag == NOT_FINITE).sum())
            if tree is None:  # an empty tree: an empty output tree with the same branches
                names = [f"score_{c}" for c in tagger.classes]
                fout.mktree(tagger.tree, {**dict.fromkeys(names, np.float32), "selected": np.int8})
    print(
        f"{path} -> {out_path}: {counts['entries']} entries, {counts['scored']} scored, "
        f"{counts['failed_selection']} failed the selection, {counts['not_finite']} with "
        "NaN/inf inputs",
        file=sys.stderr,
    )
    return counts
