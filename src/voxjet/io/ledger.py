"""A ledger entry a workflow output: what tells Snakemake that results built from an output
are stale once the job that made it failed.

Snakemake removes a failed job's outputs and keeps everything built from them earlier; a job
whose output is missing reruns only when something downstream needs to, so the next plain
`snakemake` said "Nothing to be done" over results from data that was no longer there. Every
rule therefore takes, beside each input another rule makes, that input's ledger entry
(`.voxjet/ledger/<output path>`). A job marks its outputs' entries when it starts (new content,
the current time) and clears them when it succeeds (neutral content, the epoch as time). A job
that fails, or is killed, leaves them marked: they are then newer than the results downstream,
which Snakemake reruns, and with them the failed job, which fails again with its message until
its cause is gone.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from voxjet.io.atomic import HOST, temporary_name

LEDGER = Path(".voxjet") / "ledger"
_CLEAR = b'{"state": "clear"}\n'


def ledger_path(output: str | os.PathLike, root: str | os.PathLike = LEDGER) -> Path:
    """The ledger entry of a workflow output (a path relative to the workflow's folder)."""
    rel = os.path.normpath(os.fspath(output)).lstrip(os.sep)
    return Path(root) / rel


def _write(path: Path, data: bytes, stamp: float | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    tmp.write_bytes(data)
    if stamp is not None:
        os.utime(tmp, (stamp, stamp))
    os.replace(tmp, path)


def ensure_entry(output: str | os.PathLike, root: str | os.PathLike = LEDGER) -> str:
    """The entry of `output`, created clear (dated at the epoch) when it does not exist yet, so
    a new entry never makes finished results look stale."""
    path = ledger_path(output, root)
    if not path.exists():
        _write(path, _CLEAR, 0.0)
    return str(path)


def mark(outputs: Iterable[str | os.PathLike], job: str, root: str | os.PathLike = LEDGER) -> None:
    """Mark the outputs' entries: this job has started and has not succeeded yet."""
    record = {"state": "started", "job": job, "host": HOST, "pid": os.getpid(),
              "since": time.time()}  # fmt: skip
    data = (json.dumps(record) + "\n").encode()
    for out in outputs:
        _write(ledger_path(out, root), data, None)


def clear(outputs: Iterable[str | os.PathLike], root: str | os.PathLike = LEDGER) -> None:
    """Clear the outputs' entries: the job succeeded, its outputs speak for themselves."""
    for out in outputs:
        _write(ledger_path(out, root), _CLEAR, 0.0)
