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

import io
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from voxjet.errors import VoxjetError

MIN_BLOCK = 64 << 10  # below this a request costs more in round trips than it moves


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
        self._in_flight = 0  # bytes requested and not yet handed over, over all calls
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
        """(index into `ranges`, bytes) for every range, as reads complete (or in order).
        Several calls may run at once (files fetched side by side): they share the thread pool
        and the bound on bytes in flight."""
        cfg = self.cfg
        pending: dict[Future, int] = {}
        done: dict[int, bytes] = {}
        mine = 0  # bytes this call counts in self._in_flight
        next_submit = next_yield = 0
        try:
            while next_yield < len(ranges):
                # keep the pool busy within the memory bound (always one request of this call)
                while next_submit < len(ranges) and len(pending) < cfg.threads:
                    size = ranges[next_submit][1] - ranges[next_submit][0]
                    with self._lock:
                        if pending and self._in_flight + size > cfg.max_bytes_in_flight:
                            break
                        self._in_flight += size
                        self.peak_bytes_in_flight = max(self.peak_bytes_in_flight, self._in_flight)
                    mine += size
                    fut = self.pool.submit(self._read, url, *ranges[next_submit])
                    pending[fut] = next_submit
                    next_submit += 1
                finished, _ = wait(pending, timeout=cfg.timeout_s, return_when=FIRST_COMPLETED)
                if not finished:
                    stuck = sorted(pending.values())[0]
                    raise FetchError(
                        f"{url}: bytes {ranges[stuck][0]}-{ranges[stuck][1]} did not arrive "
                        f"within {cfg.timeout_s:.0f} s (a stalled read); check the storage or "
                        "raise the dataset's read.timeout_s"
                    )
                for fut in finished:
                    i = pending.pop(fut)
                    data = fut.result()  # a FetchError surfaces here, in the reading thread
                    if not cfg.ordered:
                        mine -= self._release(len(data))
                        next_yield += 1
                        yield i, data
                    else:
                        done[i] = data
                while cfg.ordered and next_yield in done:
                    data = done.pop(next_yield)
                    mine -= self._release(len(data))
                    yield next_yield, data
                    next_yield += 1
        finally:
            self._release(mine)  # what an abandoned or failed call still counted

    def _release(self, n: int) -> int:
        with self._lock:
            self._in_flight -= n
        return n

    def open_file(self, url: str, size: int | None = None, side_by_side: int = 1) -> BlocksFile:
        """The whole file, fetched in concurrent blocks, as a read-only file object over the
        blocks as they arrived; with `side_by_side` files read at once, each has its share of
        the threads."""
        size = int(self.fs.size(url) if size is None else size)
        # a file smaller than its share of threads × block_bytes is cut finer, so that each of
        # those threads has a range of it in flight (a 3 MB case file would otherwise be one
        # 4 MB request) — but no finer: with other files in flight every extra request is one
        # more round trip (6 case files cut for 16 threads each took 6 rounds at 20 ms, not 4)
        share = max(1, self.cfg.threads // max(1, side_by_side))
        step = min(self.cfg.block_bytes, max(MIN_BLOCK, -(-size // share)))
        blocks = [(lo, min(lo + step, size)) for lo in range(0, size, step)]
        got: list[bytes] = [b""] * len(blocks)
        for i, data in self.ranges(url, blocks):
            got[i] = data
        return BlocksFile(got, step, size)

    def read_file(self, url: str, size: int | None = None, side_by_side: int = 1) -> bytes:
        """The whole file's bytes (see `open_file`)."""
        return self.open_file(url, size, side_by_side).read()


class BlocksFile(io.RawIOBase):
    """A read-only, seekable file over equal blocks of bytes (the last may be shorter), so
    that h5py reads a fetched file where its blocks landed: assembling them into one buffer
    first would copy every file once more, into fresh memory, under the GIL — a loader's
    fetch threads then stall the thread that computes its batches."""

    def __init__(self, blocks: list[bytes], step: int, size: int) -> None:
        super().__init__()
        self._blocks = [memoryview(b) for b in blocks]
        self._step, self._size, self._pos = step, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self._size - self._pos))
        done = 0
        while done < n:
            i, off = divmod(self._pos + done, self._step)
            take = min(self._step - off, n - done)
            out[done : done + take] = self._blocks[i][off : off + take]
            done += take
        self._pos += n
        return n
