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
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from voxjet.distributed import checkpoint
from voxjet.distributed.runtime import Runtime
from voxjet.errors import VoxjetError
from voxjet.io.device_feed import DeviceFeed
from voxjet.io.lock import RunLock
from voxjet.io.prefetch import prefetch
from voxjet.progress import Progress
from voxjet.training import accounting, identity
from voxjet.training.compiled import compile_errors
from voxjet.training.divergence import DivergenceWatch
from voxjet.training.logger import StepTimer, Trackers
from voxjet.training.run_files import RunFiles, whole_weights
from voxjet.training.state import TrainState, new_state, parallelise
from voxjet.training.task import Task, TrainSettings, epochs


class Trainer:
    """Train one run into `run_dir` (resuming from checkpoints/last.pt when it belongs to the
    run); `fit()` returns a summary. Its parts: set-up and resume (voxjet.training.state,
    RunFiles.resume), one step (train_step), the logging window, validation, checkpoints
    (RunFiles.save) and the export (RunFiles.export)."""

    def __init__(
        self, task: Task, s: TrainSettings, run_dir: str | Path, rt: Runtime, rate_key: str
    ) -> None:
        self.task, self.s, self.rt, self.rate_key = task, s, rt, rate_key
        self.run_dir = Path(run_dir)
        self.amp = rt.device.type == "cuda"
        self.horizon = s.schedule_steps or s.steps
        fingerprint = identity.run_fingerprint(
            s, task.model_config(), task.data_config(), rt.world_size
        )
        self.files = RunFiles(self.run_dir, s, rt, fingerprint)

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
        if state.first_loss is None:  # read at the window's end, with its sync
            state.first_loss = detached.clone()
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
        if state.first_loss is not None and self.watch.initial is None:
            self.watch.initial = float(state.first_loss)
        diverged = self.watch.update(state.step, mean_loss)
        if diverged is not None:
            self._record(diverged)
            if self.rt.is_main:
                print(f"warning: run diverged at step {state.step}: {diverged['why']}; the run "
                      "is marked diverged in metrics.jsonl and the summary (lower train.lr)",
                      file=sys.stderr)  # fmt: skip
        state.new_window(self.s.log_every, self.rt.device, reset_count=True)
        timer.reset()

    def _record(self, rec: dict[str, Any]) -> None:
        self.log.write(rec)
        self.trackers.log(rec)

    # ---- validation and checkpoints ---------------------------------------------------------

    def validate(self, state: TrainState) -> None:
        """Every rank scores its share; rank 0 logs and keeps the best weights."""
        if state.pipe is not None:
            state.pipe.sync_params(state.model)
        metrics = self.task.validate(self._whole_model(state), self.rt.device, self.rt)
        self._record({"step": state.step, "split": "val", **metrics})
        if metrics["score"] > state.best:
            state.best = metrics["score"]
            self.files.save_best(state)

    def _whole_model(self, state: TrainState) -> torch.nn.Module:
        """The model validation runs: an FSDP run's whole copy (its ranks score shares of
        different lengths, which a sharded forward's collectives could not follow)."""
        if not state.sharded:
            return state.model
        if state.whole_copy is None:
            state.whole_copy = self.task.build_model().to(self.rt.device)
        state.whole_copy.load_state_dict(whole_weights(state))
        return state.whole_copy

    def save_checkpoint(self, state: TrainState, final: bool = False) -> None:
        """checkpoints/last.pt (RunFiles.save), never of weights a non-finite loss touched."""
        self.files.save(state, self.meter, final, self._nonfinite)

    def stop_preempted(self, state: TrainState, signum: int | None) -> None:
        """Checkpoint and exit with the code that makes a rerun or requeue resume."""
        self.save_checkpoint(state, final=True)
        if self.rt.is_main:
            print(
                f"preempted by signal {signum}: checkpoint at step {state.step} in "
                f"{self.files.last_path}; rerun to resume",
                file=sys.stderr,
            )
        sys.exit(checkpoint.PREEMPTED_EXIT_CODE)

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
        state = new_state(self.task, s, rt, self.horizon)
        _, self.log = self.files.resume(state)
        self.watch = DivergenceWatch(getattr(self.task, "chance_loss", None))
        parallelise(state, self.task, s, rt)
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
                epochs(self.task, state.epoch, state.position, state.data_rt), s.prefetch
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
        self.files.export(state, self.task, self.meter, self.log)
        return {"step": state.step, "best": state.best,
                "diverged": (self.watch.flagged or {}).get("step")}  # fmt: skip

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
