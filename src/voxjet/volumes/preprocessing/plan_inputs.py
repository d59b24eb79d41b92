"""What a case file takes from its dataset's planning besides its own files, as a digest: the
case files record it, gather_cases compares it, and the dry run reads it without loading the
preprocessing (voxjet.workflow.cases)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from voxjet.io.atomic import read_json
from voxjet.volumes.plan.plan_file import Plan, read_configured


def plan_inputs(plan: Plan, fp: dict, skipped: str | None = None) -> dict:
    """What a case file takes from its dataset's planning (besides its own files): the plan's
    spacing, patch (the chunking), classes, storage and normalisation, the foreground intensity
    statistics of the channels normalised with them (CT), and whether the case was set aside."""
    stats = fp.get("foreground_intensity_per_channel") or [fp.get("foreground_intensity")]
    return {
        "target_spacing": plan.target_spacing,
        "patch_size": plan.patch_size,
        "num_classes": plan.num_classes,
        "ignore_label": plan.ignore_label,
        "normalization": plan.normalization,
        "storage": plan.storage.get("store", plan.config.get("storage")),
        "config": {k: plan.config.get(k) for k in ("seed", "foreground_samples", "storage")},
        "ct": [
            stats[c] if s == "ct" and c < len(stats) else None
            for c, s in enumerate(plan.normalization)
        ],  # fmt: skip
        "skipped": skipped,
    }


def plan_inputs_digest(plan: Plan, fp: dict, skipped: str | None = None) -> str:
    """A short digest of plan_inputs: equal for two plans that make the same case file."""
    text = json.dumps(plan_inputs(plan, fp, skipped), sort_keys=True, default=float)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_planning(plan_dir: str | os.PathLike, configuration: str) -> tuple[Plan, dict, dict]:
    """A planning folder's plan (of one configuration), fingerprint and skipped cases."""
    plan_dir = Path(plan_dir)
    plan = read_configured(str(plan_dir), configuration)
    return plan, read_json(plan_dir / "fingerprint.json"), read_json(plan_dir / "skipped.json")
