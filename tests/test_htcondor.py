"""HTCondor without HTCondor: snakemake-executor-plugin-htcondor submits through HTCondor's
Python bindings, so a stand-in `htcondor2` (tests/fake_htcondor, first on PYTHONPATH) records
each submit description and runs the job here. The dry run with the htcondor profile, every
job's request in HTCondor's terms equal to its SLURM request (one place decides both), and the
demo's jets part through the executor to the summary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import merge_config, run_snakemake, snakemake_env, write_config
from readme import README

from voxjet.workflow.submissions import dry_jobs, htcondor_submit, sbatch_options

FAKE = Path(__file__).resolve().parent / "fake_htcondor"
SITE = {"slurm": {"account": "proj42", "cpu_partition": "cpu", "gpu_partition": "gpu",
                  "gpu_model": "a100"}}  # fmt: skip


@pytest.mark.parametrize("gpus", [0, 2])
def test_every_job_asks_htcondor_what_it_asks_slurm(workflow_dir, demo_config, tmp_path, gpus):
    cfg = merge_config(demo_config, {"site": SITE, "experiments": {"part": {"launch": {
        "gpus": gpus, "threads": 6, "mem_mb": 12000}}}})  # fmt: skip
    path = write_config(tmp_path / "c.yaml", cfg)
    r = run_snakemake(workflow_dir, *README["htcondor-dry-run"][1:], "-p", "--configfile",
                      str(path), "--replace-workflow-config")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = dry_jobs(r.stdout)
    assert len(jobs) > 10
    for job in jobs:
        submit, sbatch = htcondor_submit(job), sbatch_options(job)
        where = (job.rule, job.wildcards)
        assert submit["request_cpus"] == sbatch["--cpus-per-task"], where
        assert submit["request_memory"] == f"{sbatch['--mem']}MB", where
        assert submit["+MaxRuntime"] == 60 * int(sbatch["--time"]), where
        asked = sbatch.get("--gpus", "0").split(":")[-1]
        assert str(submit.get("request_gpus", 0)) == asked, where
        if job.rule == "train_jets" and job.wildcards.endswith("run=part"):
            assert (submit["request_cpus"], submit.get("request_gpus", 0)) == ("6", gpus)


@pytest.mark.slow
def test_the_demos_jets_part_runs_through_the_htcondor_executor(workflow_dir, tmp_path):
    """Every job submitted through the plugin, run by the stand-in schedd, to the summary."""
    config = workflow_dir / "config" / "config.yaml"
    demo = yaml.safe_load(config.read_text())
    demo["datasets"].pop("toy_ct")
    demo["experiments"] = {"pfn": demo["experiments"]["pfn"]}
    small = {"datasets": {"toy_jets": {"source": {"synthetic": {
                 "generator": "toy", "files_per_class": 1, "jets_per_file": 300}},
                 "jets": {"max_particles": 16}}},
             "experiments": {"pfn": {"train": {"steps": 6, "eval_every": 3, "batch_size": 32},
                                     "launch": {"threads": 1}}}}  # fmt: skip
    write_config(config, merge_config(demo, small))
    state = tmp_path / "schedd"
    prof = tmp_path / "speedy"
    prof.mkdir()
    (prof / "config.yaml").write_text("seconds-between-status-checks: 1\njobs: 4\n")
    env = snakemake_env()
    env.update(FAKE_HTCONDOR_DIR=str(state), SNAKEMAKE_PROFILE=str(prof),
               PYTHONPATH=os.pathsep.join([str(FAKE), env["PYTHONPATH"]]))  # fmt: skip
    r = run_snakemake(workflow_dir, *README["htcondor-run"][1:], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    submits = [json.loads(line) for line in (state / "submits.jsonl").read_text().splitlines()]
    rules = {s["submit"]["batch_name"].rsplit("-", 1)[0] for s in submits}
    assert {"synth_jets", "stage", "shard_jets", "index_jets", "train_jets", "evaluate_jets",
            "plan_runs", "aggregate"} <= rules, rules  # fmt: skip
    for s in submits:
        sub = s["submit"]
        assert int(sub["request_cpus"]) >= 1 and sub["request_memory"].endswith("MB")
        assert int(sub["+MaxRuntime"]) >= 60 and "request_gpus" not in sub
    train = [s["submit"] for s in submits if s["submit"]["batch_name"].startswith("train_jets")]
    assert {t["request_cpus"] for t in train} == {"1"}  # the run's launch.threads
    summary = (workflow_dir / "results" / "summary" / "summary.md").read_text()
    assert "| pfn_lr-0.001" in summary
