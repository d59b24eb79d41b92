"""The planner's predicted throughput against the measured one, side by side in one run, for
PFN, ParticleNet, ParT and the U-Net at 1, 2 and 4 gloo processes (one thread each) on this
machine:

1. gloo's link over loopback measured first (voxjet.planner.links: all-reduces at DDP's bucket
   sizes between 2 processes; the site values a cluster would give);
2. each model profiled on one process as plan_runs does (voxjet.planner.plan.profile_task:
   warm-up until settled, median step, a validation and a checkpoint timed), its run predicted
   at n processes (processes beyond the cores share them);
3. the same run trained for real through `voxjet launch --cpu-processes n` (torchrun, DDP,
   gloo, validation and checkpoints every 20 steps), its throughput from the training log's
   windows after the first, as the summary's planner table measures it.

Target: mean |predicted ÷ measured − 1| ≤ 8%, none over 15% (Echo reports 8% on GPUs).

    python benchmarks/planner.py            # several minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from voxjet.distributed.runtime import init_runtime
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.planner.links import measure_link
from voxjet.planner.plan import Site, predict_run, profile_task
from voxjet.report.scaling import steady_rate
from voxjet.stage.transfer import stage
from voxjet.training.logger import read_metrics

BIN = Path(sys.executable).parent
STEPS = 80


def _jets(d: Path) -> str:
    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=2, jets_per_file=2000),
                     progress=False)  # fmt: skip
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    shard_jets(d / "m.json", d / "shards", JetDataConfig(max_particles=64, jets_per_shard=4000))
    return str(d / "shards")


def _cases(d: Path) -> str:
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig
    from voxjet.volumes.dataset.synth import generate_dataset as toy_ct
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset

    toy_ct(d / "ct", ToyVolumesConfig(train_cases=6, test_cases=1), progress=False)
    (d / "cm.json").write_text(json.dumps({"root": str(d / "ct"), "files": []}))
    preprocess_dataset(d / "cm.json", d / "cases",
                       VolumePrepConfig(patch_size=[32, 32, 16], val_fraction=0.2))  # fmt: skip
    return str(d / "cases")


def measured_rate(domain: str, data: str, cfg: dict, n: int, out: Path) -> float:
    """Items a second of the real DDP run at n processes, one thread each."""
    cmd = [str(BIN / "voxjet"), "launch", "--gpus", "0", "--cpu-processes", str(n), "--threads",
           str(n), "--", f"train-{'jets' if domain == 'jets' else 'seg'}",
           "--shards" if domain == "jets" else "--cases", data,
           "--run-config", json.dumps(cfg), "--out", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})  # fmt: skip
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    return steady_rate(read_metrics(out / "metrics.jsonl"))[0]


MODELS = [
    ("jets", "PFN", {"name": "pfn", "phi_sizes": [128, 128, 128], "f_sizes": [128, 128]}, 256),
    ("jets", "ParticleNet", {"name": "particlenet", "k": 8,
                             "conv_channels": [[32, 32, 32], [64, 64, 64]], "fc_size": 128}, 64),
    ("jets", "ParT", {"name": "part", "dim": 32, "heads": 4, "blocks": 2, "class_blocks": 1,
                      "pair_dim": 16}, 64),
    ("volumes", "U-Net", {"name": "unet", "channels": [8, 16, 32, 64], "num_res_units": 1}, 2),
]  # fmt: skip


def main() -> None:
    bw, lat = measure_link("gloo")
    print(f"gloo over loopback: {bw / 1e9:.2f} GB/s, {lat * 1e6:.0f} µs a message")
    site = Site(intra_node_gbps=bw / 1e9, latency_us=lat * 1e6, cores_per_node=os.cpu_count())
    train = {"steps": STEPS, "log_every": 10, "eval_every": 20, "checkpoint_every": 20,
             "warmup_steps": 5, "lr": 1e-3}  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = {"jets": _jets(tmp / "jets"), "volumes": _cases(tmp / "vol")}
        torch.set_num_threads(1)
        rt = init_runtime("cpu")
        for domain, name, model, batch in MODELS:
            cfg = {"model": model, "train": {**train, "batch_size": batch}}
            if domain == "jets":
                from voxjet.jets.train import make_task
            else:
                from voxjet.volumes.training.train import make_task
            task, s = make_task(data[domain], cfg)
            prof = profile_task(task, s, rt)
            for n in (1, 2, 4):
                run = {"config": cfg, "threads": n, "processes": n}
                pred = next(p for p in predict_run(prof, run, site) if p["processes_total"] == n)
                meas = measured_rate(domain, data[domain], cfg, n, tmp / f"{name}-{n}")
                rows.append((name, n, pred["items_per_s"], meas, prof.spread))
    print(f"{'model':<12} {'n':>2} {'predicted':>12} {'measured':>12} {'error':>7}")
    for name, n, pred, meas, spread in rows:
        err = pred / meas - 1
        ok = "PASS" if abs(err) <= 0.15 else "FAIL"
        print(f"{name:<12} {n:>2} {pred:>10.1f}/s {meas:>10.1f}/s {err:>+7.0%}  "
              f"(profile spread {spread:.0%}; target |error| <= 15%) {ok}")  # fmt: skip
    errs = [abs(p / m - 1) for _, _, p, m, _ in rows]
    mean = sum(errs) / len(errs)
    print(f"mean |error| {mean:.1%} over {len(errs)} runs (target <= 8%): "
          f"{'PASS' if mean <= 0.08 else 'FAIL'}; worst {max(errs):.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
