"""Standardisation that one bad value cannot move: each input's centre is its median and its
scale the larger distance from it to the 16th or 84th percentile over the training split —
weaver-core's `auto` definition, so a weaver config's `auto` and voxjet's own inputs mean the
same — and the standardised inputs are clipped to ±CLIP (weaver's default for `auto`). A mean
and std are moved by a single 1e30 or by a feature's −999 "not computed" entries; percentiles
are not. Values declared missing (`jets.missing`) are left out of the statistics and given the
centre at training and prediction. An undeclared sentinel is found too (`find_sentinel`): a
value that a feature holds in more than SENTINEL_SHARE of its training values, beyond every
other value it takes, where those others are continuous (−999 for neutral particles' Δη, 0 for
a positive feature "not computed", 1e30): named with its share and, unless the dataset says
otherwise (`jets.sentinels`), treated as declared. Values far outside the percentiles
(OUTLIER_SPREADS spreads) are listed with their file and entries: overflows a user should know
of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CLIP = 5.0
OUTLIER_SPREADS = 1000.0  # a value this many spreads from the median is listed as an outlier
SAMPLE = 1_000_000  # values of each input a shard job keeps for the percentiles
SENTINEL_SHARE = 0.02  # a value this common at an edge of a continuous feature is a sentinel
LISTED_ENTRIES = 5  # entries named a (feature, file)
DESCRIPTION = (f"median and the larger distance to the 16th/84th percentile over the training "
               f"split (weaver's auto), inputs clipped to ±{CLIP:g}")  # fmt: skip


def missing_values(features: Sequence[str], missing: Mapping[str, Any]) -> list[float | None]:
    """The declared "missing" value of each feature, in the features' order (None: none)."""
    return [None if missing.get(f) is None else float(missing[f]) for f in features]


def find_sentinel(column: np.ndarray) -> tuple[float, float] | None:
    """(value, share) of a column's sentinel, or None: its most common value, held by at least
    SENTINEL_SHARE of the values, below or above every other value, the others mostly distinct
    (a flag's 0/1 or an integer count is not continuous: no sentinel)."""
    col = column[np.isfinite(column)]
    if len(col) < 100:
        return None
    values, counts = np.unique(col, return_counts=True)
    k = int(counts.argmax())
    share = counts[k] / len(col)
    if share < SENTINEL_SHARE or len(values) < 3:
        return None
    value = values[k]
    rest = len(col) - counts[k]
    at_edge = k in (0, len(values) - 1)
    continuous = len(values) - 1 >= 0.5 * rest
    return (float(value), float(share)) if at_edge and continuous else None


def sentinels(sample: np.ndarray, names: Sequence[str], declared: Sequence[float | None],
              kind: str) -> dict[str, dict]:  # fmt: skip
    """{feature: {value, share, input}} of the undeclared sentinels in a [N, F] sample."""
    found = {}
    for j, name in enumerate(names):
        if j < len(declared) and declared[j] is not None:
            continue
        hit = find_sentinel(sample[:, j].astype(np.float64))
        if hit is not None:
            found[name] = {"value": hit[0], "share": hit[1], "input": kind}
    return found


def with_sentinels(
    names: Sequence[str], declared: Sequence[float | None], found: Mapping[str, Mapping]
) -> list[float | None]:
    """The declared missing values with the sentinels found added."""
    return [found[n]["value"] if n in found else (declared[j] if j < len(declared) else None)
            for j, n in enumerate(names)]  # fmt: skip


def describe_sentinels(found: Mapping[str, Mapping], treat: str) -> list[str]:
    """One line a sentinel: the feature, the value, its share and what is done with it."""
    done = {"replace": "left out of its statistics and given its centre",
            "keep": "kept as an ordinary value (jets.sentinels: keep)"}  # fmt: skip
    done = done.get(treat, "refused")
    return [f"{name} = {item['value']:g} in {item['share']:.1%} of its training values, below "
            f"or above all its others: a sentinel (\"not computed\"?), {done}"
            for name, item in sorted(found.items())]  # fmt: skip


