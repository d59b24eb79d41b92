"""The running jobs' progress, read from their logs: what voxjet's Snakemake logger prints while
a training, evaluation or preprocessing job runs (its step, rate and time left), so the console
says more than "n of 43 steps" for the quarter of an hour a training job takes.

Each job's log is read from where the last look stopped (a job on a cluster node writes it on the
shared file system). A job's newest progress line is shown when it is new and the job's last one
on the console is older than `voxjet.progress.interval` of the job's age: often in a job's first
minute, then every half minute. At most `most` jobs a look; the others are counted, so a cluster
run of a thousand jobs does not flood the console."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from voxjet.progress import interval, latest_line

TAIL_BYTES = 65536  # of a log grown by more since the last look, only its end is read


@dataclass
class Watched:
    """One running job: where its log is, how far it was read, what the console last showed."""

    label: str
    log: Path
    started: float
    offset: int = 0
    shown_at: float | None = None
    newest: str | None = None
    shown: str | None = None


@dataclass
class RunningJobs:
    """The jobs Snakemake started and has not seen end, by job id."""

    shortest: float = 5.0
    longest: float = 30.0
    most: int = 4
    jobs: dict[int, Watched] = field(default_factory=dict)

    def started(self, jobid: int, label: str, log: str | None, now: float | None = None) -> None:
        """Watch a job from now (no log: nothing to show)."""
        if log:
            self.jobs[jobid] = Watched(label, Path(log), time.monotonic() if now is None else now)

    def ended(self, jobid: int) -> None:
        """Stop watching a job (failed: its error is said instead)."""
        self.jobs.pop(jobid, None)

    def finished(self, jobid: int) -> list[str]:
        """Stop watching a job that finished: its last progress line (the whole run's steps,
        rate and time), if the console showed an earlier one and not this; jobs too short to
        have shown one stay quiet, so a thousand short jobs add nothing."""
        job = self.jobs.pop(jobid, None)
        if job is None or job.shown is None:
            return []
        self._read(job)
        return [self._line(jobid, job)] if job.newest != job.shown else []

    @staticmethod
    def _line(jobid: int, job: Watched) -> str:
        return f"    job {jobid} ({job.label}): {job.newest}"

    def _read(self, job: Watched) -> None:
        try:
            size = os.path.getsize(job.log)
        except OSError:
            return  # not started yet (a queued cluster job), or its log is elsewhere
        if size < job.offset:  # truncated: a retry's fresh log
            job.offset = 0
        if size == job.offset:
            return
        start = max(job.offset, size - TAIL_BYTES)
        skipped = start > job.offset  # grown by more than TAIL_BYTES: start inside a line
        with open(job.log, "rb") as f:
            f.seek(start)
            data = f.read(size - start)
        end = data.rfind(b"\n") + 1  # a line still being written is read at the next look
        if end == 0:
            return
        job.offset = start + end
        text = data[:end].decode("utf-8", "replace")
        if skipped:
            text = text.split("\n", 1)[-1]
        line = latest_line(text)
        if line:
            job.newest = line

    def due(self, now: float | None = None) -> list[str]:
        """The console lines due now: each job's newest progress line not yet shown, if its
        last one is old enough; the most stale first, at most `most`, then a count of the rest."""
        now = time.monotonic() if now is None else now
        ready = []
        for jobid, job in self.jobs.items():
            self._read(job)
            if job.newest is None or job.newest == job.shown:
                continue
            gap = interval(now - job.started, self.shortest, self.longest)
            if job.shown_at is None or now - job.shown_at >= gap:
                ready.append((job.shown_at or job.started, jobid, job))
        ready.sort(key=lambda r: r[:2])
        lines = []
        for _, jobid, job in ready[: self.most]:
            job.shown, job.shown_at = job.newest, now
            lines.append(self._line(jobid, job))
        if len(ready) > self.most:
            lines.append(f"    … and {len(ready) - self.most} more running jobs with news in "
                         "their logs")  # fmt: skip
        return lines
