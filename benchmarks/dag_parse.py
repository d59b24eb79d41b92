"""How long `snakemake -n` takes for a large study: a jets dataset of 10,000 ROOT files given
as a file list of root:// URLs, and a volumes dataset of 1,000 cases, each with a sweep.
Every SLURM job re-parses the Snakefile, so this is paid once a job. Goal: <= 30 s.

Then a campaign of 2,000 runs (a jets sweep of 40 × 50 values): it plans, and its runs are
listed (list_runs, a real run) and aggregated (`voxjet aggregate`, every run missing) without
passing Linux's 128 KiB limit on one command-line argument.

    .venv/bin/python benchmarks/dag_parse.py [--files 10000] [--cases 1000] [--runs 2000]

Nothing is opened at parse time but the config and the file list's existence; the per-case
preprocessing jobs join after the planning checkpoint, so they do not load the first parse.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from workflow_copy import copy_workflow

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=2000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        copy_workflow(d)
        (d / "files.txt").write_text(
            "".join(
                f"root://eos.example.org//eos/jetclass/{c}_{i:05d}.root\n"
                for i in range(a.files // 10)
                for c in (
                    "HToBB",
                    "HToCC",
                    "HToGG",
                    "HToWW2Q1L",
                    "HToWW4Q",
                    "TTBar",
                    "TTBarLep",
                    "WToQQ",
                    "ZToQQ",
                    "ZJetsToNuNu",
                )
            )
        )
        msd = d / "Task99_Large"
        (msd / "imagesTr").mkdir(parents=True)
        (msd / "labelsTr").mkdir()
        for i in range(a.cases):  # the DAG checks that what dataset.json lists exists
            for sub in ("imagesTr", "labelsTr"):
                (msd / sub / f"c_{i:04d}.nii.gz").touch()
        (msd / "dataset.json").write_text(
            json.dumps(
                {
                    "modality": {"0": "CT"},
                    "labels": {"0": "background", "1": "organ"},
                    "training": [
                        {
                            "image": f"./imagesTr/c_{i:04d}.nii.gz",
                            "label": f"./labelsTr/c_{i:04d}.nii.gz",
                        }
                        for i in range(a.cases)
                    ],
                }
            )
        )
        config = {
            "datasets": {
                "jetclass": {
                    "domain": "jets",
                    "source": {"file_list": str(d / "files.txt")},
                    "jets": {"shard_jobs": 100},  # the scatter: 100 shard jobs
                },
                "large_ct": {"domain": "volumes", "source": {"path": str(msd)}},
            },
            "experiments": {
                "pfn": {
                    "dataset": "jetclass",
                    "model": {"name": "pfn"},
                    "sweep": {"train.lr": [0.001, 0.002, 0.004]},
                },
                "unet": {
                    "dataset": "large_ct",
                    "model": {"name": "unet", "channels": [32, 64]},
                    "sweep": {"train.lr": [0.01, 0.003]},
                },
            },
        }
        (d / "big.yaml").write_text(yaml.safe_dump(config))
        cmd = [
            str(Path(sys.executable).parent / "snakemake"),
            "-n",
            "--configfile",
            "big.yaml",
            "--replace-workflow-config",
        ]
        took = [_time(cmd, d)]
        # Later parses, once planning has run: the 1,000 preprocess_case jobs are in the DAG.
        (d / "resources" / "large_ct").mkdir(parents=True)
        (d / "resources" / "large_ct" / "manifest.json").write_text("{}")
        time.sleep(0.05)
        plan = d / "results" / "large_ct" / "plan"
        plan.mkdir(parents=True)
        ids = [f"c_{i:04d}" for i in range(a.cases)]
        (plan / "splits.json").write_text(json.dumps({"train": ids, "val": [], "test": []}))
        took.append(_time(cmd, d, expect="preprocess_case"))
        for what, t in zip(("first parse", "after planning"), took, strict=True):
            print(
                f"snakemake -n, {a.files} ROOT files (file list) + {a.cases} volume cases, "
                f"{what}: {t:.1f} s (goal <= 30 s): {'PASS' if t <= 30 else 'FAIL'}"
            )
        campaign(d, config, a.runs)


def campaign(d: Path, config: dict, n_runs: int) -> None:
    """A sweep of `n_runs` runs: plan it, list the runs and aggregate them for real."""
    lrs = [round(1e-4 * (i + 1), 6) for i in range(40)]
    wds = [round(1e-5 * (j + 1), 7) for j in range(max(1, n_runs // 40))]
    config["experiments"] = {
        "pfn": {
            "dataset": "jetclass",
            "model": {"name": "pfn"},
            "sweep": {"train.lr": lrs, "train.weight_decay": wds},
        }
    }
    (d / "campaign.yaml").write_text(yaml.safe_dump(config))
    base = [str(Path(sys.executable).parent / "snakemake"), "--configfile", "campaign.yaml",
            "--replace-workflow-config"]  # fmt: skip
    plan = _time([*base, "-n"], d, expect="train_jets")
    listed = _time([*base, "--until", "list_runs", "--cores", "1"], d)
    runs = json.loads((d / "results" / "summary" / "runs.json").read_text())
    agg = [str(Path(sys.executable).parent / "voxjet"), "aggregate", "--runs",
           "@results/summary/runs.json", "--out", "results/summary"]  # fmt: skip
    aggregated = _time(agg, d)
    size = len(json.dumps(runs))
    print(
        f"{len(runs)} runs: plan {plan:.1f} s, list_runs {listed:.1f} s, aggregate "
        f"{aggregated:.1f} s; the run list is {size / 1024:.0f} KiB (one argument may hold "
        f"128 KiB): passed as a file: {'PASS' if len(runs) == len(lrs) * len(wds) else 'FAIL'}"
    )


def _time(cmd: list[str], cwd: Path, expect: str | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0 or (expect and expect not in r.stdout):
        sys.exit(r.stdout[-3000:] + r.stderr[-3000:])
    return took


if __name__ == "__main__":
    main()