def centre_and_spread(values: np.ndarray, missing: Sequence[float | None] = ()) -> tuple:
    """Per column of [N, F] `values`: the median and the larger distance from it to the 16th or
    84th percentile (1 where that is 0), missing and non-finite values left out."""
    f = values.shape[1] if values.ndim == 2 else 0
    centre, spread = np.zeros(f), np.ones(f)
    for j in range(f):
        col = values[:, j].astype(np.float64)
        keep = np.isfinite(col)
        if j < len(missing) and missing[j] is not None:
            keep &= col != missing[j]
        col = col[keep]
        if not len(col):
            continue
        low, mid, high = np.percentile(col, [16, 50, 84])
        centre[j] = mid
        gap = max(high - mid, mid - low)
        spread[j] = gap if gap > 0 else 1.0
    return centre, spread


class Sample:
    """A uniform sample (about SAMPLE rows a shard job) of the training split's rows of one
    input array (particles, or a collection's real objects)."""

    def __init__(self, total: int, seed: Sequence[int]) -> None:
        self.keep = min(1.0, SAMPLE / max(total, 1))
        self.rng = np.random.default_rng(list(seed))
        self.parts: list[np.ndarray] = []

    def add(self, rows: np.ndarray) -> None:
        """Take the sample's share of these rows."""
        self.parts.append(rows[self.rng.random(len(rows)) < self.keep])

    def array(self, width: int) -> np.ndarray:
        """The sample so far, [n, width]."""
        return np.concatenate(self.parts) if self.parts else np.zeros((0, width), np.float32)


def outliers(values: np.ndarray, centre: np.ndarray, spread: np.ndarray,
             missing: Sequence[float | None] = ()) -> np.ndarray:  # fmt: skip
    """[N, F] mask: values more than OUTLIER_SPREADS spreads from the centre (declared missing
    values are not outliers)."""
    far = np.abs(values.astype(np.float64) - centre) > OUTLIER_SPREADS * spread
    for j, m in enumerate(missing):
        if m is not None:
            far[:, j] &= values[:, j] != m
    return far


def add_outliers(report: dict, kind: str, names: Sequence[str], values: np.ndarray,
                 far: np.ndarray, entries: np.ndarray, file: str) -> None:  # fmt: skip
    """Add one file's outliers of an input array to `report` ({feature: {count, worst, files:
    {file: [entries]}}}); `entries` is each row's entry in the file."""
    for j in np.flatnonzero(far.any(0)):
        rows = np.flatnonzero(far[:, j])
        item = report.setdefault(names[j], {"input": kind, "count": 0, "worst": None, "files": {}})
        item["count"] += len(rows)
        worst = values[rows, j][np.argmax(np.abs(values[rows, j].astype(np.float64)))]
        if item["worst"] is None or abs(float(worst)) > abs(item["worst"]):
            item["worst"] = float(worst)
        listed = item["files"].setdefault(file, [])
        room = LISTED_ENTRIES - len(listed)
        listed += [int(e) for e in dict.fromkeys(entries[rows].tolist())][:room]


def merge_outliers(reports: Sequence[Mapping[str, Any]]) -> dict:
    """The shard jobs' outlier reports as one."""
    out: dict = {}
    for r in reports:
        for name, item in r.items():
            mine = out.setdefault(name, {"input": item["input"], "count": 0, "worst": None,
                                         "files": {}})  # fmt: skip
            mine["count"] += item["count"]
            if mine["worst"] is None or abs(item["worst"]) > abs(mine["worst"]):
                mine["worst"] = item["worst"]
            for f, entries in item["files"].items():
                mine["files"].setdefault(f, []).extend(entries)
    return out


def describe_outliers(report: Mapping[str, Any], totals: Mapping[str, int]) -> list[str]:
    """One line an input: how many values lie far out, the worst, where."""
    lines = []
    for name, item in sorted(report.items()):
        n = totals.get(item["input"], 0)
        where = "; ".join(f"{f} entries {e}" for f, e in list(item["files"].items())[:3])
        share = f" ({item['count'] / n:.2%} of its values)" if n else ""
        lines.append(
            f"{name}: {item['count']} value(s){share} more than {OUTLIER_SPREADS:g} spreads "
            f"from its median, the worst {item['worst']:g}, in {where}"
        )
    return lines
