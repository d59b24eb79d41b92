"""Outputs never written over inputs: a command whose output folder is, contains or lies
inside one of its inputs would replace the user's own files (predict's score files took the
names of the ntuples they were computed from)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path

from voxjet.errors import VoxjetError


def _local_root(spec: str) -> Path | None:
    """The local file or folder an input names (a glob's fixed part); None for a URL."""
    if "://" in spec and not spec.startswith("file://"):
        return None
    spec = spec.removeprefix("file://")
    if glob.has_magic(spec):
        fixed = []
        for part in Path(spec).parts:
            if glob.has_magic(part):
                break
            fixed.append(part)
        spec = str(Path(*fixed)) if fixed else "."
    return Path(os.path.realpath(spec))


def refuse_overlap(out: str | os.PathLike, inputs: Iterable[str], command: str, flag: str) -> None:
    """Stop, naming both, when the output folder `out` is an input, holds one or lies in one."""
    target = Path(os.path.realpath(out))
    for spec in inputs:
        root = _local_root(str(spec))
        if root is None:
            continue
        if target == root or root.is_relative_to(target) or target.is_relative_to(root):
            how = ("is" if target == root else "holds" if root.is_relative_to(target)
                   else "lies inside")  # fmt: skip
            raise VoxjetError(
                f"{command}: {flag} {out} {how} the input {spec}: its outputs could replace "
                f"the input files. Give {flag} a folder of its own, outside the inputs"
            )
