"""A training run's files: checkpoints/last.pt (everything to resume exactly), best.pt (the
best weights so far), and at the end model.pt and metrics.jsonl beside them with the
completion mark — each written atomically by the main process, with what every rank holds
gathered first."""

from __future__ import annotations

import hashlib
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from voxjet.distributed import checkpoint, sharded
from voxjet.distributed.runtime import Runtime
from voxjet.io.atomic import atomic_path, write_json
from voxjet.training import accounting, identity
from voxjet.training.logger import MetricsLog
from voxjet.training.state import TrainState
from voxjet.training.task import Task, TrainSettings


def param_digest(model: nn.Module) -> str:
    """A short hash of every parameter's bytes."""
    return _digest(p for p in model.parameters())


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def whole_weights(state: TrainState) -> dict[str, Any]:
    """The model's whole state dict (an FSDP run's gathered from its shards: a collective,
    every rank calls it)."""
    if state.sharded:
        return sharded.full_model_state(state.model)
    return state.model.state_dict()


def whole_digest(state: TrainState, weights: dict[str, Any]) -> str:
    """param_digest of the whole model, from its whole state dict `weights` (whole_weights')."""
    if not state.sharded:
        return param_digest(state.model)
    return _digest(weights[name] for name, _ in state.model.named_parameters())


def _gathered(rt: Runtime, mine: Any) -> list[Any]:
    """Every rank's `mine`, in rank order (this one's alone when not distributed)."""
    if not rt.distributed:
        return [mine]
    ranks = [None] * rt.world_size
    dist.all_gather_object(ranks, mine)
    return ranks


