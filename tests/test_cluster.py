"""What each job asks SLURM for, rule by rule, in five set-ups: the demo (all CPU), a GPU jets
sweep, a 2-node run, a GPU segmentation cross-validation with validation, predict and the
planner, and a pipeline-parallel run. Each is dry-run with the slurm profile as README shows it;
each job's threads, resources and command line as Snakemake prints them are handed to
snakemake-executor-plugin-slurm's own command construction (`get_submit_command`,
`set_gres_string`), and the sbatch arguments it builds are checked: CPU jobs on the CPU
partition without a GPU, GPU jobs on the GPU partition with their count, `--cpus-per-task`
equal to the `--threads` the job's command uses, one task a node. README's table of what the
jobs ask for is rendered from the same dry runs (`python tests/test_cluster.py` rewrites it)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import (
    REPO,
    copy_workflow,
    merge_config,
    run_snakemake,
    snakemake_env,
    write_config,
)
from readme import README
from slurm_jobs import command_threads, dry_jobs, sbatch_of


def readme_site() -> dict:
    """The `site:` example docs/cluster.md shows (the set-ups below use it)."""
    section = (
        (REPO / "docs" / "cluster.md")
        .read_text()
        .split("## Run on a cluster: SLURM or HTCondor")[1]
    )
    block = re.search(r"```yaml\n(.*?)```", section, re.S)[1]
    return yaml.safe_load(block)["site"]


SITE = readme_site()


def _nifti(path: Path) -> Path:
    import nibabel as nib

    path.mkdir(parents=True)
    img = np.zeros((32, 32, 16), np.float32)
    img[8:24, 8:24, 4:12] = 100
    nib.save(nib.Nifti1Image(img, np.diag([2.0, 2.0, 4.0, 1.0])), path / "new_0000.nii.gz")
    return path


def setups(demo: dict, tmp: Path) -> dict[str, tuple[dict, dict]]:
    """(config, expected GPUs a (rule, run prefix)) of each set-up."""
    base = merge_config(demo, {"site": SITE})
    gpu_sweep = merge_config(base, {"experiments": {"pfn": {"launch": {"gpus": 2}}}})
    two_node = merge_config(base, {"experiments": {"part": {"launch": {"gpus": 4, "nodes": 2}}}})
    cv = copy.deepcopy(base)
    cv["experiments"]["unet"].update({"folds": 2, "launch": {"gpus": 1, "threads": 6}})
    cv["experiments"]["unet"].pop("sweep")
    cv["predict"] = {"new": {"experiment": "unet", "input": str(_nifti(tmp / "new"))}}
    pipe = merge_config(base, {"experiments": {"unet": {
        "train": {"pipeline_stages": 2}, "launch": {"gpus": 2, "threads": 8}}}})  # fmt: skip
    return {
        "demo": (base, {}),
        "gpu_sweep": (
            gpu_sweep,
            {("train_jets", "pfn_lr"): 2, ("evaluate_jets", "pfn_lr"): 2, ("plan_runs", ""): 2},
        ),  # fmt: skip
        "two_node": (
            two_node,
            {("train_jets", "part"): 4, ("evaluate_jets", "part"): 4, ("plan_runs", ""): 2},
        ),  # fmt: skip
        "seg_cv": (
            cv,
            {
                ("train_seg", "unet"): 1,
                ("evaluate_seg", "unet"): 1,
                ("validate_seg", "unet"): 1,
                ("predict", ""): 1,
                ("plan_runs", ""): 1,
            },
        ),  # fmt: skip
        "pipeline": (
            pipe,
            {("train_seg", "unet"): 2, ("evaluate_seg", "unet"): 2, ("plan_runs", ""): 2},
        ),  # fmt: skip
    }


def _run_of(job: dict) -> str:
    m = re.search(r"run=([^,]+)", job["wildcards"])
    return m[1] if m else ""


def _experiment_of(job: dict, cfg: dict) -> str:
    """The experiment a job runs: its run's prefix, or the one a prediction set names."""
    m = re.search(r"name=([^,]+)", job["wildcards"])
    if job["rule"] == "predict" and m:
        return cfg["predict"][m[1]]["experiment"]
    return _run_of(job).split("_")[0]


def _is_run_of(name: str, prefix: str) -> bool:
    """`pfn_lr` names pfn_lr-0.001 and `part` names part, not particlenet; "" names any."""
    return not prefix or re.fullmatch(re.escape(prefix) + r"([-_].*)?", name) is not None


def expected_gpus(job: dict, gpus: dict) -> int:
    return next((n for (rule, run), n in gpus.items()
                 if job["rule"] == rule and _is_run_of(_run_of(job), run)), 0)  # fmt: skip


def dry_run(wf: Path, cfg: dict, tmp: Path) -> list[dict]:
    path = write_config(tmp / "cfg.yaml", cfg)
    r = run_snakemake(wf, *README["slurm-dry-run"][1:], "--configfile", str(path),
                      "--replace-workflow-config")  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return dry_jobs(r.stdout)


