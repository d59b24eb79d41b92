"""Concurrent byte-range reads from any fsspec filesystem, so that storage with milliseconds
of latency a request (object stores, XRootD, a busy parallel file system) is read at the speed
of its bandwidth, not one round trip at a time.

A pool of threads keeps up to `threads` requests in flight; completed blocks are handed over
as they arrive (or in request order with `ordered=True`), and no more than `max_bytes_in_flight`
are requested but not yet consumed. A failed or short read is retried with backoff, then fails
naming the URL and byte range; a read that does not answer within `timeout_s` fails the same
way instead of hanging the training job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from voxjet.errors import VoxjetError


@dataclass(frozen=True)
class FetchConfig:
    """How reads are issued: concurrency, block size, memory bound, retries, timeout."""

    threads: int = 8
    block_bytes: int = 4 << 20
    max_bytes_in_flight: int = 256 << 20
    retries: int = 3
    timeout_s: float = 120.0
    ordered: bool = False


class FetchError(VoxjetError):
    """A byte range that could not be read (after retries) or did not arrive in time."""


class Fetcher:
    """Reads byte ranges of files of one fsspec filesystem with a bounded thread pool."""

    def __init__(self, fs, cfg: FetchConfig | None = None) -> None:
        self.fs = fs
        self.cfg = cfg or FetchConfig()
        self.pool = ThreadPoolExecutor(max(1, self.cfg.threads), thread_name_prefix="voxjet-fetch")
        self.peak_bytes_in_flight = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop the threads (reads in progress finish in the background)."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self, url: str, start: int, stop: int) -> bytes:
        last: Exception | None = None
        for attempt in range(self.cfg.retries + 1):
            try:
                data = self.fs.cat_file(url, start=start, end=stop)
                if len(data) != stop - start:
                    raise OSError(f"short read: {len(data)} of {stop - start} bytes")
                return data
            except Exception as e:  # network errors come in many types
                last = e
                if attempt < self.cfg.retries:
                    time.sleep(min(2.0, 0.05 * 2**attempt))
        raise FetchError(
            f"{url}: bytes {start}-{stop} unreadable after {self.cfg.retries + 1} tries "
            f"({type(last).__name__}: {last})"
        )

    def ranges(self, url: str, ranges: list[tuple[int, int]]) -> Iterator[tuple[int, bytes]]:
        """(index into `ranges`, bytes) for every range, as reads complete (or in order)."""
        cfg = self.cfg
        pending: dict[Future, int] = {}
        done: dict[int, bytes] = {}
        in_flight = 0
        next_submit = next_yield = 0
        while next_yield < len(ranges):
            # keep the pool busy within the memory bound (always at least one request)
            while next_submit < len(ranges) and len(pending) < cfg.threads:
                size = ranges[next_submit][1] - ranges[next_submit][0]
                if pending and in_flight + size > cfg.max_bytes_in_flight:
                    break
                fut = self.pool.submit(self._read, url, *ranges[next_submit])
                pending[fut] = next_submit
                in_flight += size
                with self._lock:
                    self.peak_bytes_in_flight = max(self.peak_bytes_in_flight, in_flight)
                next_submit += 1
            finished, _ = wait(pending, timeout=cfg.timeout_s, return_when=FIRST_COMPLETED)
            if not finished:
                stuck = sorted(pending.values())[0]
                raise FetchError(
                    f"{url}: bytes {ranges[stuck][0]}-{ranges[stuck][1]} did not arrive within "
                    f"{cfg.timeout_s:.0f} s (a stalled read); check the storage or raise "
                    "io.timeout_s"
                )
            for fut in finished:
                i = pending.pop(fut)
                data = fut.result()  # a FetchError surfaces here, in the reading thread
                if not cfg.ordered:
                    in_flight -= len(data)
                    next_yield += 1
                    yield i, data
                else:
                    done[i] = data
            while cfg.ordered and next_yield in done:
                data = done.pop(next_yield)
                in_flight -= len(data)
                yield next_yield, data
                next_yield += 1

    def read_file(self, url: str, size: int | None = None) -> bytes:
        """The whole file, fetched in concurrent blocks and assembled in memory."""
        size = int(self.fs.size(url) if size is None else size)
        step = self.cfg.block_bytes
        blocks = [(lo, min(lo + step, size)) for lo in range(0, size, step)]
        out = bytearray(size)
        for i, data in self.ranges(url, blocks):
            lo = blocks[i][0]
            out[lo : lo + len(data)] = data
        return bytes(out)
