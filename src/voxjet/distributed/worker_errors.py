"""The failing processes' own messages, brought to the end of the job's output: a worker that
stops with voxjet's error (or crashes) leaves a line in the launcher's folder, and the launcher
prints those lines after torchrun's ChildFailedError report, so the console and the log end
with what went wrong and its fix, not with torchrun's traceback (which stays above it)."""

from __future__ import annotations

import os
from pathlib import Path

ERROR_DIR_ENV = "VOXJET_ERROR_DIR"


def record(message: str) -> None:
    """Leave this process's error line for its launcher (nothing outside a launched job)."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder:
        return
    rank = os.environ.get("RANK", "0")
    path = Path(folder) / f"rank-{int(rank):06d}.txt"
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(message.rstrip() + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # the error is on stderr anyway; the summary is a convenience


def summary(folder: str | os.PathLike) -> list[str]:
    """The distinct error lines the processes left, each with the ranks that gave it."""
    by_message: dict[str, list[int]] = {}
    for path in sorted(Path(folder).glob("rank-*.txt")):
        rank = int(path.stem.split("-")[1])
        by_message.setdefault(path.read_text().strip(), []).append(rank)
    lines = []
    for message, ranks in by_message.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        lines.append(f"launch: {who} failed: {message}")
    return lines
