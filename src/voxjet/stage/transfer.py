"""Copy files from a local path, glob or fsspec URL into a staging folder: several in flight,
retries with backoff, write to a temporary name, verify, rename; a rerun skips verified files.

What was verified is kept in a ledger inside the staging folder (`.verified.json`: each file's
size, modification time and checksum, and its source's size and modification time or ETag), not
only in the manifest: Snakemake deletes the manifest before a forced rerun (`--forcerun stage`),
and the ledger lets that rerun skip every file still as it was verified. A source file that
changed (size, modification time or ETag) is copied again; nothing else is."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import fsspec

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, read_json, write_json
from voxjet.io.overlap import refuse_overlap
from voxjet.io.parquet_files import ParquetTable, is_parquet
from voxjet.io.trees import tree_names
from voxjet.progress import Progress
from voxjet.stage.checksum import CHUNK, algorithm_for, checksum_file, new_hasher
from voxjet.stage.fingerprint import quick_fingerprint

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class SourceFile:
    """One file to stage: where it is read from and where it lands relative to the stage root;
    `stamp` tells a changed source apart (modification time, or the store's ETag/checksum)."""

    url: str
    relpath: str
    size: int
    stamp: str = ""


def _stamp(info: dict) -> str:
    for key in ("ETag", "etag", "checksum", "mtime", "LastModified", "last_modified", "created"):
        if info.get(key) not in (None, ""):
            return f"{key}={info[key]}"
    return ""


LEDGER = ".verified.json"


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def list_sources(
    source: str, patterns: list[str], key: str = "the dataset's source.path"
) -> tuple[fsspec.AbstractFileSystem, list[SourceFile]]:
    """Resolve a directory, glob or URL into the files to stage, sorted by relative path
    (`key`: where the user gave it, for messages)."""
    fs, root = fsspec.core.url_to_fs(source)
    # One listing with sizes (detail=True): no per-file stat calls against remote storage.
    if _is_glob(root):
        listing = fs.glob(root, detail=True)
        base = re.split(r"[*?\[]", root)[0].rsplit("/", 1)[0]
    elif fs.isdir(root):
        listing = fs.find(root, detail=True)
        base = root
    elif fs.isfile(root):
        listing, base = {root: fs.info(root)}, root.rsplit("/", 1)[0]
    else:
        raise VoxjetError(
            f"{source!r} does not exist: fix {key} (a file, a directory, a glob such as "
            "/data/*.root, or a URL such as root://host//path/)"
        )
    files = []
    for p, info in sorted(listing.items()):
        rel = str(PurePosixPath(p).relative_to(base))
        name = PurePosixPath(rel).name
        if info.get("type") == "directory" or name.startswith("."):
            continue
        if not any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(name, pat) for pat in patterns):
            continue
        url = fs.unstrip_protocol(p)
        files.append(SourceFile(url=url, relpath=rel, size=int(info["size"]), stamp=_stamp(info)))
    if not files:
        raise VoxjetError(
            f"source {source!r} has no files matching {patterns}: check source.path "
            "and source.patterns in the config"
        )
    return fs, files