@dataclass
class RunFiles:
    """Where a run's files are, and what identifies the run (its fingerprint)."""

    run_dir: Path
    s: TrainSettings
    rt: Runtime
    fingerprint: str

    @property
    def ckpt_dir(self) -> Path:
        """The checkpoints' folder."""
        return self.run_dir / "checkpoints"

    @property
    def last_path(self) -> Path:
        """The checkpoint a run resumes from."""
        return self.ckpt_dir / "last.pt"

    @property
    def best_path(self) -> Path:
        """The best weights so far."""
        return self.ckpt_dir / "best.pt"

    def resume(self, state: TrainState) -> tuple[dict | None, MetricsLog]:
        """Load checkpoints/last.pt into `state` when it belongs to this run (a checkpoint
        that does not, identity.refusal, is moved aside and the run starts afresh); the
        checkpoint and the run's metrics log, cut back to the step resumed from."""
        rt = self.rt
        saved = checkpoint.load(self.last_path)
        why = identity.refusal(saved, self.fingerprint, self.s.steps, self.ckpt_dir)
        if rt.distributed:
            # every rank decides on the same files: none may look after rank 0 moved them
            # aside (the late one saw no checkpoint, skipped the barrier below and hung)
            dist.barrier()
        if why is not None:
            if rt.is_main:
                moved = identity.move_aside(self.ckpt_dir)
                print(f"{self.last_path}: not resumed, {why}; moved to {moved}", file=sys.stderr)
            if rt.distributed:
                dist.barrier()
            saved = None
        log = MetricsLog(self.ckpt_dir / "metrics.jsonl", enabled=rt.is_main)
        if saved is None:
            return None, log
        state.model.load_state_dict(saved["model"])
        if saved.get("optimizer_format") == sharded.OPTIMIZER_FORMAT:
            state.pending_optimizer = saved["optimizer"]  # loaded once the model is sharded
        else:
            state.optimizer.load_state_dict(saved["optimizer"])
        state.scheduler.load_state_dict(saved["scheduler"])
        rank = min(rt.rank, len(saved["rng"]) - 1)
        checkpoint.set_rng_state(saved["rng"][rank])
        state.step, state.epoch = saved["step"], saved["epoch"]
        state.position, state.best = saved["position"], saved["best"]
        loss_sum, count = saved["loss_window"][min(rank, len(saved["loss_window"]) - 1)]
        state.loss_sum.fill_(loss_sum)
        state.loss_count = count
        state.step_on_device.fill_(state.step)
        state.cost = saved.get("cost")
        log.truncate_after(state.step)
        if rt.is_main:
            print(f"resumed from {self.last_path} at step {state.step}", file=sys.stderr)
        return saved, log

    def save_best(self, state: TrainState) -> None:
        """best.pt: the weights of the best validation score so far (whole)."""
        weights = whole_weights(state)
        if self.rt.is_main:
            checkpoint.save(self.best_path, {"model": weights, "step": state.step,
                                             "score": state.best})  # fmt: skip

    def save(self, state: TrainState, meter: accounting.Session, final: bool,
             refuse_nonfinite: Callable[[TrainState], None]) -> None:  # fmt: skip
        """checkpoints/last.pt: weights, optimiser, schedule, every rank's RNG and loss window,
        the loader position, the cost so far. Weights a non-finite loss has touched are never
        kept (`refuse_nonfinite` raises)."""
        rt = self.rt
        window = (float(state.loss_sum), state.loss_count)
        if int(state.nonfinite.item()):
            refuse_nonfinite(state)
        # energy is read (sacct asks the cluster's database) only when the session ends here
        ranks = _gathered(rt, (checkpoint.rng_state(), window,
                               meter.snapshot(rt.device, energy=final)))  # fmt: skip
        cost = accounting.add_session(state.cost, accounting.combine_ranks([r[2] for r in ranks]))
        optimizer = state.optimizer.state_dict()
        if state.pipe is not None:
            state.pipe.sync_params(state.model)
            optimizer = state.pipe.gather_optimizer_state(state.optimizer)
        if state.sharded:  # whole, keyed by name: resumable as this run was sharded
            optimizer = sharded.full_optimizer_state(state.model, state.optimizer)
        weights = whole_weights(state)
        if not rt.is_main:
            return
        checkpoint.save(self.last_path, {
            "model": weights, "optimizer": optimizer,
            "optimizer_format": sharded.OPTIMIZER_FORMAT if state.sharded else "torch",
            "scheduler": state.scheduler.state_dict(), "rng": [r[0] for r in ranks],
            "loss_window": [r[1] for r in ranks], "step": state.step, "epoch": state.epoch,
            "position": state.position, "best": state.best, "settings": asdict(self.s),
            "world_size": rt.world_size, "fingerprint": self.fingerprint, "cost": cost,
        })  # fmt: skip

    def export(self, state: TrainState, task: Task, meter: accounting.Session,
               log: MetricsLog) -> None:  # fmt: skip
        """model.pt (the best weights, the model's config, each rank's parameter digest) and
        metrics.jsonl beside it, the run's cost its last record; then mark the run complete."""
        rt = self.rt
        if state.pipe is not None:
            state.pipe.sync_params(state.model)
        # DDP keeps replicas identical; record each rank's digest so that is checkable (an FSDP
        # rank's: of the whole model gathered from the shards)
        weights = whole_weights(state)  # an FSDP run's gathered once: digest and model.pt
        ranks = _gathered(rt, (whole_digest(state, weights), meter.snapshot(rt.device)))
        if not rt.is_main:
            return
        cost = accounting.add_session(state.cost, accounting.combine_ranks([r[1] for r in ranks]))
        # an FSDP run's estimate is of its whole model (a sharded one cannot be copied to
        # the meta device): what DDP would need, which its peak is measured against
        whole = (state.whole_copy or task.build_model()) if state.sharded else state.model
        estimate = None if state.pipe is not None else task.memory_estimate(
            whole, rt.device.type == "cuda")  # fmt: skip
        # the run's cost as the log's last record, beside the numbers it bought
        log.write({"step": state.step, "cost": accounting.summary(cost, estimate)})
        best = checkpoint.load(self.best_path) or {"model": weights, "step": state.step}
        checkpoint.save(self.run_dir / "model.pt", {
            "model": best["model"], "best_step": best["step"], "best_score": state.best,
            "model_config": task.model_config(), "settings": asdict(self.s),
            "world_size": rt.world_size, "rank_param_digests": [r[0] for r in ranks],
        })  # fmt: skip
        with atomic_path(self.run_dir / "metrics.jsonl") as tmp:
            shutil.copyfile(self.ckpt_dir / "metrics.jsonl", tmp)
        write_json(self.ckpt_dir / identity.COMPLETE, {"step": state.step})
