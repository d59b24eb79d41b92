"""Training throughput (jets/s) of each jet tagger on this machine's CPU, with the share of
step time spent waiting for data, measured side by side in one run on the same toy shards.

    .venv/bin/python benchmarks/jets_training.py [--steps 60] [--batch 128] [--particles 48]

Target (issue 6): data-wait fraction <= 5% with the default loader settings.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from voxjet.distributed.runtime import init_runtime
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.jets.train import JetTask
from voxjet.stage.transfer import stage
from voxjet.training.logger import read_metrics
from voxjet.training.loop import train
from voxjet.training.task import TrainSettings

MODELS = {
    "pfn": {"name": "pfn", "phi_sizes": [64, 64, 64], "f_sizes": [64, 64]},
    "particlenet": {
        "name": "particlenet",
        "k": 8,
        "conv_channels": [[32, 32, 32], [64, 64, 64]],
        "fc_size": 128,
    },
    "part": {"name": "part", "dim": 64, "heads": 4, "blocks": 3, "class_blocks": 1, "pair_dim": 32},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--particles", type=int, default=48)
    a = ap.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        generate_dataset(
            d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=1500), progress=False
        )
        stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
        shard_jets(
            d / "m.json",
            d / "shards",
            JetDataConfig(max_particles=a.particles, jets_per_shard=2000),
        )
        rt = init_runtime("cpu")
        print(f"{'model':<12} {'params':>9} {'jets/s':>9} {'data wait':>10}")
        worst = 0.0
        for name, cfg in MODELS.items():
            s = TrainSettings(
                steps=a.steps, batch_size=a.batch, log_every=10, eval_every=0, checkpoint_every=0
            )
            task = JetTask(d / "shards", dict(cfg), s)
            n_params = sum(p.numel() for p in task.build_model().parameters())
            train(task, s, d / name, rt, rate_key="jets_per_s")
            lines = [r for r in read_metrics(d / name / "metrics.jsonl") if "loss" in r][1:]
            rate = sum(r["jets_per_s"] for r in lines) / len(lines)
            wait = sum(r["data_wait_fraction"] for r in lines) / len(lines)
            worst = max(worst, wait)
            print(f"{name:<12} {n_params:>9,} {rate:>9.0f} {100 * wait:>9.1f}%")
        print(
            f"largest data-wait fraction {100 * worst:.1f}% (target <= 5%): "
            f"{'PASS' if worst <= 0.05 else 'FAIL'}"
        )


if __name__ == "__main__":
    main()
