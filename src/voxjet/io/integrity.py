"""Checksums on what voxjet writes and reads back: HDF5 datasets (shards, case files,
predictions) carry a fletcher32 checksum a chunk, verified by HDF5 on every read (a flipped
byte fails the read instead of becoming a number); checkpoints a sha256 beside them, checked
when loaded. A mismatch names the file, what was read and the stage to rerun."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from voxjet.errors import VoxjetError


def checked_lz4() -> dict:
    """create_dataset keywords: LZ4 (hdf5plugin) with a fletcher32 checksum a chunk."""
    import hdf5plugin

    return {**hdf5plugin.LZ4(), "fletcher32": True}


def is_corruption(e: BaseException) -> bool:
    """A read error that means the bytes on disk are not what was written (a checksum or a
    decoder failed, or HDF5's own structures are damaged)."""
    text = str(e).lower()
    return isinstance(e, OSError | KeyError | ValueError | RuntimeError) and any(
        w in text
        for w in (
            "filter returned failure",
            "checksum",
            "fletcher",
            "bad object header",
            "truncated",
            "file signature not found",
            "wrong b-tree",
            "bad symbol table",
            "unable to open",
            "address of object past end",
            "bad local heap",
        )  # fmt: skip
    )


def corrupt_error(path: str | os.PathLike, what: str, stage: str, e: BaseException) -> VoxjetError:
    """The message for a file whose bytes changed after they were written."""
    first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
    return VoxjetError(
        f"{path}: {what} failed its checksum or cannot be decoded ({first}): the file was "
        f"damaged or changed after it was written; rerun {stage} (snakemake -R {stage}), "
        "which rewrites it"
    )


def sha256_file(path: str | os.PathLike, block: int = 1 << 22) -> str:
    """The sha256 hex digest of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def digest_path(path: str | os.PathLike) -> Path:
    """Where a file's sha256 is kept: `<name>.sha256` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def verify_digest(path: str | os.PathLike, what: str) -> None:
    """Raise when `path` has a recorded sha256 that its bytes no longer match."""
    side = digest_path(path)
    if not side.is_file():
        return
    want = side.read_text().split()[0]
    got = sha256_file(path)
    if got != want:
        raise VoxjetError(
            f"{path}: {what} does not match its recorded checksum ({side.name}: {want[:12]}…, "
            f"the file: {got[:12]}…): it was damaged or changed after it was written; delete it "
            "(and its .sha256) to start that run afresh"
        )
