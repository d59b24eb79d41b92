"""The state a training run's parts share (nnU-Net's trainer hooks over one object): the model
and its optimisation, where the run is, and the current logging window summed on the device;
made fresh for a run, and parallelised over its processes."""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from voxjet.distributed import sharded
from voxjet.distributed.pipeline import PipelineConfig, PipelineParallel
from voxjet.distributed.runtime import Runtime
from voxjet.errors import VoxjetError
from voxjet.training.compiled import CompiledModule, compile_wanted
from voxjet.training.schedule import multiplier
from voxjet.training.task import PipelineTask, Task, TrainSettings, make_optimizer

DATA_PARALLEL = ("ddp", "fsdp")


@dataclass
class TrainState:
    """Everything the loop's parts share: the model and its optimisation, where the run is,
    and the current logging window (summed on the device)."""

    model: nn.Module
    module: nn.Module  # what a step calls: the model (sharded in place by FSDP), or its DDP wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    pipe: Any = None  # voxjet.distributed.pipeline.PipelineParallel, when pipelined
    data_rt: Runtime | None = None  # the runtime the loader sees (a pipeline's ranks share data)
    step: int = 0
    epoch: int = 0
    position: int = 0
    best: float = float("-inf")
    loss_sum: torch.Tensor | None = None
    loss_count: int = 0
    nonfinite: torch.Tensor | None = None  # non-finite losses in the window
    first_bad: torch.Tensor | None = None  # the first of them, as a step (-1: none)
    step_on_device: torch.Tensor | None = None
    first_loss: torch.Tensor | None = None  # the session's first step's (the watch's reference)
    recent: deque = field(default_factory=deque)  # (step, provenance) of the window's batches
    cost: dict | None = None  # what earlier sessions of the run cost (accounting.add_session)
    compiled: CompiledModule | None = None  # train.compile: the compiled step and its fallback
    sharded: bool = False  # train.data_parallel: fsdp over several processes (FSDP2)
    pending_optimizer: dict | None = None  # a resumed FSDP run's whole optimiser state
    whole_copy: nn.Module | None = None  # an FSDP run's unsharded copy that validates

    def new_window(self, log_every: int, device: torch.device, reset_count: bool) -> None:
        """A fresh logging window: loss sum, non-finite count, the batches' provenance."""
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.nonfinite = torch.zeros((), dtype=torch.long, device=device)
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.recent = deque(maxlen=max(1, log_every))
        if reset_count:
            self.loss_count = 0


def new_state(task: Task, s: TrainSettings, rt: Runtime, horizon: int) -> TrainState:
    """A fresh model, its optimiser and schedule (the learning rate scaled with the number of
    data-parallel processes)."""
    torch.manual_seed(s.seed)
    model = task.build_model().to(rt.device)
    data_parallel = rt.world_size // max(1, s.pipeline_stages)
    lr = s.lr * (data_parallel if s.scale_lr_with_world else 1)
    opt = make_optimizer(model.parameters(), s, lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: multiplier(s.schedule, step, horizon, s.warmup_steps)
    )
    state = TrainState(model, model, opt, sched, data_rt=rt)
    state.new_window(s.log_every, rt.device, reset_count=True)
    state.step_on_device = torch.zeros((), dtype=torch.long, device=rt.device)
    return state


def _fully_shard(state: TrainState, task: Task, s: TrainSettings, rt: Runtime) -> None:
    """The model sharded (voxjet.distributed.sharded), its optimiser and schedule made anew
    over the shards with the state they had (a resumed run's, or a fresh one's)."""
    named = state.pending_optimizer
    if named is None and state.optimizer.state:
        # (never of a fresh optimiser: torch would initialise its state by a step, which
        # counts in Adam's bias correction)
        named = sharded.named_optimizer_state(state.model, state.optimizer)
    lr = state.optimizer.defaults["lr"]
    units = getattr(task, "fsdp_units", sharded.shard_units)(state.model)
    sharded.shard_model(state.model, rt, units)
    opt = make_optimizer(state.model.parameters(), s, lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, state.scheduler.lr_lambdas[0])
    sched.load_state_dict(state.scheduler.state_dict())
    if named is not None:
        sharded.load_optimizer_state(state.model, opt, named)
    state.optimizer, state.scheduler = opt, sched
    state.sharded, state.pending_optimizer = True, None


def parallelise(state: TrainState, task: Task, s: TrainSettings, rt: Runtime) -> None:
    """DDP or FSDP over the processes (train.data_parallel), or the model cut into pipeline
    stages (pipeline × data parallel on a 2-D mesh); compiled where train.compile says so."""
    if s.data_parallel == "auto" and rt.distributed:
        raise VoxjetError("train.data_parallel: auto is the plan's choice, and this run was "
                          "given no plan: train it through the workflow (its job waits for "
                          "plan_runs), or name ddp or fsdp")  # fmt: skip
    if s.data_parallel not in (*DATA_PARALLEL, "auto"):
        raise VoxjetError(f"train.data_parallel {s.data_parallel!r}: use one of {DATA_PARALLEL}")
    if s.pipeline_stages > 1:
        if s.data_parallel == "fsdp":
            raise VoxjetError(
                f"train.data_parallel: fsdp with train.pipeline_stages={s.pipeline_stages}: "
                "a pipeline's stages are not sharded (each stage holds its own part of the "
                "model already); use data_parallel: ddp with pipeline_stages, or fsdp with "
                "pipeline_stages: 1"
            )
        if not isinstance(task, PipelineTask):
            raise VoxjetError(
                f"train.pipeline_stages={s.pipeline_stages}: only segmentation U-Nets are "
                "cut into pipeline stages; use 1 (data parallel) for this model"
            )
        cfg = PipelineConfig(s.pipeline_stages, s.microbatches, s.pipeline_schedule)
        modules, loss_fn = task.pipeline_stages(state.model, s.pipeline_stages)
        state.pipe = PipelineParallel(modules, cfg, rt, loss_fn)
        state.data_rt = state.pipe.data_runtime(rt)
    elif rt.distributed and s.data_parallel == "fsdp":
        _fully_shard(state, task, s, rt)
    elif rt.distributed:
        state.module = torch.nn.parallel.DistributedDataParallel(
            state.model, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None
        )
    if state.pending_optimizer is not None:  # an FSDP checkpoint resumed unsharded
        sharded.load_optimizer_state(state.model, state.optimizer, state.pending_optimizer)
        state.pending_optimizer = None
    if not compile_wanted(s.compile, rt.device):
        return
    if state.pipe is not None:
        # a schedule's micro-batch runs inside torch.distributed.pipelining, where a failed
        # compile could not fall back without leaving the other stages waiting
        if rt.is_main:
            print("train.compile: pipeline stages run eager (no fallback inside a "
                  "pipeline schedule)", file=sys.stderr)  # fmt: skip
        return
    state.compiled = CompiledModule.wrap(state.module, announce=rt.is_main)
    state.module = state.compiled.module
