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


def test_the_device_feed_on_cuda_hands_over_what_the_plain_path_does():
    from voxjet.io.device_feed import DeviceFeed

    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(64, 128, 17, generator=g), "n": torch.arange(64),
                "source": torch.arange(64)} for _ in range(6)] + [None]  # fmt: skip
    dev = torch.device("cuda", 0)
    fed = list(DeviceFeed(dev, ("x", "n"))(batches))  # pinned, side stream, one ahead
    assert fed[-1] is None
    for plain, b in zip(batches[:-1], fed[:-1], strict=True):
        assert b["x"].device.type == "cuda" and b["source"].device.type == "cpu"
        assert torch.equal(b["x"].cpu(), plain["x"]) and torch.equal(b["n"].cpu(), plain["n"])


def test_device_augmentation_on_cuda_follows_the_cpus():
    import numpy as np

    from voxjet.volumes.training import augment as A

    g = A.AugmentGeometry(channels=1)
    params = {k[4:]: v for k, v in A.draw_batch((0, 0, 0, 0), 8, g).items()}
    params["noise"][:] = 0  # the CPU's and CUDA's generators draw different noise
    patch = np.array([32, 32, 16])
    big = A.cut_sizes({f"aug_{k}": v for k, v in params.items()}, patch)
    k = int(params["spatial"].sum())
    x = torch.randn(8, 1, *patch, generator=torch.Generator().manual_seed(1))
    lab = (x > 0).to(torch.uint8)
    cuts = (torch.randn(k, 1, *big), torch.randint(0, 2, (k, 1, *big), dtype=torch.uint8))
    cpu = (x.clone(), lab.clone())
    A.augment_batch(*cpu, params, cuts)
    gpu = (x.cuda(), lab.cuda())
    A.augment_batch(*gpu, params, tuple(c.cuda() for c in cuts))
    assert torch.allclose(gpu[0].cpu(), cpu[0], atol=1e-3)
    assert float((gpu[1].cpu() != cpu[1]).float().mean()) < 0.01
