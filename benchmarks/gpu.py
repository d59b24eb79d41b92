"""Everything voxjet claims about GPUs, measured in one prepared run on the first GPU available
(at most 8 minutes on one H100/H200-class GPU; `--budget-s` stops starting new rows past it):

1. jet taggers' training steps at the JetClass recipe's shapes (batch 512, 128 particles, 17
   features), bf16 autocast, eager ÷ compiled (torch.compile), for voxjet's PFN, ParticleNet
   and ParT and weaver-core's ParticleTransformer (its recipe: about 3.9k jets/s on one A100,
   50 epochs of 10.24M jets in about 37 h); the compile time; peak memory;
2. NVML energy per 1k jets of ParT's step;
3. U-Net patches/s through the real training loop (`voxjet.training.loop`), augmentation in 2
   and in 8 loader workers against on the device, with each run's data-wait share and its peak
   memory against the planner's estimate;
4. one DDP training step on NCCL through torchrun (one process);
5. the fail-fast: a job asking for one GPU more than the machine has is refused before work.

On a machine without a GPU it runs the same code on the CPU (gloo instead of NCCL);
`--tiny` shrinks every shape so the slow test suite runs it end to end.

    python benchmarks/gpu.py [--tiny] [--budget-s 420] [--out gpu.json]

What a GPU machine needs (it may have no internet: bring wheels): a CUDA build of torch 2.13,
this repository installed with `pip install -e '.[imaging,weaver]'` (MONAI for the U-Net,
weaver-core for its ParT; nvidia-ml-py for NVML energy), and nothing else — the data it
trains on is generated here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

# JetClass's "full" particle inputs (the ParT paper's 17 features)
FEATURES = ["part_pt_log", "part_e_log", "part_logptrel", "part_logerel", "part_deltaR",
            "part_charge", "part_isChargedHadron", "part_isNeutralHadron", "part_isPhoton",
            "part_isElectron", "part_isMuon", "part_d0", "part_d0err", "part_dz", "part_dzerr",
            "part_deta", "part_dphi"]  # fmt: skip
WEAVER_A100_JETS_S = 3.9e3  # weaver's ParT recipe on one A100 (see the docstring)


@dataclass
class Report:
    """The rows printed and written, and the time budget they share."""

    budget_s: float
    start: float = field(default_factory=time.perf_counter)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.budget_s - (time.perf_counter() - self.start)

    def add(self, section: str, name: str, value: Any, detail: str = "") -> None:
        """One row, printed as it is measured (a run cut short keeps what it had)."""
        self.rows.append({"section": section, "name": name, "value": value, "detail": detail})
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"{section:>8} | {name:<48} | {shown!s:>12} | {detail}", flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _amp(device: torch.device):
    from contextlib import nullcontext

    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def jet_batch(batch: int, particles: int, device: torch.device, seed: int = 0) -> tuple:
    """A padded batch shaped like JetClass's: varying multiplicities, plausible features."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(particles // 4, particles + 1, (batch,), generator=g)
    mask = torch.arange(particles)[None] < counts[:, None]
    x = torch.randn(batch, particles, len(FEATURES), generator=g) * mask[..., None]
    y = torch.randint(0, 10, (batch,), generator=g)
    return x.to(device), mask.to(device), y.to(device)


def jet_models(tiny: bool) -> dict[str, Any]:
    """Builders of the taggers at the published sizes (tiny: a few units each)."""
    from voxjet.jets.models import build_model

    nf = len(FEATURES)
    common = {"n_features": nf, "n_classes": 10, "particle_mean": [0.0] * nf,
              "particle_std": [1.0] * nf, "feature_names": FEATURES}  # fmt: skip
    small = {
        "pfn": {"phi_sizes": (16, 16), "f_sizes": (16,)},
        "particlenet": {"dropout": 0.0},
        "part": {"dim": 16, "heads": 2, "blocks": 1, "class_blocks": 1, "pair_dim": 8},
    }
    out = {name: (lambda name=name: build_model(name, **common, **(small[name] if tiny else {})))
           for name in ("pfn", "particlenet", "part")}  # fmt: skip
    try:
        from weaver.nn.model.ParticleTransformer import ParticleTransformer

        from voxjet.jets.models.weaver import PART_DEFAULTS

        cfg = dict(PART_DEFAULTS)
        if tiny:
            cfg.update(embed_dims=[16, 32, 16], pair_embed_dims=[8, 8, 8], num_heads=2,
                       num_layers=1, num_cls_layers=1)  # fmt: skip
        out["weaver_part"] = lambda: _WeaverPart(ParticleTransformer(input_dim=nf, num_classes=10,
                                                                     **cfg))  # fmt: skip
    except ImportError:
        pass
    return out


