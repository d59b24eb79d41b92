"""Where training and evaluation read prepared data (shards, case files) from: a local folder,
or an fsspec URL read through voxjet.io.fetch with the dataset's `read:` settings."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.io.atomic import REMAKE, read_json
from voxjet.io.fetch import FetchConfig, Fetcher


@dataclass(frozen=True)
class ReadOptions:
    """fsspec storage options, the fetch layer's settings, and how many files to fetch ahead."""

    storage_options: dict[str, Any] = field(default_factory=dict)
    fetch: FetchConfig = FetchConfig()
    lookahead: int = 2

    @classmethod
    def from_config(cls, read: Mapping[str, Any] | None) -> ReadOptions:
        """From a dataset's `read:` section (config/schema.yaml names and units)."""
        r = dict(read or {})
        fetch = FetchConfig(
            threads=int(r.get("threads", 8)),
            block_bytes=int(float(r.get("block_mb", 4)) * 2**20),
            max_bytes_in_flight=int(float(r.get("max_mb_in_flight", 256)) * 2**20),
            retries=int(r.get("retries", 3)),
            timeout_s=float(r.get("timeout_s", 120)),
            ordered=bool(r.get("ordered", False)),
        )
        return cls(dict(r.get("storage_options", {})), fetch, int(r.get("lookahead", 2)))


def is_url(location: str | os.PathLike) -> bool:
    """True for an fsspec URL (s3://, root://, latency::file://...), False for a path."""
    return "://" in str(location)


def read_json_at(location: str | os.PathLike, name: str, opts: ReadOptions,
                 remake: str = REMAKE) -> dict:  # fmt: skip
    """The JSON file `name` of a folder or URL (`remake`: how to make it again)."""
    if not is_url(location):
        return read_json(Path(location) / name, remake)
    import fsspec

    url = f"{location}/{name}"
    try:
        with fsspec.open(url, "rb", **opts.storage_options) as f:
            return json.loads(f.read())
    except FileNotFoundError as e:
        raise VoxjetError(
            f"{url}: not found; source.prepared must point at the shards/cases folder of an "
            "earlier run (the one holding index.json or splits.json)"
        ) from e
    except (OSError, ValueError) as e:
        raise VoxjetError(f"{url}: unreadable ({type(e).__name__}: {e})") from e


class RemoteFiles:
    """Whole files of one URL folder, fetched in concurrent ranges as file objects h5py
    opens, and fetched ahead in the background in the order a reader will need them."""

    def __init__(
        self,
        location: str,
        opts: ReadOptions,
        sizes: Mapping[str, int | None] | None = None,
        side_by_side: int | None = None,
    ) -> None:
        import fsspec

        fs, self.root = fsspec.core.url_to_fs(str(location), **opts.storage_options)
        self.fetcher = Fetcher(fs, opts.fetch)
        # files fetched at once (the reader's lookahead unless it knows better), each cut for
        # its share of the fetch threads
        self.side_by_side = max(1, opts.lookahead if side_by_side is None else side_by_side)
        self.sizes = dict(sizes or {})  # from an index: spares a size request a file
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[str, Future] = {}
        self._queue: list[str] = []
        self._next, self._window = 0, 0

    def fetch(self, name: str, size: int | None = None) -> io.RawIOBase:
        """File `name`, fetched whole, as a read-only file object (`size`, when an index knows
        it, saves asking for it)."""
        size = self.sizes.get(name) if size is None else size
        return self.fetcher.open_file(f"{self.root}/{name}", size, self.side_by_side)

    def fetch_ahead(self, order: list[str], window: int | None = None) -> None:
        """Fetch these files in the background in this order, `side_by_side` at once (each
        in concurrent ranges), at most `window` of them fetched and not yet taken (None: no
        limit); `take` hands them over."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.side_by_side, "voxjet-file-prefetch")
        self._queue, self._next = list(dict.fromkeys(order)), 0
        self._window = len(self._queue) if window is None else window
        self._top_up()

    def _top_up(self) -> None:
        while self._next < len(self._queue) and len(self._ahead) <= self._window:
            name = self._queue[self._next]
            self._next += 1
            if name not in self._ahead:
                self._ahead[name] = self._pool.submit(self.fetch, name)

    def take(self, name: str) -> io.RawIOBase:
        """File `name`: from the background fetch once it has begun, else fetched now, ahead
        of the queue."""
        self._top_up()
        fut = self._ahead.pop(name, None)
        if fut is None or fut.cancel():
            return self.fetch(name)
        return fut.result()

    def close(self) -> None:
        """Stop the fetch threads (and any fetch ahead not yet begun)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self.fetcher.close()

    def __enter__(self) -> RemoteFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
