"""Segmentation augmentation per core, measured side by side in one run on the same synthetic
CT cases, everything on one thread (patches/s a core):

1. `train.augment_on: device` run on the CPU — the loader cuts the patches (larger where
   turned or scaled) and voxjet.volumes.training.augment applies nnU-Net's recipe to the whole batch
   with tensor ops — ÷ `augment_on: loader`, MONAI's transforms patch by patch in the loader.
   Target >= 2.
2. the same ÷ nnU-Net 2.8.1's training pipeline (nnUNetDataLoader with its training
   transforms, batchgeneratorsv2), the `bench` extra. Target >= 3.
3. the share of the device path's time each transform takes (the cost a GPU takes over).

    .venv-bench/bin/python benchmarks/augment.py [--cases 6] [--shape 192 192 96] \\
        [--patch 128 128 64] [--batch 2] [--batches 30]

Without nnU-Net installed its row says so and is left out.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _sampler(cases: Path, ids: list[str], patch: list[int], batch: int, on: str):
    from voxjet.volumes.preprocessing.store import CaseStore
    from voxjet.volumes.training.patches import PatchSampler

    spacing = json.loads((cases / "plan.json").read_text()).get("target_spacing")
    store = CaseStore(cases, ids)
    return PatchSampler(store, patch, batch, 1 / 3, seed=0, augment=True, spacing=spacing,
                        augment_on=on)  # fmt: skip


def loader_rate(cases: Path, ids: list[str], patch: list[int], batch: int, n: int) -> float:
    """Patches/s with MONAI's transforms in the loader (what a loader worker does)."""
    sampler = _sampler(cases, ids, patch, batch, "loader")
    sampler.batch(0, 0, 0)
    t = time.perf_counter()
    for i in range(n):
        sampler.batch(0, 0, i + 1)
    return n * batch / (time.perf_counter() - t)


def device_rate(cases: Path, ids: list[str], patch: list[int], batch: int,
                n: int) -> tuple[float, float]:  # fmt: skip
    """(patches/s cutting and augmenting on the CPU as the device would, the cutting's share)."""
    from voxjet.volumes.training.augment import augment_batch, params_of

    sampler = _sampler(cases, ids, patch, batch, "device")
    cut = aug = 0.0
    for i in range(n + 1):
        t0 = time.perf_counter()
        b = sampler.batch(0, 0, i)
        t1 = time.perf_counter()
        augment_batch(b["image"], b["label"], params_of(b), (b["big_image"], b["big_label"]))
        if i:  # the first batch warms up
            cut, aug = cut + t1 - t0, aug + time.perf_counter() - t1
    return n * batch / (cut + aug), cut / (cut + aug)


def transform_costs(patch: list[int], channels: int = 1, reps: int = 3) -> dict[str, float]:
    """Milliseconds a patch each transform takes when applied, times its probability: where
    the device path's time goes."""
    import torch

    from voxjet.volumes.training import augment as A

    p = np.array(patch)
    big = A.cut_size(np.full(3, 0.3), 1.1, p)
    img = torch.randn(1, channels, *p)
    lbl = torch.zeros(1, 1, *p, dtype=torch.uint8)
    bigs = (torch.randn(1, channels, *big), torch.zeros(1, 1, *big, dtype=torch.uint8))
    neutral = {"spatial": np.zeros(1, bool), "angles": np.zeros((1, 3)), "scale": np.ones(1),
               "noise": np.zeros(1), "noise_seed": np.zeros(1, np.int64),
               "blur": np.zeros((1, channels, 3)), "brightness": np.ones((1, channels)),
               "contrast": np.ones((1, channels)), "lowres": np.ones((1, channels)),
               "gamma_inverted": np.ones((1, channels)), "gamma": np.ones((1, channels)),
               "mirror": np.zeros((1, 3), bool), "coarse_axis": np.full(1, -1)}  # fmt: skip
    one = np.ones((1, channels))
    cases = {
        "rotation/scaling": ({"spatial": np.ones(1, bool), "angles": np.full((1, 3), 0.3),
                              "scale": np.full(1, 1.1)}, 1 - (1 - A.P_ROTATE) * (1 - A.P_SCALE)),
        "noise": ({"noise": np.full(1, 0.05)}, A.P_NOISE),
        "blur": ({"blur": np.full((1, channels, 3), 0.75)}, A.P_BLUR * A.P_BLUR_CHANNEL),
        "brightness": ({"brightness": one * 1.1}, A.P_BRIGHTNESS),
        "contrast": ({"contrast": one * 1.1}, A.P_CONTRAST),
        "low resolution": ({"lowres": one * 0.7}, A.P_LOWRES * A.P_LOWRES_CHANNEL),
        "gamma (both)": ({"gamma": one * 1.2}, A.P_GAMMA + A.P_GAMMA_INVERTED),
    }  # fmt: skip
    out = {}
    for name, (change, prob) in cases.items():
        params = {**neutral, **change}
        A.augment_batch(img, lbl, params, bigs)
        t = time.perf_counter()
        for _ in range(reps):
            A.augment_batch(img, lbl, params, bigs)
        out[name] = 1000 * (time.perf_counter() - t) / reps * prob
    return out


