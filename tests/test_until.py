"""Every rule reachable alone, executed (a dry run can list jobs the run then never executes,
snakemake#2824): `--until R` leaves every job of R done and a repeat does nothing, on a fresh
clone and stage by stage; after a complete run `-R R --until R` reruns R's jobs and nothing
else; `--omit-from R` runs what R needs and not R. One tiny workflow holds every rule of both
domains: generated jets and volumes, a local jets source (the stage's verification), a
cross-validated U-Net (validation, find_best) and a prediction."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
from conftest import copy_workflow, job_counts, run_snakemake, write_config

pytestmark = pytest.mark.slow

CONFIG = {
    "datasets": {
        "j": {"domain": "jets",
              "source": {"synthetic": {"generator": "toy", "classes": ["QCD", "Wqq"],
                                       "files_per_class": 2, "jets_per_file": 60, "seed": 1}},
              "jets": {"labels": ["label_QCD", "label_Wqq"], "max_particles": 12,
                       "shard_jobs": 2}},
        # a local source, staged and verified, that no experiment trains on
        "raw": {"domain": "jets", "source": {"path": "raw"},
                "jets": {"labels": ["label_QCD", "label_Wqq"]}},
        "v": {"domain": "volumes",
              "source": {"synthetic": {"train_cases": 5, "test_cases": 1, "seed": 2}},
              "volumes": {"patch_size": [16, 16, 8], "network_depth": 2, "val_fraction": 0.2,
                          "test_fraction": 0.2}},
    },
    "experiments": {
        "pfn": {"dataset": "j", "model": {"name": "pfn", "phi_sizes": [8], "f_sizes": [8]},
                "train": {"steps": 4, "eval_every": 2, "batch_size": 32},
                "launch": {"gpus": 0, "threads": 1}},
        "unet": {"dataset": "v", "folds": 2,
                 "model": {"name": "unet", "channels": [4, 8], "num_res_units": 0},
                 "train": {"steps": 2, "batch_size": 2, "eval_every": 2,
                           "iterations_per_epoch": 2},
                 "evaluate": {"overlap": 0.25},
                 "launch": {"gpus": 0, "threads": 1}},
    },
    "predict": {"new": {"run": "pfn", "input": "raw"}},
}  # fmt: skip
ARGS = ("--cores", "2", "--configfile", "c.yaml", "--replace-workflow-config")
# every rule, upstream first
RULES = ("synth_jets", "synth_volumes", "stage", "verify_sources", "shard_jets", "index_jets",
         "plan_volumes", "preprocess_case", "gather_cases", "plan_runs", "train_jets",
         "train_seg", "evaluate_jets", "validate_seg", "evaluate_seg", "find_best", "list_runs",
         "aggregate", "predict")  # fmt: skip


def _outputs(stdout: str, rule: str) -> list[str]:
    """The outputs of every job of `rule` a `snakemake -n` listing shows (group jobs too)."""
    out, current = [], None
    for line in stdout.splitlines():
        s = line.strip()
        m = re.fullmatch(r"(?:local)?rule (\w+):", s)
        if m:
            current = m[1]
        elif current == rule and s.startswith("output: "):
            out += s.removeprefix("output: ").split(", ")
    return out


def _until(wf: Path, rule: str) -> list[str]:
    """`snakemake --until rule`, executed: every job of the rule it ran is done, exit 0, and a
    repeat has nothing to do; returns the outputs of the rule's jobs it ran."""
    r = run_snakemake(wf, *ARGS, "--until", rule)
    assert r.returncode == 0, (rule, r.stderr[-3000:])
    outputs = _outputs(r.stderr, rule)
    missing = [o for o in outputs if not (wf / o).exists()]
    assert not missing, (rule, missing, r.stderr[-3000:])
    again = run_snakemake(wf, *ARGS, "-n", "--until", rule)
    assert _nothing(again), (rule, again.stdout[-3000:])
    return outputs


def _nothing(r) -> bool:
    """Whether a snakemake run or dry run had no job to do."""
    out = r.stdout + r.stderr
    return r.returncode == 0 and ("Nothing to be done" in out or job_counts(out) == {})


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """The workflow with its sources and config, nothing run."""
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset

    wf = copy_workflow(tmp_path_factory.mktemp("until") / "wf")
    generate_dataset(wf / "raw", ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=1,
                     jets_per_file=40, seed=5), progress=False)  # fmt: skip
    write_config(wf / "c.yaml", CONFIG)
    return wf


def _copy(fresh: Path, to: Path) -> Path:
    return Path(shutil.copytree(fresh, to, symlinks=True))


@pytest.mark.parametrize("rule", ["shard_jets", "plan_volumes", "preprocess_case"])
def test_until_a_rule_right_after_the_stage_runs_it_on_a_fresh_clone(fresh, tmp_path, rule):
    wf = _copy(fresh, tmp_path / "wf")
    outputs = _until(wf, rule)
    assert len(outputs) == {"shard_jets": 2, "plan_volumes": 1, "preprocess_case": 5}[rule]


@pytest.mark.long
def test_every_rule_alone_then_forced_alone_then_omitted(fresh, tmp_path):
    wf = _copy(fresh, tmp_path / "wf")
    for rule in RULES:  # stage by stage: each `--until` finds its upstream done
        assert _until(wf, rule), rule
    done = run_snakemake(wf, *ARGS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _nothing(run_snakemake(wf, *ARGS, "-n"))
    for rule in RULES:  # after a complete run: exactly the rule's jobs again
        dry = run_snakemake(wf, *ARGS, "-n", "-R", rule, "--until", rule)
        assert set(job_counts(dry.stdout)) == {rule}, (rule, job_counts(dry.stdout))
    for rule in ("stage", "preprocess_case", "train_seg", "aggregate"):
        r = run_snakemake(wf, *ARGS, "-R", rule, "--until", rule)
        assert r.returncode == 0 and f"rule {rule}:" in r.stderr, (rule, r.stderr[-3000:])
        assert set(job_counts(r.stderr)) == {rule}, (rule, r.stderr[-3000:])


@pytest.mark.parametrize("rule,ran", [("index_jets", "shard_jets"),
                                      ("gather_cases", "preprocess_case")])  # fmt: skip
@pytest.mark.long
def test_omit_from_a_rule_runs_what_it_needs_on_a_fresh_clone(fresh, tmp_path, rule, ran):
    """(The other domain left out: it would run whole, having nothing to omit.)"""
    wf = _copy(fresh, tmp_path / "wf")
    domain = "jets" if rule == "index_jets" else "volumes"
    cfg = copy.deepcopy(CONFIG)
    cfg["datasets"] = {k: d for k, d in cfg["datasets"].items() if d["domain"] == domain}
    cfg["experiments"] = {k: e for k, e in cfg["experiments"].items()
                          if e["dataset"] in cfg["datasets"]}  # fmt: skip
    cfg.pop("predict")
    write_config(wf / "c.yaml", cfg)
    r = run_snakemake(wf, *ARGS, "--omit-from", rule)
    assert r.returncode == 0, r.stderr[-3000:]
    needed = _outputs(r.stderr, ran)
    assert needed and f"rule {rule}:" not in r.stderr
    assert all((wf / o).exists() for o in needed)
    assert _nothing(run_snakemake(wf, *ARGS, "-n", "--omit-from", rule))
