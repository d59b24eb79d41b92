"""A sweep's runs onto a GPU budget: every run at the same size n, the runs scheduled longest
first onto the budget's n-GPU slots (experiment parallelism at n = 1, data parallelism as n
grows); the n with the shortest makespan wins, ties going to fewer device-hours."""

from __future__ import annotations

import heapq
import json
import os
from typing import Any

from voxjet.errors import VoxjetError


def makespan(durations: list[float], slots: int) -> float:
    """Longest-first list scheduling of runs of `durations` seconds on `slots` slots."""
    if slots < 1:
        return float("inf")
    loads = [0.0] * slots
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(loads, loads[0] + d)
    return max(loads)


def allocate(times: dict[str, dict[int, float]], budget: int) -> dict[str, Any]:
    """`times`: per run, seconds to its steps at each size it can run at (processes). The size
    for all of them and the predicted makespan and device-hours of every size considered."""
    sizes = sorted(set.intersection(*(set(t) for t in times.values()))) if times else []
    options = []
    for n in sizes:
        if n > budget:
            continue
        durations = [t[n] for t in times.values()]
        options.append({
            "processes": n,
            "slots": budget // n,
            "makespan_s": makespan(durations, budget // n),
            "device_hours": sum(durations) * n / 3600,
        })  # fmt: skip
    if not options:
        return {"budget": budget, "choice": None, "options": []}
    best = min(options, key=lambda o: (round(o["makespan_s"], 6), o["device_hours"]))
    return {"budget": budget, "choice": best["processes"], "options": options}


def allocation_choice(plan_json: str | os.PathLike) -> int:
    """GPUs a run of the planner's sweep allocation (results/plan/runs.json)."""
    with open(plan_json) as f:
        choice = (json.load(f).get("allocation") or {}).get("choice")
    if not choice:
        raise VoxjetError(f"{plan_json}: no allocation (is site.gpu_budget set?); give "
                          "launch.gpus a number or rerun plan_runs")  # fmt: skip
    return int(choice)