class _WeaverPart(torch.nn.Module):
    """weaver's ParticleTransformer fed as weaver's loader feeds it: features [B, F, P],
    four-vectors [B, 4, P], mask [B, 1, P]."""

    def __init__(self, mod: torch.nn.Module) -> None:
        super().__init__()
        self.mod = mod

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pt = torch.exp(x[..., 0].clamp(max=5))
        eta, phi = x[..., 15], x[..., 16]
        v = torch.stack([pt * torch.cos(phi), pt * torch.sin(phi), pt * torch.sinh(eta),
                         pt * torch.cosh(eta)], 1) * mask[:, None]  # fmt: skip
        return self.mod(x.transpose(1, 2), v=v, mask=mask[:, None].float())


def step_rate(model: torch.nn.Module, batch: tuple, steps: int, warmup: int,
              device: torch.device) -> tuple[float, float]:  # fmt: skip
    """(items/s over `steps` training steps after `warmup`, seconds of the first step)."""
    x, mask, y = batch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    first = 0.0
    t0 = time.perf_counter()
    for i in range(warmup + steps):
        if i == warmup:
            _sync(device)
            t0 = time.perf_counter()
        with _amp(device):
            logits = model(x, mask)
        F.cross_entropy(logits.float(), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i == 0:
            _sync(device)
            first = time.perf_counter() - t0
    _sync(device)
    return steps * len(y) / (time.perf_counter() - t0), first


def jets_eager(r: Report, device: torch.device, a: argparse.Namespace) -> dict[str, float]:
    """Each tagger's eager training step (jets/s), returned for the compiled rows."""
    batch = jet_batch(a.jet_batch, a.particles, device)
    rates = {}
    for name, build in jet_models(a.tiny).items():
        if r.left() < 0:
            r.add("jets", f"{name}: left out", "-", "the time budget is spent")
            continue
        torch.manual_seed(0)
        model = build().to(device).train()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        rates[name], _ = step_rate(model, batch, a.steps, a.warmup, device)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        r.add(
            "jets",
            f"{name} eager jets/s",
            rates[name],
            f"batch {a.jet_batch} × {a.particles} particles"
            + (f", bf16, peak {peak:.2f} GiB" if peak is not None else ", fp32 (CPU)"),
        )
        if name == "weaver_part" and device.type == "cuda":
            r.add(
                "jets",
                "weaver ParT eager ÷ weaver's A100 recipe",
                rates[name] / WEAVER_A100_JETS_S,
                "target >= 3 on an H100/H200-class GPU",
            )
        if name == "part":
            energy_row(r, model, batch, a, device)
    return rates


def jets_compiled(r: Report, device: torch.device, a: argparse.Namespace,
                  eager: dict[str, float]) -> None:  # fmt: skip
    """The same steps compiled (last: compiling costs the most time), against eager."""
    from voxjet.training.compiled import compile_errors, first_line

    batch = jet_batch(a.jet_batch, a.particles, device)
    wanted = set(a.compile_models.split(",")) if a.compile_models else set()
    for name, build in jet_models(a.tiny).items():
        if name not in eager or not ({name, "all"} & wanted):
            continue
        if r.left() < 0:
            r.add("jets", f"{name} compiled: left out", "-", "the time budget is spent")
            continue
        torch.manual_seed(0)
        model = build().to(device).train()
        try:
            rate, first = step_rate(torch.compile(model), batch, a.steps, a.warmup, device)
        except compile_errors() as e:
            r.add("jets", f"{name} compiled", "fell back", first_line(e))
            continue
        r.add("jets", f"{name} compiled jets/s", rate, f"compiled ÷ eager "
              f"{rate / eager[name]:.2f}; compile + first step {first:.1f} s")  # fmt: skip


def energy_row(r: Report, model: torch.nn.Module, batch: tuple, a: argparse.Namespace,
               device: torch.device) -> None:  # fmt: skip
    """NVML's energy counter over ParT's eager steps: joules per 1k jets."""
    if device.type != "cuda":
        r.add("jets", "ParT energy J / 1k jets", "-", "NVML measures GPUs only")
        return
    try:
        from voxjet.training.accounting import NvmlEnergy

        meter = NvmlEnergy(device.index or 0)
    except Exception as e:  # noqa: BLE001 - no NVML: say why
        r.add("jets", "ParT energy J / 1k jets", "-", f"NVML: {type(e).__name__}: {e}")
        return
    steps = max(a.steps, 50)
    rate, _ = step_rate(model, batch, steps, 2, device)  # the 2 warm-up steps count too
    joules = meter.joules()
    jets = (steps + 2) * a.jet_batch
    r.add("jets", "ParT energy J / 1k jets", 1000 * joules / jets, f"{rate:.0f} jets/s")


def seg_cases(root: Path, tiny: bool) -> tuple[Path, list[int]]:
    """Preprocessed toy CT cases and the patch (nnU-Net's 128×128×64; tiny: 32×32×16)."""
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset

    shape, patch = ((40, 40, 20), [32, 32, 16]) if tiny else ((192, 192, 96), [128, 128, 64])
    cfg = ToyVolumesConfig(train_cases=4 if tiny else 8, test_cases=0, min_shape=shape,
                           max_shape=shape)  # fmt: skip
    msd = generate_dataset(root / "msd", cfg, progress=False)
    (root / "manifest.json").write_text(json.dumps({"root": str(msd), "files": []}))
    preprocess_dataset(
        root / "manifest.json",
        root / "cases",
        VolumePrepConfig(patch_size=patch, network_depth=5 if not tiny else 2),
    )
    return root / "cases", patch


def seg_run(cases: Path, out: Path, a: argparse.Namespace, on: str, workers: int) -> dict:
    """Train the U-Net through the loop; patches/s and data wait over the windows after the
    first, and the run's cost record (peak memory, the planner's estimate)."""
    from voxjet.distributed.runtime import init_runtime
    from voxjet.training.logger import read_metrics
    from voxjet.training.loop import train
    from voxjet.volumes.training.train import make_task

    channels = [8, 16] if a.tiny else [32, 64, 128, 256, 320]
    steps = a.seg_steps
    cfg = {"model": {"name": "unet", "channels": channels, "num_res_units": 1},
           "train": {"steps": steps, "batch_size": 2, "lr": 1e-3, "log_every": max(1, steps // 4),
                     "eval_every": 0, "checkpoint_every": 10**6, "iterations_per_epoch": 10**6,
                     "augment_on": on, "loader_workers": workers, "prefetch": 4,
                     "compile": False}}  # fmt: skip
    task, s = make_task(str(cases), cfg)
    train(task, s, out, init_runtime(), rate_key="patches_per_s")
    recs = read_metrics(out / "metrics.jsonl")
    windows = [x for x in recs if "patches_per_s" in x][1:]
    cost = next((x["cost"] for x in reversed(recs) if "cost" in x), {})
    return {
        "patches_s": float(np.mean([w["patches_per_s"] for w in windows])),
        "wait": float(np.mean([w["data_wait_fraction"] for w in windows])),
        "cost": cost,
    }


def seg_section(r: Report, device: torch.device, a: argparse.Namespace, tmp: Path) -> None:
    """Augmentation in loader workers against on the device, at 2 and 8 workers."""
    if r.left() < 0:
        r.add("seg", "U-Net rows: left out", "-", "the time budget is spent")
        return
    cases, patch = seg_cases(tmp / "seg", a.tiny)
    for workers in a.workers:
        for on in ("loader", "device"):
            if r.left() < 0:
                r.add("seg", f"{on}, {workers} workers: left out", "-", "time budget spent")
                continue
            res = seg_run(cases, tmp / f"run-{on}-{workers}", a, on, workers)
            c = res["cost"]
            if device.type != "cuda":  # a CPU's peak is the process's, not the step's
                mem = f"peak RSS {c.get('peak_memory_gib', 0):.2f} GiB (the whole process)"
            elif c.get("peak_over_estimate"):
                mem = (f"peak {c['peak_memory_gib']:.2f} GiB = {c['peak_over_estimate']:.2f}× "
                       "the planner's estimate")  # fmt: skip
            else:
                mem = "no memory estimate"
            r.add("seg", f"U-Net patches/s, augment on {on}, {workers} workers",
                  res["patches_s"], f"patch {patch}, batch 2; data wait "
                  f"{100 * res['wait']:.1f}%; {mem}")  # fmt: skip


DDP_WORKER = """
import sys, time, torch, torch.distributed as dist, torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
import gpu
dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
tiny = sys.argv[2] == "1"
model = gpu.jet_models(tiny)["pfn"]().to(dev)
ids = [0] if dev.type == "cuda" else None
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
x, m, y = gpu.jet_batch(64 if tiny else 512, 16 if tiny else 128, dev)
opt = torch.optim.AdamW(ddp.parameters())
times = []
for i in range(6):
    gpu._sync(dev); t = time.perf_counter()
    with gpu._amp(dev):
        loss = F.cross_entropy(ddp(x, m).float(), y)
    loss.backward(); opt.step(); opt.zero_grad()
    gpu._sync(dev); times.append(time.perf_counter() - t)
print(dist.get_backend(), 1000 * min(times[1:]))
dist.destroy_process_group()
"""


def ddp_row(r: Report, a: argparse.Namespace) -> None:
    """One process of torchrun: the DDP step's time on NCCL (gloo on a CPU)."""
    # torchrun runs a script: the worker goes through a file
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(DDP_WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
           f.name, str(Path(__file__).resolve().parent), "1" if a.tiny else "0"]  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        r.add("ddp", "DDP step (1 process)", "failed", out.stderr.strip().splitlines()[-1])
        return
    backend, ms = out.stdout.split()[-2:]
    r.add("ddp", f"DDP step on {backend} (1 process), ms", float(ms), "PFN, batch as above")


def data_parallel_rows(r: Report, a: argparse.Namespace) -> None:
    """DDP, FSDP and pipeline stages side by side (benchmarks/data_parallel.py) on 2 GPUs:
    peak memory a process, step time, bytes sent a step."""
    if torch.cuda.device_count() < 2 or a.tiny:
        why = "tiny run" if a.tiny else f"{torch.cuda.device_count()} GPU(s): NCCL needs 2"
        r.add("data_parallel", "DDP vs FSDP vs pipeline", "skipped", why)
        return
    script = Path(__file__).resolve().parent / "data_parallel.py"
    cmd = [sys.executable, str(script), "--device", "cuda", "--steps", "6"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=max(60, int(r.left())))
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not rows:
        r.add("data_parallel", "DDP vs FSDP vs pipeline", "failed", out.stderr[-300:])
        return
    for row in rows:
        detail = f"step {row['step_s'] * 1e3:.0f} ms, {row['sent_bytes'] / 2**20:.0f} MiB sent"
        r.add("data_parallel", f"{row['model']} {row['scheme']} peak GiB a GPU",
              row["peak_bytes"] / 2**30, detail)  # fmt: skip


def fail_fast_row(r: Report) -> None:
    """`voxjet launch` asking for one GPU more than torch sees: refused, before any work."""
    gpus = torch.cuda.device_count() + 1 if torch.cuda.is_available() else 2
    exe = Path(sys.executable).parent / "voxjet"
    t = time.perf_counter()
    out = subprocess.run([str(exe), "launch", "--gpus", str(gpus), "--threads", "1", "--",
                          "train-jets", "--shards", "/nonexistent", "--run-config", "{}",
                          "--out", "/nonexistent/run"], capture_output=True, text=True)  # fmt: skip
    said = (out.stderr.strip().splitlines() or [""])[-1]
    refused = out.returncode != 0 and "asked for" in said
    r.add(
        "fail",
        f"job asking for {gpus} GPUs refused",
        "yes" if refused else "NO",
        f"in {time.perf_counter() - t:.1f} s: {said[:160]}",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (the test suite's CPU run)")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument(
        "--compile-models",
        default="all",
        help="comma-separated models to compile too (all: every one)",
    )
    ap.add_argument("--out", type=Path, help="write the rows here as JSON")
    a = ap.parse_args()
    a.jet_batch, a.particles = (64, 16) if a.tiny else (512, 128)
    a.steps, a.warmup = (3, 1) if a.tiny else (30, 5)
    a.seg_steps = 8 if a.tiny else 40
    a.workers = [1, 2] if a.tiny else [2, 8]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    r = Report(a.budget_s)
    r.add("machine", "device", name, f"torch {torch.__version__}, {os.cpu_count()} CPU cores")
    with tempfile.TemporaryDirectory() as tmp:
        eager: dict[str, float] = {}
        parts = (lambda: eager.update(jets_eager(r, device, a)), lambda: fail_fast_row(r),
                 lambda: ddp_row(r, a), lambda: seg_section(r, device, a, Path(tmp)),
                 lambda: jets_compiled(r, device, a, eager),
                 lambda: data_parallel_rows(r, a))  # fmt: skip
        for part in parts:
            try:
                part()
            except Exception as e:  # noqa: BLE001 - one failed section must not lose the rest
                r.add("error", type(e).__name__, "-", str(e)[:300])
    r.add("machine", "seconds", time.perf_counter() - r.start, f"budget {a.budget_s:.0f} s")
    if a.out:
        a.out.write_text(json.dumps(r.rows, indent=1))


if __name__ == "__main__":
    main()