def _row(name: str, ratio: float, target: float, detail: str) -> None:
    print(f"{name}: {ratio:.2f} (target >= {target}; {'met' if ratio >= target else 'NOT met'})"
          f" — {detail}")  # fmt: skip


def main() -> None:
    sys.path.insert(0, str(HERE))
    import nnunet_peer
    import torch
    from volumes_io import bench_preprocess, case_arguments

    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset

    a = case_arguments(__doc__)
    torch.set_num_threads(1)  # per core: nnU-Net's loaders run under threadpool_limits(1)
    peer = nnunet_peer.available()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        cfg = ToyVolumesConfig(train_cases=a.cases, test_cases=0, min_shape=tuple(a.shape),
                               max_shape=tuple(a.shape))  # fmt: skip
        msd = generate_dataset(d / "msd", cfg, progress=False)
        spacing = nn = None
        if peer:
            nn = nnunet_peer.plan_and_preprocess(msd, d / "nnunet", a.patch)
            spacing = list(reversed(nn["plans"]["configurations"]["3d_fullres"]["spacing"]))
        bench_preprocess(msd, d / "cases", a.patch, spacing)
        cases = d / "cases"
        ids = sorted(p.stem for p in cases.glob("*.h5"))
        print(f"cases {a.cases} of {a.shape}, patch {a.patch}, batch {a.batch}, "
              f"{a.batches} batches a side, one thread")  # fmt: skip
        # alternated, three times each, medians compared: the machine's load drifts over a run
        loader, device, cut = [], [], []
        for _ in range(3):
            loader.append(loader_rate(cases, ids, a.patch, a.batch, a.batches))
            rate, share = device_rate(cases, ids, a.patch, a.batch, a.batches)
            device.append(rate)
            cut.append(share)
        theirs = None
        if peer:
            theirs = nnunet_peer.loader_rate(nn, a.patch, a.batch, a.batches, True, d / "nnunet")[0]
    ours, base = float(np.median(device)), float(np.median(loader))
    _row(
        "augmentation on the device (run on the CPU) ÷ in the loader (MONAI), patches/s a core",
        ours / base,
        2,
        f"{ours:.1f} vs {base:.1f} patches/s (runs: device "
        f"{', '.join(f'{r:.1f}' for r in device)}; loader {', '.join(f'{r:.1f}' for r in loader)})",
    )
    if theirs is not None:
        _row(
            "augmentation on the device (run on the CPU) ÷ nnU-Net's training pipeline, "
            "patches/s a core",
            ours / theirs,
            3,
            f"{ours:.1f} vs {theirs:.1f} patches/s",
        )
    else:
        print("nnU-Net row left out: nnunetv2 is not installed (make bench-venv)")
    print(
        f"device path: cutting the patches {100 * np.mean(cut):.0f}% of its time (mirroring "
        "included: the loader cuts a patch mirrored, or the turn's map mirrors it); each "
        "transform's expected ms a patch (cost when applied × probability):"
    )
    for name, ms in transform_costs(a.patch).items():
        print(f"  {name:>18}: {ms:6.2f} ms")


if __name__ == "__main__":
    main()
