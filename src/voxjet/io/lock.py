"""Exclusive locks held for a process's life (fcntl; released by the kernel when the process
dies, however it dies): one writer per run folder (`<run>/.lock`), one job per log file. A
second process that would write the same thing refuses, naming the holder's host and PID."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.io.atomic import HOST


class HeldLock:
    """Held from `acquire()` until `release()` or the end of the process; `refusal` is the
    message a second holder gets, with `{holder}` filled in."""

    def __init__(self, path: str | os.PathLike, refusal: str) -> None:
        self.path = Path(path)
        self.refusal = refusal
        self.fd: int | None = None

    def acquire(self) -> HeldLock:
        """Take the lock, or raise naming whoever holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise VoxjetError(self.refusal.format(holder=holder)) from None
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


class RunLock(HeldLock):
    """The training job's lock on its run folder."""

    def __init__(self, folder: str | os.PathLike) -> None:
        super().__init__(
            Path(folder) / ".lock",
            f"{folder}: another training job is writing this run ({{holder}}); wait for it to "
            "end or stop it, then rerun; two writers would mix their checkpoints",
        )
