"""A rule's long parameter (a run config, a dataset's section as JSON) as Snakemake sees it: the
full text on the job's command line, and a short digest where Snakemake records parameters to
decide reruns, so a changed setting reads `params ... sha256:1a2b3c4d5e6f` in the reason line
instead of kilobytes of JSON (and an unchanged one, re-serialised, changes nothing)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


class Digested(str):
    """A string whose repr (what Snakemake records and prints of a parameter) is its digest."""

    def __repr__(self) -> str:
        return f"'sha256:{hashlib.sha256(self.encode()).hexdigest()[:12]}'"


def json_param(value: Any) -> Digested:
    """`value` as canonical JSON (sorted keys), for a command line, recorded by digest."""
    return Digested(json.dumps(value, sort_keys=True))


class DigestedList(list):
    """A list parameter (what a script reads, e.g. every run's record) whose repr is the
    digest of its JSON."""

    def __repr__(self) -> str:
        text = json.dumps(list(self), sort_keys=True, default=str)
        return f"'sha256:{hashlib.sha256(text.encode()).hexdigest()[:12]}'"
