"""Standardisation that one bad value cannot move: each input's centre is its median and its
scale the larger distance from it to the 16th or 84th percentile over the training split —
weaver-core's `auto` definition, so a weaver config's `auto` and voxjet's own inputs mean the
same — and the standardised inputs are clipped to ±CLIP (weaver's default for `auto`). A mean
and std are moved by a single 1e30 or by a feature's −999 "not computed" entries; percentiles
are not. Values declared missing (`jets.missing`) are left out of the statistics and given the
centre at training and prediction. Values far outside the percentiles (OUTLIER_SPREADS
spreads) are listed with their file and entries: sentinels and overflows a user should know of.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CLIP = 5.0
OUTLIER_SPREADS = 1000.0  # a value this many spreads from the median is listed as an outlier
SAMPLE = 1_000_000  # values of each input a shard job keeps for the percentiles
LISTED_ENTRIES = 5  # entries named a (feature, file)
DESCRIPTION = (f"median and the larger distance to the 16th/84th percentile over the training "
               f"split (weaver's auto), inputs clipped to ±{CLIP:g}")  # fmt: skip


def missing_values(features: Sequence[str], missing: Mapping[str, Any]) -> list[float | None]:
    """The declared "missing" value of each feature, in the features' order (None: none)."""
    return [None if missing.get(f) is None else float(missing[f]) for f in features]


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
