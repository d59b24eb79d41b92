"""Copy files from a local path, glob or fsspec URL into a staging folder: several in flight,
retries with backoff, write to a temporary name, verify, rename; a rerun skips verified files."""

from __future__ import annotations

import fnmatch
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import fsspec

from voxjet.errors import VoxjetError
from voxjet.io.atomic import read_json, write_json
from voxjet.progress import Progress
from voxjet.stage.checksum import CHUNK, algorithm_for, checksum_file, new_hasher

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class SourceFile:
    """One file to stage: where it is read from and where it lands relative to the stage root."""

    url: str
    relpath: str
    size: int


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def list_sources(
    source: str, patterns: list[str]
) -> tuple[fsspec.AbstractFileSystem, list[SourceFile]]:
    """Resolve a directory, glob or URL into the files to stage, sorted by relative path."""
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
            f"source {source!r} does not exist: fix the dataset's source.path in the config "
            "(a directory, a glob such as /data/*.root, or a URL such as root://host//path/)"
        )
    files = []
    for p, info in sorted(listing.items()):
        rel = str(PurePosixPath(p).relative_to(base))
        name = PurePosixPath(rel).name
        if info.get("type") == "directory" or name.startswith("."):
            continue
        if not any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(name, pat) for pat in patterns):
            continue
        files.append(SourceFile(url=fs.unstrip_protocol(p), relpath=rel, size=int(info["size"])))
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
            size = int(fs.info(p)["size"])
        except FileNotFoundError as e:
            raise VoxjetError(f"{path}: listed file {url!r} does not exist") from e
        files.append(SourceFile(url=fs.unstrip_protocol(p), relpath=name, size=size))
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
    tmp = dest.with_name(f".{dest.name}.part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    last_error: Exception | None = None
    for attempt in range(retries + 1):
        try:
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
                    f"{src.url}: {algorithm} {digest} does not match the manifest's {expected}; "
                    "the source file is corrupt or the manifest is stale"
                )
            os.replace(tmp, dest)
            return digest
        except VoxjetError:
            tmp.unlink(missing_ok=True)
            raise
        except OSError as e:
            last_error = e
            tmp.unlink(missing_ok=True)
            if attempt < retries:
                time.sleep(backoff * 2**attempt)
    raise VoxjetError(f"{src.url}: copy failed after {retries + 1} tries: {last_error}")


def _root_entries(path: Path, tree: str | None) -> int | None:
    if tree is None or not path.name.endswith(".root"):
        return None
    import uproot

    try:
        with uproot.open(path) as f:
            if tree not in f:
                raise VoxjetError(
                    f"{path}: no tree named {tree!r} (it has {sorted(f.keys())}); "
                    "set the dataset's jets.tree in the config"
                )
            return int(f[tree].num_entries)
    except VoxjetError:
        raise
    except Exception as e:
        raise VoxjetError(f"{path}: not a readable ROOT file ({e})") from e


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
) -> dict:
    """Stage `source` (or the files a `file_list` names) into `dest` and write the manifest
    last; returns the manifest."""
    dest = Path(dest)
    if file_list:
        files = list_from_file(file_list, patterns or ["*"])
    else:
        _, files = list_sources(source, patterns or ["*"])
    previous = {}
    if Path(manifest_path).is_file():
        previous = {f["path"]: f for f in read_json(manifest_path).get("files", [])}
    expected = expected or {}

    def one(src: SourceFile) -> dict:
        target = dest / src.relpath
        algorithm = algorithm_for(src.relpath)
        want = expected.get(src.relpath)
        prev = previous.get(src.relpath)
        digest = None
        if target.is_file() and target.stat().st_size == src.size:
            known = want or (prev or {}).get("checksum", {}).get(algorithm)
            if known is not None:
                got = checksum_file(str(target), algorithm)
                digest = got if got == known else None
        if digest is None:
            digest = _copy_verified(src, target, want, retries, backoff)
        record = {
            "path": src.relpath,
            "source": src.url,
            "size": src.size,
            "checksum": {algorithm: digest},
        }
        entries = _root_entries(target, tree)
        if entries is not None:
            record["entries"] = entries
        return record

    records = []
    bar = Progress(len(files), f"stage {Path(dest).name}", "file")
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(one, f): f for f in files}
        for fut in as_completed(futures):
            records.append(fut.result())
            bar.update(1)
    bar.close()
    records.sort(key=lambda r: r["path"])
    manifest = {"version": MANIFEST_VERSION, "source": source, "root": str(dest), "files": records}
    write_json(manifest_path, manifest)
    return manifest


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
