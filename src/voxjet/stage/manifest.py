"""The stage's manifest as what follows the stage reads it: its digest of the staged files'
content (their paths, sizes, checksums and entries), the same for a manifest rewritten with the
same content."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def content_of(manifest: dict) -> list:
    """What a manifest says of the staged files' content, in a fixed order."""
    keys = ("path", "size", "checksum", "entries", "unreadable")
    return sorted([[k, f.get(k)] for k in keys] for f in manifest.get("files", []))


def staged_digest(path: str | os.PathLike) -> str:
    """A short digest of a manifest's files' content ("" before the first stage)."""
    p = Path(path)
    if not p.is_file():
        return ""
    try:
        manifest = json.loads(p.read_text())
    except (OSError, ValueError):
        return ""  # a torn manifest: the stage reruns, and the digest is asked again after it
    text = json.dumps([content_of(manifest), manifest.get("duplicates")], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
