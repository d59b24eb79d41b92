"""The conda environment the rules run in under `snakemake --sdm conda`. Snakemake copies an
env file under `.snakemake/conda/` before creating it, so a pip entry relative to the file
(`-e ..`) would point at the wrong folder: the workflow uses a copy whose pip entry names the
workflow's own folder."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path

LOCAL_PACKAGE = "-e .."  # envs/voxjet.yaml installs the checkout it sits in


def render_conda_env(template: str | os.PathLike, workflow_dir: str | os.PathLike) -> str:
    """The env file's text with its pip entry for voxjet pointing at `workflow_dir`."""
    text = Path(template).read_text()
    root = Path(workflow_dir).resolve()
    if not (root / "pyproject.toml").is_file():
        raise VoxjetError(
            f"{template}: the workflow folder {root} has no pyproject.toml to install voxjet "
            "from; run snakemake from a voxjet checkout"
        )
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == f"- {LOCAL_PACKAGE}"]
    if len(hits) != 1:
        raise VoxjetError(f"{template}: expected one pip entry '- {LOCAL_PACKAGE}' to render")
    i = hits[0]
    lines[i] = lines[i].replace(LOCAL_PACKAGE, f"-e {root}")
    return "\n".join(lines) + "\n"


def conda_env_file(
    template: str | os.PathLike, workflow_dir: str | os.PathLike, out_dir: str | os.PathLike
) -> Path:
    """Write the rendered env file under `out_dir` (named by its content, written atomically
    so concurrent Snakemake processes never read half a file) and return its path."""
    text = render_conda_env(template, workflow_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"voxjet-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    if not path.is_file() or path.read_text() != text:
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    return path


def rule_env(template: str | os.PathLike, workflow_dir: str | os.PathLike, deployed: bool,
             named: str = "../../envs/voxjet.yaml") -> str:  # fmt: skip
    """The rules' `conda:` env: the file as the rules name it (`named`, relative to them), or,
    when Snakemake deploys envs (`--sdm conda`), a rendered copy that installs voxjet from the
    workflow's own folder."""
    if not deployed:
        return named
    return str(conda_env_file(template, workflow_dir, ".snakemake/voxjet-envs").resolve())
