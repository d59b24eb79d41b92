"""SLURM without SLURM: fake `sbatch`/`squeue`/`sacct`/`srun`/`scontrol` record what voxjet and
Snakemake's SLURM plugin ask of them and run the jobs here. Multi-node launches, the stop
before a time limit, and the whole workflow through `--executor slurm` with the slurm profile."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from conftest import BIN, merge_config, run_snakemake, write_config
from fake_slurm import calls, options
from readme import README
from slurm_jobs import dry_jobs, sbatch_of

from voxjet.distributed.checkpoint import PREEMPTED_EXIT_CODE
from voxjet.distributed.launch import RDZV_PORT
from voxjet.distributed.slurm import parse_slurm_duration, stop_delay_s
from voxjet.training.logger import read_metrics

MODEL = {"name": "pfn", "phi_sizes": [16, 16], "f_sizes": [16]}
TRAIN = {"batch_size": 32, "lr": 3e-3, "warmup_steps": 4, "log_every": 5, "seed": 3}


# what a record measures of the machine, not of the training: differs between two sessions
TIMINGS = {"time", "jets_per_s", "data_wait_fraction", "window_s"}


def test_slurm_durations_and_the_stop_time():
    assert parse_slurm_duration("1-02:03:04") == ((24 + 2) * 60 + 3) * 60 + 4
    assert parse_slurm_duration("2:03:04") == (2 * 60 + 3) * 60 + 4
    assert parse_slurm_duration("03:04") == 3 * 60 + 4
    assert parse_slurm_duration("2-05") == (2 * 24 + 5) * 3600
    assert parse_slurm_duration("UNLIMITED") is None
    assert stop_delay_s(3600, 300) == 3300
    assert stop_delay_s(200, 300) == 100  # a short job still trains for half its time


def _submit(env, workdir: Path, command: str, *sbatch_args: str) -> str:
    r = subprocess.run(
        ["sbatch", "--parsable", "--job-name", "t", *sbatch_args, f"--wrap={command}"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.strip()


def _wait(state: Path, job: str, timeout: float = 600) -> dict:
    path = state / "jobs" / f"{job}.json"
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = json.loads(path.read_text())
        if info["state"] not in {"PENDING", "RUNNING"}:
            return info
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not end within {timeout} s")


def _launch_cmd(shards: Path, out: Path, cfg: dict, *launch: str) -> str:
    return (
        f"{BIN / 'voxjet'} launch --gpus 0 {' '.join(launch)} -- train-jets --shards {shards}"
        f" --run-config '{json.dumps(cfg)}' --out {out}"
    )


def test_two_node_job_starts_one_torchrun_a_node_at_a_c10d_rendezvous(shards, tmp_path, fake_slurm):
    env, state = fake_slurm
    out = tmp_path / "run"
    cfg = {"model": MODEL, "train": {**TRAIN, "steps": 20, "eval_every": 10}}
    job = _submit(env, tmp_path, _launch_cmd(shards, out, cfg, "--nodes", "2"), "--nodes=2")
    info = _wait(state, job)
    log = Path(info["output"]).read_text()
    assert info["exit_code"] == 0, log[-3000:]
    # the node list came from squeue + scontrol, as the jobstep leaves no SLURM_NODELIST
    assert ["-h", "-j", job, "-o", "%N"] in calls(state, "squeue")
    assert ["show", "hostnames", "127.0.0.1,127.0.0.2"] in calls(state, "scontrol")
    (srun,) = calls(state, "srun")
    opts = options(srun)
    assert (opts["--nodes"], opts["--ntasks"], opts["--ntasks-per-node"]) == ("2", "2", "1")
    torchrun = srun[srun.index(next(a for a in srun if a.endswith("torchrun"))) :]
    assert "--nnodes=2" in torchrun and "--nproc-per-node=1" in torchrun
    assert "--rdzv-backend=c10d" in torchrun
    assert f"--rdzv-endpoint=127.0.0.1:{RDZV_PORT + int(job) % 1000}" in torchrun
    assert f"--rdzv-id=voxjet-{job}" in torchrun
    model = torch.load(out / "model.pt", weights_only=True)
    assert model["world_size"] == 2
    digests = model["rank_param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]


def test_multi_node_outside_slurm_fails_saying_what_to_do(shards, tmp_path):
    from conftest import snakemake_env

    cmd = _launch_cmd(shards, tmp_path / "run", {"model": MODEL}, "--nodes", "2")
    r = subprocess.run(cmd, shell=True, env=snakemake_env(), capture_output=True, text=True)
    assert r.returncode == 2
    assert "needs a SLURM allocation" in r.stderr and "launch.nodes: 1" in r.stderr


def test_training_checkpoints_and_stops_before_the_time_limit(shards, tmp_path, fake_slurm):
    env, state = fake_slurm
    out = tmp_path / "run"
    cfg = {"model": MODEL, "train": {**TRAIN, "steps": 10**6, "checkpoint_every": 10**6}}
    # a 40 s limit and a 35 s margin: the launcher stops training after max(5, 20) s (long
    # enough for a loaded machine to start training and take steps before it)
    job = _submit(env, tmp_path, _launch_cmd(shards, out, cfg, "--stop-margin", "35"), "-t", "0:40")
    info = _wait(state, job)
    log = Path(info["output"]).read_text()
    assert info["exit_code"] == PREEMPTED_EXIT_CODE, log[-3000:]
    # half of the time left (about 20 of 40 s), as the margin is most of the limit
    m = re.search(rf"SLURM job {job} has (\d+) s left; checkpointing and stopping in (\d+) s", log)
    assert m and 0 < int(m[2]) <= 20 and abs(int(m[2]) - int(m[1]) / 2) <= 1
    assert torch.load(out / "checkpoints" / "last.pt", weights_only=True)["step"] > 0
    assert not (out / "model.pt").exists()


def test_a_node_local_training_job_reads_only_its_copy(shards, tmp_path, fake_slurm):
    env, state = fake_slurm
    src, hidden, out = tmp_path / "shared" / "shards", tmp_path / "hidden", tmp_path / "run"
    shutil.copytree(shards, src)
    cfg = {"model": MODEL, "train": {**TRAIN, "steps": 60, "eval_every": 30}}
    train = (f"{BIN / 'voxjet'} launch --gpus 0 -- train-jets --shards {src} --run-config "
             f"'{json.dumps(cfg)}' --read '{json.dumps({'node_local': '$SLURM_TMPDIR'})}' "
             f"--out {out}")  # fmt: skip
    # the job's own shell hides the shared copy as soon as the node-local one is complete:
    # from then on, a read of the shared folder fails the job
    wrap = (f"{train} & pid=$!; until ls $SLURM_TMPDIR/voxjet/*/.complete.json; do "
            f"kill -0 $pid || break; sleep 0.05; done; mv {src} {hidden}; wait $pid")  # fmt: skip
    job = _submit(env, tmp_path, wrap)
    info = _wait(state, job)
    log = Path(info["output"]).read_text()
    assert info["exit_code"] == 0, log[-3000:]
    assert hidden.is_dir() and (out / "model.pt").is_file()
    scratch = state / "scratch" / info["nodes"][0] / job
    assert f"{scratch}/voxjet/" in log  # the job said where it read
    assert ".complete.json" in log  # and the shared copy was hidden while it trained
    assert not list(scratch.glob("voxjet/*/.complete.json"))  # and removed its copy at the end


# the names a site gives its queues (config `site.slurm`, the one place a site edits)
SITE = {"slurm": {"account": "my_account", "cpu_partition": "cpu", "gpu_partition": "gpu",
                  "gpu_model": "a100"}}  # fmt: skip
TINY = {
    "site": SITE,
    "datasets": {
        "toy_jets": {
            "source": {
                "synthetic": {"generator": "toy", "files_per_class": 1, "jets_per_file": 300}
            },
            "jets": {"max_particles": 24, "jets_per_shard": 400, "shard_jobs": 1},
        },
        "toy_ct": {
            "source": {"synthetic": {"train_cases": 5, "test_cases": 1}},
            "volumes": {"patch_size": [32, 32, 16]},
        },
    },
    "experiments": {
        "pfn": {
            "model": {"phi_sizes": [16, 16], "f_sizes": [16]},
            "train": {"steps": 60, "eval_every": 30, "lr": 0.003},
            "launch": {"threads": 1, "runtime": 30, "mem_mb": 3000},
        },
        "pfn-2node": {
            "dataset": "toy_jets",
            "model": {"name": "pfn", "phi_sizes": [16, 16], "f_sizes": [16]},
            "train": {"steps": 40, "eval_every": 20, "batch_size": 64},
            "launch": {"gpus": 0, "nodes": 2, "threads": 1, "runtime": 45, "mem_mb": 6000},
        },
        "unet": {
            "model": {"channels": [8, 16, 32]},
            "train": {"steps": 40, "eval_every": 20, "iterations_per_epoch": 20},
            "launch": {"threads": 1},
        },
    },
}
# experiments of the demo config that this run leaves out
DROPPED = ("particlenet", "part")
SPEEDY = ["--slurm-init-seconds-before-status-checks=1", "--seconds-between-status-checks=1",
          "--jobs=2", "--retries=1"]  # fmt: skip


def speedy(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The environment with a global Snakemake profile that polls the fake SLURM every second
    (the README's command line then runs as written, with the workflow profile beside it)."""
    prof = tmp_path / "speedy-profile"
    prof.mkdir(parents=True)
    (prof / "config.yaml").write_text(
        "slurm-init-seconds-before-status-checks: 1\nseconds-between-status-checks: 1\n"
    )
    return {**env, "SNAKEMAKE_PROFILE": str(prof)}


