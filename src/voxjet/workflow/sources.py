"""What the dry run knows of each dataset's sources: their files (for a local source.path),
the stage's command-line source, and the content keys that decide which jobs rerun
(voxjet.stage.fingerprint): the shard and planning jobs read every file of a dataset, a case's
preprocessing only that case's files and dataset.json."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.io.parquet_files import is_parquet
from voxjet.stage.fingerprint import content_keys, digest
from voxjet.stage.transfer import LEDGER, SourceFile, list_sources
from voxjet.workflow import paths

# the files of a volumes dataset every case's preprocessing depends on besides its own
DATASET_FILES = ("dataset.json", "splits_final.json")
JET_PATTERNS = ["*.root", "*.parquet"]


def stage_patterns(ds: Mapping[str, Any]) -> list[str]:
    """The file patterns a dataset stages (ROOT or Parquet files for jets, everything for
    volumes)."""
    return ds["source"].get("patterns", JET_PATTERNS if ds["domain"] == "jets" else ["*"])


def is_local(ds: Mapping[str, Any]) -> bool:
    """Whether the dataset stages from a local source.path (files Snakemake can look at)."""
    path = ds["source"].get("path")
    return bool(path) and "://" not in path


@dataclass
class DatasetSources:
    """One dataset's source as the dry run sees it."""

    name: str
    ds: Mapping[str, Any]
    files: list[SourceFile] = field(default_factory=list)  # a local source.path's
    _keys: dict[str, str] | None = None

    @classmethod
    def listed(cls, name: str, ds: Mapping[str, Any]) -> DatasetSources:
        """The dataset's local source files listed (none for a URL, a file list, generated
        or prepared data)."""
        if not is_local(ds):
            return cls(name, ds)
        key = f"datasets.{name}.source.path"
        try:
            return cls(name, ds, list_sources(ds["source"]["path"], stage_patterns(ds), key)[1])
        except VoxjetError as e:
            raise VoxjetError(f"config key '{key}': {e}") from e

    @property
    def synthetic(self) -> bool:
        """Whether the dataset is generated (the demo's)."""
        return "synthetic" in self.ds["source"]

    @property
    def tracked(self) -> bool:
        """Whether its files' content keys decide reruns (else any restage reruns all)."""
        return bool(self.files)

    def keys(self) -> dict[str, str]:
        """Each local file's content key, by path relative to the source (read once)."""
        if self._keys is None:
            ledger = os.path.join(paths.fill(paths.STAGED, dataset=self.name), LEDGER)
            self._keys = content_keys(self.files, ledger)
        return self._keys

    def digest(self) -> str:
        """What every file's content is known as ("" where no files are tracked)."""
        return digest(f"{k}={v}" for k, v in self.keys().items()) if self.tracked else ""

    def digest_of(self, relpaths: list[str]) -> str:
        """The content digest of some files and the dataset-wide ones (dataset.json, ...); the
        whole dataset's where one of them is not a file of the source."""
        keys = self.keys()
        wanted = [*relpaths, *(f for f in DATASET_FILES if f in keys)]
        if not self.tracked or any(p not in keys for p in relpaths):
            return self.digest()
        return digest(f"{p}={keys[p]}" for p in wanted)

    def stage_input(self) -> list[str]:
        """The stage's input files: the generated folder, the file list, or the local files
        (relative where source.path is, so the workflow folder can move without restaging)."""
        source = self.ds["source"]
        if self.synthetic:
            return [paths.fill(paths.SYNTHETIC, dataset=self.name)]
        if "file_list" in source:
            return [source["file_list"]]
        files = [f.url.removeprefix("file://") for f in self.files]
        absolute = os.path.isabs(source.get("path", ""))
        return files if absolute else [os.path.relpath(f) for f in files]

    def generated(self) -> list[str]:
        """The generated folder a synthetic dataset stages from (its synth rule's output)."""
        return [paths.fill(paths.SYNTHETIC, dataset=self.name)] if self.synthetic else []

    def stage_source(self) -> str:
        """The stage command's source option, shell-quoted."""
        source = self.ds["source"]
        if self.synthetic:
            return f"--source {paths.fill(paths.SYNTHETIC, dataset=self.name)}"
        if "file_list" in source:
            return f"--file-list {shlex.quote(source['file_list'])}"
        return f"--source {shlex.quote(source['path'])}"

    def first_jets_file(self) -> str | None:
        """The first local ROOT or Parquet file (the dry run checks its tree and branches)."""
        found = [f for f in self.files if f.relpath.endswith(".root") or is_parquet(f.relpath)]
        return found[0].url.removeprefix("file://") if found else None
