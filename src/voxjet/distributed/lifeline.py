"""Processes that die with the process that started them: a training job killed with
SIGKILL (Snakemake's process group, a cancelled SLURM step) must not leave torchrun or its
training processes running on, unwatched, into the next job's run folder."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux; elsewhere
    nothing), and exit now if the parent is already gone."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent or parent == 1:  # the parent died before the request took
        os._exit(1)


def under_launcher() -> bool:
    """True in a process torchrun started (its workers carry these variables)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ
