"""One writer per run folder: the training job holds an exclusive lock on `<run>/.lock`
(fcntl; released by the kernel when the process dies, however it dies) and a second job that
would write the same run refuses, naming the holder's host and PID."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.io.atomic import HOST


class RunLock:
    """Held from `acquire()` until `release()` or the end of the process."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = Path(folder) / ".lock"
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        """Take the lock, or raise naming whoever holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise VoxjetError(
                f"{self.path.parent}: another training job is writing this run ({holder}); "
                "wait for it to end or stop it, then rerun; two writers would mix their "
                "checkpoints"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"host": HOST, "pid": os.getpid(), "since": time.time()}).encode())
        self.fd = fd
        return self

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
            return f"host {info['host']}, PID {info['pid']}, since {since}"
        except (ValueError, KeyError, OSError):
            return "holder unknown"

    def release(self) -> None:
        """Give the lock up."""
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
