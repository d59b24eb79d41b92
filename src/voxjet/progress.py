"""Progress of long work: a tqdm bar on a terminal, plain periodic lines in a log file (rules
send stderr to `logs/`, where a bar would be one line of carriage returns). Snakemake's console
(voxjet's logger, snakemake_logger_plugin_voxjet) shows the newest such line of each running
job: `latest_line` finds it."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def _fmt_s(s: float) -> str:
    s = int(s)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


# `desc: n/total unit, rate unit/s, m:ss elapsed[, m:ss left][, postfix]`, as Progress writes it
LINE = re.compile(r"^[^:\n]{1,120}: \d+(?:/\d+)? \S+, \S+ \S+/s, [\d:]+ elapsed\b.*$", re.M)


def latest_line(text: str) -> str | None:
    """The last progress line Progress wrote in `text` (a log's newest part), or None."""
    matches = LINE.findall(text)
    return matches[-1] if matches else None


def interval(elapsed_s: float, shortest: float = 5.0, longest: float = 30.0) -> float:
    """Seconds between two lines after `elapsed_s`: short at first (a job of a minute still
    shows several), then `longest`, so a day-long job writes a line every half minute."""
    return min(longest, max(shortest, elapsed_s / 4))


class Progress:
    """`update(n)` as work gets done; on a terminal a tqdm bar, elsewhere one plain line every
    `interval_s` seconds (None: `interval` of the time elapsed) and one at the end (`desc:
    n/total unit, rate, elapsed, left`)."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        initial: int = 0,
        disable: bool = False,
        interval_s: float | None = None,
        stream: Any = None,
    ) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.disabled = disable
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.postfix = ""
        self._bar = None
        if not disable and getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, initial=initial, desc=desc, unit=unit, file=self.stream, mininterval=1
            )
        self._start = self._last = time.monotonic()
        self._n0 = initial

    def update(self, n: int = 1) -> None:
        """Count `n` more units done."""
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif not self.disabled:
            now = time.monotonic()
            gap = self.interval_s if self.interval_s is not None else interval(now - self._start)
            if now - self._last >= gap:
                self._line()

    def set_postfix(self, **values: Any) -> None:
        """What to show after the count (e.g. the latest loss)."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())
        if self._bar is not None:
            self._bar.set_postfix(values, refresh=False)

    def _line(self) -> None:
        now = time.monotonic()
        self._last = now
        elapsed = now - self._start
        rate = (self.n - self._n0) / elapsed if elapsed > 0 else 0.0
        parts = [
            f"{self.desc}: {self.n}" + (f"/{self.total}" if self.total else "") + f" {self.unit}"
        ]
        parts.append(f"{rate:.3g} {self.unit}/s, {_fmt_s(elapsed)} elapsed")
        if self.total and rate > 0 and self.n < self.total:
            parts.append(f"{_fmt_s((self.total - self.n) / rate)} left")
        if self.postfix:
            parts.append(self.postfix)
        print(", ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        """The final line (or close the bar)."""
        if self._bar is not None:
            self._bar.close()
        elif not self.disabled:
            self._line()


def progress(
    items: Iterable[T],
    desc: str,
    unit: str = "it",
    total: int | None = None,
    disable: bool = False,
    interval_s: float | None = None,
) -> Iterator[T]:
    """Iterate `items`, reporting progress as Progress does."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    bar = Progress(total, desc, unit, disable=disable, interval_s=interval_s)
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()
