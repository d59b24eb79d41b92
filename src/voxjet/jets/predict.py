"""Apply a trained tagger to ROOT files it has never seen (weaver's `--predict`): one output
file a input file, the same tree with the same entries in the same order, branches
`score_<class>`, for a model with targets `pred_<target>` (a regression, in its units) or
`pred_<target>_<class>` (a classification's probabilities), and a flag, plus observer branches
copied through. The features and their
standardisation come from the model (model.pt carries the jets config it was trained with), so
files that were never sharded — without label branches — can be scored. Files are read in
steps of `step_size` entries: memory does not grow with the file.

A jet that fails the model's selection, or whose input branches hold NaN/inf, keeps its row:
its scores (and target outputs) are SCORE_NOT_SCORED and `selected` says why (SELECTED /
FAILED_SELECTION / NOT_FINITE); no row is ever dropped or shifted."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import awkward as ak
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path
from voxjet.io.trees import tree_names, tree_with
from voxjet.jets.collections import collection_arrays, collection_inputs, parse_collections
from voxjet.jets.features import branches_needed, compute_features, select, variables
from voxjet.jets.tagger import Tagger, infer

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


def input_tree(f, path: Path, tagger: Tagger, need: list[str], tree: str | None) -> str:
    """The tree of `f` to score: the one named, else the training files' tree where it holds
    every branch needed, else the one tree that does (none or several: an error)."""
    fix = "name it with voxjet predict --tree NAME (predict.<name>.tree in the config)"
    if tree is not None:
        if tree not in f:
            raise VoxjetError(f"{path}: no tree {tree!r} (found {tree_names(f)}); {fix}")
        return tree
    trained = tagger.tree
    if trained in f and all(b in f[trained] for b in need):
        return trained
    holding = [n for n in tree_names(f) if all(b in f[n] for b in need)]
    if not holding and trained in f:
        return trained  # its own message names the branches it lacks
    return tree_with(f, need, f"{path} (the model {tagger.path} was trained on tree "
                     f"{trained!r})", fix)  # fmt: skip


def scored_chunks(
    tagger: Tagger, path: Path, observers: list[str], step_size: int, batch: int | None,
    tree_name: str | None = None, found: dict | None = None,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """The output columns of a ROOT file's tree (TTree or RNTuple), step by step, every entry
    in order; `found` gets the tree's name and whether it is an RNTuple."""
    import uproot

    cfg = tagger.data
    # new data is selected as the test split was (weaver's test_time_selection, if given)
    v = variables(cfg.new_variables, cfg.test_time_selection or cfg.selection)
    need = branches_needed(v, cfg.particle_features, cfg.jet_features, cfg.sort_by)
    colls = parse_collections(cfg.collections)
    more = v.branches(collection_inputs(colls)) + [c.count for c in colls if c.count]
    need += [b for b in dict.fromkeys(more) if b not in need]
    try:
        f = uproot.open(path)
    except Exception as e:
        raise VoxjetError(f"{path}: cannot open as ROOT ({e})") from e
    with f:
        name = input_tree(f, path, tagger, need, tree_name)
        tree = f[name]
        if found is not None:
            found.update(name=name, rntuple="RNTuple" in f.classname_of(name))
        missing = [b for b in [*need, *observers] if b not in tree]
        if missing:
            raise VoxjetError(
                f"{path}: tree {name!r} lacks the branches {missing} that the model's "
                f"features (or the observers asked for) need; the model {tagger.path} reads "
                f"{need}"
            )
        start = 0  # the entry this step begins at (for messages)
        for arrays in tree.iterate([*need, *observers], step_size=step_size, library="ak"):
            n = len(arrays)
            flag = np.full(n, FAILED_SELECTION, np.int8)
            keep = select(arrays[need] if need else arrays, v)
            keep = np.ones(n, bool) if keep is None else np.asarray(keep, bool)
            finite = _finite_jets(arrays[need])
            flag[keep & finite] = SELECTED
            flag[keep & ~finite] = NOT_FINITE
            scores = np.full((n, len(tagger.classes)), SCORE_NOT_SCORED, np.float32)
            regressed = np.full((n, len(tagger.target_names)), SCORE_NOT_SCORED, np.float32)
            chosen = flag == SELECTED
            if chosen.any():
                jets = arrays[need][chosen]
                feats = compute_features(jets, v, cfg.particle_features, cfg.jet_features,
                                         cfg.max_particles, cfg.sort_by)  # fmt: skip
                for c in colls:  # as the shard job made them for training
                    rows = np.flatnonzero(chosen) + start
                    feats.update(collection_arrays(jets, v, c, rows))
                scores[chosen], regressed[chosen] = infer(tagger, feats, batch)
            out = {f"score_{c}": scores[:, i] for i, c in enumerate(tagger.classes)}
            # the targets' outputs, beside the scores
            out.update({f"pred_{t}": regressed[:, i] for i, t in enumerate(tagger.target_names)})
            out["selected"] = flag
            for obs in observers:
                out[obs] = _observer(arrays, obs, path)
            start += n
            yield out


