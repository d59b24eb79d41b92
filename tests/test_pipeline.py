"""The U-Net cut into pipeline stages: the cut reproduces the network, and a 2-stage pipeline
over torchrun (gloo, 2 processes; 4 for pipeline × data parallel) computes the gradients and
loss curve of single-process training."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BIN, snakemake_env
from monai.losses import DiceCELoss
from pipeline_worker import problem

from voxjet.distributed.pipeline import bubble_fraction
from voxjet.errors import VoxjetError
from voxjet.volumes.networks.models import build_unet
from voxjet.volumes.networks.unet_stages import balanced_cuts, op_costs, split_network, unet_ops


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_stages_chained_are_the_unet(k):
    torch.manual_seed(0)
    unet = build_unet(2, 3, [4, 8, 16, 32], num_res_units=1)
    stages = split_network(unet, k, 2, [32, 32, 16])
    x = torch.randn(2, 2, 32, 32, 16)
    out = x
    for s in stages:
        out = s(*out) if isinstance(out, tuple) else s(out)
    assert torch.equal(out, unet(x))
    # every parameter belongs to exactly one stage, and they are the U-Net's own tensors
    ids = [id(p) for s in stages for p in s.parameters()]
    assert sorted(ids) == sorted(id(p) for p in unet.parameters())


def test_cuts_balance_activation_memory():
    costs = [5.0, 1.0, 1.0, 1.0, 2.0, 6.0]
    assert balanced_cuts(costs, 2) == [0, 4, 6]  # 8 and 8
    assert balanced_cuts(costs, 3) == [0, 1, 5, 6]  # 5, 5 and 6
    assert balanced_cuts(costs, 1) == [0, 6]
    with pytest.raises(VoxjetError, match="7 pipeline stages"):
        balanced_cuts(costs, 7)
    unet = build_unet(1, 2, [8, 16, 32], num_res_units=1)
    c = op_costs(unet_ops(unet), 1, [32, 32, 32])
    assert len(c) == 5 and c[0] == 4 * c[1]  # a level down halves each axis, doubles channels
    assert bubble_fraction(2, 4) == pytest.approx(0.2)


def _reference(batch: int, steps: int):
    model, x, y = problem(batch)
    _reference.model = model
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, grads = [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(float(loss.detach()))
    return grads, losses


@pytest.mark.parametrize(
    "schedule,procs,microbatches", [("gpipe", 2, 4), ("1f1b", 2, 2), ("1f1b", 4, 2)]
)
def test_pipeline_matches_single_process_training(tmp_path, schedule, procs, microbatches):
    """2 stages (and with 4 processes, 2 pipelines × 2 data-parallel replicas): the gradients
    of the first step (each stage's, reduced over its replicas only), the loss of every step
    and the final weights (synchronised from the stages) equal single-process training's."""
    stages, batch, steps = 2, 4, 5
    out = tmp_path / "pp.pt"
    r = subprocess.run(
        [
            str(BIN / "torchrun"),
            "--standalone",
            f"--nproc-per-node={procs}",
            str(Path(__file__).parent / "pipeline_worker.py"),
            str(out),
            schedule,
            str(stages),
            str(microbatches),
            str(steps),
            str(batch),
        ],
        env=snakemake_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    got = torch.load(out, weights_only=True)
    stage_grads = [torch.load(f"{out}.grads-{k}", weights_only=True) for k in range(stages)]
    assert not set(stage_grads[0]) & set(stage_grads[1])  # a stage holds only its own
    got_grads = {n: g for part in stage_grads for n, g in part.items()}
    grads, losses = _reference(batch * got["dp"], steps)
    assert set(got_grads) == set(grads)
    for name, g in grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert got["losses"] == pytest.approx(losses, rel=1e-4)
    assert losses[-1] < losses[0]
    for name, w in _reference.model.state_dict().items():
        torch.testing.assert_close(got["weights"][name], w, rtol=1e-4, atol=1e-5, msg=name)
