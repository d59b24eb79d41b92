"""`voxjet job`, what every rule runs: the log locked before it is written (a refused second
job never truncates a running job's log) and the outputs' ledger entries marked until the
command succeeds, in state files beside the outputs."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from conftest import BIN, snakemake_env

from voxjet.io import ledger


def _job(cwd, log, outputs, *command) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "voxjet"), "job", "--log", log, "--outputs", *outputs, "--", *command],
        cwd=cwd, env=snakemake_env(), capture_output=True, text=True,
    )  # fmt: skip


def test_a_failed_job_leaves_its_outputs_marked_and_a_good_one_clears_them(tmp_path):
    entry = tmp_path / ledger.state_path("results/a/manifest.json")
    bad = _job(tmp_path, "logs/stage.log", ["results/a/manifest.json"],
               "stage", "--source", "nowhere", "--dest", "d", "--manifest", "m.json")  # fmt: skip
    assert bad.returncode == 2 and bad.stderr == ""  # all of it went to the log
    assert "voxjet stage: error:" in (tmp_path / "logs/stage.log").read_text()
    record = json.loads(entry.read_text())
    assert record["state"] == "started" and record["job"] == "logs/stage.log"
    assert entry.stat().st_mtime > time.time() - 60  # newer than anything built before
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.txt").write_text("x")
    good = _job(tmp_path, "logs/stage.log", ["results/a/manifest.json"],
                "stage", "--source", "src", "--dest", "d", "--manifest", "m.json")  # fmt: skip
    assert good.returncode == 0, (tmp_path / "logs/stage.log").read_text()
    assert json.loads(entry.read_text())["state"] == "clear" and entry.stat().st_mtime == 0


def test_a_crash_goes_to_the_log_with_its_traceback(tmp_path):
    r = _job(tmp_path, "l.log", ["out.json"], "aggregate", "--runs", "[{}]", "--out", "o")
    assert r.returncode != 0
    log = (tmp_path / "l.log").read_text()
    assert "error" in log.lower() and r.stderr == ""
    assert json.loads((tmp_path / ledger.state_path("out.json")).read_text())["state"] == "started"


def test_a_second_job_on_a_held_log_is_refused_without_touching_it(tmp_path):
    from voxjet.job import log_lock

    log = tmp_path / "logs" / "train.log"
    log.parent.mkdir()
    log.write_text("step 100 of the running job\n")
    lock = log_lock(log).acquire()  # the running job
    try:
        r = _job(tmp_path, "logs/train.log", ["model.pt"], "stage", "--dest", "d",
                 "--manifest", "m")  # fmt: skip
    finally:
        lock.release()
    assert r.returncode == 2
    assert "logs/train.log: another process is running this job" in r.stderr
    assert f"PID {os.getpid()}" in r.stderr
    assert log.read_text() == "step 100 of the running job\n"
    assert not (tmp_path / ledger.state_path("model.pt")).exists()


def test_states_sit_beside_their_outputs_and_only_jobs_write_them(tmp_path, monkeypatch):
    """The state of `results/x/index.json` is `results/x/.index.json.voxjet-state` (of a folder
    output, beside the folder); looking for states writes none (a dry run changes nothing)."""
    monkeypatch.chdir(tmp_path)
    assert ledger.state_path("results/x/index.json") == Path("results/x/.index.json.voxjet-state")
    assert ledger.state_path("results/x/plan/") == Path("results/x/.plan.voxjet-state")
    assert ledger.existing_states(["results/x/index.json"]) == []
    assert not (tmp_path / "results").exists()
    ledger.mark(["results/x/index.json"], "j")
    assert ledger.existing_states(["results/x/index.json"]) == [
        "results/x/.index.json.voxjet-state"
    ]
    assert ledger.read("results/x/index.json")["pid"] == os.getpid()
    ledger.clear(["results/x/index.json"])
    assert os.stat("results/x/.index.json.voxjet-state").st_mtime == 0


def test_a_run_makes_missing_states_cleared_and_never_overwrites_a_mark(tmp_path, monkeypatch):
    """What a run's DAG construction does (ledger.ensure): the same state paths whether the job
    ran or not, missing ones made cleared and dated at the epoch, a job's mark kept."""
    monkeypatch.chdir(tmp_path)
    ledger.mark(["results/a.json"], "job a")
    paths = ledger.ensure(["results/a.json", "results/b/part_0000"])
    assert paths == ["results/.a.json.voxjet-state", "results/b/.part_0000.voxjet-state"]
    assert ledger.read("results/a.json")["state"] == "started"
    assert ledger.read("results/b/part_0000") == {"state": "clear"}
    assert os.stat(paths[1]).st_mtime == 0
    assert sorted(p.name for p in (tmp_path / "results" / "b").iterdir()) == [
        ".part_0000.voxjet-state"  # no temporary file left
    ]
