"""Atomic checkpoints with everything a resumed run needs, and preemption signals that
turn into a checkpoint plus a distinct exit code instead of lost work."""

from __future__ import annotations

import hashlib
import os
import random
import re
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path

# SLURM sends SIGUSR1 (with --signal) or SIGTERM before a time limit or preemption. Exiting with
# this code after a checkpoint tells the profile's requeue logic the job is resumable.
PREEMPTED_EXIT_CODE = 124


def rng_state() -> dict[str, Any]:
    """Every random generator's state, so a resumed run draws the same numbers."""
    name, key, pos, has_gauss, cached = np.random.get_state()
    # Plain numbers and tensors only, so checkpoints load with torch.load(weights_only=True).
    state = {
        "python": random.getstate(),
        "numpy": {
            "name": name,
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what rng_state() captured."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


DIGEST = "_sha256"  # a checkpoint's digest of its own content (torch.load checks no CRC)


def content_digest(obj: Any) -> str:
    """sha256 over a checkpoint's content: keys, numbers, strings and every tensor's bytes, in
    a fixed order (the same for the object saved and the object loaded back)."""
    h = hashlib.sha256()

    def feed(o: Any) -> None:
        if isinstance(o, dict):
            for k in sorted(o, key=str):
                if k != DIGEST:
                    h.update(f"<{k!s}>".encode())
                    feed(o[k])
        elif isinstance(o, list | tuple):
            h.update(f"[{len(o)}".encode())
            for v in o:
                feed(v)
        elif torch.is_tensor(o):
            t = o.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(o).encode())

    feed(obj)
    return h.hexdigest()


def save(path: str | os.PathLike, state: dict[str, Any]) -> None:
    """torch.save to a temporary name, then rename (a kill never leaves half a checkpoint),
    with a digest of the content that loading checks (a damaged file is refused, not used)."""
    with atomic_path(path) as tmp:
        torch.save({**state, DIGEST: content_digest(state)}, tmp)


def load(path: str | os.PathLike) -> dict[str, Any] | None:
    """The checkpoint at `path`, or None when there is none yet."""
    path = Path(path)
    if not path.is_file():
        return None
    return load_file(path)


def load_model_file(path: str | os.PathLike, domain: str, task: str, trainer: str) -> dict:
    """A model.pt of `domain` (a model of another domain refused, naming what trains one)."""
    saved = load_file(path)
    found = saved.get("model_config", {}).get("domain", domain)
    if found != domain:
        raise VoxjetError(f"{path}: a {found} model; {task} needs a model trained by {trainer}")
    return saved


def load_file(path: str | os.PathLike) -> dict[str, Any]:
    """torch.load with weights_only=True (no arbitrary code from a file), clear errors."""
    if not Path(path).is_file():
        raise VoxjetError(
            f"{path}: no such file; give a trained run's model.pt "
            "(results/<dataset>/runs/<run>/model.pt)"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines()[0][:160]
        raise VoxjetError(
            f"{path}: not a readable voxjet checkpoint ({type(e).__name__}: {reason}); it may be "
            "corrupt or from an older voxjet (a run's own checkpoint: delete it, and the run "
            "starts afresh)"
        ) from e
    if not isinstance(state, dict) or "model" not in state:
        raise VoxjetError(f"{path}: not a voxjet checkpoint (no model state); delete it")
    want = state.pop(DIGEST, None)
    if want is not None and content_digest(state) != want:
        raise VoxjetError(
            f"{path}: its content does not match the checksum it was saved with: the file was "
            "damaged or changed after it was written; delete it (a training run then starts "
            "afresh, or resumes from a kept checkpoint) or rerun the rule that writes it"
        )
    return state


def load_weights(
    model: torch.nn.Module, state: dict[str, torch.Tensor], path: str | os.PathLike, what: str
) -> None:
    """Load a state dict, refusing one of another architecture with a message that says so."""
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).splitlines()
        raise VoxjetError(
            f"{path}: weights do not fit {what} ({' '.join(first[:2])[:300]}); "
            "it was written by another model or configuration"
        ) from e


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
