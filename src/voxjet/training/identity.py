"""What makes a run the same run: the settings that change its trajectory (model, data,
optimiser, schedule shape, seed, world size), not those that only extend it (`steps`) or watch
it (logging, validation and checkpoint intervals, read-ahead). A checkpoint of the same run is
resumed, also after `steps` was raised; any other is moved aside, never deleted."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

# train: keys that do not change what the run computes, step for step
NOT_TRAJECTORY = (
    "steps",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "prefetch",
    "compile",
)  # compiled or not: the same step to float rounding
COMPLETE = "complete.json"  # written beside the checkpoints once model.pt is written


def trajectory_settings(settings: Any) -> dict[str, Any]:
    """The training settings that decide the trajectory (a dataclass or a dict)."""
    d = asdict(settings) if not isinstance(settings, dict) else dict(settings)
    if d.get("data_parallel") == "ddp":  # the default, left out: runs from before it resume
        del d["data_parallel"]
    return {k: v for k, v in d.items() if k not in NOT_TRAJECTORY}


def run_fingerprint(settings: Any, model_config: dict, data_config: dict, world_size: int) -> str:
    """A short hash of everything a checkpoint must share with the run to be resumed."""
    blob = json.dumps(
        [trajectory_settings(settings), model_config, data_config, world_size],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def refusal(state: dict | None, fingerprint: str, steps: int, ckpt_dir: Path) -> str | None:
    """Why the checkpoint `state` cannot be resumed by this run (None: it can, or there is
    none). A checkpoint at the final step of a run that completed (model.pt was written) is a
    forced rerun (`snakemake -R`, `--forcerun`): it starts afresh; one short of `steps`
    continues — an interrupted run, or one whose `steps` was raised."""
    if state is None:
        return None
    if state.get("fingerprint") != fingerprint:
        return (
            "it belongs to a different run configuration (model, data, optimiser, schedule, "
            "seed or number of processes changed)"
        )
    if state["step"] > steps:
        return f"it is at step {state['step']}, past train.steps={steps} (a run is not shortened)"
    if state["step"] == steps and _completed_at(ckpt_dir) == steps:
        return "the run completed and its outputs were removed: a forced rerun trains afresh"
    return None


def _completed_at(ckpt_dir: Path) -> int | None:
    try:
        return int(json.loads((ckpt_dir / COMPLETE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def move_aside(ckpt_dir: Path) -> Path:
    """Rename the checkpoint folder out of the way (kept for the user) and return its new name."""
    dest = ckpt_dir.with_name(f"{ckpt_dir.name}.refused-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while dest.exists():
        dest = dest.with_name(f"{dest.name.split('~')[0]}~{n}")
        n += 1
    ckpt_dir.rename(dest)
    return dest
