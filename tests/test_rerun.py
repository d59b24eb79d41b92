"""What a second `snakemake` redoes: nothing for sources whose content did not change (touched,
copied without times, a config file saved again), what depends on a source whose content did;
and a dry run on a fresh clone changes nothing in it but Snakemake's own `.snakemake/`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import uproot
from conftest import JETS_ARGS, copy_workflow, job_counts, run_snakemake

pytestmark = pytest.mark.slow

# What a run leaves that a user keeps: the model, its evaluation and the summary.
KEPT = ("results/j/runs/pfn/model.pt", "results/j/runs/pfn/eval", "results/summary")


@pytest.fixture
def wf(finished_jets, tmp_path) -> Path:
    """A copy of the finished tiny jets workflow (times kept, Snakemake's records with it)."""
    return Path(shutil.copytree(finished_jets, tmp_path / "wf", symlinks=True))


def _digests(wf: Path) -> dict[str, str]:
    """blake2b of every file under KEPT, by path."""
    out = {}
    for top in KEPT:
        paths = [wf / top] if (wf / top).is_file() else sorted((wf / top).rglob("*"))
        for p in paths:
            if p.is_file():
                out[str(p.relative_to(wf))] = hashlib.blake2b(p.read_bytes()).hexdigest()
    assert any(k.endswith("model.pt") for k in out) and len(out) > 5, out
    return out


def _dry_jobs(wf: Path) -> dict[str, int]:
    r = run_snakemake(wf, *JETS_ARGS, "-n")
    assert r.returncode == 0, r.stderr[-3000:]
    return {} if "Nothing to be done" in r.stdout else job_counts(r.stdout)


def _touch(paths: list[Path]) -> None:
    """Every path's times set to now, as `touch`, `cp` without -p or a restore do."""
    for p in paths:
        os.utime(p)


def test_touched_sources_and_config_rerun_nothing_beyond_the_stage(wf):
    before = _digests(wf)
    sources = sorted((wf / "src").glob("*.root"))
    _touch([*sources, wf / "c.yaml"])
    assert set(_dry_jobs(wf)) <= {"stage", "all"}
    r = run_snakemake(wf, *JETS_ARGS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _digests(wf) == before
    assert _dry_jobs(wf) == {}  # and it settles


def test_copied_without_times_the_sources_rerun_nothing_beyond_the_stage(wf, tmp_path):
    before = _digests(wf)
    copy = tmp_path / "copy"
    shutil.copytree(wf / "src", copy, copy_function=shutil.copyfile)  # `cp -r`, no times
    shutil.rmtree(wf / "src")
    shutil.move(copy, wf / "src")  # the move to another filesystem keeps the new times
    _touch(sorted((wf / "src").glob("*.root")))
    assert set(_dry_jobs(wf)) <= {"stage", "all"}
    assert run_snakemake(wf, *JETS_ARGS).returncode == 0
    assert _digests(wf) == before


def test_a_changed_source_reruns_what_depends_on_it(wf):
    path = wf / "src" / "Wqq_001.root"
    with uproot.open(path) as f:
        arrays = f["tree"].arrays(library="ak")
    fields = {k: arrays[k][:-10] for k in arrays.fields}  # ten jets fewer
    with uproot.recreate(path) as f:
        f.mktree("tree", {k: v.type for k, v in fields.items()}).extend(fields)
    # the dry run shows the stage, whose manifest decides what follows once it has run
    dry = run_snakemake(wf, *JETS_ARGS, "-n")
    assert "stage" in job_counts(dry.stdout), dry.stdout[-3000:]
    before = _digests(wf)
    r = run_snakemake(wf, *JETS_ARGS)
    assert r.returncode == 0, r.stderr[-3000:]
    for rule in ("shard_jets", "index_jets", "train_jets", "evaluate_jets", "aggregate"):
        assert f"rule {rule}:" in r.stderr, rule
    after = _digests(wf)
    assert after["results/j/runs/pfn/model.pt"] != before["results/j/runs/pfn/model.pt"]
    index = json.loads((wf / "results/j/shards/index.json").read_text())
    assert sum(split["jets"] for split in index["splits"].values()) == 590
    # each reason says what changed in a line, not the run's whole config
    reasons = [ln for ln in r.stderr.splitlines() if "reason:" in ln]
    assert reasons and max(map(len, reasons)) < 300, max(reasons, key=len)


def test_a_dry_run_on_a_fresh_clone_changes_nothing_but_snakemakes_folder(tmp_path):
    wf = copy_workflow(tmp_path / "clone")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(wf)]
    subprocess.run([*git, "init", "-q"], check=True)
    (wf / ".gitignore").write_text("")  # nothing hidden from the listing below
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], check=True)

    def listing() -> set[str]:
        out = subprocess.run([*git, "status", "--porcelain", "--ignored", "-uall"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return set(out.splitlines())

    before = listing()
    r = run_snakemake(wf, "-n")
    assert r.returncode == 0, r.stderr[-3000:]
    new = listing() - before
    # Snakemake keeps its own records there whatever the workflow; everything else is untouched
    assert all(line.startswith("?? .snakemake/") for line in new), new
