"""Pipeline model parallelism of the 3D U-Net, measured side by side in one run (CPU, gloo;
the same code runs on CUDA/NCCL where the memory is read from the allocator):

1. per-rank peak memory of one training step with the U-Net cut into K = 2 stages (1F1B, 2
   micro-batches) ÷ the same step with K = 1 (the whole network in one process): target ≤ 0.6;
2. the pipeline bubble measured for M = 1, 2, 4, 8 micro-batches against (K − 1)/(M + K − 1):
   1 − T_sequential / (K · T_pipeline), where T_sequential is one process running the same M
   micro-batches through the whole network (so imbalance between the stages and the time spent
   sending activations count as bubble too).

    python benchmarks/pipeline_parallel.py            # about 3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from monai.losses import DiceCELoss

from voxjet.volumes.networks.models import build_unet
from voxjet.volumes.networks.unet_stages import split_network

CHANNELS = [16, 32, 64, 128]
MEM_PATCH, MEM_BATCH = [96, 96, 96], 2
TIME_PATCH, TIME_BATCH = [48, 48, 48], 8
MICRO = [1, 2, 4, 8]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _data(batch: int, patch: list[int]):
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, 1, *patch, generator=g), torch.randint(
        0, 3, (batch, 1, *patch), generator=g
    )


def single(out: str) -> None:
    """K = 1: peak memory of one step, then sequential time of M micro-batches."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    model = build_unet(1, 3, CHANNELS)
    x, y = _data(MEM_BATCH, MEM_PATCH)
    base = _rss_mb()
    loss_fn(model(x), y).backward()
    res = {"mem_mb": _peak_mb() - base}
    x, y = _data(TIME_BATCH, TIME_PATCH)
    res["time"] = {}
    for m in MICRO:
        times = []
        for _ in range(6):
            t = time.perf_counter()
            for xs, ys in zip(x.chunk(m), y.chunk(m), strict=True):
                (loss_fn(model(xs), ys) / m).backward()
            times.append(time.perf_counter() - t)
        res["time"][m] = float(np.median(times[1:]))
    Path(out).write_text(json.dumps(res))


def pipelined(out: str) -> None:
    """K = 2 under torchrun: per-rank peak memory of one step, then step time for each M."""
    from voxjet.distributed.pipeline import PipelineConfig, PipelineParallel
    from voxjet.distributed.runtime import init_runtime, shutdown

    torch.set_num_threads(1)
    rt = init_runtime()
    torch.manual_seed(0)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    model = build_unet(1, 3, CHANNELS)
    res = {}
    x, y = _data(MEM_BATCH, MEM_PATCH)
    pp = PipelineParallel(
        split_network(model, 2, 1, MEM_PATCH), PipelineConfig(2, 2, "1f1b"), rt, loss_fn
    )
    base = _rss_mb()
    pp.step(x, y)
    res["mem_mb"] = _peak_mb() - base
    x, y = _data(TIME_BATCH, TIME_PATCH)
    res["time"] = {}
    for m in MICRO:
        pp = PipelineParallel(
            split_network(model, 2, 1, TIME_PATCH), PipelineConfig(2, m, "gpipe"), rt, loss_fn
        )
        times = []
        for _ in range(6):
            torch.distributed.barrier()
            t = time.perf_counter()
            pp.step(x, y)
            times.append(time.perf_counter() - t)
        res["time"][m] = float(np.median(times[1:]))
    mems = [None] * rt.world_size
    torch.distributed.all_gather_object(mems, res["mem_mb"])
    res["mem_mb_ranks"] = mems
    if rt.is_main:
        Path(out).write_text(json.dumps(res))
    shutdown(rt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--role", choices=["single", "pipelined"], default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.role == "single":
        return single(a.out)
    if a.role == "pipelined":
        return pipelined(a.out)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as d:
        one, two = Path(d) / "k1.json", Path(d) / "k2.json"
        me = str(Path(__file__).resolve())
        subprocess.run(
            [sys.executable, me, "--role", "single", "--out", str(one)], env=env, check=True
        )
        torchrun = Path(sys.executable).with_name("torchrun")
        subprocess.run(
            [str(torchrun), "--standalone", "--nproc-per-node=2", me, "--role", "pipelined"]
            + ["--out", str(two)],
            env=env,
            check=True,
        )
        k1, k2 = json.loads(one.read_text()), json.loads(two.read_text())
    from voxjet.distributed.pipeline import bubble_fraction

    peak2 = max(k2["mem_mb_ranks"])
    print(f"U-Net channels {CHANNELS}; memory: patch {MEM_PATCH} x batch {MEM_BATCH}")
    print(
        f"per-rank peak memory, K=2 ÷ K=1: {peak2 / k1['mem_mb']:.2f} (target ≤ 0.6) "
        f"[{', '.join(f'{m:.0f}' for m in k2['mem_mb_ranks'])} MB vs {k1['mem_mb']:.0f} MB]"
    )
    print(f"bubble, K=2, GPipe, batch {TIME_BATCH} of {TIME_PATCH}:")
    print("  M   measured   (K-1)/(M+K-1)   step s (pipeline / sequential)")
    for m in MICRO:
        t2, t1 = k2["time"][str(m)], k1["time"][str(m)]
        measured = 1 - t1 / (2 * t2)
        print(f"  {m:<3} {measured:8.2f}   {bubble_fraction(2, m):13.2f}   {t2:.2f} / {t1:.2f}")


if __name__ == "__main__":
    main()