@pytest.mark.long
@pytest.mark.slow
def test_whole_workflow_through_the_slurm_executor(workflow_dir, fake_slurm, tmp_path):
    env, state = fake_slurm
    yaml_config(workflow_dir)
    env = speedy({**env, "FAKE_SLURM_ENERGY_J": "36000"}, tmp_path)  # sacct records energy
    dry = run_snakemake(workflow_dir, *README["slurm-dry-run"][1:], env=env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    r = run_snakemake(workflow_dir, *README["slurm-run"][1:], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    submitted = {}
    for argv in calls(state, "sbatch"):
        opts = options(argv)
        submitted.setdefault(opts["--comment"].split("_wildcards_")[0], []).append(opts)
    # the dry run was the submission: what each rule's jobs asked for, as the dry run printed it
    keys = ("--partition", "--cpus-per-task", "--gpus", "--nodes", "--ntasks", "--mem", "--time")
    printed = defaultdict(set)
    for job in dry_jobs(dry.stdout):
        printed[f"rule_{job['rule']}"].add(tuple(sbatch_of(job).get(k) for k in keys))
    for rule, jobs in submitted.items():
        assert {tuple(o.get(k) for k in keys) for o in jobs} == printed[rule], rule
    rules = {"rule_" + r for r in ("synth_jets", "stage", "shard_jets", "train_jets", "aggregate")}
    assert rules <= submitted.keys()
    for rule, jobs in submitted.items():
        for opts in jobs:
            assert opts["--account"] == "my_account" and "--time" in opts and "--mem" in opts
            # the demo asks for the CPU: every job on the CPU partition, none asking for a GPU
            # (GPU requests: the test below, and tests/test_cluster.py for every rule)
            assert "--gpus" not in opts and "--gres" not in opts
            assert opts["--partition"] == "cpu"
            assert "--cpus-per-task" in opts
            if rule.startswith(("rule_train_", "rule_evaluate_")):
                assert opts["--cpus-per-task"] == "1"  # the run's launch.threads
    train = {o["--comment"].split("toy_jets_")[-1]: o for o in submitted["rule_train_jets"]}
    one, two = train["pfn"], train["pfn-2node"]
    assert (one["--time"], one["--mem"], one["--nodes"]) == ("30", "3000", "1")
    assert one["--ntasks"] == "1"  # one launcher a node (it starts the processes)
    assert (two["--nodes"], two["--ntasks"], two["--time"], two["--mem"]) == (
        "2",
        "2",
        "45",
        "6000",
    )
    # the 5 per-case preprocessing jobs went as one job array of 5 tasks, not 5 submissions
    (cases,) = submitted["rule_preprocess_case"]
    assert cases["--array"] == "1-5"
    assert submitted["rule_train_seg"][0]["--partition"] == "cpu"
    # the 2-node run: the jobstep left it alone (no `srun -n1`), voxjet's srun started torchrun
    # (its evaluation runs on the experiment's processes too)
    multi = [a for a in calls(state, "srun") if any("--nnodes=2" in x for x in a)]
    assert sorted(next(x for x in a if x in ("train-jets", "evaluate-jets")) for a in multi) == [
        "evaluate-jets",
        "train-jets",
    ]
    assert all(options(a)["--nodes"] == "2" for a in multi)
    runs = workflow_dir / "results" / "toy_jets" / "runs"
    assert torch.load(runs / "pfn-2node" / "model.pt", weights_only=True)["world_size"] == 2
    summary = (workflow_dir / "results" / "summary" / "summary.md").read_text()
    assert "| pfn-2node" in summary and "| unet" in summary
    # what each job cost: the energy its sacct record holds (36 kJ = 0.01 kWh), from sacct
    rows = list(csv.DictReader(open(workflow_dir / "results" / "summary" / "metrics.csv")))
    energy = {r["run"]: (float(r["value"]), r["note"]) for r in rows if r["metric"] == "energy_kwh"}
    assert energy["pfn"] == (pytest.approx(0.01), "from sacct"), energy
    # the profile's efficiency report, from sacct, at the end
    assert list(workflow_dir.glob("efficiency_report_*.csv"))
    q = subprocess.run(README["squeue"], cwd=workflow_dir, env=env, capture_output=True, text=True)
    assert q.returncode == 0 and ["--me"] in calls(state, "squeue")


def test_gpu_jobs_ask_slurm_for_gpus_and_stop_before_training_without_them(
    workflow_dir, fake_slurm, shards, tmp_path
):
    """What a GPU run submits (`--gpus=<model>:<n>`, nodes and tasks), and, on a node where torch
    sees no GPU, the job's stop before training with the reason on the console."""
    env, state = fake_slurm
    exp = {"dataset": "prepared", "model": MODEL, "train": {"steps": 4, "eval_every": 2}}
    cfg = {
        "site": SITE,
        "datasets": {"prepared": {"domain": "jets", "source": {"prepared": str(shards)}}},
        "experiments": {
            "one": {**exp, "launch": {"gpus": 1, "threads": 1, "runtime": 30, "mem_mb": 3000}},
            "two": {**exp, "launch": {"gpus": 2, "nodes": 2, "runtime": 45, "mem_mb": 6000}},
        },
    }
    path = write_config(tmp_path / "gpu.yaml", cfg)
    targets = [f"results/prepared/runs/{r}/model.pt" for r in ("one", "two")]
    r = run_snakemake(
        workflow_dir,
        "--workflow-profile",
        "workflow/profiles/slurm",
        "--configfile",
        str(path),
        "--replace-workflow-config",
        "--keep-going",
        "--retries=0",
        *targets,
        env=speedy(env, tmp_path),
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0
    train = {
        options(a)["--comment"].split("prepared_")[-1]: options(a) for a in calls(state, "sbatch")
    }
    one, two = train["one"], train["two"]
    assert (one["--gpus"], one["--partition"], one["--cpus-per-task"]) == ("a100:1", "gpu", "1")
    assert (one["--time"], one["--mem"], one["--nodes"]) == ("30", "3000", "1")
    # several nodes: GPUs a node (--gpus is the job's total, which SLURM may spread unevenly)
    assert (two["--gres"], two["--nodes"], two["--ntasks"]) == ("gpu:a100:2", "2", "2")
    assert "--gpus" not in two
    # as many CPUs as the command's threads (launch.threads, on each node), one task a node
    assert two["--cpus-per-task"] == "2" and "--cpus-per-gpu" not in one
    assert "--ntasks-per-gpu" not in one and "--ntasks-per-gpu" not in two
    assert out.count("GPU(s) asked for, but this torch") >= 2, out[-4000:]
    assert not list((workflow_dir / "results").rglob("last.pt"))


def yaml_config(workflow_dir: Path) -> Path:
    """The demo config shrunk (an overlay through --configfile would merge the dropped runs
    back in, so the copy's config.yaml is rewritten)."""
    import yaml

    path = workflow_dir / "config" / "config.yaml"
    demo = yaml.safe_load(path.read_text())
    for name in DROPPED:
        demo["experiments"].pop(name)
    demo["experiments"]["pfn"].pop("sweep")
    demo["experiments"]["unet"].pop("sweep")  # one run of each domain shows the submissions
    write_config(path, merge_config(demo, TINY))
    return path


@pytest.mark.long
@pytest.mark.slow
def test_cancelled_training_is_retried_and_resumes_to_the_uninterrupted_result(
    workflow_dir, fake_slurm
):
    """SIGTERM to every process of a running training job (what SLURM does on preemption or
    scancel): the job checkpoints, Snakemake's retry resubmits it, and it resumes from the
    checkpoint to the same metrics as an identical run that was never interrupted."""
    import yaml

    env, state = fake_slurm
    path = workflow_dir / "config" / "config.yaml"
    demo = yaml.safe_load(path.read_text())
    demo["datasets"] = {
        "toy_jets": merge_config(demo["datasets"]["toy_jets"], TINY["datasets"]["toy_jets"])
    }
    exp = {
        "dataset": "toy_jets",
        "model": {"name": "pfn", "phi_sizes": [32, 32], "f_sizes": [32]},
        "train": {"steps": 2000, "eval_every": 500, "checkpoint_every": 500, "lr": 0.003},
        "launch": {"gpus": 0, "threads": 1, "runtime": 30},
    }
    demo["experiments"] = {"pfn-a": exp, "pfn-b": exp}
    write_config(path, demo)
    runs = workflow_dir / "results" / "toy_jets" / "runs"
    targets = [f"results/toy_jets/runs/{r}/model.pt" for r in ("pfn-a", "pfn-b")]
    proc = subprocess.Popen(
        [
            str(BIN / "snakemake"),
            "--workflow-profile",
            "workflow/profiles/slurm",
            *SPEEDY,
            *targets,
        ],
        cwd=workflow_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    last = runs / "pfn-a" / "checkpoints" / "last.pt"
    deadline = time.time() + 600
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert last.exists(), "training never wrote its first checkpoint"
    (job,) = [
        j["id"]
        for j in map(json.loads, (p.read_text() for p in (state / "jobs").glob("*.json")))
        if "pfn-a" in j["script"] and "train_jets" in j["script"]
    ]
    subprocess.run(["scancel", job], env=env, check=True)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-5000:]
    cancelled = json.loads((state / "jobs" / f"{job}.json").read_text())
    assert cancelled["state"] == "CANCELLED"
    log = (workflow_dir / "logs" / "train_jets" / "toy_jets" / "pfn-a.log").read_text()
    resumed = re.search(r"resumed from .*last\.pt at step (\d+)", log)
    assert resumed and 0 < int(resumed[1]) < 2000, log[-3000:]
    a, b = (
        [
            {k: v for k, v in r.items() if k not in TIMINGS}
            for r in read_metrics(runs / name / "metrics.jsonl")
            if "cost" not in r  # what the sessions cost differs; what they trained may not
        ]
        for name in ("pfn-a", "pfn-b")
    )
    steps = [r["step"] for r in a if "loss" in r]
    assert steps == sorted(set(steps))  # nothing logged twice across the resume
    assert a == b


@pytest.mark.long
@pytest.mark.slow
def test_many_shard_parts_go_to_slurm_as_job_arrays_and_all_finish(tmp_path, fake_slurm):
    """200 shard parts (jets.shard_jobs) with the slurm profile as README runs it: four sbatch
    calls of a 50-task array each (the profile's slurm-array-limit), a task a part, every part
    written and indexed."""
    from conftest import copy_workflow

    from voxjet.jets.synth import ToyJetsConfig, generate_dataset

    env, state = fake_slurm
    wf = copy_workflow(tmp_path / "wf")
    generate_dataset(wf / "src", ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=1,
                     jets_per_file=1000, seed=3), progress=False)  # fmt: skip
    jets = {"labels": ["label_QCD", "label_Wqq"], "max_particles": 8, "shard_jobs": 200}
    pfn = {"dataset": "j", "model": MODEL, "launch": {"gpus": 0}}
    cfg = {"datasets": {"j": {"domain": "jets", "source": {"path": "src"}, "jets": jets}},
           "experiments": {"pfn": pfn}}  # fmt: skip
    write_config(wf / "config" / "config.yaml", cfg)
    r = run_snakemake(wf, *README["slurm-run"][1:], "--until", "index_jets",
                      env=speedy(env, tmp_path), timeout=3000)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    shard = [options(a) for a in calls(state, "sbatch") if "rule_shard_jets" in " ".join(a)]
    spans = [[int(x) for x in o["--array"].split("-")] for o in shard]
    assert len(shard) == 4 and all(b - a + 1 == 50 for a, b in spans), spans
    parts = sorted((wf / "results" / "j" / "shards").glob("part_*"))
    assert len(parts) == 200
    index = json.loads((wf / "results" / "j" / "shards" / "index.json").read_text())
    assert sum(s["jets"] for s in index["splits"].values()) == 2000
    # more array jobs than may be in flight: refused before any job, not a stalled run
    refused = run_snakemake(wf, *README["slurm-run"][1:], "--jobs", "100", "--forceall",
                            env=speedy(env, tmp_path / "again"))  # fmt: skip
    assert refused.returncode != 0
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("voxjet: shard_jets has 200 jobs, submitted as SLURM job arrays, but "
                           "at most 100"), last  # fmt: skip
