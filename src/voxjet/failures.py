"""What failed, said last and once: each failed job's own voxjet message (from its log), as one
line, for the end of the console (voxjet's Snakemake logger prints them after Snakemake's
summary; the Snakefile's `onerror` does when another logger is in use), and Snakemake's
tracebacks for a config file that is missing or not YAML turned into one line naming the file
and, for YAML, the line and column."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from voxjet.config_file import config_file_problem

Logs = str | os.PathLike | Sequence[str | os.PathLike]  # what Snakemake gives onerror: `log`
_FAILED = re.compile(r"^Error in rule (\w+):\n(?:    .*\n)*?    log: (\S+)", re.M)
# a line that starts a job's error: the CLI's (`voxjet CMD: error: …`) or the launcher's
# summary of its processes' errors (`launch: rank N failed: …`), which comes after torchrun's
_START = re.compile(r"^(?:voxjet [\w-]+: (?:error:|\w+Error:)|launch: ranks? [\d, ]+ failed:)")
# where a message's continuation lines end: a traceback or torchrun's report after it
_END = re.compile(r"^(?:Traceback \(most recent call last\)|\[W|W\d{4} |E\d{4} |=+$|-+$)")
LONGEST = 700  # characters of a message on the console; the log keeps all of it


def failed_jobs(snakemake_logs: Logs) -> list[tuple[str, str]]:
    """(rule, job log) of every failed job Snakemake's log(s) report, in order, once each."""
    paths = [snakemake_logs] if isinstance(snakemake_logs, (str, os.PathLike)) else snakemake_logs
    text = "".join(Path(p).read_text(errors="replace") for p in paths if Path(p).is_file())
    return list(dict.fromkeys((m[1], m[2]) for m in _FAILED.finditer(text)))


def one_line(lines: Iterable[str]) -> str:
    """A message of several lines as one: a line ending in ':' runs on into the next, other
    lines are joined with '; '; cut at LONGEST characters, saying where the rest is."""
    out = ""
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        out = line if not out else f"{out} {line}" if out.endswith(":") else f"{out}; {line}"
    if len(out) > LONGEST:
        out = out[: LONGEST - 1].rstrip() + "… (the rest in the log)"
    return out


def last_message(job_log: str | os.PathLike) -> str | None:
    """The last voxjet error a job's log holds (a launcher's summary of its processes' errors
    counts as one), its lines joined into one, or None."""
    path = Path(job_log)
    if not path.is_file():
        return None
    lines = path.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if _START.match(line)]
    if not starts:
        return None
    body = [lines[starts[-1]]]
    for line in lines[starts[-1] + 1 :]:
        if _END.match(line):
            break
        body.append(line)
    return one_line(body)


def job_failure(rule: str, log: str | None) -> str:
    """The console's line for one failed job: its rule, its log and its voxjet message."""
    message = (last_message(log) if log else None) or "no voxjet message; see the log"
    return f"voxjet: {rule} failed ({log or 'no log'}): {message}"


def failure_summary(snakemake_logs: Logs) -> list[str]:
    """One line a failed job of Snakemake's log(s)."""
    return [job_failure(rule, log) for rule, log in failed_jobs(snakemake_logs)]


def configfiles_of(argv: Sequence[str]) -> list[str]:
    """The files given to `--configfile`/`--configfiles` on a snakemake command line."""
    files, taking = [], False
    for arg in argv:
        name, eq, value = arg.partition("=")
        if name in ("--configfile", "--configfiles"):
            taking = not eq
            if eq:
                files.append(value)
        elif arg.startswith("-"):
            taking = False
        elif taking:
            files.append(arg)
    return files


def config_error_line(message: str, argv: Sequence[str]) -> str | None:
    """Snakemake's error for a config file it could not load (a traceback for a missing file, a
    sentence naming no file for bad YAML) as voxjet's one line, or None for other errors."""
    if not (
        "Config file is not valid JSON or YAML" in message
        or ("No such file or directory" in message and "load_configfile" in message)
        or ("IsADirectoryError" in message and "load_configfile" in message)
    ):
        return None
    for path in configfiles_of(argv):
        problem = config_file_problem(path)
        if problem:
            return f"voxjet: {problem}"
    return None
