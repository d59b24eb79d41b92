"""What a training job learns from SLURM about its own allocation: the nodes, and the time left.

Snakemake's SLURM jobstep strips most `SLURM_*` variables from a rule's environment but keeps
`SLURM_JOB_ID`, so the allocation is asked of `squeue`/`scontrol` rather than read from
`SLURM_NNODES` or `SLURM_JOB_NODELIST`.
"""

from __future__ import annotations

import os
import re
import subprocess

from voxjet.errors import VoxjetError


def job_id() -> str | None:
    """The SLURM job this process runs in, or None outside SLURM."""
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or None


def _query(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise VoxjetError(f"`{' '.join(argv)}` failed ({e}); is SLURM on PATH here?") from e
    if done.returncode != 0:
        raise VoxjetError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def job_nodes(job: str) -> list[str]:
    """Host names of the job's nodes, first node first (`squeue` then `scontrol show hostnames`)."""
    nodelist = _query(["squeue", "-h", "-j", job, "-o", "%N"]).strip()
    if not nodelist:
        raise VoxjetError(f"squeue lists no nodes for SLURM job {job}")
    hosts = _query(["scontrol", "show", "hostnames", nodelist]).split()
    if not hosts:
        raise VoxjetError(f"scontrol could not expand the node list {nodelist!r} of job {job}")
    return hosts


_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(?:(\d+):)?(\d+)$")


def parse_slurm_duration(text: str) -> float | None:
    """Seconds in a SLURM duration (`D-HH:MM:SS`, `HH:MM:SS`, `MM:SS`); None when unlimited."""
    text = text.strip()
    if text.upper() in {"UNLIMITED", "NOT_SET", "INVALID", ""}:
        return None
    m = _TIME.match(text)
    if not m:
        raise VoxjetError(f"cannot read the SLURM duration {text!r}")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    # SLURM writes MM:SS, HH:MM:SS or D-HH:MM:SS; a bare number with a day part is hours
    if days is not None and len(parts) == 1:
        parts = [parts[0], 0, 0]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, mnt, s = parts
    return float(((int(days or 0) * 24 + h) * 60 + mnt) * 60 + s)


def time_left_s(job: str) -> float | None:
    """Seconds until the job's time limit (`squeue -o %L`), or None when it has none."""
    return parse_slurm_duration(_query(["squeue", "-h", "-j", job, "-o", "%L"]))


def stop_delay_s(time_left: float, margin: float) -> float:
    """When to checkpoint and stop: `margin` seconds before the limit, never before half of the
    time left (a job shorter than the margin still trains for a while)."""
    return max(time_left - margin, 0.5 * time_left)
