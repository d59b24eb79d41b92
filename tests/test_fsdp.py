"""Fully sharded data parallelism (`train.data_parallel: fsdp`, torch's FSDP2) on 2 CPU processes
(gloo) beside DDP: a ParT and a U-Net follow the DDP run's losses on the same seed, their
model.pt is the whole model that evaluation reads, and a killed FSDP run resumes to the final
loss of one never interrupted."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import BIN, snakemake_env
from test_volumes import cases, toy_msd  # noqa: F401 (fixtures)

from voxjet.distributed.sharded import shard_units
from voxjet.errors import VoxjetError
from voxjet.training.logger import read_metrics

PART = {"name": "part", "dim": 16, "heads": 2, "blocks": 2, "class_blocks": 1, "pair_dim": 8,
        "dropout": 0.0}  # fmt: skip
TRAIN = {"steps": 24, "batch_size": 32, "lr": 3e-3, "warmup_steps": 4, "log_every": 4,
         "eval_every": 12, "checkpoint_every": 4, "seed": 5}  # fmt: skip
TWO = ["launch", "--gpus", "0", "--cpu-processes", "2", "--"]


def _run(cmd: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([str(BIN / "voxjet"), *cmd], env=snakemake_env(), capture_output=True,
                       text=True, timeout=timeout)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _jets(shards, out, data_parallel: str, steps: int = TRAIN["steps"]) -> list[str]:
    cfg = {"model": PART, "train": {**TRAIN, "steps": steps, "data_parallel": data_parallel}}
    return [*TWO, "train-jets", "--shards", str(shards), "--run-config", json.dumps(cfg),
            "--out", str(out)]  # fmt: skip


def _losses(run_dir) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r]


@pytest.mark.slow
def test_a_sharded_part_follows_ddp_and_is_evaluated_from_a_whole_model(shards, tmp_path):
    from voxjet.jets.evaluate import evaluate

    for dp in ("ddp", "fsdp"):
        _run(_jets(shards, tmp_path / dp, dp))
    ddp, fsdp = _losses(tmp_path / "ddp"), _losses(tmp_path / "fsdp")
    assert len(ddp) == len(fsdp) == 6
    assert fsdp[-1] == pytest.approx(ddp[-1], rel=0.02), (ddp, fsdp)
    whole = {k: v.shape for k, v in torch.load(tmp_path / "ddp" / "model.pt")["model"].items()}
    saved = torch.load(tmp_path / "fsdp" / "model.pt", weights_only=True)
    assert {k: v.shape for k, v in saved["model"].items()} == whole  # not a rank's shards
    assert saved["settings"]["data_parallel"] == "fsdp" and saved["world_size"] == 2
    assert len(set(saved["rank_param_digests"])) == 1
    last = torch.load(tmp_path / "fsdp" / "checkpoints" / "last.pt", weights_only=True)
    # the optimiser's state whole, by parameter name, counting the run's steps
    state = last["optimizer"]["state"]
    assert last["optimizer_format"] == "fqn-full" and "blocks.1.mlp.0.weight" in state
    assert int(state["blocks.1.mlp.0.weight"]["step"]) == TRAIN["steps"]
    metrics = evaluate(str(shards), str(tmp_path / "fsdp" / "model.pt"), str(tmp_path / "eval"))
    assert 0.5 < metrics["auc_macro"] <= 1


@pytest.mark.long
@pytest.mark.slow
def test_a_killed_fsdp_run_resumes_to_the_uninterrupted_runs_loss(shards, tmp_path):
    steps = 40
    _run(_jets(shards, tmp_path / "ref", "fsdp", steps))
    proc = subprocess.Popen([str(BIN / "voxjet"), *_jets(shards, tmp_path / "run", "fsdp", steps)],
                            env=snakemake_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if last.exists() and torch.load(last, weights_only=True)["step"] >= 8:
            break
        time.sleep(0.05)
    tree = [proc, *(psutil.Process(proc.pid).children(recursive=True))]
    for p in tree:  # as a node failure would: no process gets to checkpoint
        p.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "run" / "model.pt").exists(), "finished before it was killed"
    r = _run(_jets(shards, tmp_path / "run", "fsdp", steps))
    assert "resumed from" in r.stderr
    ref, run = _losses(tmp_path / "ref"), _losses(tmp_path / "run")
    assert run[-1] == pytest.approx(ref[-1], rel=1e-5), (ref, run)
    a = torch.load(tmp_path / "ref" / "model.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "run" / "model.pt", weights_only=True)["model"]
    differ = {k: float((a[k].float() - b[k].float()).abs().max()) for k in a
              if not torch.allclose(a[k].float(), b[k].float(), atol=1e-6,
                                    equal_nan=True)}  # fmt: skip
    assert not differ, differ


@pytest.mark.long
@pytest.mark.slow
def test_a_sharded_unet_follows_ddp_and_its_model_loads_whole(cases, tmp_path):  # noqa: F811
    from voxjet.volumes.networks.models import load_trained

    model = {"name": "unet", "channels": [8, 16, 32], "num_res_units": 1}
    train = {"steps": 12, "lr": 5e-3, "batch_size": 2, "log_every": 3, "eval_every": 12,
             "iterations_per_epoch": 6}  # fmt: skip
    for dp in ("ddp", "fsdp"):
        cfg = {"model": model, "train": {**train, "data_parallel": dp}}
        _run([*TWO, "train-seg", "--cases", str(cases), "--run-config", json.dumps(cfg),
              "--out", str(tmp_path / dp)])  # fmt: skip
    ddp, fsdp = _losses(tmp_path / "ddp"), _losses(tmp_path / "fsdp")
    assert fsdp[-1] == pytest.approx(ddp[-1], rel=0.02), (ddp, fsdp)
    net, _ = load_trained(tmp_path / "fsdp" / "model.pt")
    ref, _ = load_trained(tmp_path / "ddp" / "model.pt")
    assert [p.shape for p in net.parameters()] == [p.shape for p in ref.parameters()]


@pytest.mark.parametrize("model", [PART, {"name": "pfn", "phi_sizes": [8], "f_sizes": [8]}])
def test_the_blocks_sharded_are_a_transformers_blocks(shards, model):
    from voxjet.jets.train import JetTask
    from voxjet.training.task import TrainSettings

    net = JetTask(shards, model, TrainSettings()).build_model()
    units = shard_units(net)
    if model["name"] == "part":
        assert units == [*net.blocks, *net.cls_blocks]
    else:
        assert units == []  # a PFN's few layers: the whole model is one unit


def test_fsdp_with_pipeline_stages_is_refused_at_the_dry_run(demo_config):
    from voxjet.config import check_config

    exp = next(e for e in demo_config["experiments"].values() if e["model"]["name"] == "unet")
    exp["train"] = {**(exp.get("train") or {}), "pipeline_stages": 2, "data_parallel": "fsdp"}
    with pytest.raises(VoxjetError, match=r"data_parallel': fsdp with pipeline_stages 2"):
        check_config(demo_config)


def test_a_sweep_over_ddp_and_fsdp_plans_one_run_each(demo_config):
    from voxjet.config import check_config, expand_runs, fill_defaults

    exp = next(e for e in demo_config["experiments"].values() if e["model"]["name"] == "part")
    exp["sweep"] = {"train.data_parallel": ["ddp", "fsdp"]}
    check_config(demo_config)
    fill_defaults(demo_config)
    runs = [r for r in expand_runs(demo_config).values() if r.params.get("train.data_parallel")]
    assert sorted(r.params["train.data_parallel"] for r in runs) == ["ddp", "fsdp"]


def test_auto_trains_as_the_plan_chose_and_its_job_waits_for_the_plan(shards, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    from voxjet.config import fill_defaults
    from voxjet.training.task import settings_of
    from voxjet.workflow import paths
    from voxjet.workflow.graph import build

    monkeypatch.chdir(tmp_path)
    cfg = {"datasets": {"p": {"domain": "jets", "source": {"prepared": str(shards)}}},
           "experiments": {"part": {"dataset": "p", "model": PART,
                                    "launch": {"gpus": 0, "cpu_processes": 2},
                                    "train": {"data_parallel": "auto"}}}}  # fmt: skip
    g = build(cfg, fill_defaults)
    assert g.plan_for_auto("part") == [paths.RUN_PLAN]
    run_config = json.loads(g.run_config("part"))
    assert run_config["plan"] == paths.RUN_PLAN and run_config["run"] == "part"
    Path(paths.RUN_PLAN).parent.mkdir(parents=True)
    for scheme, want in (("fsdp", ("fsdp", 1)), ("ddp", ("ddp", 1)), ("pipeline", ("ddp", 2))):
        plan = {"runs": [{"run": "part", "parallelism": {
            "scheme": scheme, "options": [{"scheme": scheme, "processes": 2}]}}]}  # fmt: skip
        Path(paths.RUN_PLAN).write_text(json.dumps(plan))
        s = settings_of(run_config)
        assert (s.data_parallel, s.pipeline_stages) == want
    Path(paths.RUN_PLAN).write_text(json.dumps({"runs": []}))
    with pytest.raises(VoxjetError, match="has no choice for run part"):
        settings_of(run_config)
    # the planner's own profile (one process, no plan given) keeps `auto`
    assert settings_of({k: v for k, v in run_config.items() if k != "plan"}).data_parallel == "auto"
