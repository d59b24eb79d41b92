"""metrics.jsonl: one JSON object a logged step, appended and flushed so a killed job keeps
what it logged; on resume, lines after the checkpoint's step are dropped."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from voxjet.io.atomic import finite_json


class MetricsLog:
    """Append-only JSON-lines log owned by rank 0."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> None:
        """Drop records logged after `step` (work the checkpoint does not contain)."""
        if not self.enabled or not self.path.exists():
            return
        keep = [
            line
            for line in self.path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step
        ]
        self.path.write_text("".join(line + "\n" for line in keep))

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (with a wall-clock time stamp)."""
        if not self.enabled:
            return
        clean = finite_json(record)
        clean.setdefault("time", time.time())
        with open(self.path, "a") as f:
            f.write(json.dumps(clean, allow_nan=False) + "\n")
            f.flush()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class StepTimer:
    """Splits wall time into waiting for data and the rest, for the data-stall fraction."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start a new logging window."""
        self.data = 0.0
        self.items = 0
        self.start = self._t = time.perf_counter()

    def data_ready(self) -> None:
        """Call when a batch has arrived: the time since the last step ended was data wait."""
        now = time.perf_counter()
        self.data += now - self._t
        self._t = now

    def step_done(self, items: int) -> None:
        """Call when the step's compute finished."""
        self._t = time.perf_counter()
        self.items += items

    def other_done(self) -> None:
        """Call after work that is neither a step nor waiting (validation, a checkpoint): its
        time counts in the window's wall time, not as data wait."""
        self._t = time.perf_counter()

    def summary(self) -> dict[str, float]:
        """Throughput and data-wait fraction over the window."""
        total = max(time.perf_counter() - self.start, 1e-9)
        return {
            "items_per_s": self.items / total,
            "data_wait_fraction": min(1.0, self.data / total),
        }
