"""voxjet's console for Snakemake (`--logger voxjet`; voxjet's profiles set it).

Snakemake's own lines as its default handler prints them, and:

- while jobs run, the newest progress line of each (step or case, rate, time left), read from
  its log (voxjet.watch): often in a job's first minute, then every `--logger-voxjet-interval`
  seconds at most, and a watched job's last line when it finishes;
- at the end of a failed run, each failed job's voxjet message (the file, the key, the fix) as
  one line, once, as the console's last lines (its log keeps the whole story);
- Snakemake's traceback for a `--configfile` that does not exist or is not YAML as one line
  naming the file (and the line and column); `--verbose` shows the tracebacks as before.

Snakemake finds this module by its name (snakemake_logger_plugin_*), installed with voxjet.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase

from voxjet.failures import config_error_line, job_failure
from voxjet.watch import RunningJobs

TICK_S = 2.0  # how often the running jobs' logs are looked at


@dataclass
class LogHandlerSettings(LogHandlerSettingsBase):
    """`--logger-voxjet-interval`, `--logger-voxjet-jobs` (or the same keys in a profile)."""

    interval: int = field(
        default=30,
        metadata={
            "help": "most seconds between two progress lines of a running job on the console "
            "(sooner in its first minute); 0: no progress lines",
            "type": int,
        },
    )
    jobs: int = field(
        default=4,
        metadata={
            "help": "running jobs whose progress one look shows (the rest are counted)",
            "type": int,
        },  # fmt: skip
    )


def _first_log(record: logging.LogRecord) -> str | None:
    logs = getattr(record, "log", None) or []
    return str(logs[0]).split(" ")[0] if logs else None


def _label(record: logging.LogRecord) -> str:
    wildcards = getattr(record, "wildcards", None) or {}
    rule = getattr(record, "rule_name", "?")
    return f"{rule} {'/'.join(str(v) for v in wildcards.values())}".strip()


class LogHandler(LogHandlerBase):
    """Snakemake's console, with running jobs' progress and failures said last."""

    def __post_init__(self) -> None:
        from snakemake.logging import ColorizingTextHandler

        cs = self.common_settings
        self.console = ColorizingTextHandler(
            nocolor=cs.nocolor, stream=sys.stdout if cs.stdout else sys.stderr
        )
        settings = self.settings or LogHandlerSettings()
        self.watch = RunningJobs(longest=max(settings.interval, 1), most=max(settings.jobs, 1))
        self.watching = settings.interval > 0 and not cs.dryrun
        self.failed: dict[int, tuple[str, str | None]] = {}
        self.logs: dict[int, str | None] = {}  # each started job's log, by job id
        self.jobs_lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.closed = False

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return False  # Snakemake's default filter (quiet, --printshellcmds, …) applies

    @property
    def has_formatter(self) -> bool:
        return False  # Snakemake's default formatter writes its lines

    @property
    def needs_rulegraph(self) -> bool:
        return False

    def emit(self, record: logging.LogRecord) -> None:
        """Track jobs and failures; print the record as Snakemake's console would, except a
        traceback that voxjet says in one line."""
        event = getattr(record, "event", None)
        last: list[str] = []
        with self.jobs_lock:
            if event == LogEvent.JOB_INFO:
                self.logs[record.jobid] = _first_log(record)
                if self.watching:
                    self.watch.started(record.jobid, _label(record), self.logs[record.jobid])
                    self._start_thread()
            elif event == LogEvent.JOB_FINISHED:
                last = self.watch.finished(record.job_id)
                self.failed.pop(record.job_id, None)  # a retry that succeeded
            elif event == LogEvent.JOB_ERROR:
                self.watch.ended(record.jobid)
                log = _first_log(record) or self.logs.get(record.jobid)
                self.failed[record.jobid] = (record.rule_name, log)
        if event == LogEvent.ERROR and not self.common_settings.verbose:
            message = str(record.msg)
            if message.startswith("RuleException:") and "CalledProcessError" in message:
                return  # the failed shell command again; the job's error block names its log
            short = config_error_line(message, sys.argv)
            if short:
                record = logging.makeLogRecord({**record.__dict__, "msg": short, "args": ()})
        for line in last:
            self._say(line)
        self._print(record)

    def _print(self, record: logging.LogRecord) -> None:
        if self.console.formatter is None:
            self.console.setFormatter(self.formatter)
        self.console.emit(record)

    def _say(self, text: str, level: int = logging.INFO) -> None:
        self._print(logging.makeLogRecord({"msg": text, "levelno": level,
                                           "levelname": logging.getLevelName(level)}))  # fmt: skip

    def _start_thread(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._look, name="voxjet-progress", daemon=True)
            self.thread.start()

    def _look(self) -> None:
        while not self.stopped.wait(TICK_S):
            with self.jobs_lock:
                lines = self.watch.due()
            for line in lines:
                self._say(line)

    def close(self) -> None:
        """Stop watching; the failed jobs' voxjet messages, last."""
        if not self.closed:
            self.closed = True
            self.stopped.set()
            if self.thread is not None:
                self.thread.join(timeout=5)
            for rule, log in self.failed.values():
                self._say(job_failure(rule, log), logging.ERROR)
            self.console.flush()
        super().close()
