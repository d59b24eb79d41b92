"""The preprocessed case files of a dataset (a folder, or an fsspec URL whose files are fetched
whole in concurrent ranges): their format version, lazily opened handles, each case's image
and label as its store reads them (voxjet.io.case_arrays), and its foreground samples."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401  (registers the LZ4 filter in this process)
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.case_arrays import open_array, read_verified
from voxjet.io.chunks import ChunkCache
from voxjet.io.fetch import FetchConfig
from voxjet.io.integrity import corrupt_error
from voxjet.io.remote import ReadOptions, RemoteFiles, read_json_at

# 5: image and label may be blosc2 frames (storage: blosc2; 4 files stay readable);
# 4: image and label uncompressed with a CRC32 a slab (storage: mapped) or in half-patch
# chunks; 3: the original label kept for metrics in the original space; 2: a fletcher32
# checksum a chunk (1: none); written by voxjet.volumes.preprocessing.preprocess
CASE_FORMAT = 5
READABLE_CASE_FORMATS = (4, 5)


def case_sizes(cases_dir: str | os.PathLike, opts: ReadOptions) -> dict[str, int]:
    """Bytes of each case file at a URL, from its cases.json (empty for a local folder, or
    cases written before sizes were recorded)."""
    if "://" not in str(cases_dir):
        return {}
    try:
        cases = read_json_at(cases_dir, "cases.json", opts)
    except VoxjetError:  # only a saving: without it each file's size is asked for
        return {}
    return {c["case_id"]: int(c["bytes"]) for c in cases if "bytes" in c}


class CaseStore:
    """Lazily opened case files (one handle a case, opened in the process that reads)."""

    def __init__(
        self,
        cases_dir: str | os.PathLike,
        case_ids: list[str],
        cache_bytes: int = 512 << 20,
        fetch: FetchConfig | None = None,
        storage_options: dict | None = None,
        lookahead: int = 2,
        sizes: dict[str, int] | None = None,
        previous=None,
    ) -> None:
        # the cascade's previous stage (voxjet.volumes.inference.cascade.PreviousStage): its
        # channels are read as the image's last ones (its `joined`)
        self.previous = previous
        # a folder, or an fsspec URL: remote case files are fetched whole in concurrent ranges
        # on first use and kept in memory as stored (compressed); stage datasets bigger than RAM
        # (`sizes`, bytes a case file, e.g. from cases.json, saves a request each)
        self.url = str(cases_dir)
        self.remote = "://" in self.url
        self.dir = Path(cases_dir) if not self.remote else None
        self.case_ids = list(case_ids)
        self._files: dict[str, h5py.File] = {}
        self._volumes: dict[str, tuple] = {}
        self._foreground: dict[str, list[np.ndarray]] = {}
        self.cache = ChunkCache(cache_bytes)
        if self.remote:
            opts = ReadOptions(storage_options or {}, fetch or FetchConfig(), lookahead)
            sizes = {f"{c}.h5": n for c, n in (sizes or {}).items()}
            self._url_files = RemoteFiles(self.url, opts, sizes)
            self._prefetching = False  # started in the process that reads
            return
        missing = [c for c in self.case_ids if not (self.dir / f"{c}.h5").is_file()]
        if missing:
            raise VoxjetError(
                f"{self.dir}: case files missing for {missing[:3]}; rerun preprocessing"
            )

    @property
    def prefetching(self) -> bool:
        """Whether the background fetch of the case files has started (remote only)."""
        return self.remote and self._prefetching

    def prefetch(self, first: Sequence[str] = ()) -> None:
        """Start fetching every case file in the background, `lookahead` side by side (each
        in concurrent ranges), the cases `first` (the order a sampler will need them) before
        the rest; a no-op for a local folder or once started."""
        if not self.remote or self._prefetching:
            return
        self._prefetching = True
        self._url_files.fetch_ahead([f"{c}.h5" for c in [*first, *self.case_ids]])

    def _open(self, case_id: str) -> h5py.File:
        if not self.remote:
            return h5py.File(self.dir / f"{case_id}.h5", "r")
        self.prefetch()
        return h5py.File(self._url_files.take(f"{case_id}.h5"), "r")

    def file(self, case_id: str) -> h5py.File:
        """The open HDF5 file of a case (of the format this voxjet reads)."""
        if case_id not in self._files:
            path = f"{self.url}/{case_id}.h5"
            try:
                f = self._open(case_id)
            except OSError as e:
                raise corrupt_error(path, "the case file", "preprocess_case", e) from e
            version = f.attrs.get("format_version")
            if version not in READABLE_CASE_FORMATS:
                f.close()
                raise VoxjetError(
                    f"{path}: a case file of format {version}, this voxjet reads formats "
                    f"{READABLE_CASE_FORMATS}; rerun preprocessing (snakemake -R plan_volumes)"
                )
            self._files[case_id] = f
        return self._files[case_id]

    def volumes(self, case_id: str) -> tuple:
        """Image [C, X, Y, Z] and label [X, Y, Z] of a case as its store reads them
        (voxjet.io.case_arrays); each with .read(lo, hi)."""
        if case_id not in self._volumes:
            f = self.file(case_id)
            where = f"{self.url}/{case_id}.h5"
            local = None if self.remote else str(self.dir / f"{case_id}.h5")
            image, label = (
                open_array(f, name, axis, where, local, self.cache, (case_id, name))
                for name, axis in (("image", 1), ("label", 0))
            )
            if self.previous is not None:  # a cascade: the previous stage's channels after
                image = self.previous.joined(image, case_id, f.attrs)
            self._volumes[case_id] = (image, label)
        return self._volumes[case_id]

    def foreground(self, case_id: str) -> list[np.ndarray]:
        """The stored foreground coordinates of each present class (kept in memory)."""
        if case_id not in self._foreground:
            f = self.file(case_id)
            groups = f["foreground"] if "foreground" in f else {}
            try:
                self._foreground[case_id] = [
                    groups[k][...] for k in sorted(groups) if groups[k].shape[0] > 0
                ]
            except (OSError, RuntimeError, ValueError) as e:
                where = f"{self.url}/{case_id}.h5"
                raise corrupt_error(where, "its foreground samples", "preprocess_case", e) from e
        return self._foreground[case_id]

    def close(self) -> None:
        """Close every open handle."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        self._volumes.clear()
        if self.remote:
            self._url_files.close()
            self._prefetching = False


def read_case_arrays(f: h5py.File) -> tuple[np.ndarray, np.ndarray]:
    """The whole preprocessed image and label of an open case file."""
    where = f.filename
    return read_verified(f, "image", 1, where), read_verified(f, "label", 0, where)
