"""A job's state beside each output it makes: what tells Snakemake that results built from an
output are stale once the job that made it failed.

Snakemake removes a failed job's outputs and keeps everything built from them earlier; a job
whose output is missing reruns only when something downstream needs to, so the next plain
`snakemake` said "Nothing to be done" over results from data that was no longer there. Each
output therefore has a state file beside it (`results/x/.index.json.voxjet-state` for
`results/x/index.json`), and every rule takes the state files of the inputs other rules make.
A job marks its outputs' state files when it starts (new content, the current time) and clears
them when it succeeds (neutral content, the epoch as time). A job that fails, or is killed,
leaves them marked: newer than the results downstream, which Snakemake reruns, and with them the
failed job, which fails again with its message until its cause is gone.

The state lives with the results it guards, not in a hidden folder of its own: clearing
`.snakemake` (what users do to fix a lock) forgets nothing.

Snakemake reruns a job whose set of input files changed, so the states a job takes must be the
same files from its first run on: a run that executes jobs makes the missing ones, cleared, as
it builds the DAG (`ensure`), before any job reads them. A dry run makes none and takes the
states that exist: the same set, once a run has been made.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from voxjet.io.atomic import HOST, temporary_name

SUFFIX = ".voxjet-state"
_CLEAR = b'{"state": "clear"}\n'


def state_path(output: str | os.PathLike) -> Path:
    """The state file of a workflow output (a file or a folder): beside it, hidden."""
    out = Path(os.path.normpath(os.fspath(output)))
    return out.with_name(f".{out.name}{SUFFIX}")


def existing_states(outputs: Iterable[str | os.PathLike]) -> list[str]:
    """The state files of `outputs` that exist, as input paths."""
    return [str(p) for p in map(state_path, outputs) if p.exists()]


def ensure(outputs: Iterable[str | os.PathLike]) -> list[str]:
    """The state files of `outputs`, each made cleared where missing (a job's mark, made at
    the same moment by another process, is never overwritten), as input paths."""
    paths = []
    for out in outputs:
        path = state_path(out)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = temporary_name(path)
            tmp.write_bytes(_CLEAR)
            os.utime(tmp, (0.0, 0.0))
            try:
                os.link(tmp, path)  # atomic, and fails where the file appeared meanwhile
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        paths.append(str(path))
    return paths


def _write(path: Path, data: bytes, stamp: float | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    tmp.write_bytes(data)
    if stamp is not None:
        os.utime(tmp, (stamp, stamp))
    os.replace(tmp, path)


def mark(outputs: Iterable[str | os.PathLike], job: str) -> None:
    """Mark the outputs' states: this job has started and has not succeeded yet."""
    record = {"state": "started", "job": job, "host": HOST, "pid": os.getpid(),
              "since": time.time()}  # fmt: skip
    data = (json.dumps(record) + "\n").encode()
    for out in outputs:
        _write(state_path(out), data, None)


def clear(outputs: Iterable[str | os.PathLike]) -> None:
    """Clear the outputs' states (dated at the epoch, so they never make results downstream
    look stale): the job succeeded, its outputs speak for themselves."""
    for out in outputs:
        _write(state_path(out), _CLEAR, 0.0)


def read(output: str | os.PathLike) -> dict | None:
    """The state of an output (None: no job has run for it)."""
    path = state_path(output)
    return json.loads(path.read_text()) if path.exists() else None
