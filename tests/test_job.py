"""`voxjet job`, what every rule runs: the log locked before it is written (a refused second
job never truncates a running job's log) and the outputs' ledger entries marked until the
command succeeds."""

from __future__ import annotations

import json
import os
import subprocess
import time

from conftest import BIN, snakemake_env

from voxjet.io import ledger


def _job(cwd, log, outputs, *command) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "voxjet"), "job", "--log", log, "--outputs", *outputs, "--", *command],
        cwd=cwd, env=snakemake_env(), capture_output=True, text=True,
    )  # fmt: skip


def test_a_failed_job_leaves_its_outputs_marked_and_a_good_one_clears_them(tmp_path):
    entry = tmp_path / ledger.ledger_path("results/a/manifest.json")
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
    assert json.loads((tmp_path / ledger.ledger_path("out.json")).read_text())["state"] == "started"


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
    assert not (tmp_path / ledger.ledger_path("model.pt")).exists()


def test_new_entries_are_clear_and_dated_at_the_epoch(tmp_path):
    path = ledger.ensure_entry("results/x/index.json", root=tmp_path)
    assert os.stat(path).st_mtime == 0
    assert ledger.ledger_path("/abs/p.h5", tmp_path) == tmp_path / "abs" / "p.h5"
    ledger.mark(["results/x/index.json"], "j", root=tmp_path)
    assert ledger.ensure_entry("results/x/index.json", root=tmp_path) == path
    assert json.loads(open(path).read())["pid"] == os.getpid()  # left as marked
