"""The training loop both domains share: DDP, schedule, gradient clipping, AMP on CUDA,
periodic validation with a best checkpoint, atomic checkpoints with the loader position,
exact resume, and SIGTERM/SIGUSR1 turned into a checkpoint and a resumable exit."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from voxjet.distributed import checkpoint
from voxjet.distributed.runtime import Runtime, all_reduce_mean
from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path
from voxjet.io.prefetch import prefetch
from voxjet.training.logger import MetricsLog, StepTimer
from voxjet.training.schedule import multiplier


@dataclass
class TrainSettings:
    """Optimisation settings from the experiment's `train:` section (defaults: the schema's,
    config/schema.yaml, tested equal)."""

    steps: int = 300
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
    pipeline_stages: int = 1
    microbatches: int = 4
    pipeline_schedule: str = "1f1b"


class Task(Protocol):
    """What a domain supplies to the loop."""

    def build_model(self) -> nn.Module:
        """A fresh model on CPU."""

    def batches(self, epoch: int, start: int, rt: Runtime) -> Iterator[Any]:
        """This rank's batches of `epoch`, from batch index `start` on (deterministic)."""

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[torch.Tensor, int]:
        """The loss of one batch and how many items (jets, patches) it held."""

    def validate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation metrics; `score` (higher is better) picks the best checkpoint."""

    def model_config(self) -> dict[str, Any]:
        """What evaluation needs to rebuild the model."""

    def describe(self, batch: Any) -> str:
        """Where a batch's items came from, for error messages."""

    def data_config(self) -> dict[str, Any]:
        """What, besides settings and model, decides the batches (part of the fingerprint)."""


