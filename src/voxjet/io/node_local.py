"""Node-local copies of prepared data (`read.node_local`), as HPC sites ask of training jobs on
shared filesystems and as weaver (`--copy-inputs`) and salt (`move_files_temp`) offer: the
shards or case files a job reads are copied once a node into node-local storage (`$TMPDIR`,
`$SLURM_TMPDIR`, /dev/shm), verified, read from there by every process of the node, and
removed when the last of them is done (kept with `read.keep_node_local: true`, for the next job
on the node).

One copy a node: the processes of a node take an exclusive lock on the copy's folder in turn;
the first copies (free space checked first), the others find it complete. Each registers
itself while it reads; the last to leave removes the copy."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.io.atomic import HOST
from voxjet.progress import Progress

COMPLETE = ".complete.json"
USERS = ".users"
HEADROOM = 1.05  # free space asked for beyond the copy's size
BLOCK = 16 << 20


def node_dir(setting: str, where: str) -> Path:
    """The node-local folder a setting names, environment variables expanded; one left
    unexpanded (not set on this node) is an error naming it."""
    expanded = os.path.expandvars(os.path.expanduser(setting))
    if "$" in expanded:
        raise VoxjetError(f"{where}: {setting!r} names a variable this node does not set "
                          f"({expanded!r}); use a folder every node has, e.g. /tmp")  # fmt: skip
    return Path(expanded)


def _listing(location: str, storage_options: dict) -> tuple[list[tuple[str, int]], object]:
    """(relative name, size) of every file under a folder or URL, and the filesystem."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(str(location), **storage_options)
    root = root.rstrip("/")
    if not root:  # a URL fsspec cannot place (e.g. a chained one): never list the whole cwd
        raise VoxjetError(f"{location}: cannot tell which folder this URL names; give the "
                          "folder's URL in the protocol://path form")  # fmt: skip
    files = []
    for path, info in sorted(fs.find(root, detail=True).items()):
        if info.get("type", "file") == "file":
            files.append((path[len(root) + 1 :], int(info["size"])))
    if not files:
        raise VoxjetError(f"{location}: no files to copy to node-local storage")
    return files, (fs, root)


def _copy_verified(fs, src: str, dst: Path, size: int) -> None:
    """Copy one file, then read the copy back: its size and CRC32 must be the source's."""
    crc = 0
    tmp = dst.with_name(f".{dst.name}.part")
    with fs.open(src, "rb") as fin, open(tmp, "wb") as fout:
        while block := fin.read(BLOCK):
            crc = zlib.crc32(block, crc)
            fout.write(block)
    back = 0
    with open(tmp, "rb") as f:
        while block := f.read(BLOCK):
            back = zlib.crc32(block, back)
    if tmp.stat().st_size != size or back != crc:
        tmp.unlink(missing_ok=True)
        raise VoxjetError(f"{src}: its node-local copy {dst} does not match it (size or CRC32); "
                          "the node's storage may be failing: rerun on another node")  # fmt: skip
    tmp.replace(dst)


def _fill(dest: Path, files: list[tuple[str, int]], source, location: str, base: Path) -> None:
    """Copy every file into `dest` (free space checked first) and mark it complete."""
    fs, root = source
    need = sum(size for _, size in files)
    free = shutil.disk_usage(base).free
    if free < need * HEADROOM:
        raise VoxjetError(
            f"read.node_local: copying {location} needs {need / 2**30:.2f} GiB, but {base} has "
            f"{free / 2**30:.2f} GiB free; point node_local at larger node-local storage, or "
            "read in place (node_local: null)"
        )

    bar = Progress(len(files), f"node-local copy to {dest}", "file")
    for rel, size in files:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        _copy_verified(fs, f"{root}/{rel}", out, size)
        bar.update(1)
    bar.close()
    (dest / COMPLETE).write_text(json.dumps({"source": location, "files": files}))


def _users(dest: Path) -> list[Path]:
    """The processes registered as reading the copy; those of this host that died (a killed
    job leaves its entry) are dropped."""
    folder = dest / USERS
    alive = []
    for entry in folder.iterdir() if folder.is_dir() else ():
        host, pid, _ = (entry.name.rsplit("-", 2) + ["", ""])[:3]
        if host == HOST and pid.isdigit():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                entry.unlink(missing_ok=True)
                continue
            except PermissionError:
                pass
        alive.append(entry)
    return alive


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the node's processes in turn
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def node_local(location: str, setting: str | None, keep: bool = False,
               storage_options: dict | None = None) -> Iterator[str]:  # fmt: skip
    """The folder to read `location` from: itself without `setting`, else its node-local copy
    (made, or found complete) for as long as the block runs."""
    if not setting:
        yield str(location)
        return
    base = node_dir(setting, "read.node_local")
    key = hashlib.sha256(str(location).encode()).hexdigest()[:16]
    dest = base / "voxjet" / key
    me = dest / USERS / f"{HOST}-{os.getpid()}-{threading.get_ident()}"
    with _locked(base / "voxjet" / f".{key}.lock"):
        files, source = _listing(str(location), storage_options or {})
        done = dest / COMPLETE
        fresh = done.is_file() and json.loads(done.read_text()).get("files") == [
            list(f) for f in files
        ]
        if not fresh:
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            try:
                _fill(dest, files, source, str(location), base)
            except BaseException:
                shutil.rmtree(dest, ignore_errors=True)  # no partial copy left behind
                raise
        me.parent.mkdir(parents=True, exist_ok=True)
        me.touch()
    print(f"read.node_local: reading {location} from {dest}" + ("" if fresh else " (copied)"),
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        yield str(dest)
    finally:
        with _locked(base / "voxjet" / f".{key}.lock"):
            me.unlink(missing_ok=True)
            if not _users(dest) and not keep:
                shutil.rmtree(dest, ignore_errors=True)


def localised(location: str, read: dict | None) -> contextmanager:
    """node_local() with a dataset's `read:` settings (a no-op without `node_local`)."""
    r = read or {}
    return node_local(str(location), r.get("node_local"), bool(r.get("keep_node_local")),
                      r.get("storage_options"))  # fmt: skip
