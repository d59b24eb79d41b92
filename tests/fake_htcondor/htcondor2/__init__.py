"""A stand-in for HTCondor's Python bindings (htcondor2), which snakemake-executor-plugin-htcondor
submits through instead of condor_submit: `Schedd.submit` records the submit description in
$FAKE_HTCONDOR_DIR/submits.jsonl and runs the job here in the background (an execute point on
this machine), `Schedd.query`/`history` report its state as the schedd and condor_history
would, `Schedd.act` removes it. Tests put this folder first on PYTHONPATH."""

from __future__ import annotations

import enum
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

IDLE, RUNNING, REMOVED, COMPLETED = 1, 2, 3, 4


def _state() -> Path:
    path = Path(os.environ["FAKE_HTCONDOR_DIR"])
    (path / "jobs").mkdir(parents=True, exist_ok=True)
    return path


def _job_file(cluster: int) -> Path:
    return _state() / "jobs" / f"{cluster}.json"


def _load(cluster: int) -> dict:
    return json.loads(_job_file(cluster).read_text())


def _save(job: dict) -> None:
    path = _job_file(job["ClusterId"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(job))
    tmp.replace(path)


def _next_cluster() -> int:
    with open(_state() / "counter", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read().strip() or "100") + 1
        f.seek(0)
        f.truncate()
        f.write(str(n))
    return n


class JobAction(enum.Enum):
    Remove = "Remove"
    Hold = "Hold"
    Release = "Release"


class JobEventType(enum.Enum):
    SUBMIT = 0
    EXECUTE = 1
    JOB_TERMINATED = 5
    JOB_ABORTED = 9
    JOB_HELD = 12
    JOB_RELEASED = 13


class JobEventLog:
    """No event log is written: the plugin falls back to the schedd and history queries."""

    def __init__(self, path: str) -> None:
        raise OSError(f"{path}: the fake writes no job event log")


class Submit(dict):
    def issue_credentials(self) -> None:
        return None


class SubmitResult:
    def __init__(self, cluster: int) -> None:
        self._cluster = cluster

    def cluster(self) -> int:
        return self._cluster


def _clusters(constraint: str) -> set[int]:
    return {int(c) for c in __import__("re").findall(r"ClusterId == (\d+)", constraint or "")}


def _environment(text: str) -> dict[str, str]:
    env = {}
    for item in shlex.split(text.strip('"')):
        key, _, value = item.partition("=")
        env[key] = value
    return env


class Schedd:
    def submit(self, description: Submit, count: int = 1) -> SubmitResult:
        cluster = _next_cluster()
        record = {k: str(v) for k, v in description.items()}
        with open(_state() / "submits.jsonl", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps({"cluster": cluster, "submit": record}) + "\n")
        _save({"ClusterId": cluster, "JobStatus": IDLE, "EnteredCurrentStatus": time.time(),
               "submit": record, "cwd": os.getcwd()})  # fmt: skip
        subprocess.Popen([sys.executable, __file__, "_run", str(cluster)], cwd=os.getcwd(),
                         env=dict(os.environ), start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        return SubmitResult(cluster)

    def _jobs(self, constraint: str, finished: bool) -> list[dict]:
        out = []
        for cluster in sorted(_clusters(constraint)):
            if not _job_file(cluster).exists():
                continue
            job = _load(cluster)
            if (job["JobStatus"] in (COMPLETED, REMOVED)) == finished:
                out.append({k: v for k, v in job.items() if k not in ("submit", "cwd")})
        return out

    def query(self, constraint: str = "", projection: list[str] | None = None, **kw) -> list:
        return self._jobs(constraint, finished=False)

    def history(self, constraint: str = "", projection: list[str] | None = None, **kw) -> list:
        return self._jobs(constraint, finished=True)

    def act(self, action: JobAction, job_ids: list[str]) -> None:
        for spec in job_ids:
            job = _load(int(str(spec).split(".")[0]))
            if job.get("pid"):
                try:
                    os.killpg(job["pid"], signal.SIGTERM)
                except ProcessLookupError:
                    pass
            job.update(JobStatus=REMOVED, EnteredCurrentStatus=time.time())
            _save(job)


def _run(cluster: int) -> None:
    """The execute point: run the job's executable with its arguments and environment."""
    job = _load(cluster)
    sub = job["submit"]
    env = dict(os.environ)
    env.update(_environment(sub.get("environment", "")))
    out = sub["output"].replace("$(ClusterId)", str(cluster))
    err = sub["error"].replace("$(ClusterId)", str(cluster))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "ab") as fo, open(err, "ab") as fe:
        proc = subprocess.Popen([sub["executable"], *shlex.split(sub.get("arguments", ""))],
                                cwd=job["cwd"], env=env, stdout=fo, stderr=fe,
                                start_new_session=True)  # fmt: skip
        job.update(JobStatus=RUNNING, pid=proc.pid, EnteredCurrentStatus=time.time())
        _save(job)
        code = proc.wait()
    job = _load(cluster)
    if job["JobStatus"] != REMOVED:
        job.update(JobStatus=COMPLETED, ExitCode=code, ExitBySignal=code < 0,
                   EnteredCurrentStatus=time.time())  # fmt: skip
        _save(job)


if __name__ == "__main__":
    _run(int(sys.argv[2]))
