"""The planner's predicted step time against the measured one, side by side in one run, for
PFN, ParticleNet and the U-Net at 2 and 4 gloo processes (one thread each) on this machine:

1. gloo's link over loopback measured first (all-reduces of 1 and 32 MiB between 2 processes:
   latency and bandwidth, the site values a cluster would give);
2. each model profiled on one process (voxjet.planner.plan.profile_task), its step predicted
   at n processes (processes beyond the cores share them);
3. the same run trained for real through `voxjet launch --cpu-processes n` (torchrun, DDP,
   gloo), its step time from the training log's steady windows.

Target: |predicted ÷ measured − 1| ≤ 15% (Echo reports 8% on GPUs).

    python benchmarks/planner.py            # a few minutes on 2 cores
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from voxjet.distributed.runtime import init_runtime
from voxjet.jets.shard import JetDataConfig, shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.planner.plan import Site, predict_run, profile_task
from voxjet.report.scaling import steady_rate
from voxjet.stage.transfer import stage
from voxjet.training.logger import read_metrics

BIN = Path(sys.executable).parent
STEPS = 60


def _allreduce_worker(rank: int, port: int, sizes: list[int], out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for n in sizes:
        x = torch.ones(n // 4)
        for _ in range(3):
            dist.all_reduce(x)
        dist.barrier()
        t = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(x)
        if rank == 0:
            out[n] = (time.perf_counter() - t) / 10
    dist.destroy_process_group()


def measure_link() -> tuple[float, float]:
    """(bandwidth B/s, latency s) of gloo between 2 local processes, from two message sizes
    through the ring model t = 2(n−1)·(α + bytes/(n·β)) with n = 2."""
    sizes = [2**20, 32 * 2**20]
    out = mp.Manager().dict()
    mp.start_processes(_allreduce_worker, args=(29731, sizes, out), nprocs=2, start_method="spawn")
    (s1, t1), (s2, t2) = sorted(out.items())
    per_byte = (t2 - t1) / (s2 - s1)  # = 2·(1/2)/β for n = 2
    bw = 1 / per_byte
    lat = max((t1 - s1 * per_byte) / 2, 0.0)
    return bw, lat


def _jets(d: Path) -> str:
    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=2, jets_per_file=2000),
                     progress=False)  # fmt: skip
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    shard_jets(d / "m.json", d / "shards", JetDataConfig(max_particles=64, jets_per_shard=4000))
    return str(d / "shards")


def _cases(d: Path) -> str:
    from voxjet.volumes.preprocess import VolumePrepConfig, preprocess_dataset
    from voxjet.volumes.synth import ToyVolumesConfig
    from voxjet.volumes.synth import generate_dataset as toy_ct

    toy_ct(d / "ct", ToyVolumesConfig(train_cases=6, test_cases=1), progress=False)
    (d / "cm.json").write_text(json.dumps({"root": str(d / "ct"), "files": []}))
    preprocess_dataset(d / "cm.json", d / "cases",
                       VolumePrepConfig(patch_size=[32, 32, 16], val_fraction=0.2))  # fmt: skip
    return str(d / "cases")


def measured_step(domain: str, data: str, cfg: dict, n: int, out: Path) -> float:
    """Seconds a step of the real DDP run at n processes, one thread each."""
    cmd = [str(BIN / "voxjet"), "launch", "--gpus", "0", "--cpu-processes", str(n), "--threads",
           str(n), "--", f"train-{'jets' if domain == 'jets' else 'seg'}",
           "--shards" if domain == "jets" else "--cases", data,
           "--run-config", json.dumps(cfg), "--out", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})  # fmt: skip
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    rate, _ = steady_rate(read_metrics(out / "metrics.jsonl"))
    return n * cfg["train"]["batch_size"] / rate


def main() -> None:
    bw, lat = measure_link()
    print(f"gloo over loopback: {bw / 1e9:.2f} GB/s, {lat * 1e6:.0f} µs a message")
    site = Site(intra_node_gbps=bw / 1e9, latency_us=lat * 1e6, cores_per_node=os.cpu_count())
    train = {"steps": STEPS, "log_every": 10, "eval_every": STEPS, "checkpoint_every": STEPS,
             "warmup_steps": 5, "lr": 1e-3}  # fmt: skip
    models = [
        ("jets", "PFN", {"name": "pfn", "phi_sizes": [128, 128, 128], "f_sizes": [128, 128]}, 256),
        ("jets", "ParticleNet", {"name": "particlenet", "k": 8,
                                 "conv_channels": [[32, 32, 32], [64, 64, 64]],
                                 "fc_size": 128}, 64),
        ("volumes", "U-Net", {"name": "unet", "channels": [8, 16, 32, 64],
                              "num_res_units": 1}, 2),
    ]  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = {"jets": _jets(tmp / "jets"), "volumes": _cases(tmp / "vol")}
        torch.set_num_threads(1)
        rt = init_runtime("cpu")
        for domain, name, model, batch in models:
            cfg = {"model": model, "train": {**train, "batch_size": batch}}
            if domain == "jets":
                from voxjet.jets.train import make_task
            else:
                from voxjet.volumes.train import make_task
            task, s = make_task(data[domain], cfg)
            prof = profile_task(task, s, rt, steps=8, warmup=3)
            for n in (2, 4):
                run = {"config": cfg, "threads": 1, "processes": n}
                pred = next(p for p in predict_run(prof, run, site) if p["processes_total"] == n)
                meas = measured_step(domain, data[domain], cfg, n, tmp / f"{name}-{n}")
                rows.append((name, n, pred["step_s"], meas))
    print(f"{'model':<12} {'n':>2} {'predicted':>10} {'measured':>10} {'error':>7}")
    for name, n, pred, meas in rows:
        err = pred / meas - 1
        ok = "PASS" if abs(err) <= 0.15 else "FAIL"
        print(f"{name:<12} {n:>2} {pred * 1e3:>8.1f}ms {meas * 1e3:>8.1f}ms {err:>+7.0%}  "
              f"(target |error| <= 15%) {ok}")  # fmt: skip
    errs = [abs(p / m - 1) for _, _, p, m in rows]
    print(f"mean |error| {sum(errs) / len(errs):.0%} over {len(errs)} runs")


if __name__ == "__main__":
    main()
