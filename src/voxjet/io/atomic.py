"""Write to a temporary name beside the target, then rename, so a killed job never leaves
a file or folder that the next stage would take for finished output.

Temporary names carry the writer's host and PID (`.name.tmp-<host>-<pid>`): the next writer
into the same folder removes those of dead processes of its own host (a killed job's leftovers
at JetClass scale are gigabytes). A full disk is reported with the path and the free space,
not as a library's internal error."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError

HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())
_TMP = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<host>[A-Za-z0-9._-]+)-(?P<pid>\d+)$")
_cleaned: set[Path] = set()  # folders this process has already swept


def _tmp_name(final: Path, kind: str = "tmp") -> Path:
    return final.with_name(f".{final.name}.{kind}-{HOST}-{os.getpid()}")


def temporary_name(final: str | os.PathLike) -> Path:
    """This process's temporary name beside `final` (what a dead process's clean-up finds)."""
    return _tmp_name(Path(final))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove temporaries in `folder` left by dead processes of this host (others' hosts and
    live writers are left alone); returns what was removed."""
    folder = Path(folder)
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _TMP.match(p.name)
        if m and m["host"] == HOST and not _alive(int(m["pid"])) and int(m["pid"]) != os.getpid():
            try:
                _remove(p)
                removed.append(p)
            except OSError:
                continue
    if removed:
        print(f"{folder}: removed {len(removed)} temporaries of dead processes", file=sys.stderr)
    return removed


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path if path.exists() else Path.cwd())
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(e: BaseException, path: Path) -> bool:
    """An error that means the file system ran out of space: its errno or a library's message
    that says so (h5py); torch's zip writer only says "iostream error" or "unexpected pos", so
    a failed write counts too when the folder has (almost) no space left."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e).lower()
    if "no space left" in text or "disk quota exceeded" in text:
        return True
    free = _free_bytes(path)
    return isinstance(e, OSError | RuntimeError) and free is not None and free < 64 * 2**20


def disk_full_error(path: Path, e: BaseException) -> VoxjetError:
    """The message for a write that found the disk full: the path and the space left."""
    left = _free_bytes(path.parent)
    free = "free space unknown" if left is None else f"{left / 2**20:.1f} MiB free there"
    return VoxjetError(
        f"{path}: no space left on device while writing it ({free}); free space or point "
        f"results elsewhere, then rerun (nothing half-written was kept) [{type(e).__name__}: "
        f"{str(e).splitlines()[0][:120] if str(e) else ''}]"
    )


@contextmanager
def output_folder(path: str | os.PathLike) -> Iterator[Path]:
    """An output folder made for the body (and its parents); on error, removed again if it is
    still empty, so that a failed command leaves no empty folder where the user looks for
    results (each file in it is written atomically on its own)."""
    path = Path(path)
    made = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        for p in made:  # the deepest first
            try:
                p.rmdir()
            except OSError:
                break  # not empty (another process's output, or a file written): kept
        raise


@contextmanager
def atomic_path(final: str | os.PathLike, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path; on success it replaces `final`, on error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.parent not in _cleaned:
        _cleaned.add(final.parent)
        remove_stale_temporaries(final.parent)
    tmp = _tmp_name(final)
    _remove(tmp)
    try:
        if directory:
            tmp.mkdir()
        yield tmp
    except BaseException as e:
        full = not isinstance(e, VoxjetError) and is_disk_full(e, final.parent)  # before clean-up
        _remove(tmp)
        if full:
            raise disk_full_error(final, e) from e
        raise
    if directory and final.exists():
        # os.replace cannot overwrite a non-empty folder: move the old one aside first.
        old = _tmp_name(final, "old")
        os.replace(final, old)
        os.replace(tmp, final)
        _remove(old)
    else:
        os.replace(tmp, final)


def finite_json(obj: Any) -> Any:
    """The same structure with NaN/inf floats as None: strict JSON has no such numbers."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    if hasattr(obj, "item") and hasattr(obj, "dtype"):  # numpy scalars
        return finite_json(obj.item())
    return obj


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write strict JSON atomically (NaN/inf as null), pretty-printed for people who open it."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(finite_json(obj), indent=2, allow_nan=False) + "\n")


REMAKE = "snakemake -R <the rule that writes it>; `snakemake --summary` lists which"


def read_json(path: str | os.PathLike, remake: str = REMAKE) -> Any:
    """Read JSON, naming the file when it is missing or malformed and how to make it again
    (`remake`: the command; a deleted workflow output is not remade by a plain `snakemake`
    once what follows it exists)."""
    path = Path(path)
    if not path.is_file():
        raise VoxjetError(f"{path}: file not found; make it: {remake}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise VoxjetError(f"{path}: not valid JSON ({e}), a damaged file (a job killed while "
                          f"writing it, a full disk?); make it again: {remake}") from e  # fmt: skip
