"""Run under torchrun by test_distributed_validation.py: every rank validates its share of the
validation jets with the same model; each saves what it scored and the metrics it got."""

from __future__ import annotations

import sys

import torch

from voxjet.distributed.runtime import init_runtime, shutdown
from voxjet.jets.train import JetTask
from voxjet.training.task import TrainSettings


def main(shards: str, out: str) -> None:
    rt = init_runtime("cpu")
    s = TrainSettings(batch_size=4)
    task = JetTask(shards, {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]}, s)
    torch.manual_seed(0)
    model = task.build_model()
    metrics = task.validate(model, rt.device, rt)
    share = len(task.validation_share(rt))
    torch.save({"metrics": metrics, "share": share, "batch": s.batch_size}, f"{out}.{rt.rank}")
    shutdown(rt)


if __name__ == "__main__":
    main(*sys.argv[1:])
