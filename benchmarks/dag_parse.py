"""How long `snakemake -n` takes for a large study: a jets dataset of 10,000 ROOT files given
as a file list of root:// URLs, and a volumes dataset of 1,000 cases, each with a sweep.
Every SLURM job re-parses the Snakefile, so this is paid once a job. Goal: <= 30 s.

    .venv/bin/python benchmarks/dag_parse.py [--files 10000] [--cases 1000]

Nothing is opened at parse time but the config and the file list's existence; the per-case
preprocessing jobs join after the planning checkpoint, so they do not load the first parse.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--cases", type=int, default=1000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for sub in ("workflow", "config", "envs"):
            shutil.copytree(REPO / sub, d / sub)
        shutil.copy(REPO / "Snakefile", d / "Snakefile")
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


def _time(cmd: list[str], cwd: Path, expect: str | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0 or (expect and expect not in r.stdout):
        sys.exit(r.stdout[-3000:] + r.stderr[-3000:])
    return took


if __name__ == "__main__":
    main()
