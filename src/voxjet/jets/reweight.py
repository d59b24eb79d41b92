"""weaver-core's reweighting (a data config's `weights:` section) as sampling weights.

Two forms, as weaver has them:
- histogram reweighting: each class's training jets are histogrammed in two jet-level variables
  (`reweight_vars`, e.g. jet_pt × jet_sdmass) and a weight a bin is derived — `flat` makes each
  class flat in the plane, `ref` makes every class look like the first — then the classes are
  equalised (times `class_weights`). The shard jobs store each jet's two values and histogram
  the training split; the index job turns the summed histograms into weight tables
  (`make_tables`, weaver's WeightMaker.make_weights without a base weight).
- precomputed weights (`use_precomputed_weights`): the product of `weight_branches` a jet.

The training stream draws each shuffle buffer's jets with probability proportional to their
weight, with replacement, as many as the buffer holds (weaver keeps a jet with probability w and
up-samples the survivors: the same distribution, but with a count that varies, which data-parallel
ranks cannot have). Validation and test jets are not reweighted: the metrics are those of the
sample as it is.

`reweight_classes` are label branches (a jet's class is its label), or, as CMS's configs have
them, any 0/1 branches or variables grouping the labels (`fj_isTop`, `fj_isQCD`): then a jet's
reweight class is the first of them it has set, stored beside its reweighting values, and a
training jet in none of them is refused (weaver would silently never train on it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from voxjet.errors import VoxjetError

KEYS = {"reweight_vars", "reweight_classes", "class_weights", "reweight_method",
        "reweight_threshold", "reweight_discard_under_overflow", "use_precomputed_weights",
        "weight_branches", "reweight_hists", "reweight_basewgt"}  # fmt: skip
METHODS = ("flat", "ref")


def parse(spec: Mapping[str, Any] | None, label_names: list[str], where: str) -> dict | None:
    """A weights section checked and completed: {"precomputed": bool, "vars": [names],
    "bins": [[edges], [edges]], "classes": [...], "class_weights", "method", "threshold",
    "discard_under_overflow", "hists" (given tables or None)}; None without reweighting.
    `label_names` are the label branches (one-hot) or class names the classes are called by."""
    if not spec:
        return None
    if not isinstance(spec, Mapping):
        raise VoxjetError(f"{where}: a mapping of weaver's weights keys, not {spec!r}")
    unknown = set(spec) - KEYS
    if unknown:
        raise VoxjetError(f"{where}: keys {sorted(unknown)} are not weaver weights keys "
                          f"(known: {sorted(KEYS)})")  # fmt: skip
    if spec.get("reweight_basewgt"):
        raise VoxjetError(f"{where}.reweight_basewgt: a base weight under the reweighting is "
                          "not supported; drop it, or fold it into weight_branches")  # fmt: skip
    if spec.get("use_precomputed_weights"):
        branches = spec.get("weight_branches")
        if not branches or not all(isinstance(b, str) for b in branches):
            raise VoxjetError(f"{where}.weight_branches: the branches whose product is each "
                              "jet's weight (use_precomputed_weights: true)")  # fmt: skip
        return {"precomputed": True, "vars": list(branches)}
    rv = spec.get("reweight_vars")
    if not isinstance(rv, Mapping) or len(rv) != 2:
        raise VoxjetError(f"{where}.reweight_vars: two variables with their bin edges, e.g. "
                          "{jet_pt: [500, 550, ..., 1000], jet_sdmass: [...]}")  # fmt: skip
    bins = []
    for name, edges in rv.items():
        e = np.asarray(edges, dtype=float) if isinstance(edges, list) else np.zeros(0)
        if e.ndim != 1 or len(e) < 2 or not np.all(np.diff(e) > 0) or not np.all(np.isfinite(e)):
            raise VoxjetError(f"{where}.reweight_vars.{name}: {edges!r} is no list of at least "
                              "two increasing bin edges")  # fmt: skip
        bins.append(e.tolist())
    classes = spec.get("reweight_classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise VoxjetError(f"{where}.reweight_classes: the label branches (or 0/1 branches "
                          "grouping them) to reweight")  # fmt: skip
    by_branches = any(c not in label_names for c in classes)
    left = [] if by_branches else [c for c in label_names if c not in classes]
    if left:
        # weaver gives such jets weight 0: a class the tagger is scored on but never sees
        raise VoxjetError(
            f"{where}.reweight_classes: {left} are labels but not reweighted, so their jets "
            "would get weight 0 and never be trained on; list every label"
        )
    cw = spec.get("class_weights")
    cw = [1.0] * len(classes) if cw is None else cw
    if (
        not isinstance(cw, list)
        or len(cw) != len(classes)
        or not all(isinstance(x, (int, float)) and x > 0 for x in cw)
    ):
        raise VoxjetError(f"{where}.class_weights: {len(classes)} positive numbers, one a "
                          "reweight class")  # fmt: skip
    method = spec.get("reweight_method", "flat")
    if method not in METHODS:
        raise VoxjetError(f"{where}.reweight_method {method!r}: one of {METHODS}")
    threshold = spec.get("reweight_threshold", 10)
    if not isinstance(threshold, (int, float)) or not 0 <= threshold < 100:
        raise VoxjetError(f"{where}.reweight_threshold {threshold!r}: a percentile in [0, 100)")
    hists = spec.get("reweight_hists")
    if hists is not None:
        shape = (len(bins[0]) - 1, len(bins[1]) - 1)
        if set(hists) != set(classes) or any(np.shape(h) != shape for h in hists.values()):
            raise VoxjetError(f"{where}.reweight_hists: a {shape[0]}×{shape[1]} table for each "
                              f"of {classes}")  # fmt: skip
    return {
        "precomputed": False,
        # reweight classes from their own 0/1 branches: each jet's class is a last column
        "by_branches": by_branches,
        "vars": list(rv),
        "bins": bins,
        "classes": list(classes),
        "class_weights": [float(x) for x in cw],
        "method": method,
        "threshold": float(threshold),
        "discard_under_overflow": bool(spec.get("reweight_discard_under_overflow", True)),
        "hists": {k: np.asarray(v, float).tolist() for k, v in hists.items()} if hists else None,
    }


def class_order(rw: dict, label_names: list[str]) -> list[int]:
    """Each reweight class's row in the counts and tables: its class number among the labels,
    or its position among reweight_classes when they are branches of their own."""
    if rw.get("by_branches"):
        return list(range(len(rw["classes"])))
    return [label_names.index(c) for c in rw["classes"]]


def class_names(rw: dict, label_names: list[str]) -> list[str]:
    """The names of the counts' and tables' rows."""
    return list(rw["classes"]) if rw.get("by_branches") else list(label_names)


def n_rows(rw: dict, n_classes: int) -> int:
    """Rows of the counts and tables: a label each, or a reweight class each."""
    return len(rw["classes"]) if rw.get("by_branches") else n_classes


def reweight_class(indicators: np.ndarray) -> np.ndarray:
    """Each jet's reweight class from its [N, k] 0/1 indicators: the first set, -1 if none."""
    hit = np.asarray(indicators) != 0
    return np.where(hit.any(1), hit.argmax(1), -1)


