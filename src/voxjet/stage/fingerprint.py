"""What the dry run knows of a source file's content without reading the dataset: a quick
fingerprint (its size, its first and last 64 KiB and sixteen 4 KiB samples between them; the
whole file up to 4 MiB), taken from the stage's ledger while the file's size and time are
those the stage verified, and read from the file only when they are not.

Snakemake decides before any job runs what reruns. A touched or copied source (new time, same
bytes) keeps its fingerprint, so what was built from it stays; a rewritten one (other size,
header, gzip trailer or sample) changes it, so exactly the jobs that read it rerun in the same
`snakemake`. A change the samples miss (the same size, one voxel in the middle of an
uncompressed file) is caught by the stage's full checksum: the stage then counts the file's
generation up, which changes its key, and stops, so the next run rebuilds what read it."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

WHOLE = 4 << 20  # files up to this size are read whole
EDGE = 64 << 10
BLOCK = 4 << 10
SAMPLES = 16


def quick_fingerprint(path: str | os.PathLike) -> str:
    """The file's quick fingerprint: a blake2b of its size and sampled bytes."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(size.to_bytes(8, "little"), digest_size=16)
    with open(path, "rb") as f:
        if size <= WHOLE:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        else:
            inner = [(size * k // (SAMPLES + 1), BLOCK) for k in range(1, SAMPLES + 1)]
            spans = [(0, EDGE), *inner, (size - EDGE, EDGE)]
            for offset, n in spans:
                f.seek(offset)
                h.update(f.read(n))
    return h.hexdigest()


def ledger_entries(ledger: str | os.PathLike) -> dict[str, dict]:
    """The stage ledger's record of each verified file, by path (none before a first stage)."""
    try:
        return json.loads(Path(ledger).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}


def content_key(url: str, size: int, stamp: str, entry: Mapping | None) -> str:
    """What a local source file's content is known as at the dry run: size, quick fingerprint
    and generation; the ledger's fingerprint while the source is as it was verified."""
    entry = entry or {}
    same = (entry.get("source"), entry.get("source_size"), entry.get("source_stamp")) == (
        url,
        size,
        stamp,
    )
    quick = entry.get("quick") if same else None
    quick = quick or quick_fingerprint(url.removeprefix("file://"))
    return f"{size}:{quick}:{int(entry.get('generation', 0))}"


def content_keys(files: Iterable, ledger: str | os.PathLike) -> dict[str, str]:
    """content_key of each voxjet.stage.transfer.SourceFile of a local source, by its path
    relative to the source."""
    entries = ledger_entries(ledger)
    return {f.relpath: content_key(f.url, f.size, f.stamp, entries.get(f.relpath)) for f in files}


def digest(keys: Iterable[str]) -> str:
    """A short digest of content keys (order-free)."""
    return hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:16]
