"""Pipeline parallelism (torch.distributed.pipelining) combined with data parallelism on a 2-D
device mesh (dp × pp): K consecutive ranks form one pipeline, the D pipelines split the batch.

Every rank keeps the whole model's parameters (a U-Net's weights are tens of MB; what does
not fit one GPU are the activations of large 3D patches) but computes and updates only its
stage: after a schedule step each stage's gradients are averaged over the D replicas of that
stage (the data-parallel group), never over the whole world, and gradient clipping takes the
norm over the stages with one scalar all-reduce. The other stages' copies are brought up to
date (`sync_params`) only where the whole model is used: validation, checkpoints, export.
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
        self.pp_group, self.dp_group = mesh["pp"].get_group(), mesh["dp"].get_group()
        self.stage_params = [list(m.parameters()) + list(m.buffers()) for m in stage_modules]
        owned = [id(p) for ps in self.stage_params for p in ps]
        if len(owned) != len(set(owned)):
            raise VoxjetError("pipeline stages share parameters; each must belong to one stage")
        self.mine = {id(p) for p in stage_modules[self.pp_rank].parameters()}
        self.stage = PipelineStage(
            stage_modules[self.pp_rank], self.pp_rank, k, rt.device, group=self.pp_group
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
        """This stage's gradients averaged over its D replicas (the data-parallel group); the
        other stages' parameters have none here (the optimizer leaves them alone)."""
        own = [p for p in params if id(p) in self.mine]
        for p in own:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.dp > 1 and own:
            flat = torch.cat([p.grad.reshape(-1) for p in own])
            dist.all_reduce(flat, group=self.dp_group)
            flat /= self.dp
            offset = 0
            for p in own:
                n = p.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p))
                offset += n

    def clip_grad_norm_(self, params: Iterable[nn.Parameter], max_norm: float) -> float:
        """Clip by the norm of the whole model's gradient (every stage's, one scalar
        all-reduce over the pipeline), as torch.nn.utils.clip_grad_norm_ would alone."""
        own = [p for p in params if id(p) in self.mine and p.grad is not None]
        sq = torch.zeros((), dtype=torch.float64, device=self.rt.device)
        for p in own:
            sq += p.grad.detach().double().pow(2).sum()
        dist.all_reduce(sq, group=self.pp_group)
        norm = sq.sqrt()
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        for p in own:
            p.grad.mul_(coef.to(p.grad.dtype))
        return float(norm)

    def sync_params(self, model: nn.Module) -> None:
        """Every stage's current weights onto every rank (from the rank of this pipeline that
        owns the stage): the whole model for validation, checkpoints and export."""
        ranks = dist.get_process_group_ranks(self.pp_group)
        with torch.no_grad():
            for stage, tensors in enumerate(self.stage_params):
                if not tensors:
                    continue
                flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
                dist.broadcast(flat, src=ranks[stage], group=self.pp_group)
                offset = 0
                for t in tensors:
                    n = t.numel()
                    t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
                    offset += n

    def gather_optimizer_state(self, opt: torch.optim.Optimizer) -> dict:
        """The optimizer's state dict with every stage's parameter states (each rank holds its
        own stage's), for a checkpoint that resumes on any layout."""
        mine = opt.state_dict()
        cpu = {
            i: {k: v.cpu() if torch.is_tensor(v) else v for k, v in st.items()}
            for i, st in mine["state"].items()
        }
        parts = [None] * dist.get_world_size(self.pp_group)
        dist.all_gather_object(parts, cpu, group=self.pp_group)
        merged = {}
        for part in parts:
            merged.update(part)
        return {"state": merged, "param_groups": mine["param_groups"]}
