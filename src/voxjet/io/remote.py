"""Where training and evaluation read prepared data (shards, case files) from: a local folder,
or an fsspec URL read through voxjet.io.fetch with the dataset's `read:` settings."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.io.atomic import read_json
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


def read_json_at(location: str | os.PathLike, name: str, opts: ReadOptions) -> dict:
    """The JSON file `name` of a folder or URL."""
    if not is_url(location):
        return read_json(Path(location) / name)
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
    """Whole files of one URL folder, fetched in concurrent ranges (for h5py over BytesIO)."""

    def __init__(self, location: str, opts: ReadOptions) -> None:
        import fsspec

        fs, self.root = fsspec.core.url_to_fs(str(location), **opts.storage_options)
        self.fetcher = Fetcher(fs, opts.fetch)
        self.side_by_side = max(1, opts.lookahead)  # files a reader fetches at once

    def fetch(self, name: str, size: int | None = None) -> bytes:
        """The bytes of file `name` (`size`, when an index knows it, saves asking for it)."""
        return self.fetcher.read_file(f"{self.root}/{name}", size, self.side_by_side)

    def open(self, name: str, size: int | None = None) -> io.BytesIO:
        """The bytes of file `name`, as a file object."""
        return io.BytesIO(self.fetch(name, size))

    def close(self) -> None:
        """Stop the fetch threads."""
        self.fetcher.close()

    def __enter__(self) -> RemoteFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
