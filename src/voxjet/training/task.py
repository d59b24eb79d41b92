"""What a domain gives the shared training loop: its settings (the experiment's `train:`
section), the Task it implements (model, batches, loss, validation, provenance), the optimiser
the settings ask for, and the endless stream of batches epoch after epoch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from voxjet.distributed.runtime import Runtime


@dataclass
class TrainSettings:
    """Optimisation settings from the experiment's `train:` section (defaults: the schema's,
    config/schema.yaml, tested equal)."""

    steps: int = 300
    schedule_steps: int | None = None  # None: `steps`
    batch_size: int | None = None  # None: the domain's (256 jets; the plan's for volumes)
    lr: float = 1e-3
    weight_decay: float = 1e-4
    optimizer: str = "adamw"
    momentum: float = 0.99
    schedule: str = "cosine"
    warmup_steps: int = 20
    grad_clip: float = 1.0
    log_every: int = 10
    eval_every: int = 100
    checkpoint_every: int = 100
    scale_lr_with_world: bool = True
    prefetch: int = 16
    loader_workers: int = 0
    seed: int = 0
    iterations_per_epoch: int = 50
    foreground_fraction: float = 0.333
    augment: bool = True
    fold: int | None = None  # volumes: the cross-validation fold (set by the experiment's folds)
    folds: int | None = None  # how many folds it is one of
    pipeline_stages: int = 1
    data_parallel: str = "ddp"  # or "fsdp": parameters, gradients, optimiser state sharded
    microbatches: int = 4
    pipeline_schedule: str = "1f1b"
    compile: bool | None = None  # None: on CUDA only
    augment_on: str | None = None  # volumes: "device" or "loader"; None: device on CUDA


def settings_of(run_config: dict[str, Any]) -> TrainSettings:
    """The run's TrainSettings; `data_parallel: auto` as its plan (`plan` in the run config,
    results/plan/runs.json, which the workflow adds) chose: ddp, fsdp, or pipeline stages
    across its processes. Without a plan `auto` stays (a profile's single process needs none;
    a distributed run is refused by voxjet.training.state.parallelise)."""
    train = dict(run_config.get("train") or {})
    if train.get("data_parallel") == "auto" and run_config.get("plan"):
        train.update(planned_parallelism(run_config))
    return TrainSettings(**train)


def planned_parallelism(run_config: dict[str, Any]) -> dict[str, Any]:
    """The train keys the plan's choice for this run sets."""
    import json
    from pathlib import Path

    from voxjet.errors import VoxjetError

    run, plan = run_config.get("run", "?"), run_config.get("plan")
    try:
        runs = json.loads(Path(plan).read_text())["runs"] if plan else []
    except (OSError, ValueError, KeyError) as e:
        raise VoxjetError(f"train.data_parallel: auto: the plan {plan} cannot be read ({e}); "
                          "run `snakemake --until plan_runs` first") from e  # fmt: skip
    chosen = next((p.get("parallelism") for p in runs if p.get("run") == run), None)
    if not chosen:
        raise VoxjetError(f"train.data_parallel: auto: the plan {plan} has no choice for run "
                          f"{run}; rerun it: snakemake -R plan_runs --until plan_runs")  # fmt: skip
    if chosen["scheme"] == "pipeline":
        return {"data_parallel": "ddp", "pipeline_stages": chosen["options"][0]["processes"]}
    return {"data_parallel": chosen["scheme"]}


class Task(Protocol):
    """What a domain supplies to the loop."""

    def build_model(self) -> nn.Module:
        """A fresh model on CPU."""

    def batches(self, epoch: int, start: int, rt: Runtime) -> Iterator[Any]:
        """This rank's batches of `epoch`, from batch index `start` on (deterministic)."""

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        """The loss of one batch and how many items (jets, patches) it held."""

    def validate(self, model: nn.Module, device: torch.device, rt: Runtime) -> dict[str, float]:
        """Validation metrics, the same on every rank (each scores its share, the inputs of the
        metrics are gathered); `score` (higher is better) picks the best checkpoint."""

    def model_config(self) -> dict[str, Any]:
        """What evaluation needs to rebuild the model."""

    def provenance(self, batch: Any) -> Any:
        """A small, detached record of where a batch's items came from (kept for messages)."""

    def describe(self, provenance: Any) -> str:
        """That record in words, for error messages."""

    def data_config(self) -> dict[str, Any]:
        """What, besides settings and model, decides the batches (part of the run identity)."""

    def memory_estimate(self, model: nn.Module, gpu: bool) -> float | None:
        """Bytes a training step is planned to take on one device (None: no plan says)."""


@runtime_checkable
class PipelineTask(Protocol):
    """A task whose model can be cut into pipeline stages (train.pipeline_stages > 1)."""

    def pipeline_stages(self, model: nn.Module, k: int) -> tuple[list[nn.Module], Any]:
        """The model cut into `k` stage modules, and the loss the last stage applies."""

    def pipeline_batch(self, batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of a batch on the device."""


def make_optimizer(params, s: TrainSettings, lr: float) -> torch.optim.Optimizer:
    """The run's optimiser (AdamW, or SGD with Nesterov momentum as nnU-Net trains)."""
    if s.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=s.weight_decay)
    if s.optimizer == "sgd":  # nnU-Net's recipe
        return torch.optim.SGD(
            params, lr=lr, momentum=s.momentum, nesterov=True, weight_decay=s.weight_decay
        )
    raise ValueError(f"unknown optimizer {s.optimizer!r} (adamw or sgd)")


def epochs(task: Task, epoch: int, pos: int, rt: Runtime) -> Iterator[Any]:
    """Batches from (epoch, pos) on, epoch after epoch, with None at each epoch's end: read
    through one prefetch thread, the next epoch's first batches are ready when it starts."""
    while True:
        yield from task.batches(epoch, pos, rt)
        yield None
        epoch, pos = epoch + 1, 0
