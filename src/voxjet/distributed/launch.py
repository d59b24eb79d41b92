"""Build the torchrun command line for a training job (torchrun does the launching; this only
picks its arguments): one process a GPU, or one process on a machine without CUDA."""

from __future__ import annotations

import os
import shutil
import sys


def processes_per_node(gpus: int, cpu_processes: int = 1) -> int:
    """GPUs asked for when CUDA sees that many, else what it sees; without CUDA,
    `cpu_processes` processes on the gloo backend."""
    import torch

    if gpus > 0 and torch.cuda.is_available():
        return min(gpus, torch.cuda.device_count())
    return max(1, cpu_processes)


def torchrun_argv(voxjet_args: list[str], nproc: int) -> list[str]:
    """`torchrun --standalone --nproc-per-node=N --no-python voxjet ARGS...` for one node."""
    torchrun = shutil.which("torchrun") or "torchrun"
    voxjet = shutil.which("voxjet") or "voxjet"
    return [
        torchrun,
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--no-python",
        voxjet,
        *voxjet_args,
    ]


def exec_torchrun(gpus: int, voxjet_args: list[str], cpu_processes: int = 1) -> None:
    """Replace this process with torchrun running `voxjet ARGS` on this node. On a machine
    with GPUs and no scheduler-set CUDA_VISIBLE_DEVICES, claim free devices first."""
    import torch

    nproc = processes_per_node(gpus, cpu_processes)
    if gpus > 0 and torch.cuda.is_available() and "CUDA_VISIBLE_DEVICES" not in os.environ:
        from voxjet.distributed.devices import claim_devices

        devices, _ = claim_devices(nproc, torch.cuda.device_count())
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        print(f"launch: using GPUs {devices}", file=sys.stderr, flush=True)
    argv = torchrun_argv(voxjet_args, nproc)
    print("launch:", " ".join(argv), file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)
