"""Atomic checkpoints with everything a resumed run needs, and preemption signals that
turn into a checkpoint plus a distinct exit code instead of lost work."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxjet.io.atomic import atomic_path

# SLURM sends SIGUSR1 (with --signal) or SIGTERM before a time limit or preemption. Exiting with
# this code after a checkpoint tells the profile's requeue logic the job is resumable.
PREEMPTED_EXIT_CODE = 124


def rng_state() -> dict[str, Any]:
    """Every random generator's state, so a resumed run draws the same numbers."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """torch.save to a temporary name, then rename: a kill never leaves half a checkpoint."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load(path: str | os.PathLike) -> dict[str, Any] | None:
    """The checkpoint at `path`, or None when there is none yet."""
    path = Path(path)
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


class PreemptionFlag:
    """Set by SIGTERM/SIGUSR1; the training loop checks it between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    @property
    def raised(self) -> bool:
        """True once a preemption signal arrived."""
        return self.signum is not None

    def restore(self) -> None:
        """Put the previous handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
