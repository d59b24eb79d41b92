"""On a CUDA machine: the same code paths as on the CPU (padding on the device, a training job
through `voxjet launch --gpus 1`). Skipped, saying so, where torch sees no GPU."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from conftest import BIN, snakemake_env

from voxjet.jets.jagged import pad_particles

pytestmark = pytest.mark.gpu


def test_padding_on_the_gpu_equals_the_cpus():
    counts = torch.tensor([3, 0, 5, 1])
    flat = torch.randn(int(counts.sum()), 4)
    cpu = pad_particles(flat, counts, 6)
    gpu = pad_particles(flat.cuda(), counts.cuda(), 6)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu, strict=True))


def test_training_job_asking_for_one_gpu_trains_on_it(shards, tmp_path):
    cfg = {
        "model": {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]},
        "train": {"steps": 10, "eval_every": 5, "batch_size": 32},
    }
    cmd = [str(BIN / "voxjet"), "launch", "--gpus", "1", "--threads", "2", "--",
           "train-jets", "--shards", str(shards), "--run-config", json.dumps(cfg),
           "--out", str(tmp_path / "run")]  # fmt: skip
    r = subprocess.run(cmd, env=snakemake_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 process(es) a node on cuda" in r.stderr
    assert (tmp_path / "run" / "model.pt").is_file()
