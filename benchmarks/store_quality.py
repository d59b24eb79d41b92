"""Segmentation quality with the blosc2 case store (16-bit fixed point) against the mapped
one (float32): the demo's toy CT dataset preprocessed both ways, the demo's `unet` experiment
trained on each with the same seeds and settings, test Dice compared. Target: |ΔDice| <= 0.005
(mean over classes and test cases).

    .venv/bin/python benchmarks/store_quality.py [--steps 1500]

The two runs differ in nothing but the stored image (at most 2^-11 of a standard deviation a
voxel), so the difference measured is what the store does to training and inference."""

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
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    ds = cfg["datasets"]["toy_ct"]
    exp = cfg["experiments"]["unet"]
    return ds["source"]["synthetic"], ds["volumes"], {"model": exp["model"], "train": exp["train"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=None, help="training steps (the demo's: 1500)")
    a = ap.parse_args()

    import torch

    from voxjet.volumes.evaluate import evaluate
    from voxjet.volumes.preprocess import VolumePrepConfig, preprocess_dataset
    from voxjet.volumes.synth import ToyVolumesConfig, generate_dataset
    from voxjet.volumes.train import run

    torch.set_num_threads(2)
    synth, volumes, run_cfg = demo_settings()
    if a.steps:
        run_cfg["train"]["steps"] = a.steps
    dice = {}
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        msd = generate_dataset(d / "msd", ToyVolumesConfig(**synth), progress=False)
        (d / "m.json").write_text(json.dumps({"root": str(msd), "files": []}))
        for store in ("mapped", "blosc2"):
            prep = VolumePrepConfig(**volumes, storage=store)
            preprocess_dataset(d / "m.json", d / store / "cases", prep)
            t = time.perf_counter()
            run(str(d / store / "cases"), json.loads(json.dumps(run_cfg)), str(d / store / "run"))
            m = evaluate(str(d / store / "cases"), str(d / store / "run" / "model.pt"),
                         str(d / store / "eval"))  # fmt: skip
            dice[store] = m
            per_class = {k: round(v["dice"], 4) for k, v in m["per_class"].items()}
            print(f"{store}: test Dice {m['dice_mean']:.4f} ({per_class}), {m['n_cases']} "
                  f"cases, trained and evaluated in {time.perf_counter() - t:.0f} s")  # fmt: skip
    delta = abs(dice["blosc2"]["dice_mean"] - dice["mapped"]["dice_mean"])
    verdict = "PASS" if delta <= 0.005 else "FAIL"
    print(f"{'test Dice |blosc2 - mapped|':<78} {delta:7.4f} (target <= 0.005) {verdict}")


if __name__ == "__main__":
    main()
