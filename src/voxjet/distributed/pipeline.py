"""Pipeline parallelism (torch.distributed.pipelining) combined with data parallelism on a 2-D
device mesh (dp × pp): K consecutive ranks form one pipeline, the D pipelines split the batch.

Every rank keeps the whole model's parameters (a U-Net's weights are tens of MB; what does
not fit one GPU are the activations of large 3D patches) but computes only its stage. After a
schedule step, one all-reduce over the world sums each stage's gradients into every rank and
averages them over the D replicas, so every rank takes the same optimizer step and holds the
same model: checkpoints, validation and evaluation work as without pipelining.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from voxjet.distributed.runtime import Runtime
from voxjet.errors import VoxjetError

SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class PipelineConfig:
    """K stages, M micro-batches a step, and the schedule that orders them."""

    stages: int = 1
    microbatches: int = 4
    schedule: str = "1f1b"


def bubble_fraction(stages: int, microbatches: int) -> float:
    """The idle share of a GPipe/1F1B step: (K − 1) / (M + K − 1)."""
    return (stages - 1) / (microbatches + stages - 1)


class PipelineParallel:
    """This rank's stage of a K-stage pipeline, its schedule, and the gradient exchange."""

    def __init__(
        self,
        stage_modules: list[nn.Module],
        cfg: PipelineConfig,
        rt: Runtime,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        k = cfg.stages
        if len(stage_modules) != k:
            raise VoxjetError(f"{len(stage_modules)} stage modules for {k} pipeline stages")
        if rt.world_size % k:
            raise VoxjetError(
                f"train.pipeline_stages={k} does not divide the {rt.world_size} processes; "
                "launch a multiple of it (launch.gpus × launch.nodes)"
            )
        if cfg.schedule not in SCHEDULES:
            raise VoxjetError(f"train.pipeline_schedule {cfg.schedule!r}: use one of {SCHEDULES}")
        self.cfg = cfg
        self.dp = rt.world_size // k
        mesh = init_device_mesh(rt.device.type, (self.dp, k), mesh_dim_names=("dp", "pp"))
        self.pp_rank = mesh["pp"].get_local_rank()
        self.dp_rank = mesh["dp"].get_local_rank()
        self.first, self.last = self.pp_rank == 0, self.pp_rank == k - 1
        self.stage = PipelineStage(
            stage_modules[self.pp_rank], self.pp_rank, k, rt.device, group=mesh["pp"].get_group()
        )
        kind = ScheduleGPipe if cfg.schedule == "gpipe" else Schedule1F1B
        self.schedule = kind(self.stage, cfg.microbatches, loss_fn=loss_fn)
        self.rt = rt

    def data_runtime(self, rt: Runtime) -> Runtime:
        """The runtime the data loader sees: the ranks of one pipeline read the same batch."""
        return replace(rt, rank=self.dp_rank, world_size=self.dp)

    def step(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch through the pipeline; the batch's mean loss,
        the same on every rank (gradients are left in this rank's stage parameters)."""
        if inputs.shape[0] % self.cfg.microbatches:
            raise VoxjetError(
                f"batch of {inputs.shape[0]} does not split into train.microbatches="
                f"{self.cfg.microbatches} equal micro-batches; make batch_size a multiple"
            )
        losses: list[torch.Tensor] = []
        if self.first and self.last:
            self.schedule.step(inputs, target=target, losses=losses)
        elif self.first:
            self.schedule.step(inputs)
        elif self.last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        mine = torch.stack([x.detach().float() for x in losses]).mean() if losses else None
        total = torch.zeros((), device=self.rt.device) if mine is None else mine
        dist.all_reduce(total)  # only the D last stages contribute
        return total / self.dp

    def reduce_grads(self, params: Iterable[nn.Parameter]) -> None:
        """Every rank gets the full gradient: the sum over stages, averaged over replicas."""
        params = list(params)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.dp
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