@pytest.mark.parametrize("name", ["demo", "gpu_sweep", "two_node", "seg_cv", "pipeline"])
def test_every_job_asks_slurm_for_what_it_uses(name, tmp_path, demo_config):
    wf = copy_workflow(tmp_path / "wf")
    cfg, gpus = setups(demo_config, tmp_path)[name]
    jobs = dry_run(wf, cfg, tmp_path)
    assert len(jobs) > 10
    seen = defaultdict(int)
    for job in jobs:
        opts = sbatch_of(job)
        want = expected_gpus(job, gpus)
        where = (name, job["rule"], job["wildcards"])
        assert opts["--account"] == "proj42", where
        nodes = job["resources"].get("nodes", 1)
        if want:
            seen[job["rule"]] += 1
            assert opts["--partition"] == "gpu", where
            if nodes == 1:
                assert opts.get("--gpus") == f"a100:{want}" and "--gres" not in opts, where
            else:  # GPUs a node: --gpus is the job's total, which SLURM may spread unevenly
                assert opts.get("--gres") == f"gpu:a100:{want}" and "--gpus" not in opts, where
            assert "--ntasks-per-gpu" not in opts, where  # one task a node, not one a GPU
        else:
            assert opts["--partition"] == "cpu", where
            assert "--gpus" not in opts and "--gres" not in opts, where
        # the CPUs asked for are the threads the command uses (the dry run's own printing)
        threads = command_threads(job)
        assert opts["--cpus-per-task"] == str(threads or job["threads"]), (where, job["shell"])
        if threads:
            experiment = _experiment_of(job, cfg)
            launch = cfg["experiments"].get(experiment, {}).get("launch", {})
            assert threads == launch.get("threads", 2), where
        if nodes > 1:
            assert (opts["--nodes"], opts["--ntasks"]) == (str(nodes), str(nodes)), where
    assert {rule for rule, _ in gpus} <= set(seen), (name, seen)


def test_the_dry_run_prints_the_threads_of_the_job_whatever_the_login_node(tmp_path, demo_config):
    """launch.threads: 32 on a 2-core machine: the dry run with the slurm profile prints
    --threads 32 and the CPUs asked are 32 (the profile's `cores` is no login node's)."""
    wf = copy_workflow(tmp_path / "wf")
    cfg = merge_config(demo_config, {"site": SITE, "experiments": {"pfn": {"launch": {
        "threads": 32}}}})  # fmt: skip
    jobs = [j for j in dry_run(wf, cfg, tmp_path) if j["rule"] == "train_jets"
            and _run_of(j).startswith("pfn_lr")]  # fmt: skip
    assert jobs and all(command_threads(j) == 32 for j in jobs)
    assert all(sbatch_of(j)["--cpus-per-task"] == "32" for j in jobs)


def test_the_submissions_are_shown_before_any_is_made(tmp_path, demo_config):
    """README's `voxjet submissions`: for every job of the planned run, the sbatch command the
    plugin builds; the shard parts and the cases marked as one array each; nothing submitted."""
    wf = copy_workflow(tmp_path / "wf")
    write_config(wf / "config" / "config.yaml", merge_config(demo_config, {"site": SITE}))
    r = subprocess.run(README["submissions"], cwd=wf, env=snakemake_env(), capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    heads = [ln for ln in lines if ln.startswith("rule ")]
    sbatch = [ln.strip() for ln in lines if ln.startswith("  sbatch ")]
    assert len(heads) == len(sbatch) == 36, (len(heads), len(sbatch))
    train = next(i for i, ln in enumerate(lines) if ln.startswith("rule train_jets (dataset="))
    assert "-p cpu" in lines[train + 1] and "--cpus-per-task=2" in lines[train + 1]
    arrays = [ln for ln in sbatch if "job array" in ln]
    assert len(arrays) == 2 + 10 and all("-p cpu" in ln for ln in arrays)
    assert not (wf / "results").exists()


# ---- docs/cluster.md's table of what the jobs ask for ---------------------------------------

TABLE = re.compile(r"<!-- cluster-table -->\n.*?<!-- end cluster-table -->", re.S)


def render_table(demo: dict, tmp: Path) -> str:
    """docs/cluster.md's table: per rule, what its jobs ask for in the demo and with a GPU
    experiment."""
    wf = copy_workflow(tmp / "wf")
    rows = {}
    configs = setups(demo, tmp)
    for label, (cfg, _) in (("demo", configs["demo"]), ("GPU", configs["seg_cv"])):
        for job in dry_run(wf, cfg, tmp):
            opts = sbatch_of(job)
            ask = [f"`-p {opts['--partition']}`", f"`--cpus-per-task={opts['--cpus-per-task']}`"]
            if opts.get("--gpus"):
                ask.append(f"`--gpus={opts['--gpus']}`")
            if opts.get("--nodes", "1") != "1":
                ask.append(f"`--nodes={opts['--nodes']}`")
            rows.setdefault(job["rule"], {})[label] = " ".join(ask)
    lines = ["<!-- cluster-table -->",
             "| rule | the demo (`launch.gpus: 0`) | `unet` with `launch: {gpus: 1, threads: 6}` "
             "and `folds: 2` |", "|---|---|---|"]  # fmt: skip
    for rule in sorted(rows):
        demo_ask = rows[rule].get("demo", "–")
        gpu_ask = rows[rule].get("GPU", "–")
        lines.append(f"| `{rule}` | {demo_ask} | {gpu_ask} |")
    return "\n".join([*lines, "<!-- end cluster-table -->"])


def test_readme_table_is_what_the_dry_run_asks_for(tmp_path, demo_config):
    readme = (REPO / "docs" / "cluster.md").read_text()
    (table,) = TABLE.findall(readme)
    assert table == render_table(demo_config, tmp_path), "run `python tests/test_cluster.py`"


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        table = render_table(demo, Path(tmp))
    path = REPO / "docs" / "cluster.md"
    path.write_text(TABLE.sub(lambda _: table, path.read_text()))
    print(f"{path}: cluster table rewritten")
