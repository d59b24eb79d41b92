"""Give each concurrent local training job its own GPUs. Snakemake's `--resources gpu=N`
limits how many run at once but does not say which devices a job may use; without this, every
job would start on GPU 0. A job claims free devices by taking an exclusive lock on one file a
device; the locks are inherited by the training processes and released when they exit, even
when they are killed. Under SLURM the allocation already sets CUDA_VISIBLE_DEVICES: then
nothing is claimed."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path


def default_lock_dir() -> Path:
    """One lock folder a machine and user, shared by all workflows running there."""
    return Path(tempfile.gettempdir()) / f"voxjet-gpu-locks-{os.getuid()}"


def claim_devices(
    wanted: int,
    available: int,
    lock_dir: str | os.PathLike | None = None,
    timeout_s: float = 3600.0,
    poll_s: float = 1.0,
) -> tuple[list[int], list[int]]:
    """Lock `wanted` of device indices 0..available-1; returns (devices, open lock fds).

    The fds are inheritable, so the locks last as long as any process holding them (this one
    and whatever it execs). Waits for devices held by other jobs, up to `timeout_s`."""
    if wanted > available:
        raise ValueError(f"{wanted} GPUs asked for, {available} on this machine")
    folder = Path(lock_dir) if lock_dir else default_lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while True:
        held: list[tuple[int, int]] = []
        for dev in range(available):
            fd = os.open(folder / f"gpu{dev}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((dev, fd))
            if len(held) == wanted:
                for _, f in held:
                    os.set_inheritable(f, True)
                return [d for d, _ in held], [f for _, f in held]
        for _, fd in held:  # not enough free: give back what we took, wait, try again
            os.close(fd)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no {wanted} free GPUs of {available} after {timeout_s:.0f} s (locks in {folder})"
            )
        time.sleep(poll_s)
