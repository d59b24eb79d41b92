"""A run grows with its user: raising `steps` continues it (ending as a run trained straight to
the new length), logging intervals change freely, a changed trajectory setting moves the old
checkpoints aside, a forced rerun of a completed run starts afresh; TensorBoard and MLflow get
the numbers metrics.jsonl has; logs are plain lines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BIN, same_tensor, snakemake_env

from voxjet.distributed.runtime import init_runtime
from voxjet.jets.train import JetTask
from voxjet.training.logger import read_metrics
from voxjet.training.loop import train
from voxjet.training.task import TrainSettings

MODEL = {"name": "pfn", "phi_sizes": [16, 16], "f_sizes": [16]}
BASE = {"batch_size": 32, "lr": 3e-3, "warmup_steps": 4, "log_every": 5, "eval_every": 10,
        "checkpoint_every": 10, "seed": 3, "schedule_steps": 40}  # fmt: skip


def _train(shards, out: Path, **kw) -> dict:
    s = TrainSettings(**{**BASE, **kw})
    return train(JetTask(shards, MODEL, s), s, out, init_runtime("cpu"))


def _weights(path: Path) -> dict:
    return torch.load(path, weights_only=True)["model"]


def test_raising_steps_continues_to_the_straight_runs_weights(shards, tmp_path, capfd):
    _train(shards, tmp_path / "straight", steps=40)
    _train(shards, tmp_path / "grown", steps=20)
    capfd.readouterr()
    _train(shards, tmp_path / "grown", steps=40, log_every=10)  # and a new log interval
    assert "last.pt at step 20" in capfd.readouterr().err
    a = _weights(tmp_path / "straight" / "checkpoints" / "last.pt")
    b = _weights(tmp_path / "grown" / "checkpoints" / "last.pt")
    assert all(same_tensor(a[k], b[k]) for k in a)
    steps = [r["step"] for r in read_metrics(tmp_path / "grown" / "metrics.jsonl") if "loss" in r]
    assert steps == [5, 10, 15, 20, 30, 40]  # the old interval, then the new one
    assert not list(tmp_path.glob("grown/checkpoints.refused-*"))


def test_a_changed_setting_moves_the_checkpoint_aside_and_restarts(shards, tmp_path, capfd):
    _train(shards, tmp_path, steps=20)
    capfd.readouterr()
    _train(shards, tmp_path, steps=20, lr=1e-2)
    err = capfd.readouterr().err
    assert "not resumed, it belongs to a different run configuration" in err
    (aside,) = tmp_path.glob("checkpoints.refused-*")
    assert torch.load(aside / "last.pt", weights_only=True)["step"] == 20  # kept, not deleted
    _train(shards, tmp_path / "ref", steps=20, lr=1e-2)
    a, b = _weights(tmp_path / "model.pt"), _weights(tmp_path / "ref" / "model.pt")
    assert all(same_tensor(a[k], b[k]) for k in a)


def test_forced_rerun_of_a_completed_run_trains_afresh(shards, tmp_path, capfd):
    _train(shards, tmp_path, steps=20)
    (tmp_path / "model.pt").unlink()  # what Snakemake does before rerunning a job (-R, --forcerun)
    capfd.readouterr()
    _train(shards, tmp_path, steps=20)
    err = capfd.readouterr().err
    assert "a forced rerun trains afresh" in err and "resumed from" not in err
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert steps == [5, 10, 15, 20]


def test_tensorboard_and_mlflow_get_the_logged_numbers(shards, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store: no server needed
    s = TrainSettings(**{**BASE, "steps": 20})
    task = JetTask(shards, MODEL, s)
    task.experiment = "pfn"
    train(task, s, tmp_path / "run", init_runtime("cpu"), rate_key="jets_per_s")
    logged = read_metrics(tmp_path / "run" / "metrics.jsonl")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert loss == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in logged if "loss" in r]
    val = [(e.step, e.value) for e in events.Scalars("val/auc_macro")]
    assert val == [(r["step"], pytest.approx(r["auc_macro"], rel=1e-6)) for r in logged
                   if r.get("split") == "val"]  # fmt: skip
    import mlflow

    runs = mlflow.search_runs(experiment_names=["pfn"])
    assert list(runs["tags.mlflow.runName"]) == ["run"]
    hist = mlflow.tracking.MlflowClient().get_metric_history(runs["run_id"][0], "train_loss")
    assert [(m.step, m.value) for m in hist] == [
        (r["step"], pytest.approx(r["loss"], rel=1e-9)) for r in logged if "loss" in r
    ]


def test_training_log_is_plain_lines(shards, tmp_path):
    cfg = {"model": MODEL, "train": {**BASE, "steps": 20}}
    log = tmp_path / "train.log"
    with open(log, "w") as f:
        cmd = [str(BIN / "voxjet"), "train-jets", "--shards", str(shards), "--run-config",
               json.dumps(cfg), "--out", str(tmp_path / "run")]  # fmt: skip
        assert subprocess.run(cmd, env=snakemake_env(), stderr=f).returncode == 0
    text = log.read_text()
    assert "\r" not in text
    assert "train run: 20/20 step" in text  # the final progress line
