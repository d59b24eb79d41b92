"""DDP against FSDP (torch's FSDP2, as `train.data_parallel: fsdp` shards) against pipeline stages,
side by side in one run on 2 processes: peak memory a process above what it held before the
model was built (parameters, gradients, optimiser state, activations), step time, and the bytes
each process sends a step, for a jets transformer (voxjet's ParT, sized so that its parameters
and AdamW state dominate) and a U-Net (MONAI's, voxjet's pipeline cut for the third column).

    .venv/bin/python benchmarks/data_parallel.py [--steps 6] [--device cpu|cuda] [--tiny]

Each scheme runs in its own `torchrun --nproc-per-node 2` (gloo on CPU, NCCL on GPUs) with the
code training uses (voxjet.distributed.sharded.shard_model, DDP, PipelineParallel); the step is
forward, backward, gradient clipping and an AdamW step on synthetic batches. Bytes sent are those
of the collectives each scheme issues (a ring: DDP all-reduces the gradients, 2(n−1)/n of their
bytes; FSDP all-gathers the parameters for forward and again for backward and reduce-scatters the
gradients, (n−1)/n each; a pipeline sends each micro-batch's activations and their gradients
across its cut), computed from the tensors' sizes, not sniffed from the wire.
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

REPO = Path(__file__).resolve().parents[1]
SCHEMES = {"part": ("ddp", "fsdp"), "unet": ("ddp", "fsdp", "pipeline")}
PART = {"dim": 768, "heads": 8, "blocks": 10, "class_blocks": 1, "pair_dim": 8, "dropout": 0.0}
UNET = {"name": "unet", "in_channels": 1, "out_channels": 3, "channels": [32, 64, 128, 256, 512],
        "strides": [2, 2, 2, 2], "num_res_units": 2}  # fmt: skip


def _rss() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


TINY_PART = {**PART, "dim": 32, "blocks": 2}
TINY_UNET = {**UNET, "channels": [4, 8, 16, 32, 64]}


def worker(model_name: str, scheme: str, steps: int, device_kind: str, tiny: bool) -> None:
    """One process of one scheme: build, wrap, step; rank 0 prints a JSON row."""
    import torch
    import torch.distributed as dist

    from voxjet.distributed.runtime import init_runtime
    from voxjet.distributed.sharded import shard_model

    rt = init_runtime(device_kind)
    torch.manual_seed(0)
    n = rt.world_size
    base = _rss()
    if model_name == "part":
        from voxjet.jets.models.part import ParT

        feats = ["part_deta", "part_dphi", "part_pt_log", "part_e_log"]
        model = ParT(4, 10, [0.0] * 4, [1.0] * 4, feats, **(TINY_PART if tiny else PART))
        model = model.to(rt.device)
        x = torch.randn(8, 32, 4, device=rt.device)
        mask = torch.ones(8, 32, dtype=torch.bool, device=rt.device)
        y = torch.randint(0, 10, (8,), device=rt.device)

        def loss_of(m):
            return torch.nn.functional.cross_entropy(m(x, mask), y)

        units = None
    else:
        from voxjet.volumes.networks.models import build_seg_model
        from voxjet.volumes.networks.unet_stages import network_ops, split_network

        model = build_seg_model(dict(TINY_UNET if tiny else UNET)).to(rt.device)
        x = torch.randn(2, 1, 32, 32, 32, device=rt.device)
        y = torch.randint(0, 3, (2, 32, 32, 32), device=rt.device)

        def loss_of(m):
            return torch.nn.functional.cross_entropy(m(x), y)

        units = [op.module for op in network_ops(model)]
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    pipe = None
    if scheme == "ddp":
        step_model = torch.nn.parallel.DistributedDataParallel(model)
        sent = 2 * (n - 1) / n * params
    elif scheme == "fsdp":
        step_model = shard_model(model, rt, units)
        sent = 3 * (n - 1) / n * params
    else:
        from voxjet.distributed.pipeline import PipelineConfig, PipelineParallel

        stages = split_network(model, n, 1, [32, 32, 32])
        ce = torch.nn.functional.cross_entropy
        pipe = PipelineParallel(stages, PipelineConfig(n, 2, "1f1b"), rt, lambda o, t: ce(o, t))
        step_model = model
        sent = None  # measured below from the tensors crossing the cut
    opt = torch.optim.AdamW(step_model.parameters(), lr=1e-4)
    times = []
    crossing = []
    for _ in range(steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if pipe is None:
            loss_of(step_model).backward()
        else:
            handles = []
            if rt.rank == 0:  # the activations stage 0 sends across the cut, a micro-batch
                last = stages[0]
                handles.append(last.register_forward_hook(lambda m, i, o: crossing.append(
                    sum(v.numel() * v.element_size() for v in (o if isinstance(o, tuple)
                                                               else (o,))))))  # fmt: skip
            pipe.step(x, y)
            pipe.reduce_grads(model.parameters())
            for h in handles:
                h.remove()
        torch.nn.utils.clip_grad_norm_(step_model.parameters(), 1.0)
        opt.step()
        if rt.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    if pipe is not None:
        per_step = sum(crossing) / max(1, steps)
        sent = 2 * per_step  # activations forward, their gradients back (same sizes)
    peak = torch.cuda.max_memory_allocated() if rt.device.type == "cuda" else _peak() - base
    rows = [None] * n
    dist.all_gather_object(rows, {"peak": peak, "step_s": sorted(times[1:])[len(times[1:]) // 2],
                                  "sent": sent})  # fmt: skip
    if rt.is_main:
        print("ROW " + json.dumps({
            "model": model_name, "scheme": scheme, "processes": n, "param_bytes": params,
            "peak_bytes": max(r["peak"] for r in rows), "step_s": max(r["step_s"] for r in rows),
            "sent_bytes": max(r["sent"] for r in rows if r["sent"] is not None),
        }), flush=True)  # fmt: skip
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny models (the test suite's run)")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "SCHEME"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(*a.worker, a.steps, a.device, a.tiny)
        return
    rows = []
    torchrun = Path(sys.executable).parent / "torchrun"
    for model_name, schemes in SCHEMES.items():
        for scheme in schemes:
            with tempfile.TemporaryDirectory() as d:
                cmd = [str(torchrun), "--nproc-per-node", "2", "--master-port",
                       str(29600 + len(rows)), __file__, "--worker", model_name, scheme,
                       "--steps", str(a.steps), "--device", a.device,
                       *(["--tiny"] if a.tiny else [])]  # fmt: skip
                # a fixed mmap threshold: freed tensors go back to the system, so the resident
                # peak follows the live tensors (glibc's moving threshold keeps freed heap)
                env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src"),
                       "MALLOC_MMAP_THRESHOLD_": "131072"}  # fmt: skip
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=d, env=env)
            row = next((json.loads(line[4:]) for line in r.stdout.splitlines()
                        if line.startswith("ROW ")), None)  # fmt: skip
            if r.returncode or row is None:
                sys.exit(f"{model_name}/{scheme} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    for model_name in SCHEMES:
        ddp = next(r for r in rows if r["model"] == model_name and r["scheme"] == "ddp")
        print(f"{model_name} ({ddp['param_bytes'] / 2**20:.0f} MiB of parameters), 2 processes:")
        for r in (r for r in rows if r["model"] == model_name):
            ratio = r["peak_bytes"] / ddp["peak_bytes"]
            goal = (f" (goal <= 0.6: {'PASS' if ratio <= 0.6 else 'FAIL'})"
                    if r["scheme"] == "fsdp" and model_name == "part" else "")  # fmt: skip
            print(f"  {r['scheme']:<8} peak {r['peak_bytes'] / 2**20:7.0f} MiB a process "
                  f"({ratio:.2f} x DDP){goal}, step {r['step_s']:.3f} s, sent "
                  f"{r['sent_bytes'] / 2**20:.1f} MiB a step")  # fmt: skip


if __name__ == "__main__":
    main()
