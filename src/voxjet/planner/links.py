"""The link between a node's devices measured rather than taken from the site's defaults: a
ring all-reduce timed between two processes at the bucket sizes DDP sends (its small first
bucket and full 25 MiB ones), fitted to the ring model's latency and bandwidth. The planner
runs it with NCCL when its job holds more than one GPU; benchmarks/planner.py runs it with
gloo over loopback. The same code either way."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from voxjet.errors import VoxjetError
from voxjet.planner.model import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES

SIZES = (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_BYTES)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, backend: str, sizes: tuple[int, ...], repeats: int,
            out) -> None:  # fmt: skip
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=2)
    try:
        for n in sizes:
            x = torch.ones(n // 4, device=device)
            for _ in range(3):  # the communicator's set-up and the first transfers
                dist.all_reduce(x)
            times = []
            for _ in range(repeats):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t = time.perf_counter()
                dist.all_reduce(x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t)
            if rank == 0:
                out[n] = sorted(times)[len(times) // 2]
    finally:
        dist.destroy_process_group()


def _measure(backend: str, sizes: tuple[int, ...], repeats: int) -> dict[int, float]:
    out = mp.Manager().dict()
    mp.start_processes(_worker, args=(_free_port(), backend, tuple(sizes), repeats, out),
                       nprocs=2, start_method="spawn")  # fmt: skip
    return dict(out)


def measure_link(backend: str = "gloo", sizes: tuple[int, ...] = SIZES,
                 repeats: int = 10) -> tuple[float, float]:  # fmt: skip
    """(bandwidth B/s, latency s) between two local processes (GPUs 0 and 1 with NCCL), from
    the median all-reduce time at each size through t = 2(n−1)·(α + bytes/(n·β)), n = 2. The
    processes start from a Python of their own (`python -m voxjet.planner.links`): spawned
    children re-import the caller's main module, which a Snakemake script cannot be."""
    cmd = [sys.executable, "-m", "voxjet.planner.links", backend, str(repeats), *map(str, sizes)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        raise VoxjetError(f"measuring the {backend} link between 2 processes failed: {why}")
    times = sorted((int(k), v) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items())
    (s1, t1), (s2, t2) = times[0], times[-1]
    per_byte = max((t2 - t1) / (s2 - s1), 1e-15)  # = 2·(1/2)/β for n = 2
    return 1 / per_byte, max((t1 - s1 * per_byte) / 2, 0.0)


if __name__ == "__main__":
    backend, repeats, *sizes = sys.argv[1:]
    print(json.dumps(_measure(backend, tuple(int(x) for x in sizes), int(repeats))))