CHECKED_ROWS = 1000  # rows of each output column read back before the output is kept


def _check_written(tmp: Path, tree: str, first: dict[str, np.ndarray], out_path: Path) -> None:
    """The first rows of every column, read back from the written file, equal what was
    written: a writer that misplaces columns must not leave scores under the wrong class."""
    import uproot

    n = min(len(v) for v in first.values())
    with uproot.open(tmp) as f:
        back = f[tree].arrays(list(first), entry_stop=n, library="np")
    bad = [k for k, v in first.items() if not np.array_equal(np.asarray(back[k]), v[:n])]
    if bad:
        raise VoxjetError(
            f"{out_path}: the columns {bad} read back differ from what was written (the ROOT "
            "writer misplaced them); nothing was kept. Convert the input to a TTree, or update "
            "uproot"
        )


def predict_file(
    tagger: Tagger,
    path: str | os.PathLike,
    out_path: str | os.PathLike,
    observers: list[str] = (),
    step_size: int = 50_000,
    batch: int | None = None,
    tree_name: str | None = None,
) -> dict[str, int]:
    """Score one ROOT file into `out_path` (same tree name, entries and order, a TTree for a
    TTree and an RNTuple for an RNTuple); written under a temporary name, so a killed job
    leaves no output that looks complete."""
    import uproot

    path, out_path = Path(path), Path(out_path)
    counts = {"entries": 0, "scored": 0, "failed_selection": 0, "not_finite": 0}
    # the dataset's observers (a weaver config's) first, then the ones asked for here
    observers = list(dict.fromkeys([*tagger.data.observers, *observers]))
    with atomic_path(out_path) as tmp:
        with uproot.recreate(tmp) as fout:
            tree, found, first = None, {}, None
            chunks = scored_chunks(tagger, path, observers, step_size, batch, tree_name, found)
            for cols in chunks:
                if found["rntuple"]:
                    # uproot 5.7's RNTuple writer puts fields given out of alphabetical order
                    # into each other's columns: names sorted, and the result read back below
                    cols = {k: cols[k] for k in sorted(cols)}
                if tree is None:
                    make = fout.mkrntuple if found["rntuple"] else fout.mktree
                    tree = make(found["name"], {k: v.dtype for k, v in cols.items()})
                    first = {k: v[:CHECKED_ROWS].copy() for k, v in cols.items()}
                tree.extend(cols)
                flag = cols["selected"]
                counts["entries"] += len(flag)
                counts["scored"] += int((flag == SELECTED).sum())
                counts["failed_selection"] += int((flag == FAILED_SELECTION).sum())
                counts["not_finite"] += int((flag == NOT_FINITE).sum())
            if tree is None:  # an empty tree: an empty output tree with the same branches
                names = [f"score_{c}" for c in tagger.classes]
                names += [f"pred_{t}" for t in tagger.target_names]
                make = fout.mkrntuple if found.get("rntuple") else fout.mktree
                make(found.get("name", tagger.tree),
                     {**dict.fromkeys(names, np.float32), "selected": np.int8})  # fmt: skip
        if first is not None:
            _check_written(tmp, found["name"], first, out_path)
    print(
        f"{path} -> {out_path}: {counts['entries']} entries, {counts['scored']} scored, "
        f"{counts['failed_selection']} failed the selection, {counts['not_finite']} with "
        "NaN/inf inputs",
        file=sys.stderr,
    )
    return counts