def _classes_of(values: np.ndarray, labels: np.ndarray, rw: dict) -> np.ndarray:
    return values[:, -1].astype(np.int64) if rw.get("by_branches") else np.asarray(labels)


def _bin_indices(values: np.ndarray, rw: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per jet: x bin, y bin and whether it is inside the plane (weaver clips to the edge bins
    and, with discard_under_overflow, gives jets outside weight 0)."""
    idx, inside = [], np.ones(len(values), bool)
    for k, edges in enumerate(rw["bins"]):
        v = values[:, k]
        inside &= (v >= edges[0]) & (v <= edges[-1])
        idx.append(np.clip(np.digitize(v, edges) - 1, 0, len(edges) - 2))
    if not rw["discard_under_overflow"]:
        inside[:] = True
    return idx[0], idx[1], inside


def empty_counts(rw: dict, n_classes: int) -> np.ndarray:
    """Zero counts [classes, nx, ny] of the reweighting plane."""
    return np.zeros(
        (n_rows(rw, n_classes), len(rw["bins"][0]) - 1, len(rw["bins"][1]) - 1), np.float64
    )


def histograms(values: np.ndarray, labels: np.ndarray, rw: dict, n_classes: int) -> np.ndarray:
    """Counts [classes, nx, ny] of jets in the reweighting plane (by class number)."""
    counts = empty_counts(rw, n_classes)
    ix, iy, inside = _bin_indices(values, rw)
    cls = _classes_of(values, labels, rw)
    inside &= cls >= 0
    np.add.at(counts, (cls[inside], ix[inside], iy[inside]), 1)
    return counts


def make_tables(counts: np.ndarray, rw: dict, label_names: list[str]) -> np.ndarray:
    """Weight tables [classes, nx, ny] from the training split's counts (weaver's
    make_weights): `flat` or `ref` a class, then the classes equalised, times class_weights."""
    order = class_order(rw, label_names)
    label_names = class_names(rw, label_names)
    tables = np.zeros_like(counts)
    events = {}
    ref_hist = counts[order[0]]
    for c, cw in zip(order, rw["class_weights"], strict=True):
        hist = counts[c]
        if hist.sum() == 0:
            raise VoxjetError(
                f"weights: class {label_names[c]!r} has no training jet inside the reweighting "
                f"plane {dict(zip(rw['vars'], rw['bins'], strict=True))}; widen the bins or "
                "check the class's files"
            )
        with np.errstate(divide="ignore", invalid="ignore"):
            if rw["method"] == "flat":
                nonzero = hist[hist > np.median(hist[hist > 0]) * 0.01]
                ref = np.percentile(nonzero, rw["threshold"])
                w = np.clip(np.nan_to_num(ref / hist, posinf=0), 0, 1)
            else:
                ratio = np.nan_to_num(ref_hist / hist, posinf=0)
                if not (ratio > 0).any():
                    raise VoxjetError(
                        f"weights: class {label_names[c]!r} shares no bin of the plane with the "
                        f"reference class {label_names[order[0]]!r} (reweight_method: ref)"
                    )
                upper = np.percentile(ratio[ratio > 0], 100 - rw["threshold"])
                w = np.clip(ratio / upper, 0, 1)
        tables[c] = w
        events[c] = float((hist * w).sum()) / cw
    low = min(events.values())
    for c in order:
        tables[c] *= low / events[c]
    return tables


def tables_of(rw: dict, counts: np.ndarray, label_names: list[str]) -> np.ndarray:
    """The tables given in the config (reweight_hists), else made from the counts."""
    if rw.get("hists"):
        tables = np.zeros_like(counts)
        for c, name in zip(class_order(rw, label_names), rw["classes"], strict=True):
            tables[c] = np.asarray(rw["hists"][name])
        return tables
    return make_tables(counts, rw, label_names)


def jet_weights(values: np.ndarray, labels: np.ndarray, rw: dict, tables: np.ndarray | None
                ) -> np.ndarray:  # fmt: skip
    """Each jet's sampling weight: its class's table at its bin (0 outside the plane when
    under/overflow is discarded), or the product of its precomputed weight branches."""
    if rw["precomputed"]:
        w = np.prod(values.astype(np.float64), axis=1)
    else:
        ix, iy, inside = _bin_indices(values, rw)
        cls = _classes_of(values, labels, rw)
        w = np.where(inside & (cls >= 0), tables[np.maximum(cls, 0), ix, iy], 0.0)
    return w


def resample(weights: np.ndarray, rng: np.random.Generator, where: str) -> np.ndarray:
    """As many rows as there are weights, drawn with replacement with probability ∝ weight."""
    w = np.asarray(weights, np.float64)
    total = w.sum()
    if not np.isfinite(total) or total <= 0 or (w < 0).any():
        raise VoxjetError(
            f"{where}: the jets' sampling weights are all zero, negative or not finite "
            "(jets.weights); check the reweighting variables' bins or the weight branches"
        )
    return rng.choice(len(w), size=len(w), p=w / total)