def list_from_file(list_path: str | os.PathLike, patterns: list[str]) -> list[SourceFile]:
    """Files named in a text file (one local path or URL a line; blank lines and # comments
    skipped), staged flat under their file names, which must therefore be unique."""
    path = Path(list_path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise VoxjetError(f"{path}: cannot read the file list ({e})") from e
    urls = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    names = [PurePosixPath(u.rstrip("/")).name for u in urls]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise VoxjetError(
            f"{path}: several entries share the file names {dupes[:5]}; files "
            "are staged flat, so names must be unique"
        )
    files = []
    for url, name in zip(urls, names, strict=True):
        if not any(fnmatch.fnmatch(name, pat) for pat in patterns):
            continue
        fs, p = fsspec.core.url_to_fs(url)
        try:
            info = fs.info(p)
        except FileNotFoundError as e:
            raise VoxjetError(f"{path}: listed file {url!r} does not exist") from e
        files.append(
            SourceFile(fs.unstrip_protocol(p), name, int(info["size"]), stamp=_stamp(info))
        )
    if not files:
        raise VoxjetError(f"{path}: lists no files matching {patterns}")
    return files


def _copy_verified(
    src: SourceFile,
    dest: Path,
    expected: str | None,
    retries: int,
    backoff: float,
) -> str:
    algorithm = algorithm_for(src.relpath)
    last_error: Exception | None = None
    for attempt in range(retries + 1):
        try:
            with atomic_path(dest) as tmp:
                h = new_hasher(algorithm)
                # each URL opens with its own protocol: a file list may mix local and remote
                with fsspec.open(src.url, "rb") as fin, open(tmp, "wb") as fout:
                    while chunk := fin.read(CHUNK):
                        h.update(chunk)
                        fout.write(chunk)
                digest = h.hexdigest()
                if tmp.stat().st_size != src.size:
                    raise OSError(f"size {tmp.stat().st_size} != {src.size} at the source")
                if expected is not None and digest != expected:
                    raise VoxjetError(
                        f"{src.url}: {algorithm} {digest} does not match the manifest's "
                        f"{expected}; the source file is corrupt or the manifest is stale"
                    )
            return digest
        except VoxjetError:
            raise
        except OSError as e:
            last_error = e
            if attempt < retries:
                time.sleep(backoff * 2**attempt)
    raise VoxjetError(f"{src.url}: copy failed after {retries + 1} tries: {last_error}")


def _root_entries(path: Path, tree: str | None, tree_key: str = "jets.tree") -> int | None:
    """A jets file's entries (its tree's, a Parquet file's rows), checked readable; None for
    other files."""
    if tree is not None and is_parquet(path):
        with ParquetTable(path) as table:  # reads the footer: a truncated file fails here
            return table.num_entries
    if tree is None or not path.name.endswith(".root"):
        return None
    import uproot

    try:
        with uproot.open(path) as f:
            # ROOT writes the directory near the end: a file cut short by a few baskets still
            # opens and reads its tree's entry count, so the header's own length is checked
            size, end = path.stat().st_size, int(f.file.fEND)
            if size < end:
                raise VoxjetError(
                    f"{path}: truncated ROOT file ({size} bytes where its header says {end}); "
                    "copy or produce it again"
                )
            if tree not in f:
                raise VoxjetError(
                    f"{path}: no tree named {tree!r} (it has {tree_names(f)}); set {tree_key} "
                    "to the tree your files hold"
                )
            return int(f[tree].num_entries)
    except VoxjetError:
        raise
    except Exception as e:
        raise VoxjetError(f"{path}: not a readable ROOT file ({e})") from e


@dataclass
class Staging:
    """One staging: where files go, what they must match (a user's checksums, the previous
    manifest, the ledger of what was verified), and the files copied so far."""

    dest: Path
    expected: dict[str, str]
    previous: dict[str, dict]
    ledger: Ledger
    tree: str | None
    on_bad_file: str
    retries: int
    backoff: float
    copied: list[str] = field(default_factory=list)
    tree_key: str = "jets.tree"  # where the user set the tree, for messages
    # files whose content changed where their quick fingerprint did not (voxjet.stage.fingerprint)
    hidden: list[str] = field(default_factory=list)

    def _verified(self, src: SourceFile, target: Path, algorithm: str) -> str | None:
        """The digest of a target already in place and equal to its source (the ledger's, or
        checked against a known checksum), else None."""
        want = self.expected.get(src.relpath)
        digest = self.ledger.unchanged(src, target, algorithm)
        if digest is not None and want is not None and digest != want:
            digest = None  # verified against another expectation: check again
        fresh = not self.ledger.source_changed(src)  # a changed source is copied again
        if digest is None and fresh and target.is_file() and target.stat().st_size == src.size:
            prev = self.previous.get(src.relpath) or {}
            known = want or prev.get("checksum", {}).get(algorithm) or self.ledger.checksum(src)
            if known is not None:
                got = checksum_file(str(target), algorithm)
                digest = got if got == known else None
        return digest

    def one(self, src: SourceFile) -> dict:
        """Stage one file (copied only when not already verified in place); its record."""
        target = self.dest / src.relpath
        algorithm = algorithm_for(src.relpath)
        before = self.ledger.entries.get(src.relpath) or {}
        before = before if before.get("source") == src.url else {}
        kept = self.ledger.unchanged(src, target, algorithm)
        digest = self._verified(src, target, algorithm)
        if digest is None:
            digest = _copy_verified(src, target, self.expected.get(src.relpath), self.retries,
                                    self.backoff)  # fmt: skip
            self.copied.append(src.relpath)
        quick = before.get("quick") if kept == digest and kept is not None else None
        quick = quick or quick_fingerprint(target)
        generation = int(before.get("generation", 0))
        old = next(iter(before.get("checksum", {}).values()), None)
        if old is not None and old != digest and before.get("quick") == quick:
            if not before.get("stale"):  # voxjet.stage.verify counted this change already
                generation += 1
                self.hidden.append(src.relpath)
        self.ledger.record(src, target, algorithm, digest, quick, generation)
        record = {"path": src.relpath, "source": src.url, "size": src.size,
                  "checksum": {algorithm: digest}}  # fmt: skip
        try:
            entries = _root_entries(target, self.tree, self.tree_key)
        except VoxjetError as e:
            if self.on_bad_file != "skip":
                raise VoxjetError(f"{e}; or, to stage the other files and have the shard job "
                                  "skip this one, set jets.on_bad_file: skip") from e  # fmt: skip
            print(f"warning: {e} (staged; the shard job skips it)", file=sys.stderr)
            record["unreadable"] = str(e)
            return record
        if entries is not None:
            record["entries"] = entries
        return record


def _listed(source: str, dest: Path, file_list: str | None,
            patterns: list[str]) -> list[SourceFile]:  # fmt: skip
    """The files to stage (a source's, or a file list's), none of them inside `dest`."""
    if file_list:
        files = list_from_file(file_list, patterns)
        refuse_overlap(dest, [f.url for f in files], "stage", "--dest")
        return files
    refuse_overlap(dest, [source], "stage", "--dest")
    return list_sources(source, patterns)[1]


def _stage_all(files: list[SourceFile], staging: Staging, workers: int) -> list[dict]:
    """Every file staged, `workers` at a time; the records sorted by path."""
    records = []
    bar = Progress(len(files), f"stage {staging.dest.name}", "file")
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = {pool.submit(staging.one, f): f for f in files}
            for fut in as_completed(futures):
                records.append(fut.result())
                bar.update(1)
    finally:
        staging.ledger.save()  # what was verified survives a failure or a kill of the rest
        bar.close()
    print(f"stage: {len(staging.copied)} of {len(files)} files copied, the rest already "
          "verified", file=sys.stderr)  # fmt: skip
    return sorted(records, key=lambda r: r["path"])


def stage(
    source: str,
    dest: str | os.PathLike,
    manifest_path: str | os.PathLike,
    patterns: list[str] | None = None,
    expected: dict[str, str] | None = None,
    tree: str | None = None,
    workers: int = 4,
    retries: int = 3,
    backoff: float = 0.5,
    file_list: str | None = None,
    on_bad_file: str = "fail",
    on_duplicate: str = "fail",
    tree_key: str = "jets.tree",
) -> dict:
    """Stage `source` (or the files a `file_list` names) into `dest` and write the manifest
    last; returns the manifest. A ROOT file that cannot be opened or lacks the tree stops
    staging, or with on_bad_file "skip" is staged and recorded with its reason (`unreadable`)
    so that the shard job skips it, naming it. Two files with one checksum stop it naming both
    (`on_duplicate` "skip": the first by name is kept; "ignore": no check, for volumes, whose
    planning compares cases instead)."""
    dest = Path(dest)
    files = _listed(source, dest, file_list, patterns or ["*"])
    previous = {}
    if Path(manifest_path).is_file():
        previous = {f["path"]: f for f in read_json(manifest_path).get("files", [])}
    staging = Staging(dest, expected or {}, previous, Ledger(dest / LEDGER), tree, on_bad_file,
                      retries, backoff, tree_key=tree_key)  # fmt: skip
    records, duplicates = drop_duplicates(_stage_all(files, staging, workers), on_duplicate)
    if staging.hidden:
        raise VoxjetError(
            f"{len(staging.hidden)} source files changed since they were staged though their "
            f"size and sampled bytes did not ({', '.join(sorted(staging.hidden)[:5])}), so this "
            "run could not tell before it started that what was built from them is stale. "
            "They are staged now and recorded as changed: run snakemake again, and it rebuilds "
            "what reads them"
        )
    manifest = {"version": MANIFEST_VERSION, "source": source, "root": str(dest), "files": records}
    if duplicates:
        manifest["duplicates"] = duplicates
    write_json(manifest_path, manifest)
    return manifest


def drop_duplicates(records: list[dict], on_duplicate: str) -> tuple[list[dict], list[dict]]:
    """Records (sorted by path) without those whose content an earlier one has, and those left
    out as {path, same_as}; with on_duplicate "fail", the first pair found stops staging."""
    if on_duplicate == "ignore":
        return records, []
    first: dict[tuple, str] = {}
    kept, dropped = [], []
    for r in records:
        key = (r["size"], *sorted(r["checksum"].items()))
        if key not in first:
            first[key] = r["path"]
            kept.append(r)
            continue
        if on_duplicate != "skip":
            algorithm, digest = sorted(r["checksum"].items())[0]
            raise VoxjetError(
                f"{first[key]} and {r['path']} have the same content ({algorithm} {digest}): "
                "one file under two names puts the same jets (or cases) in the training and "
                "the test split. Remove one of them from the source, or set the dataset's "
                "source.on_duplicate: skip to stage the first and leave the other out"
            )
        dropped.append({"path": r["path"], "same_as": first[key]})
    if dropped:
        pairs = ", ".join(f"{d['path']} (= {d['same_as']})" for d in dropped)
        print(f"stage: {len(dropped)} files left out as duplicates of others: {pairs}",
              file=sys.stderr)  # fmt: skip
    return kept, dropped


class Ledger:
    """The staging folder's record of verified files (see the module's docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.entries: dict[str, dict] = {}
        self.last_save = time.monotonic()
        try:
            self.entries = json.loads(path.read_text()).get("files", {})
        except (OSError, ValueError, AttributeError):
            self.entries = {}  # none yet, or unreadable: files are checked by their content

    def checksum(self, src: SourceFile) -> str | None:
        """The checksum a file of this source was verified with, whatever its state now."""
        e = self.entries.get(src.relpath) or {}
        return (
            next(iter(e.get("checksum", {}).values()), None) if e.get("source") == src.url else None
        )

    def source_changed(self, src: SourceFile) -> bool:
        """True when the source differs (size, time or ETag) from the one verified before."""
        e = self.entries.get(src.relpath)
        if not e:
            return False
        if e.get("source") != src.url or e.get("source_size") != src.size:
            return True
        return bool(src.stamp) and e.get("source_stamp") != src.stamp

    def unchanged(self, src: SourceFile, target: Path, algorithm: str) -> str | None:
        """The verified checksum when neither the source nor the staged copy changed since."""
        e = self.entries.get(src.relpath)
        if not e or self.source_changed(src):
            return None
        try:
            st = target.stat()
        except OSError:
            return None
        if st.st_size != e.get("size") or st.st_mtime_ns != e.get("mtime_ns"):
            return None
        return e.get("checksum", {}).get(algorithm)

    def record(self, src: SourceFile, target: Path, algorithm: str, digest: str, quick: str,
               generation: int = 0) -> None:  # fmt: skip
        """Note a verified file, its quick fingerprint and its generation (the count of its
        changes the fingerprint missed); saved every few seconds, and at the end."""
        st = target.stat()
        with self.lock:
            self.entries[src.relpath] = {
                "source": src.url,
                "source_size": src.size,
                "source_stamp": src.stamp,
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "checksum": {algorithm: digest},
                "quick": quick,
                "generation": generation,
            }
            if time.monotonic() - self.last_save > 5:
                self._write()

    def save(self) -> None:
        """Write the ledger now."""
        with self.lock:
            self._write()

    def _write(self) -> None:
        self.last_save = time.monotonic()
        if self.entries:
            write_json(self.path, {"version": 1, "files": self.entries})


def name_sources(text: str, manifest: dict) -> str:
    """A message about staged files with each one's own source named beside it (the user
    knows their files, not `resources/<dataset>/data/...`)."""
    root = str(manifest.get("root", "")).rstrip("/")
    for f in manifest.get("files", []):
        staged, source = f"{root}/{f['path']}", f.get("source", "")
        if staged in text and source and source.removeprefix("file://") != staged:
            text = text.replace(staged, f"{staged} [your {source}]", 1)
    return text


def load_expected(path: str | None) -> dict[str, str]:
    """Read a user's checksum manifest: JSON {relpath: checksum} or a voxjet manifest.json."""
    if not path:
        return {}
    data = read_json(path)
    if isinstance(data, dict) and "files" in data:
        return {f["path"]: next(iter(f["checksum"].values())) for f in data["files"]}
    if isinstance(data, dict):
        return {str(k): str(v) for k, v in data.items()}
    raise VoxjetError(f"{path}: expected a JSON object {{relative path: checksum}}")