def run_fingerprint(s: TrainSettings, task: Task, world_size: int) -> str:
    """What a checkpoint must match to be resumed: settings, model and data config, world size."""
    blob = json.dumps(
        [asdict(s), task.model_config(), task.data_config(), world_size],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def param_digest(model: nn.Module) -> str:
    """A short hash of every parameter's bytes."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _optimizer(params, s: TrainSettings, lr: float) -> torch.optim.Optimizer:
    if s.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=s.weight_decay)
    if s.optimizer == "sgd":  # nnU-Net's recipe
        return torch.optim.SGD(
            params, lr=lr, momentum=s.momentum, nesterov=True, weight_decay=s.weight_decay
        )
    raise ValueError(f"unknown optimizer {s.optimizer!r} (adamw or sgd)")


def _any_rank(flag: bool, rt: Runtime) -> bool:
    if not rt.distributed:
        return flag
    t = torch.tensor([int(flag)], device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def _epochs(task, epoch: int, pos: int, rt: Runtime) -> Iterator[Any]:
    """Batches from (epoch, pos) on, epoch after epoch, with None at each epoch's end: read
    through one prefetch thread, the next epoch's first batches are ready when it starts."""
    while True:
        yield from task.batches(epoch, pos, rt)
        yield None
        epoch, pos = epoch + 1, 0


def _pipeline(task, model: nn.Module, s: TrainSettings, rt: Runtime):
    """(PipelineParallel or None, the runtime the data loader sees)."""
    if s.pipeline_stages <= 1:
        return None, rt
    if not hasattr(task, "pipeline_stages"):
        raise VoxjetError(
            f"train.pipeline_stages={s.pipeline_stages}: only segmentation U-Nets are cut into "
            "pipeline stages; use 1 (data parallel) for this model"
        )
    from voxjet.distributed.pipeline import PipelineConfig, PipelineParallel

    cfg = PipelineConfig(s.pipeline_stages, s.microbatches, s.pipeline_schedule)
    modules, loss_fn = task.pipeline_stages(model, s.pipeline_stages)
    pipe = PipelineParallel(modules, cfg, rt, loss_fn)
    return pipe, pipe.data_runtime(rt)


def train(
    task: Task, s: TrainSettings, run_dir: str | Path, rt: Runtime, rate_key: str = "items_per_s"
) -> dict[str, Any]:
    """Train to `s.steps` (resuming from checkpoints/last.pt when present); returns a summary."""
    run_dir = Path(run_dir)
    ckpt_dir = run_dir / "checkpoints"
    last_path, best_path = ckpt_dir / "last.pt", ckpt_dir / "best.pt"
    log = MetricsLog(ckpt_dir / "metrics.jsonl", enabled=rt.is_main)
    torch.manual_seed(s.seed)
    model = task.build_model().to(rt.device)
    # the data-parallel degree: K pipeline stages share one batch
    lr = s.lr * (rt.world_size // max(1, s.pipeline_stages) if s.scale_lr_with_world else 1)
    opt = _optimizer(model.parameters(), s, lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: multiplier(s.schedule, step, s.steps, s.warmup_steps)
    )
    amp = rt.device.type == "cuda"
    step, epoch, pos, best = 0, 0, 0, float("-inf")
    fingerprint = run_fingerprint(s, task, rt.world_size)
    state = checkpoint.load(last_path)
    if state is not None and state.get("fingerprint") != fingerprint:
        # A checkpoint of another configuration (settings, data statistics or world size
        # changed): resuming it would silently mix two runs. Start again from scratch.
        if rt.is_main:
            print(
                f"{last_path} belongs to a different run configuration: starting afresh",
                file=sys.stderr,
            )
            shutil.rmtree(ckpt_dir)
            ckpt_dir.mkdir(parents=True)
        if rt.distributed:
            dist.barrier()
        state = None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        checkpoint.set_rng_state(state["rng"][min(rt.rank, len(state["rng"]) - 1)])
        step, epoch, pos, best = state["step"], state["epoch"], state["position"], state["best"]
        log.truncate_after(step)
        if rt.is_main:
            print(f"resumed from {last_path} at step {step}", file=sys.stderr)
    pipe, data_rt = _pipeline(task, model, s, rt)
    ddp = (
        torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None
        )
        if rt.distributed and pipe is None
        else model
    )

    def save_last() -> None:
        # each rank's RNG state and its loss window since the last log line (a resumed run
        # logs the same mean loss as an uninterrupted one)
        mine = (checkpoint.rng_state(), (running, count))
        ranks = [mine]
        if rt.distributed:
            ranks = [None] * rt.world_size
            dist.all_gather_object(ranks, mine)
        rng, windows = [r[0] for r in ranks], [r[1] for r in ranks]
        if rt.is_main:
            checkpoint.save(
                last_path,
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "rng": rng,
                    "loss_window": windows,
                    "step": step,
                    "epoch": epoch,
                    "position": pos,
                    "best": best,
                    "settings": asdict(s),
                    "world_size": rt.world_size,
                    "fingerprint": fingerprint,
                },
            )

    def validate() -> None:
        nonlocal best
        if rt.is_main:
            metrics = task.validate(model, rt.device)
            log.write({"step": step, "split": "val", **metrics})
            if metrics["score"] > best:
                best = metrics["score"]
                checkpoint.save(
                    best_path, {"model": model.state_dict(), "step": step, "score": best}
                )
        if rt.distributed:
            best_t = [best]
            dist.broadcast_object_list(best_t, src=0)
            best = best_t[0]
        timer.reset()

    preempt = checkpoint.PreemptionFlag()
    timer = StepTimer()
    bar = tqdm(
        total=s.steps,
        initial=step,
        desc=f"train {run_dir.name}",
        unit="step",
        disable=not rt.is_main,
        mininterval=2.0,
    )
    running, count = 0.0, 0
    if state is not None and "loss_window" in state:
        running, count = state["loss_window"][min(rt.rank, len(state["loss_window"]) - 1)]
    try:
        for batch in prefetch(_epochs(task, epoch, pos, data_rt), s.prefetch):
            if step >= s.steps:  # a run resumed from its final checkpoint
                break
            if batch is None:
                # End of an epoch: validate here when no step interval is set, and always
                # checkpoint, so the position saved is the next epoch's start.
                epoch, pos = epoch + 1, 0
                if not s.eval_every:
                    validate()
                save_last()
                timer.other_done()
                continue
            timer.data_ready()
            ddp.train()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16) if amp else nullcontext():
                if pipe is None:
                    loss, n = task.loss(ddp, batch, rt.device)
                else:  # forward and backward happen inside the pipeline schedule
                    inputs, target = task.pipeline_batch(batch, rt.device)
                    loss, n = pipe.step(inputs, target), len(inputs)
            if not torch.isfinite(loss.detach()):
                raise VoxjetError(
                    f"non-finite loss ({float(loss.detach())}) at step {step + 1} "
                    f"(epoch {epoch}, batch {pos}) from {task.describe(batch)}; lower "
                    "train.lr or check these inputs for NaN/inf"
                )
            if pipe is None:
                loss.backward()
            else:
                pipe.reduce_grads(model.parameters())
            if s.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
            opt.step()
            sched.step()
            step, pos = step + 1, pos + 1
            running, count = running + float(loss.detach()), count + 1
            timer.step_done(n * data_rt.world_size)
            bar.update(1)
            if step % s.log_every == 0 or step == s.steps:
                # the loss of all ranks' batches, not rank 0's alone
                mean_loss = all_reduce_mean(running / count, rt)
                rec = {
                    "step": step,
                    "epoch": epoch,
                    "loss": mean_loss,
                    "lr": sched.get_last_lr()[0],
                    **timer.summary(),
                }
                rec[rate_key] = rec.pop("items_per_s")
                log.write(rec)
                bar.set_postfix(loss=f"{mean_loss:.4f}", refresh=False)  # keeps logs short
                running, count = 0.0, 0
                timer.reset()
            if (s.eval_every and step % s.eval_every == 0) or step == s.steps:
                validate()
            if (s.checkpoint_every and step % s.checkpoint_every == 0) or step == s.steps:
                save_last()
            timer.other_done()  # validation and checkpoints are not data wait
            if _any_rank(preempt.raised, rt):
                save_last()
                if rt.is_main:
                    print(
                        f"preempted by signal {preempt.signum}: checkpoint at step {step} "
                        f"in {last_path}; rerun to resume",
                        file=sys.stderr,
                    )
                sys.exit(checkpoint.PREEMPTED_EXIT_CODE)
            if step >= s.steps:
                break
    finally:
        bar.close()
        preempt.restore()
    # DDP keeps replicas identical; record each rank's parameter digest so that is checkable.
    digests = [param_digest(model)]
    if rt.distributed:
        digests = [None] * rt.world_size
        dist.all_gather_object(digests, param_digest(model))
    if rt.is_main:
        best_state = checkpoint.load(best_path) or {"model": model.state_dict(), "step": step}
        with atomic_path(run_dir / "model.pt") as tmp:
            torch.save(
                {
                    "model": best_state["model"],
                    "best_step": best_state["step"],
                    "best_score": best,
                    "model_config": task.model_config(),
                    "settings": asdict(s),
                    "world_size": rt.world_size,
                    "rank_param_digests": digests,
                },
                tmp,
            )
        with atomic_path(run_dir / "metrics.jsonl") as tmp:
            shutil.copyfile(ckpt_dir / "metrics.jsonl", tmp)
    return {"step": step, "best": best}
