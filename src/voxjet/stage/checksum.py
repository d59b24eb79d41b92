"""Streaming checksums: adler32 for ROOT files (what EOS/XRootD report), sha256 otherwise."""

from __future__ import annotations

import hashlib
import zlib
from typing import BinaryIO

CHUNK = 8 << 20


class Adler32:
    """hashlib-like wrapper so both algorithms stream through one code path."""

    name = "adler32"

    def __init__(self) -> None:
        self._value = 1

    def update(self, data: bytes) -> None:
        self._value = zlib.adler32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value & 0xFFFFFFFF:08x}"


def algorithm_for(path: str) -> str:
    """The checksum a file gets by its name: adler32 for .root, sha256 for the rest."""
    return "adler32" if path.lower().endswith(".root") else "sha256"


def new_hasher(algorithm: str):
    """A fresh streaming hasher for `algorithm` ('adler32' or 'sha256')."""
    if algorithm == "adler32":
        return Adler32()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checksum algorithm {algorithm!r} (use adler32 or sha256)")


def checksum_stream(stream: BinaryIO, algorithm: str) -> str:
    """Checksum of everything left in a binary stream."""
    h = new_hasher(algorithm)
    while chunk := stream.read(CHUNK):
        h.update(chunk)
    return h.hexdigest()


def checksum_file(path: str, algorithm: str | None = None) -> str:
    """Checksum of a local file, the algorithm chosen by its name unless given."""
    with open(path, "rb") as f:
        return checksum_stream(f, algorithm or algorithm_for(path))
