"""The planner's prediction of a whole training job against the job's measured wall time: the
workflow run for real (`snakemake -c 2` on toy jets) with one PFN of 300 steps validated every
30 (CPU, one process, one thread), the plan made by plan_runs before it (start, model and first
batch, steps, validations, checkpoints, model.pt), the job timed by Snakemake's benchmark file;
the summary's planner table compares the two. Repeated with other seeds, each a fresh workflow.

    .venv/bin/python benchmarks/job_prediction.py [--repeats 3] [--steps 300]

Goal (#52): every run within 15% of its measured job, the mean |error| ≤ 8%.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from workflow_copy import copy_workflow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def config(seed: int, steps: int) -> dict:
    """One PFN on toy jets, validated every tenth of its steps."""
    source = {"synthetic": {"generator": "toy", "classes": ["QCD", "Hbb", "Wqq", "Tbqq"],
                            "files_per_class": 2, "jets_per_file": 1500, "seed": seed}}  # fmt: skip
    return {
        "datasets": {"jets": {"domain": "jets", "source": source,
                              "jets": {"max_particles": 32}}},  # fmt: skip
        "experiments": {"pfn": {"dataset": "jets", "launch": {"gpus": 0, "threads": 1},
                                "model": {"name": "pfn"},
                                "train": {"steps": steps, "eval_every": steps // 10,
                                          "checkpoint_every": steps // 10, "seed": seed}}},
    }  # fmt: skip


def one(seed: int, steps: int) -> dict:
    """A fresh workflow run; the summary's planner row for the PFN."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        copy_workflow(d)
        (d / "config" / "config.yaml").write_text(yaml.safe_dump(config(seed, steps)))
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        r = subprocess.run([str(BIN / "snakemake"), "-c", "2"], cwd=d, env=env,
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode:
            sys.exit(r.stderr[-3000:])
        md = (d / "results" / "summary" / "summary.md").read_text()
        row = re.search(r"^\| pfn \| 1 \| job \| .*? \| ([\d.e+]+) s / ([\d.e+]+) s \| "
                        r"([+-]\d+)% \|$", md, re.M)  # fmt: skip
        if not row:
            sys.exit("no job row in the summary's planner table:\n" + md[-2000:])
        plan = json.loads((d / "results" / "plan" / "runs.json").read_text())
        own = next(p for p in plan["runs"][0]["predictions"] if p["own"])
        predicted, measured = float(row[1]), float(row[2])
        return {"seed": seed, "predicted_s": predicted, "measured_s": measured,
                "error": measured / predicted - 1, "parts": own["job_parts_s"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    rows = []
    for seed in range(a.repeats):
        rows.append(one(seed, a.steps))
        print(json.dumps(rows[-1]), flush=True)
    errs = [abs(r["error"]) for r in rows]
    mean = sum(errs) / len(errs)
    each = ", ".join(f"{100 * r['error']:+.0f}%" for r in rows)
    print(f"\nPFN, {a.steps} steps, validated every {a.steps // 10}: job predicted vs measured, "
          f"errors {each}; worst "
          f"{100 * max(errs):.0f}% (goal <= 15%: {'PASS' if max(errs) <= 0.15 else 'FAIL'}), "
          f"mean {100 * mean:.1f}% (goal <= 8%: {'PASS' if mean <= 0.08 else 'FAIL'})")  # fmt: skip


if __name__ == "__main__":
    main()
