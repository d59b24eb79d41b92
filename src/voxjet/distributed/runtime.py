"""Process-group set-up from torchrun's environment: NCCL on CUDA, gloo on CPU, same code."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from voxjet.distributed.gpus import job_device


@dataclass(frozen=True)
class Runtime:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on the rank that writes logs, checkpoints and progress bars."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1


def init_runtime(device: str | None = None) -> Runtime:
    """Join the process group that torchrun describes (or run alone when it describes none),
    on `device` ("cuda" or "cpu"; by default what `voxjet launch` decided for the job)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = (device or job_device()) == "cuda"
    if use_cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return Runtime(rank=rank, world_size=world, local_rank=local, device=device)


def shutdown(rt: Runtime) -> None:
    """Leave the process group cleanly."""
    if rt.distributed and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_mean(value: float, rt: Runtime) -> float:
    """Average a Python number over ranks (a no-op alone)."""
    if not rt.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=rt.device)
    dist.all_reduce(t)
    return float(t.item() / rt.world_size)
