"""Evaluation and prediction at scale, measured side by side in one run on toy JetClass-schema
jets with a small ParticleNet:

1. peak resident memory of `voxjet evaluate-jets` (a process of its own) on a test split 10x
   larger ÷ on the small one (target <= 1.2: the split is streamed in chunks);
2. jets/s of `voxjet predict` over ROOT files with 2 processes ÷ 1 process, one thread each
   (target >= 1.6: the files are shared out over the processes, as over GPUs).

    .venv/bin/python benchmarks/predict.py [--jets 8000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _voxjet(args: list[str], threads: int = 1) -> float:
    # the venv's bin first: predict starts torchrun from PATH, as the workflow's jobs do
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    t = time.perf_counter()
    r = subprocess.run([str(BIN / "voxjet"), *args], env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    return time.perf_counter() - t


def _peak_rss_mb(args: list[str]) -> float:
    """Peak RSS of a `voxjet` command run in a child of a fresh process (so the maximum over
    children is this command's alone)."""
    code = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", code, str(BIN / "voxjet"), *args],
                       capture_output=True, text=True, env=env)  # fmt: skip
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    return int(r.stdout.split()[-1]) / 1024


def _dataset(d: Path, jets_per_file: int, files: int):
    from voxjet.jets.data_config import JetDataConfig
    from voxjet.jets.shard import shard_jets
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset
    from voxjet.stage.transfer import stage

    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=files, jets_per_file=jets_per_file),
                     progress=False)  # fmt: skip
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    cfg = JetDataConfig(max_particles=64, jets_per_shard=20000, test_fraction=0.5)
    shard_jets(d / "m.json", d / "shards", cfg)
    return d / "shards"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--jets",
        type=int,
        default=8000,
        help="jets of the small dataset (its test half must span several reads)",
    )
    a = ap.parse_args()
    model = {"name": "particlenet", "k": 8, "conv_channels": [[32, 32], [64, 64]], "fc_size": 64}
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        small = _dataset(d / "small", a.jets // 4, 1)
        large = _dataset(d / "large", a.jets // 4, 10)
        run = d / "run"
        cfg = json.dumps({"model": model, "train": {"steps": 20, "batch_size": 128}})
        _voxjet(["train-jets", "--shards", str(small), "--out", str(run), "--run-config", cfg])
        n_small = json.loads((small / "index.json").read_text())["splits"]["test"]["jets"]
        n_large = json.loads((large / "index.json").read_text())["splits"]["test"]["jets"]
        rss = []
        for shards in (small, large):
            out = d / f"eval-{shards.parent.name}"
            rss.append(_peak_rss_mb(["evaluate-jets", "--shards", str(shards), "--model",
                                     str(run / "model.pt"), "--out", str(out)]))  # fmt: skip
        inputs = sorted(str(p) for p in (d / "large" / "raw").glob("*.root"))
        n_pred = 10 * a.jets
        times = {}
        for procs in (1, 2):
            launch = ["launch", "--gpus", "0", "--cpu-processes", str(procs), "--threads",
                      str(procs), "--"]  # fmt: skip
            times[procs] = _voxjet([*launch, "predict", "--model", str(run / "model.pt"),
                                    "--input", *inputs, "--out", str(d / f"pred-{procs}")],
                                   threads=1)  # fmt: skip
    rows = [
        (f"evaluate peak RSS, {n_large:,} ÷ {n_small:,} test jets (10x)", rss[1] / rss[0], 1.2,
         "<=", f"{rss[1]:.0f} vs {rss[0]:.0f} MB"),
        (f"predict jets/s, 2 processes ÷ 1 ({n_pred:,} jets, {len(inputs)} files, 1 thread each)",
         times[1] / times[2], 1.6, ">=",
         f"{n_pred / times[2]:,.0f} vs {n_pred / times[1]:,.0f} jets/s, launch included"),
    ]  # fmt: skip
    for name, ratio, target, how, detail in rows:
        ok = ratio <= target if how == "<=" else ratio >= target
        print(f"{name:<82} {ratio:5.2f} (target {how} {target}) {'PASS' if ok else 'FAIL'}  "
              f"[{detail}]")  # fmt: skip


if __name__ == "__main__":
    main()
