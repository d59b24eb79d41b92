"""A workflow job as every rule runs it (`voxjet job --log LOG --outputs OUT... -- COMMAND`):
the log belongs to this job alone, and the outputs' state files say whether it finished.

The log is locked before it is truncated: a second Snakemake on the same folder (`--nolock`)
that starts the same job is refused without touching the running job's log (a shell's
`> {log}` truncated it before anything could refuse). The outputs' state files are marked
while the command runs and cleared when it succeeds (voxjet.io.ledger says why)."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from voxjet.io import ledger
from voxjet.io.lock import HeldLock


def log_lock(log: str | os.PathLike) -> HeldLock:
    """The lock a job holds on its log file while it runs."""
    log = Path(log)
    return HeldLock(
        log.with_name(f".{log.name}.lock"),
        f"{log}: another process is running this job ({{holder}}); its log and outputs are "
        "left alone. Wait for it to end (or stop it), then rerun; two Snakemake runs on one "
        "folder need their own --directory",
    )


@contextmanager
def job_log(log: str | os.PathLike) -> Iterator[None]:
    """Lock `log`, then send this process's stdout and stderr (and its children's) into it."""
    lock = log_lock(log).acquire()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            yield
        except SystemExit:
            raise  # said already (script_job), or a plain exit
        except BaseException:  # into the log, before the terminal is given back
            traceback.print_exc()
            raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)
        lock.release()


@contextmanager
def ledger_marked(outputs: Sequence[str], job: str) -> Iterator[None]:
    """Outputs' state files marked for the body's time; cleared only when it succeeds."""
    ledger.mark(outputs, job)
    yield
    ledger.clear(outputs)


@contextmanager
def script_job(log: str, outputs: Sequence[str], name: str) -> Iterator[None]:
    """A Snakemake `script:` run as every rule's job is: its own log, its outputs' states
    marked until it succeeds, and voxjet's error said as the CLI says it (`voxjet NAME: error:
    …`, exit 2), not as a traceback."""
    from voxjet.errors import VoxjetError

    with job_log(log), ledger_marked(outputs, log):
        try:
            yield
        except VoxjetError as e:
            print(f"voxjet {name}: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None


def run_job(log: str, outputs: Sequence[str], command: Callable[[], int], job: str) -> int:
    """Run `command` (returning an exit code) as a workflow job; returns its exit code."""
    with job_log(log):
        ledger.mark(outputs, job)
        try:
            code = command()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # the traceback goes to the job's log, not Snakemake's terminal
            traceback.print_exc()
            code = 1
        if code == 0:
            ledger.clear(outputs)
        return code
