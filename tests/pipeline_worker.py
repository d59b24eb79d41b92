"""Run under torchrun by test_pipeline.py: a U-Net trained a few SGD steps through
PipelineParallel; the ranks of the first pipeline save their stage's first-step gradients, and
rank 0 every step's loss and the final weights (after sync_params)."""

from __future__ import annotations

import sys

import torch
from monai.losses import DiceCELoss

from voxjet.distributed.pipeline import PipelineConfig, PipelineParallel
from voxjet.distributed.runtime import init_runtime, shutdown
from voxjet.volumes.networks.models import build_unet
from voxjet.volumes.networks.unet_stages import split_network

PATCH = [16, 16, 16]


def problem(total_batch: int):
    """The model and data both sides use (same seeds)."""
    torch.manual_seed(0)
    model = build_unet(1, 3, [4, 8, 16], num_res_units=1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(total_batch, 1, *PATCH, generator=g)
    y = torch.randint(0, 3, (total_batch, 1, *PATCH), generator=g)
    return model, x, y


def main(out: str, schedule: str, stages: int, microbatches: int, steps: int, batch: int) -> None:
    rt = init_runtime()
    dp = rt.world_size // stages
    model, x, y = problem(batch * dp)
    cfg = PipelineConfig(stages=stages, microbatches=microbatches, schedule=schedule)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    pp = PipelineParallel(split_network(model, stages, 1, PATCH), cfg, rt, loss_fn)
    rows = slice(pp.dp_rank * batch, (pp.dp_rank + 1) * batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, grads = [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = pp.step(x[rows], y[rows])
        pp.reduce_grads(model.parameters())
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(float(loss))
    pp.sync_params(model)
    if pp.dp_rank == 0:
        torch.save(grads, f"{out}.grads-{pp.pp_rank}")
    if rt.is_main:
        torch.save({"losses": losses, "dp": dp, "weights": model.state_dict()}, out)
    shutdown(rt)


if __name__ == "__main__":
    out, schedule, *nums = sys.argv[1:]
    main(out, schedule, *map(int, nums))
