"""Write to a temporary name beside the target, then rename, so a killed job never leaves
a file or folder that the next stage would take for finished output."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextmanager
def atomic_path(final: str | os.PathLike, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path; on success it replaces `final`, on error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(final)
    _remove(tmp)
    if directory:
        tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    if directory and final.exists():
        # os.replace cannot overwrite a non-empty folder: move the old one aside first.
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
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


def read_json(path: str | os.PathLike) -> Any:
    """Read JSON, naming the file when it is missing or malformed."""
    from voxjet.errors import VoxjetError

    path = Path(path)
    if not path.is_file():
        raise VoxjetError(f"{path}: file not found (did the stage that writes it run?)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise VoxjetError(f"{path}: not valid JSON ({e}); delete it and rerun the stage") from e
