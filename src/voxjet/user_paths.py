"""Paths in a config as a shell would read them: `~` and `$VARS` (`${VARS}`) expanded, so that
`source.path: ~/data/jetclass` or `$SCRATCH/jets` name the folder the user means; a variable
that is not set is refused naming the key, never left in the path to fail as "does not exist"."""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from typing import Any

from voxjet.errors import VoxjetError

_VAR = re.compile(r"\$(\w+)|\$\{([^}]*)\}")
_SOURCE_KEYS = ("path", "file_list", "prepared")


def expand(value: str, where: str) -> str:
    """`value` with a leading `~` and every `$VAR`/`${VAR}` expanded."""
    out = os.path.expanduser(value) if value.startswith("~") else value
    unset = [a or b for a, b in _VAR.findall(out) if (a or b) not in os.environ]
    if unset:
        raise VoxjetError(
            f"config key '{where}': {value!r} uses the environment variable ${unset[0]}, which "
            "is not set here; export it before running snakemake, or write the path out"
        )
    return os.path.expandvars(out)


def expand_user_paths(config: MutableMapping[str, Any]) -> None:
    """Expand the paths a user writes (sources, weaver configs, prediction inputs) in place."""
    for name, ds in (config.get("datasets") or {}).items():
        if not isinstance(ds, MutableMapping):
            continue
        source = ds.get("source")
        if isinstance(source, MutableMapping):
            for key in _SOURCE_KEYS:
                if isinstance(source.get(key), str):
                    source[key] = expand(source[key], f"datasets.{name}.source.{key}")
        jets = ds.get("jets")
        if isinstance(jets, MutableMapping) and isinstance(jets.get("weaver_config"), str):
            jets["weaver_config"] = expand(jets["weaver_config"],
                                           f"datasets.{name}.jets.weaver_config")  # fmt: skip
    for name, p in (config.get("predict") or {}).items():
        if not isinstance(p, MutableMapping):
            continue
        given = p.get("input")
        where = f"predict.{name}.input"
        if isinstance(given, str):
            p["input"] = expand(given, where)
        elif isinstance(given, list):
            p["input"] = [expand(v, f"{where}[{i}]") if isinstance(v, str) else v
                          for i, v in enumerate(given)]  # fmt: skip
