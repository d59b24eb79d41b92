"""Segmentation quality with the blosc2 case store (16-bit fixed point) against the mapped
one (float32): the demo's toy CT dataset preprocessed both ways and the demo's `unet`
experiment trained on each, for several training seeds, test Dice compared.

Two measurements, as training is chaotic (a change of 2^-11 σ in the inputs is enough to send
two runs of the same seed apart, as any other change of that size would):
1. the store's own effect: each model trained on the mapped cases, evaluated on the mapped and
   on the blosc2 cases (the same model, the inputs 2^-11 σ apart). Target: |ΔDice| <= 0.005.
2. training on each store: mean test Dice over the seeds, the paired difference, and the spread
   across seeds on the mapped store (what a difference must exceed to mean anything).

    .venv/bin/python benchmarks/store_quality.py [--seeds 3] [--steps 1500]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def demo_settings() -> tuple[dict, dict, dict]:
    """(synthetic source, volumes section, run config) of the demo's toy_ct and unet."""
    cfg = yaml.safe_load((ROOT / "config" / "demo-full.yaml").read_text())
    ds = cfg["datasets"]["toy_ct"]
    exp = cfg["experiments"]["unet"]
    return ds["source"]["synthetic"], ds["volumes"], {"model": exp["model"], "train": exp["train"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=3, help="training seeds (train.seed 0..N-1)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (the demo's: 1500)")
    ap.add_argument("--cases", type=int, default=None, help="training cases (the demo's: 16)")
    a = ap.parse_args()

    import numpy as np
    import torch

    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset
    from voxjet.volumes.training.train import run

    torch.set_num_threads(2)
    synth, volumes, run_cfg = demo_settings()
    if a.steps:
        run_cfg["train"]["steps"] = a.steps
        run_cfg["train"]["eval_every"] = min(run_cfg["train"]["eval_every"], a.steps)
    if a.cases:
        synth["train_cases"] = a.cases
    stores = ("mapped", "blosc2")
    trained = {s: [] for s in stores}  # test Dice of the model trained on each store
    crossed = []  # the mapped-trained model on the blosc2 cases
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        msd = generate_dataset(d / "msd", ToyVolumesConfig(**synth), progress=False)
        (d / "m.json").write_text(json.dumps({"root": str(msd), "files": []}))
        for store in stores:
            prep = VolumePrepConfig(**volumes, storage=store)
            preprocess_dataset(d / "m.json", d / store / "cases", prep)
        for seed in range(a.seeds):
            cfg = json.loads(json.dumps(run_cfg))
            cfg["train"]["seed"] = seed
            for store in stores:
                out = d / store / f"seed{seed}"
                t = time.perf_counter()
                run(str(d / store / "cases"), cfg, str(out / "run"))
                m = evaluate(str(d / store / "cases"), str(out / "run" / "model.pt"),
                             str(out / "eval"))  # fmt: skip
                trained[store].append(m["dice_mean"])
                print(f"seed {seed}, trained on {store}: test Dice {m['dice_mean']:.4f} "
                      f"({time.perf_counter() - t:.0f} s)", flush=True)  # fmt: skip
            model = d / "mapped" / f"seed{seed}" / "run" / "model.pt"
            m = evaluate(str(d / "blosc2" / "cases"), str(model), str(d / f"cross{seed}"))
            crossed.append(m["dice_mean"])
            print(f"seed {seed}, trained on mapped, evaluated on blosc2 cases: test Dice "
                  f"{m['dice_mean']:.4f}", flush=True)  # fmt: skip
    mapped, packed = np.array(trained["mapped"]), np.array(trained["blosc2"])
    own = float(np.abs(np.array(crossed) - mapped).max())
    verdict = "PASS" if own <= 0.005 else "FAIL"
    print(f"{'test Dice, one model: |blosc2 cases - mapped cases| (largest over seeds)':<78} "
          f"{own:7.4f} (target <= 0.005) {verdict}")  # fmt: skip
    diff = packed - mapped
    print(f"trained on each: mean test Dice mapped {mapped.mean():.4f}, blosc2 "
          f"{packed.mean():.4f}; paired difference {diff.mean():+.4f} (sd "
          f"{diff.std(ddof=1):.4f} over {a.seeds} seeds); seed-to-seed sd on mapped "
          f"{mapped.std(ddof=1):.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
