"""A copy of the workflow (Snakefile, rules, config, envs, profiles) in a folder of its own, for
the benchmarks that run it for real or dry: what a user's checkout holds."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_workflow(dest: Path) -> Path:
    """The workflow's files copied into `dest` (made if needed); returns `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for sub in ("workflow", "config", "envs", "profiles"):
        shutil.copytree(REPO / sub, dest / sub, dirs_exist_ok=True)
    shutil.copy(REPO / "Snakefile", dest / "Snakefile")
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest
