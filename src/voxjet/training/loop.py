"""The training loop both domains share, in named parts around a state object (as nnU-Net's
trainer hooks): set-up, resume, step, log, validate-and-checkpoint, export. DDP or pipeline
parallelism, schedule, gradient clipping, AMP on CUDA, validation on every rank with a best
checkpoint, atomic checkpoints with the loader position, exact resume, and SIGTERM/SIGUSR1
turned into a checkpoint and a resumable exit.

Host synchronisations are kept to the logging interval: the loss is summed on the device and
checked for NaN/inf there, and ranks agree on a preemption signal only when they log (every
step when training alone, where that costs nothing)."""

from __future__ import annotations

import os
import shutil
import sys
from collections import deque
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from voxjet.distributed import checkpoint
from voxjet.distributed.pipeline import PipelineConfig, PipelineParallel
from voxjet.distributed.runtime import Runtime
from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, write_json
from voxjet.io.device_feed import DeviceFeed
from voxjet.io.lock import RunLock
from voxjet.io.prefetch import prefetch
from voxjet.progress import Progress
from voxjet.training import accounting, identity
from voxjet.training.compiled import CompiledModule, compile_errors, compile_wanted
from voxjet.training.logger import MetricsLog, StepTimer, Trackers
from voxjet.training.schedule import multiplier


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
    microbatches: int = 4
    pipeline_schedule: str = "1f1b"
    compile: bool | None = None  # None: on CUDA only
    augment_on: str | None = None  # volumes: "device" or "loader"; None: device on CUDA


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


def param_digest(model: nn.Module) -> str:
    """A short hash of every parameter's bytes."""
    import hashlib

    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def make_optimizer(params, s: TrainSettings, lr: float) -> torch.optim.Optimizer:
    """The run's optimiser (AdamW, or SGD with Nesterov momentum as nnU-Net trains)."""
    if s.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=s.weight_decay)
    if s.optimizer == "sgd":  # nnU-Net's recipe
        return torch.optim.SGD(
            params, lr=lr, momentum=s.momentum, nesterov=True, weight_decay=s.weight_decay
        )
    raise ValueError(f"unknown optimizer {s.optimizer!r} (adamw or sgd)")


def _epochs(task: Task, epoch: int, pos: int, rt: Runtime) -> Iterator[Any]:
    """Batches from (epoch, pos) on, epoch after epoch, with None at each epoch's end: read
    through one prefetch thread, the next epoch's first batches are ready when it starts."""
    while True:
        yield from task.batches(epoch, pos, rt)
        yield None
        epoch, pos = epoch + 1, 0


@dataclass
class TrainState:
    """Everything the loop's parts share: the model and its optimisation, where the run is,
    and the current logging window (summed on the device)."""

    model: nn.Module
    module: nn.Module  # what a step calls: the model, or its DDP wrapper
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
    recent: deque = field(default_factory=deque)  # (step, provenance) of the window's batches
    cost: dict | None = None  # what earlier sessions of the run cost (accounting.add_session)
    compiled: CompiledModule | None = None  # train.compile: the compiled step and its fallback


