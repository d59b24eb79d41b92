"""Validation on every rank: 2 gloo processes each score their half of the validation split
(many times a training batch), and the gathered metrics equal one process validating all."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch
from conftest import BIN, snakemake_env

from voxjet.distributed.runtime import init_runtime
from voxjet.jets.train import JetTask
from voxjet.training.task import TrainSettings


def test_two_ranks_validate_their_shares_to_the_single_process_metrics(shards, tmp_path):
    out = tmp_path / "val"
    r = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2",
         str(Path(__file__).parent / "validation_worker.py"), str(shards), str(out)],
        env=snakemake_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [torch.load(f"{out}.{k}", weights_only=False) for k in (0, 1)]
    task = JetTask(shards, {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]}, TrainSettings())
    torch.manual_seed(0)
    model = task.build_model()
    alone = task.validate(model, torch.device("cpu"), init_runtime("cpu"))
    total = len(task.validation_share(init_runtime("cpu")))
    # each rank scored half, ten and more times a training batch of 4: no rank waited
    assert [k["share"] for k in ranks] == [total // 2, total - total // 2]
    assert min(k["share"] for k in ranks) >= 10 * ranks[0]["batch"]
    assert ranks[0]["metrics"] == ranks[1]["metrics"] == alone
