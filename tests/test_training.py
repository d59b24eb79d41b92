"""Training through the shared loop: metrics written, loss falling, exact resume after a
preemption signal, 2-process DDP through torchrun (gloo), and segmentation training."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
import torch
from conftest import BIN, same_tensor, snakemake_env

from voxjet.distributed.checkpoint import PREEMPTED_EXIT_CODE
from voxjet.distributed.runtime import init_runtime
from voxjet.jets.train import JetTask, run
from voxjet.training.logger import read_metrics
from voxjet.training.loop import train
from voxjet.training.task import TrainSettings

MODEL = {"name": "pfn", "phi_sizes": [16, 16], "f_sizes": [16]}


def _settings(**kw) -> dict:
    base = {
        "steps": 40,
        "batch_size": 32,
        "lr": 3e-3,
        "warmup_steps": 4,
        "log_every": 5,
        "eval_every": 20,
        "checkpoint_every": 10,
        "seed": 3,
    }
    return {**base, **kw}


def test_training_writes_model_and_metrics_and_learns(shards, tmp_path):
    out = run(str(shards), {"model": MODEL, "train": _settings(steps=100, lr=1e-2)}, str(tmp_path))
    assert out["step"] == 100
    lines = read_metrics(tmp_path / "metrics.jsonl")
    steps = [r for r in lines if "loss" in r]
    vals = [r for r in lines if r.get("split") == "val"]
    assert [r["step"] for r in steps] == list(range(5, 101, 5))
    assert steps[-1]["loss"] < steps[0]["loss"] * 0.7
    assert all(0 <= r["data_wait_fraction"] <= 1 and r["jets_per_s"] > 0 for r in steps)
    assert [r["step"] for r in vals] == [20, 40, 60, 80, 100] and vals[-1]["auc_macro"] > 0.8
    saved = torch.load(tmp_path / "model.pt", weights_only=False)
    assert saved["best_score"] == max(r["score"] for r in vals)
    assert saved["model_config"]["classes"] == ["QCD", "Hbb", "Wqq", "Tbqq"]


class _SignalAt:
    """A task that sends this process SIGUSR1 during step `at` (a real signal)."""

    def __init__(self, task, at: int):
        self.task, self.at, self.n = task, at, 0

    def __getattr__(self, name):
        return getattr(self.task, name)

    def loss(self, model, batch, device):
        self.n += 1
        if self.n == self.at:
            os.kill(os.getpid(), signal.SIGUSR1)
        return self.task.loss(model, batch, device)


@pytest.mark.parametrize("workers", [0, 2])
def test_preempted_run_resumes_to_identical_weights(shards, tmp_path, workers):
    # with workers, batches come through the shared-memory hand-over while the loop's
    # read-ahead holds up to `prefetch` of them: a slab reused too early would change the data
    s = TrainSettings(**_settings(steps=30, loader_workers=workers, prefetch=4))
    rt = init_runtime("cpu")
    train(JetTask(shards, MODEL, s), s, tmp_path / "a", rt)
    with pytest.raises(SystemExit) as stop:
        train(_SignalAt(JetTask(shards, MODEL, s), at=13), s, tmp_path / "b", rt)
    assert stop.value.code == PREEMPTED_EXIT_CODE
    assert torch.load(tmp_path / "b" / "checkpoints" / "last.pt", weights_only=False)["step"] == 13
    assert not (tmp_path / "b" / "model.pt").exists()
    train(JetTask(shards, MODEL, s), s, tmp_path / "b", rt)
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=False)["model"]
    for k in a:
        assert same_tensor(a[k], b[k]), k
    la = [r for r in read_metrics(tmp_path / "a" / "metrics.jsonl") if "loss" in r]
    lb = [r for r in read_metrics(tmp_path / "b" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in la] == [r["step"] for r in lb]
    assert [r["loss"] for r in la][3:] == [r["loss"] for r in lb][3:]  # after the resume point
    # the cost covers both sessions of b; on this machine nothing measures energy, and says so
    cost_a, cost_b = (
        next(r["cost"] for r in read_metrics(tmp_path / x / "metrics.jsonl") if "cost" in r)
        for x in ("a", "b")
    )
    assert (cost_a["sessions"], cost_b["sessions"]) == (1, 2)
    assert cost_b["device_kind"] == "cpu_core" and cost_b["device_hours"] > 0
    assert cost_b["peak_memory_gib"] > 0.01 and 0 < cost_b["utilisation"] <= 1
    assert cost_b["energy_kwh"] is None and "no GPU, so no NVML" in cost_b["energy_missing"]


def test_two_process_ddp_through_torchrun(shards, tmp_path):
    cfg = {"model": MODEL, "train": _settings(steps=20, eval_every=10, checkpoint_every=10)}
    r = subprocess.run(
        _train_cmd(shards, tmp_path, cfg, launch=("--gpus", "0", "--cpu-processes", "2")),
        env=snakemake_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--nproc-per-node=2" in r.stderr
    ck = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert ck["world_size"] == 2 and len(ck["rng"]) == 2
    digests = torch.load(tmp_path / "model.pt", weights_only=True)["rank_param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]  # replicas identical after training
    losses = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in losses] == [5, 10, 15, 20]
    assert losses[-1]["loss"] < losses[0]["loss"]  # it learns with the averaged gradients
    cost = next(r["cost"] for r in read_metrics(tmp_path / "metrics.jsonl") if "cost" in r)
    assert cost["devices"] % 2 == 0 and cost["device_hours"] > cost["wall_h"]  # both ranks'
    # a forced rerun (Snakemake removed the outputs): both ranks agree to start afresh (one
    # that looked after rank 0 moved the checkpoints aside used to hang the other)
    (tmp_path / "model.pt").unlink()
    r = subprocess.run(
        _train_cmd(shards, tmp_path, cfg, launch=("--gpus", "0", "--cpu-processes", "2")),
        env=snakemake_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not resumed, the run completed and its outputs were removed" in r.stderr


def test_checkpoint_of_another_configuration_is_not_resumed(shards, tmp_path):
    rt = init_runtime("cpu")
    s = TrainSettings(**_settings(steps=20))
    train(JetTask(shards, MODEL, s), s, tmp_path, rt)
    changed = TrainSettings(**_settings(steps=20, lr=1e-2))
    train(JetTask(shards, MODEL, changed), changed, tmp_path, rt)
    fresh = TrainSettings(**_settings(steps=20, lr=1e-2))
    train(JetTask(shards, MODEL, fresh), fresh, tmp_path / "ref", rt)
    a = torch.load(tmp_path / "model.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "ref" / "model.pt", weights_only=False)["model"]
    assert all(same_tensor(a[k], b[k]) for k in a)
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert steps == [5, 10, 15, 20]


def _train_cmd(shards, out, cfg, launch: tuple[str, ...] | None = None):
    """`voxjet train-jets ...`, or through `voxjet launch LAUNCH -- train-jets ...`."""
    train = [
        "train-jets",
        "--shards",
        str(shards),
        "--run-config",
        json.dumps(cfg),
        "--out",
        str(out),
    ]
    return [str(BIN / "voxjet"), *(["launch", *launch, "--"] if launch is not None else []), *train]


def test_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(shards, tmp_path):
    """A real SIGKILL (no chance to checkpoint): the rerun continues from the last periodic
    checkpoint and ends where a run that was never interrupted ends."""
    import time

    cfg = {"model": MODEL, "train": _settings(steps=150, checkpoint_every=10, eval_every=50)}
    env = snakemake_env()
    ref = subprocess.run(
        _train_cmd(shards, tmp_path / "ref", cfg), env=env, capture_output=True, timeout=600
    )
    assert ref.returncode == 0, ref.stderr[-2000:]
    proc = subprocess.Popen(
        _train_cmd(shards, tmp_path / "run", cfg),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    deadline = time.time() + 300
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.kill()
    assert proc.wait() == -signal.SIGKILL, "training finished before it could be killed"
    assert not (tmp_path / "run" / "model.pt").exists()
    done = subprocess.run(
        _train_cmd(shards, tmp_path / "run", cfg),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "resumed from" in done.stderr
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert all(same_tensor(a["model"][k], b["model"][k]) for k in a["model"])
    la = read_metrics(tmp_path / "ref" / "metrics.jsonl")
    lb = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in la] == [r["step"] for r in lb]
    assert [r["loss"] for r in la if "loss" in r][-5:] == [r["loss"] for r in lb if "loss" in r][
        -5:
    ]


class _NanAt(_SignalAt):
    def loss(self, model, batch, device):
        self.n += 1
        loss, n = self.task.loss(model, batch, device)
        return (loss * float("nan") if self.n == self.at else loss), n


def test_nan_loss_stops_naming_step_and_batch_source(shards, tmp_path):
    from voxjet.errors import VoxjetError

    s = TrainSettings(**_settings(steps=20))
    with pytest.raises(
        VoxjetError, match=r"non-finite loss .* at step 3 .*part_0000/train_000\.h5"
    ):
        train(_NanAt(JetTask(shards, MODEL, s), at=3), s, tmp_path, init_runtime("cpu"))
    assert not (tmp_path / "model.pt").exists()


def test_evaluation_refuses_foreign_or_broken_checkpoints(shards, tmp_path):
    from voxjet.errors import VoxjetError
    from voxjet.jets.evaluate import evaluate

    run(str(shards), {"model": MODEL, "train": _settings(steps=10)}, str(tmp_path / "ok"))
    saved = torch.load(tmp_path / "ok" / "model.pt", weights_only=True)
    saved.pop("_sha256")  # models of another run, saved without voxjet's digest
    saved["model_config"]["classes"] = ["QCD", "Zqq"]
    torch.save(saved, tmp_path / "other.pt")
    with pytest.raises(VoxjetError, match=r"other\.pt: trained for classes \['QCD', 'Zqq'\]"):
        evaluate(str(shards), str(tmp_path / "other.pt"), str(tmp_path / "e1"))
    saved = torch.load(tmp_path / "ok" / "model.pt", weights_only=True)
    saved.pop("_sha256")
    saved["model_config"]["phi_sizes"] = [8, 8]
    torch.save(saved, tmp_path / "arch.pt")
    with pytest.raises(VoxjetError, match=r"arch\.pt: weights do not fit"):
        evaluate(str(shards), str(tmp_path / "arch.pt"), str(tmp_path / "e2"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(VoxjetError, match=r"junk\.pt: not a readable voxjet checkpoint"):
        evaluate(str(shards), str(tmp_path / "junk.pt"), str(tmp_path / "e3"))
    assert not (tmp_path / "e1" / "metrics.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_preemption_signal_to_the_launcher_checkpoints_and_exits_124(shards, tmp_path, sig):
    """SLURM's warning (SIGUSR1) or SIGTERM reaches the training process through voxjet launch
    and torchrun; the job stops with a checkpoint and code 124."""
    import time

    cfg = {
        "model": MODEL,
        "train": _settings(steps=100000, checkpoint_every=100000, eval_every=100000),
    }
    cmd = _train_cmd(shards, tmp_path, cfg, launch=("--gpus", "0"))
    proc = subprocess.Popen(
        cmd, env=snakemake_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    last = tmp_path / "checkpoints" / "last.pt"
    deadline = time.time() + 300
    while not last.exists() and time.time() < deadline:  # the first epoch's checkpoint
        time.sleep(0.05)
    first = torch.load(last, weights_only=True)["step"]
    time.sleep(1.0)
    if sig == signal.SIGUSR1:  # as `sbatch --signal=USR1@T`: every process of the job gets it
        _signal_tree(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-2000:]
    assert "preempted by signal" in err
    assert torch.load(last, weights_only=True)["step"] > first  # saved on the signal
    assert not (tmp_path / "model.pt").exists()


def _signal_tree(pid: int, sig: int) -> None:
    """Send `sig` to a process and all its descendants (what SLURM does to a job step)."""
    import psutil

    parent = psutil.Process(pid)
    for p in [parent, *parent.children(recursive=True)]:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def test_step_timer_counts_only_the_wait_for_a_batch_as_data_wait(monkeypatch):
    """Validation and checkpoints between steps are wall time, not data wait."""
    import voxjet.training.logger as logger

    clock = [0.0]
    monkeypatch.setattr(logger.time, "perf_counter", lambda: clock[0])
    timer = logger.StepTimer()
    for wait, step, other in ((1.0, 3.0, 0.0), (0.0, 3.0, 10.0), (1.0, 2.0, 0.0)):
        clock[0] += wait
        timer.data_ready()
        clock[0] += step
        timer.step_done(4)
        clock[0] += other  # a checkpoint after the second step
        timer.other_done()
    summary = timer.summary()
    assert summary["data_wait_fraction"] == pytest.approx(2.0 / 20.0)
    assert summary["items_per_s"] == pytest.approx(12 / 20.0)