class Trainer:
    """Train one run into `run_dir` (resuming from checkpoints/last.pt when it belongs to the
    run); `fit()` returns a summary."""

    def __init__(
        self, task: Task, s: TrainSettings, run_dir: str | Path, rt: Runtime, rate_key: str
    ) -> None:
        self.task, self.s, self.rt, self.rate_key = task, s, rt, rate_key
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.last_path, self.best_path = self.ckpt_dir / "last.pt", self.ckpt_dir / "best.pt"
        self.amp = rt.device.type == "cuda"
        self.horizon = s.schedule_steps or s.steps
        self.fingerprint = identity.run_fingerprint(
            s, task.model_config(), task.data_config(), rt.world_size
        )

    # ---- set-up and resume ------------------------------------------------------------------

    def setup(self) -> TrainState:
        """A fresh model, its optimiser and schedule (the learning rate scaled with the number of
        data-parallel processes), wrapped for DDP or cut into pipeline stages."""
        s, rt = self.s, self.rt
        torch.manual_seed(s.seed)
        model = self.task.build_model().to(rt.device)
        data_parallel = rt.world_size // max(1, s.pipeline_stages)
        lr = s.lr * (data_parallel if s.scale_lr_with_world else 1)
        opt = make_optimizer(model.parameters(), s, lr)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: multiplier(s.schedule, step, self.horizon, s.warmup_steps)
        )
        state = TrainState(model, model, opt, sched, data_rt=rt)
        self._window(state, reset_count=True)
        state.step_on_device = torch.zeros((), dtype=torch.long, device=rt.device)
        return state

    def resume(self, state: TrainState) -> dict | None:
        """Load checkpoints/last.pt into `state` when it belongs to this run; a checkpoint that
        does not (identity.refusal) is moved aside and the run starts afresh."""
        saved = checkpoint.load(self.last_path)
        why = identity.refusal(saved, self.fingerprint, self.s.steps, self.ckpt_dir)
        if self.rt.distributed:
            # every rank decides on the same files: none may look after rank 0 moved them
            # aside (the late one saw no checkpoint, skipped the barrier below and hung)
            dist.barrier()
        if why is not None:
            if self.rt.is_main:
                moved = identity.move_aside(self.ckpt_dir)
                print(f"{self.last_path}: not resumed, {why}; moved to {moved}", file=sys.stderr)
            if self.rt.distributed:
                dist.barrier()
            saved = None
        self.log = MetricsLog(self.ckpt_dir / "metrics.jsonl", enabled=self.rt.is_main)
        if saved is None:
            return None
        state.model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        state.scheduler.load_state_dict(saved["scheduler"])
        rank = min(self.rt.rank, len(saved["rng"]) - 1)
        checkpoint.set_rng_state(saved["rng"][rank])
        state.step, state.epoch = saved["step"], saved["epoch"]
        state.position, state.best = saved["position"], saved["best"]
        loss_sum, count = saved["loss_window"][min(rank, len(saved["loss_window"]) - 1)]
        state.loss_sum.fill_(loss_sum)
        state.loss_count = count
        state.step_on_device.fill_(state.step)
        state.cost = saved.get("cost")
        self.log.truncate_after(state.step)
        if self.rt.is_main:
            print(f"resumed from {self.last_path} at step {state.step}", file=sys.stderr)
        return saved

    def parallelise(self, state: TrainState) -> None:
        """DDP over the processes, or the model cut into pipeline stages (pipeline × data
        parallel on a 2-D mesh)."""
        s, rt = self.s, self.rt
        if s.pipeline_stages > 1:
            if not isinstance(self.task, PipelineTask):
                raise VoxjetError(
                    f"train.pipeline_stages={s.pipeline_stages}: only segmentation U-Nets are "
                    "cut into pipeline stages; use 1 (data parallel) for this model"
                )

            cfg = PipelineConfig(s.pipeline_stages, s.microbatches, s.pipeline_schedule)
            modules, loss_fn = self.task.pipeline_stages(state.model, s.pipeline_stages)
            state.pipe = PipelineParallel(modules, cfg, rt, loss_fn)
            state.data_rt = state.pipe.data_runtime(rt)
        elif rt.distributed:
            state.module = torch.nn.parallel.DistributedDataParallel(
                state.model, device_ids=[rt.local_rank] if rt.device.type == "cuda" else None
            )
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

    # ---- one step ---------------------------------------------------------------------------

    def _forward(self, state: TrainState, batch: Any) -> tuple[torch.Tensor, int]:
        """Forward (under autocast on CUDA) and backward (outside it) of one batch."""
        with torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else nullcontext():
            if state.pipe is not None:  # forward and backward happen inside the schedule
                inputs, target = self.task.pipeline_batch(batch, self.rt.device)
                return state.pipe.step(inputs, target), len(inputs)
            loss, n = self.task.loss(state.module, batch, self.rt.device)
        loss.backward()
        return loss, n

    def _compiled_forward(self, state: TrainState, batch: Any) -> tuple[torch.Tensor, int]:
        """The step's forward and backward through the compiled module; when torch cannot
        compile it, the same step again eagerly (nothing was updated yet)."""
        c = state.compiled
        c.step_started()
        try:
            out = self._forward(state, batch)
        except compile_errors() as e:
            c.fall_back(e)
            state.module = c.module
            state.optimizer.zero_grad(set_to_none=True)
            return self._forward(state, batch)
        c.step_done()
        return out

    def train_step(self, state: TrainState, batch: Any) -> int:
        """Forward, backward and optimiser step of one batch; returns the items it held. The
        loss stays on the device (summed into the window, NaN/inf counted there)."""
        s = self.s
        state.module.train()
        state.optimizer.zero_grad(set_to_none=True)
        on_device = getattr(self.task, "on_device", None)
        if on_device is not None:  # e.g. augmentation on the device: part of the step
            batch = on_device(batch, self.rt.device)
        if state.compiled is not None and state.compiled.compiled is not None:
            loss, n = self._compiled_forward(state, batch)
        else:
            loss, n = self._forward(state, batch)
        if state.pipe is None:
            if s.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(state.model.parameters(), s.grad_clip)
        else:
            state.pipe.reduce_grads(state.model.parameters())
            if s.grad_clip > 0:
                state.pipe.clip_grad_norm_(state.model.parameters(), s.grad_clip)
        state.optimizer.step()
        state.scheduler.step()
        detached = loss.detach().float()
        bad = ~torch.isfinite(detached)
        state.step_on_device += 1
        state.first_bad = torch.where(
            (state.first_bad < 0) & bad, state.step_on_device, state.first_bad
        )
        state.nonfinite += bad.long()
        state.loss_sum += torch.where(bad, torch.zeros_like(detached), detached)
        state.loss_count += 1
        state.step, state.position = state.step + 1, state.position + 1
        state.recent.append((state.step, self.task.provenance(batch)))
        return n

    def _window(self, state: TrainState, reset_count: bool) -> None:
        dev = self.rt.device
        state.loss_sum = torch.zeros((), dtype=torch.float32, device=dev)
        state.nonfinite = torch.zeros((), dtype=torch.long, device=dev)
        state.first_bad = torch.full((), -1, dtype=torch.long, device=dev)
        state.recent = deque(maxlen=max(1, self.s.log_every))
        if reset_count:
            state.loss_count = 0

    # ---- the logging interval: one host sync and one collective -----------------------------

    def sync_window(self, state: TrainState, preempted: bool) -> tuple[float, bool]:
        """End of a logging window: the mean loss over all ranks' batches, whether any rank was
        signalled to stop; raises on a non-finite loss, naming the batch it came from."""
        rt = self.rt
        t = torch.stack(
            [
                state.loss_sum.double(),
                torch.tensor(float(state.loss_count), dtype=torch.float64, device=rt.device),
                state.nonfinite.double(),
                torch.tensor(float(preempted), dtype=torch.float64, device=rt.device),
            ]
        )
        if rt.distributed:
            dist.all_reduce(t)
        total, count, nonfinite, stop = t.tolist()
        if nonfinite:
            self._nonfinite(state)
        return total / max(count, 1.0), stop > 0

    def _nonfinite(self, state: TrainState) -> None:
        bad = int(state.first_bad.item())
        where = next((self.task.describe(p) for st, p in state.recent if st == bad), None)
        raise VoxjetError(
            f"non-finite loss (NaN or inf) at step {bad if bad >= 0 else '?'} (epoch {state.epoch})"
            + (f" from {where}" if where else " on another rank")
            + "; lower train.lr or check these inputs for NaN/inf"
        )

    def log_window(self, state: TrainState, mean_loss: float, timer: StepTimer) -> None:
        """One metrics.jsonl line (loss, rate, throughput, data wait) for the window."""
        rec = {
            "step": state.step,
            "epoch": state.epoch,
            "loss": mean_loss,
            "lr": state.scheduler.get_last_lr()[0],
            **timer.summary(),
        }
        rec[self.rate_key] = rec.pop("items_per_s")
        self.meter.sample()
        self._record(rec)
        self._window(state, reset_count=True)
        timer.reset()

    def _record(self, rec: dict[str, Any]) -> None:
        self.log.write(rec)
        self.trackers.log(rec)

    # ---- validation and checkpoints ---------------------------------------------------------

    def validate(self, state: TrainState) -> None:
        """Every rank scores its share; rank 0 logs and keeps the best weights."""
        if state.pipe is not None:
            state.pipe.sync_params(state.model)
        metrics = self.task.validate(state.model, self.rt.device, self.rt)
        self._record({"step": state.step, "split": "val", **metrics})
        if metrics["score"] > state.best:
            state.best = metrics["score"]
            if self.rt.is_main:
                checkpoint.save(
                    self.best_path,
                    {"model": state.model.state_dict(), "step": state.step, "score": state.best},
                )

    def save_checkpoint(self, state: TrainState, final: bool = False) -> None:
        """checkpoints/last.pt: weights, optimiser, schedule, every rank's RNG and loss window,
        the loader position. Refuses to keep weights a non-finite loss has touched."""
        rt = self.rt
        window = (float(state.loss_sum), state.loss_count)
        if int(state.nonfinite.item()):
            self._nonfinite(state)
        # energy is read (sacct asks the cluster's database) only when the session ends here
        mine = (checkpoint.rng_state(), window, self.meter.snapshot(rt.device, energy=final))
        ranks = [mine]
        if rt.distributed:
            ranks = [None] * rt.world_size
            dist.all_gather_object(ranks, mine)
        cost = accounting.add_session(state.cost, accounting.combine_ranks([r[2] for r in ranks]))
        optimizer = state.optimizer.state_dict()
        if state.pipe is not None:
            state.pipe.sync_params(state.model)
            optimizer = state.pipe.gather_optimizer_state(state.optimizer)
        if rt.is_main:
            checkpoint.save(
                self.last_path,
                {
                    "model": state.model.state_dict(),
                    "optimizer": optimizer,
                    "scheduler": state.scheduler.state_dict(),
                    "rng": [r[0] for r in ranks],
                    "loss_window": [r[1] for r in ranks],
                    "step": state.step,
                    "epoch": state.epoch,
                    "position": state.position,
                    "best": state.best,
                    "settings": asdict(self.s),
                    "world_size": rt.world_size,
                    "fingerprint": self.fingerprint,
                    "cost": cost,
                },
            )

    def stop_preempted(self, state: TrainState, signum: int | None) -> None:
        """Checkpoint and exit with the code that makes a rerun or requeue resume."""
        self.save_checkpoint(state, final=True)
        if self.rt.is_main:
            print(
                f"preempted by signal {signum}: checkpoint at step {state.step} in "
                f"{self.last_path}; rerun to resume",
                file=sys.stderr,
            )
        sys.exit(checkpoint.PREEMPTED_EXIT_CODE)

    # ---- export -----------------------------------------------------------------------------

    def export(self, state: TrainState) -> None:
        """model.pt (the best weights, the model's config, each rank's parameter digest) and
        metrics.jsonl beside it; then mark the run complete."""
        rt = self.rt
        if state.pipe is not None:
            state.pipe.sync_params(state.model)
        # DDP keeps replicas identical; record each rank's digest so that is checkable
        mine = (param_digest(state.model), self.meter.snapshot(rt.device))
        ranks = [mine]
        if rt.distributed:
            ranks = [None] * rt.world_size
            dist.all_gather_object(ranks, mine)
        digests = [r[0] for r in ranks]
        if not rt.is_main:
            return
        cost = accounting.add_session(state.cost, accounting.combine_ranks([r[1] for r in ranks]))
        estimate = None if state.pipe is not None else self.task.memory_estimate(
            state.model, rt.device.type == "cuda")  # fmt: skip
        # the run's cost as the log's last record, beside the numbers it bought
        self.log.write({"step": state.step, "cost": accounting.summary(cost, estimate)})
        best = checkpoint.load(self.best_path) or {
            "model": state.model.state_dict(),
            "step": state.step,
        }
        checkpoint.save(
            self.run_dir / "model.pt",
            {
                "model": best["model"],
                "best_step": best["step"],
                "best_score": state.best,
                "model_config": self.task.model_config(),
                "settings": asdict(self.s),
                "world_size": rt.world_size,
                "rank_param_digests": digests,
            },
        )
        with atomic_path(self.run_dir / "metrics.jsonl") as tmp:
            shutil.copyfile(self.ckpt_dir / "metrics.jsonl", tmp)
        write_json(self.ckpt_dir / identity.COMPLETE, {"step": state.step})

    # ---- the loop ---------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """Train to `steps`: set-up, resume, then step after step with logging, validation and
        checkpoints at their intervals, and the export at the end."""
        lock = RunLock(self.run_dir).acquire() if self.rt.is_main else None
        try:
            return self._fit()
        finally:
            if lock is not None:
                lock.release()

    def _fit(self) -> dict[str, Any]:
        s, rt = self.s, self.rt
        # the cost of this session, from set-up on (building and resuming count as the run's)
        nodes = rt.world_size // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", rt.world_size)))
        self.meter = accounting.Session.start(rt.device, rt.is_main, nodes=max(1, nodes))
        state = self.setup()
        self.resume(state)
        self.parallelise(state)
        self.trackers = Trackers(
            self.run_dir,
            rt.is_main,
            state.step,
            getattr(self.task, "experiment", "") or "voxjet",
            self.run_dir.name,
        )
        if state.step == 0:
            self.trackers.params(identity.trajectory_settings(s))
        preempt = checkpoint.PreemptionFlag()
        timer = StepTimer()
        bar = Progress(s.steps, f"train {self.run_dir.name}", "step", state.step, not rt.is_main)
        try:
            feed = DeviceFeed(rt.device, getattr(self.task, "device_keys", None))
            batches = feed(prefetch(
                _epochs(self.task, state.epoch, state.position, state.data_rt), s.prefetch
            ))  # fmt: skip
            for batch in batches:
                if state.step >= s.steps:  # a run resumed from its final checkpoint
                    break
                if batch is None:
                    # End of an epoch: validate here when no step interval is set, and always
                    # checkpoint, so the position saved is the next epoch's start.
                    state.epoch, state.position = state.epoch + 1, 0
                    if not s.eval_every:
                        self.validate(state)
                    self.save_checkpoint(state)
                    timer.other_done()
                    continue
                timer.data_ready()
                n = self.train_step(state, batch)
                timer.step_done(n * state.data_rt.world_size)
                self.meter.count(n * state.data_rt.world_size)
                bar.update(1)
                if self.after_step(state, timer, bar, preempt):
                    break
        finally:
            bar.close()
            preempt.restore()
            self.trackers.close()
        self.export(state)
        return {"step": state.step, "best": state.best}

    def after_step(self, state: TrainState, timer: StepTimer, bar: Progress, preempt: Any) -> bool:
        """Logging, validation and checkpoints when their intervals come round, and the
        preemption check; True when the run has reached `steps`."""
        s, rt = self.s, self.rt
        last = state.step == s.steps
        stop = False
        if state.step % s.log_every == 0 or last:
            mean_loss, stop = self.sync_window(state, preempt.raised)
            self.log_window(state, mean_loss, timer)
            bar.set_postfix(loss=f"{mean_loss:.4f}")
        elif not rt.distributed:
            stop = preempt.raised  # alone, the check costs nothing: every step
        if (s.eval_every and state.step % s.eval_every == 0) or last:
            self.validate(state)
        if (s.checkpoint_every and state.step % s.checkpoint_every == 0) or last:
            self.save_checkpoint(state, final=last)
        timer.other_done()  # validation and checkpoints are not data wait
        if stop:
            self.stop_preempted(state, preempt.signum)
        return state.step >= s.steps


def train(
    task: Task, s: TrainSettings, run_dir: str | Path, rt: Runtime, rate_key: str = "items_per_s"
) -> dict[str, Any]:
    """Train to `s.steps` (resuming from checkpoints/last.pt when it belongs to this run)."""
    return Trainer(task, s, run_dir, rt, rate_key).fit()
