"""An fsspec filesystem that adds a fixed delay to every read request of another one: remote
storage's latency on a laptop, for tests and benchmarks (`latency::file:///data/shards`).

It can also fail every n-th read (raise, or return fewer bytes) and stall reads, to exercise
the retry and timeout paths. It counts requests and the most that were in flight at once.
"""

from __future__ import annotations

import threading
import time

import fsspec
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem


class LatencyFileSystem(AbstractFileSystem):
    """Every `cat_file` / buffered read of the wrapped filesystem waits `delay_s` first."""

    protocol = "latency"
    cachable = False

    def __init__(
        self,
        target_protocol: str = "file",
        target_options: dict | None = None,
        delay_s: float = 0.02,
        fail_every: int = 0,
        fail_mode: str = "raise",
        stall_s: float = 0.0,
        fail_match: str = "",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.fs = fsspec.filesystem(target_protocol, **(target_options or {}))
        self.delay_s, self.fail_every, self.fail_mode, self.stall_s = (
            delay_s,
            fail_every,
            fail_mode,
            stall_s,
        )
        self.fail_match = fail_match  # only paths containing this fail
        self.requests = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self._lock = threading.Lock()

    def _strip(self, path: str) -> str:
        return path.split("::", 1)[-1].removeprefix("latency://")

    def cat_file(self, path, start=None, end=None, **kwargs):
        with self._lock:
            self.requests += 1
            n = self.requests
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            time.sleep(self.delay_s + (self.stall_s if self.stall_s and n == 1 else 0.0))
            data = self.fs.cat_file(self._strip(path), start=start, end=end)
            if self.fail_every and n % self.fail_every == 0 and self.fail_match in str(path):
                if self.fail_mode == "raise":
                    raise ConnectionError(f"injected failure of request {n}")
                return data[: len(data) // 2]
            return data
        finally:
            with self._lock:
                self.in_flight -= 1

    def info(self, path, **kwargs):
        return self.fs.info(self._strip(path), **kwargs)

    def ls(self, path, detail=True, **kwargs):
        return self.fs.ls(self._strip(path), detail=detail, **kwargs)

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        if mode != "rb":
            raise ValueError("the latency filesystem is read-only")
        return _LatencyFile(self, path, mode=mode, block_size=block_size or 1 << 20, **kwargs)


class _LatencyFile(AbstractBufferedFile):
    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.cat_file(self.path, start=start, end=end)


fsspec.register_implementation("latency", LatencyFileSystem, clobber=True)
