"""What failed, said last: after a failed `snakemake`, each failed job's own voxjet message
(from its log) is printed at the end of the console, below Snakemake's job blocks, logs and
torchrun's reports, so the user reads what went wrong and its fix without scrolling."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

Logs = str | os.PathLike | Sequence[str | os.PathLike]  # what Snakemake gives onerror: `log`
_FAILED = re.compile(r"^Error in rule (\w+):\n(?:    .*\n)*?    log: (\S+)", re.M)


def failed_jobs(snakemake_logs: Logs) -> list[tuple[str, str]]:
    """(rule, job log) of every failed job Snakemake's log(s) report, in order, once each."""
    paths = [snakemake_logs] if isinstance(snakemake_logs, (str, os.PathLike)) else snakemake_logs
    text = "".join(Path(p).read_text(errors="replace") for p in paths if Path(p).is_file())
    return list(dict.fromkeys((m[1], m[2]) for m in _FAILED.finditer(text)))


def last_message(job_log: str | os.PathLike) -> str | None:
    """The last voxjet error a job's log holds (a launcher's summary of its processes'
    errors counts as one), or None."""
    path = Path(job_log)
    if not path.is_file():
        return None
    found = None
    for line in path.read_text(errors="replace").splitlines():
        if (line.startswith("voxjet ") and ": error:" in line) or line.startswith("launch: rank"):
            found = line
    return found


def failure_summary(snakemake_logs: Logs) -> list[str]:
    """One line a failed job: its rule, its log and its voxjet message."""
    lines = []
    for rule, log in failed_jobs(snakemake_logs):
        message = last_message(log) or "no voxjet message; see the log"
        lines.append(f"voxjet: {rule} failed ({log}): {message}")
    return lines
