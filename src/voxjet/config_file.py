"""Reading a YAML (or JSON) config file a user wrote, and saying in one line what is wrong with
one that cannot be read: the file, and for a syntax error the line and column."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError


def config_file_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with a config file Snakemake could not load, in one line naming the file
    (and for YAML or JSON the line and column), or None when it loads."""
    import yaml

    p = Path(path)
    if not p.exists():
        return f"config file {path} does not exist (looked for {p.absolute()})"
    if p.is_dir():
        return f"config file {path} is a folder; give the YAML file in it"
    text = p.read_text(errors="replace")
    if p.suffix == ".json":
        try:
            json.loads(text)
        except json.JSONDecodeError as e:
            return f"{path} line {e.lineno}, column {e.colno}: not valid JSON: {e.msg}"
        return None
    try:
        yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = e.context or ""
        if e.context_mark and e.problem_mark and e.context_mark.line != e.problem_mark.line:
            cm = e.context_mark  # where the unclosed bracket, quote or block began
            context += f" begun at line {cm.line + 1}, column {cm.column + 1}"
        what = "; ".join(x for x in (context, e.problem) if x)
        tab = " (a tab in the indentation? YAML indents with spaces)" if "\t" in text else ""
        return f"{path}{where}: not valid YAML: {what}{tab}; fix it there and rerun"
    except yaml.YAMLError as e:
        return f"{path}: not valid YAML: {e}"
    return None


def read_config_file(path: str | os.PathLike, what: str = "config") -> dict[str, Any]:
    """The mapping a YAML/JSON file holds; a missing file, a syntax error (line, column) or a
    file that is not a mapping is a VoxjetError naming it."""
    problem = config_file_problem(path)
    if problem:
        raise VoxjetError(problem)
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise VoxjetError(f"{what} file {path}: holds {type(data).__name__}, not a mapping of "
                          "keys (datasets:, experiments:, …)")  # fmt: skip
    return data
