"""`voxjet plan-runs`: for each run, a short profile of real training steps on one device (runs
that differ only in learning rate or seed share one), the step time predicted at the sizes the
site allows (planner.model), time to `train.steps`, device-hours, energy where a power is known,
and, under a GPU budget, the sweep's allocation (planner.allocate). Written to runs.json and a
readable runs.md."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxjet.distributed import checkpoint
from voxjet.distributed.launch import threads_per_process
from voxjet.distributed.runtime import Runtime, init_runtime, shutdown
from voxjet.distributed.sharded import shard_units
from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, write_json
from voxjet.io.device_feed import DeviceFeed
from voxjet.io.prefetch import prefetch
from voxjet.jets.train import make_task as jets_task
from voxjet.planner.allocate import allocate
from voxjet.planner.links import measure_link
from voxjet.planner.model import (
    Links,
    Prediction,
    Profile,
    cpu_slowdown,
    predict_pipeline_step,
    predict_step,
)
from voxjet.planner.parallelism import choose, compare
from voxjet.training.task import epochs, make_optimizer
from voxjet.volumes.inference.case_memory import check_job_memory, largest_case_need
from voxjet.volumes.training.train import make_task as seg_task


@dataclass
class Site:
    """The cluster as the config's `site:` section describes it."""

    gpus_per_node: int | None = None
    gpu_budget: int | None = None
    intra_node_gbps: float = 100.0
    inter_node_gbps: float = 12.5
    latency_us: float = 10.0
    inter_latency_us: float = 20.0
    cores_per_node: int | None = None
    mem_mb_per_node: int | None = None  # the dry run's check, not the planner's
    device_power_w: float | None = None
    # the queues' names (voxjet.config.SlurmSite), not the planner's
    slurm: dict = field(default_factory=dict)

    def links(self) -> Links:
        """The link values in bytes/s and seconds."""
        return Links(self.intra_node_gbps * 1e9, self.inter_node_gbps * 1e9,
                     self.latency_us * 1e-6, self.inter_latency_us * 1e-6)  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class ProfileLimits:
    """How long a profile times steps: warm-up until step times settle, then until the
    median is known to `precision` (or `max_steps`), within `budget_s` seconds."""

    min_steps: int = 10
    max_steps: int = 200
    max_warmup: int = 20
    precision: float = 0.02  # relative standard error of the median step
    budget_s: float | None = None  # None: no limit


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else 0.0


def _trimmed_mean(xs: list[float], cut: float = 0.2) -> float:
    """The mean of the middle values (a fifth cut off each end): robust to steps that waited
    for a descheduled thread, yet, unlike the median, the mean of steps whose cost varies
    with the batch (jets of many or few particles), which is what throughput averages."""
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = int(len(xs) * cut)
    return float(np.mean(xs[k : len(xs) - k]))


def _settled(times: list[float]) -> bool:
    """The last two steps within 15% of the median of the three before them."""
    if len(times) < 5:
        return False
    ref = _median(times[-5:-2])
    return all(abs(t - ref) <= 0.15 * ref for t in times[-2:])


def _precise(times: list[float], precision: float) -> bool:
    """The median's relative standard error (from the median absolute deviation) is small."""
    med = _median(times)
    mad = _median([abs(t - med) for t in times]) * 1.4826  # a standard deviation's estimate
    return med > 0 and 1.2533 * mad / np.sqrt(len(times)) <= precision * med


VALIDATION_SHARES = (1, 2, 4)


class _Share(Runtime):
    """Rank `rank` of `world_size` as a validation sees it, in this process alone: its share
    of the split, nothing gathered."""

    @property
    def distributed(self) -> bool:
        """Alone: no collective to join."""
        return False


def validation_at(profile: Profile, n: int) -> float:
    """Seconds rank 0's share of a validation takes at n processes: measured at 1, 2 and 4,
    beyond that a + b/n through the last two."""
    shares = {int(k): float(v) for k, v in (profile.validation_shares or [])}
    if not shares:
        return profile.validation_s / n
    if n in shares:
        return shares[n]
    (n1, t1), (n2, t2) = sorted(shares.items())[-2:]
    b = (t1 - t2) / (1 / n1 - 1 / n2) if n1 != n2 else 0.0
    return max(t2 - b / n2 + b / n, 0.0) if n > n2 else t1


class _Stepper:
    """The run's training step as the loop takes it: batches through the same prefetch thread,
    forward with the loss, backward, gradient clipping and the optimiser, timed in parts."""

    def __init__(self, task: Any, s: Any, rt: Any) -> None:

        self.task, self.s, self.rt, self.device = task, s, rt, rt.device
        self.model = task.build_model().to(self.device)
        self.model.train()
        self.opt = make_optimizer(self.model.parameters(), s, s.lr)
        feed = DeviceFeed(self.device, getattr(task, "device_keys", None))
        self.batches = feed(prefetch((b for b in epochs(task, 0, 0, rt) if b is not None),
                                     s.prefetch))  # fmt: skip
        self.on_device = getattr(task, "on_device", None)
        self.items = 0

    def step(self) -> tuple[float, float, float, float]:
        """(data wait, forward, backward, optimiser) seconds of one step."""
        t0 = time.perf_counter()
        batch = next(self.batches)
        t1 = time.perf_counter()
        if self.on_device is not None:  # as the loop: part of the step (device augmentation)
            batch = self.on_device(batch, self.device)
        loss, n = self.task.loss(self.model, batch, self.device)
        _sync(self.device)
        t2 = time.perf_counter()
        loss.backward()
        _sync(self.device)
        t3 = time.perf_counter()
        if self.s.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        float(loss.detach())  # the window's host sync, at most once a step
        _sync(self.device)
        self.items = int(n)
        return t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3

    def close(self) -> None:
        """Stop the prefetch thread."""
        self.batches.close()


def _loader_seconds(task: Any, rt: Any, batches: int = 8) -> float:
    """The median time the loader takes to produce a batch on its own (no step beside it):
    the CPU a loader thread needs, which processes sharing cores pay."""
    times, it = [], iter(task.batches(1, 0, rt))
    for _ in range(batches):
        t = time.perf_counter()
        if next(it, None) is None:
            break
        times.append(time.perf_counter() - t)
    return _median(times[1:] or times)


def _over_budget(run: str, what: str, needed: float, limits: ProfileLimits) -> VoxjetError:
    return VoxjetError(
        f"run {run}: profiling cannot finish in the plan job's time: {what} (about "
        f"{needed:.0f} s needed, {max(0.0, limits.budget_s):.0f} s left for this run). Give the "
        "plan_runs job more time (set-resources: plan_runs: runtime: <minutes> in your "
        "profile) or make the run's step smaller (train.batch_size, the model's size)"
    )


def profile_task(task: Any, s: Any, rt: Any, limits: ProfileLimits | None = None,
                 run: str = "?") -> Profile:  # fmt: skip
    """Time real training steps of `task` on this process's device as the loop runs them:
    warm-up until step times settle, then steps until their median is stable; the step's
    trimmed mean and its parts', the spread, and once each a validation and a checkpoint
    (what a run pays every eval_every / checkpoint_every steps)."""
    limits = limits or ProfileLimits()
    device = rt.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    stepper = _Stepper(task, s, rt)
    built_s = time.perf_counter() - start
    first_load = None
    try:
        walls: list[float] = []
        warm = 0
        while warm < limits.max_warmup and not _settled(walls):
            parts_of = stepper.step()
            first_load = parts_of[0] if first_load is None else first_load
            walls.append(sum(parts_of))
            warm += 1
            spent = time.perf_counter() - start
            needed = spent + _median(walls[-3:]) * limits.min_steps
            if limits.budget_s is not None and needed > limits.budget_s:
                raise _over_budget(run, f"a step takes {_median(walls[-3:]):.3g} s", needed,
                                   limits)  # fmt: skip
        parts: list[tuple[float, float, float, float]] = []
        while len(parts) < limits.max_steps and (
            len(parts) < limits.min_steps or not _precise([sum(p) for p in parts], limits.precision)
        ):
            if limits.budget_s is not None and time.perf_counter() - start > 0.8 * limits.budget_s:
                if len(parts) < limits.min_steps:
                    raise _over_budget(run, f"{len(parts)} of {limits.min_steps} steps timed",
                                       limits.budget_s * 1.25, limits)  # fmt: skip
                break
            parts.append(stepper.step())
    finally:
        stepper.close()
    model, opt = stepper.model, stepper.opt
    loader = _loader_seconds(task, rt)
    # what rank 0's share of a validation takes at 1, 2 and 4 processes (the split's
    # granularity, the metrics every rank computes, the share's first read included)
    shares = []
    for k in VALIDATION_SHARES:
        t = time.perf_counter()
        task.validate(model, device, _Share(0, k, rt.local_rank, device) if k > 1 else rt)
        shares.append([k, time.perf_counter() - t])
    validation = shares[0][1]
    with tempfile.TemporaryDirectory(prefix="voxjet-profile-") as tmp:
        t = time.perf_counter()
        checkpoint.save(Path(tmp) / "last.pt", {"model": model.state_dict(),
                                                 "optimizer": opt.state_dict()})  # fmt: skip
        saving = time.perf_counter() - t
        t = time.perf_counter()  # the best weights, which a validation that improves keeps
        checkpoint.save(Path(tmp) / "best.pt", {"model": model.state_dict(), "step": 0})
        validation += time.perf_counter() - t
    totals = [sum(p) for p in parts]
    step = _trimmed_mean(totals)
    load, fwd, bwd, opt_s = (_trimmed_mean([p[i] for p in parts]) for i in range(4))
    # the parts' trimmed means scaled to add up to the step's
    scale = step / max(load + fwd + bwd + opt_s, 1e-12)
    q25, q75 = np.percentile(totals, [25, 75])
    grad = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if device.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(device))
    else:
        import resource

        peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    load *= scale
    units = getattr(task, "fsdp_units", shard_units)(model)
    unit_bytes = max((sum(p.numel() * p.element_size() for p in u.parameters()) for u in units),
                     default=0)  # fmt: skip
    opt_bytes = sum(t.numel() * t.element_size() for st in opt.state.values()
                    for t in st.values() if torch.is_tensor(t))  # fmt: skip
    total = (torch.cuda.get_device_properties(device).total_memory
             if device.type == "cuda" else None)  # fmt: skip
    return Profile(fwd * scale, bwd * scale, opt_s * scale, float(grad), stepper.items,
                   1 / load if load > 0 else None, peak, device.type,
                   step_s=step, spread=float((q75 - q25) / step) if step > 0 else 0.0,
                   steps_timed=len(parts), warmup_steps=warm, validation_s=validation,
                   checkpoint_s=saving, threads=torch.get_num_threads(),
                   validation_shares=shares, loader_s=loader,
                   cores=len(os.sched_getaffinity(0)), optimizer_bytes=float(opt_bytes),
                   unit_bytes=float(unit_bytes), units=len(units) + 1,
                   device_memory_bytes=total, data_ready_s=built_s + (first_load or 0.0),
                   warmup_extra_s=max(0.0, sum(walls) - (first_load or 0.0)
                                      - len(walls) * step))  # fmt: skip


def sizes_for(gpu: bool, site: Site) -> list[tuple[int, int]]:
    """(processes a node, nodes) to predict: powers of two up to a node's GPUs (8 when the
    site does not say), then whole nodes up to the budget; CPU runs: 1, 2, 4 processes."""
    if not gpu:
        return [(n, 1) for n in (1, 2, 4)]
    per_node = site.gpus_per_node or 8
    out = [(n, 1) for n in (1, 2, 4, 8, 16) if n <= per_node]
    budget = site.gpu_budget or per_node * 4
    nodes = 2
    while per_node * nodes <= budget:
        out.append((per_node, nodes))
        nodes *= 2
    return out


def _at(every: int, steps: int, first: int | None = None) -> int:
    """How many times the loop validates (or checkpoints) every `every` steps in a run of
    `steps`: at each multiple and at the last step; with `first`, only those from step
    `first` to the one before the last (what falls between a log's windows after its first)."""
    if not every:
        return 0
    if first is None:
        return (steps - 1) // every + 1
    return max(0, (steps - 1) // every - (first - 1) // every)


def predict_run(profile: Profile, run: dict[str, Any], site: Site) -> list[dict]:
    """Predictions for one run at each size: step, time to its steps with the validations and
    checkpoints the loop adds (what a user budgets), the steady throughput a training log
    shows (its windows after the first), device-hours, energy; the run's own size marked
    `own`. A CPU profile ran with the threads each of the run's own processes gets; at n
    processes each gets threads // n (compute taken to scale with threads), and processes
    that outnumber the node's cores share them."""
    threads = int(run.get("threads", 1))
    train = run["config"].get("train", {})
    steps = int(train.get("steps", 0))
    stages = int(train.get("pipeline_stages", 1) or 1)
    log_every = int(train.get("log_every", 10) or 10)
    eval_every = int(train.get("eval_every", 100) or 0)
    ckpt_every = int(train.get("checkpoint_every", 100) or 0)
    gpu = profile.device == "cuda"
    out = []
    for per_node, nodes in sizes_for(gpu, site):
        n = per_node * nodes
        if stages > 1:
            if n % stages:
                continue
            step = predict_pipeline_step(profile, stages, int(train.get("microbatches", 4)))
            pred = Prediction(per_node, nodes, step, step, 0.0, 0.0, False,
                              (n // stages) * profile.batch / step)  # fmt: skip
        else:
            pred = predict_step(profile, per_node, nodes, site.links(), loader_overlaps=gpu)
        slow = 1.0
        if not gpu:
            # the job's cores (the node's where site.cores_per_node says, else launch.threads)
            # shared by its processes,
            # their threads and loader threads: the profiled step scaled by the core-seconds
            # model, the all-reduce (gloo runs on the same cores) likewise
            each = threads_per_process(threads, per_node)
            cores = site.cores_per_node or threads
            slow = cpu_slowdown(profile, each, per_node, cores)
            base = profile.step_s or (
                pred.compute_s
                + (1 / profile.loader_batches_per_s if profile.loader_batches_per_s else 0)
            )
            pred.compute_s *= slow
            pred.exposed_comm_s *= slow
            pred.step_s = base * slow + pred.exposed_comm_s
        # every rank validates its share; rank 0 writes the checkpoint while the others wait
        validation = validation_at(profile, max(1, n // stages)) * slow
        extra = _at(eval_every, steps) * validation + _at(ckpt_every, steps) * profile.checkpoint_s
        seconds = pred.step_s * steps + extra
        # what the log's windows after the first hold: their steps and the validations and
        # checkpoints between them (those after the last window are in no window)
        window_steps = max(steps - log_every, 1)
        window_s = (window_steps * pred.step_s
                    + _at(eval_every, steps, first=log_every) * validation
                    + _at(ckpt_every, steps, first=log_every) * profile.checkpoint_s)  # fmt: skip
        pred.items_per_s = (n // stages) * profile.batch * window_steps / window_s
        parts = job_parts(profile, pred.step_s * steps,
                          _at(eval_every, steps) * validation,
                          _at(ckpt_every, steps) * profile.checkpoint_s)  # fmt: skip
        job = sum(parts.values())
        row = {**asdict(pred), "processes_total": n, "time_to_steps_s": seconds,
               "loop_overhead_s": extra, "profile_spread": profile.spread,
               "job_s": job, "job_parts_s": parts,
               "job_items_per_s": (n // stages) * profile.batch * steps / job if job else 0.0,
               "device_hours": job * n / 3600, "own": n == run.get("processes")}  # fmt: skip
        row["energy_kwh"] = (job * n * site.device_power_w / 3.6e6
                             if site.device_power_w else None)  # fmt: skip
        out.append(row)
    return out


def parallelism_of(p: Profile, run: dict[str, Any], site: Site) -> dict[str, Any]:
    """DDP, FSDP and pipeline stages compared at the run's processes (2 for a one-process
    run: what it would take to spread it), the choice and why (planner.parallelism)."""
    n = max(2, int(run.get("processes") or 1))
    train = run["config"].get("train", {})
    per_node = min(n, site.gpus_per_node or n) if p.device == "cuda" else n
    nodes = max(1, n // per_node)
    limit = p.device_memory_bytes
    if p.device != "cuda" and run.get("mem_mb"):
        limit = float(run["mem_mb"]) * 2**20 / n  # the job's memory, shared by its processes
    pipelinable = run["domain"] == "volumes" and \
        run["config"].get("model", {}).get("name", "unet") in ("unet", "dynunet")  # fmt: skip
    rows = compare(p, per_node, nodes, site.links(), limit, pipelinable,
                   int(train.get("microbatches", 4)))  # fmt: skip
    out = choose(rows, limit, run["run"])
    out["configured"] = "pipeline" if int(train.get("pipeline_stages", 1) or 1) > 1 else \
        train.get("data_parallel", "ddp")  # fmt: skip
    return out


# what a training job starts before its first step: `voxjet job -- launch` (the CLI, which
# imports torch to count the GPUs), torchrun, then each of its processes importing the domain's
# training code (torch with it)
STARTUP_IMPORTS = {"jets": "voxjet.jets.train", "volumes": "voxjet.volumes.training.train"}


def startup_probe(domain: str) -> float:
    """Seconds a training job of `domain` takes to start, measured here: fresh interpreters
    importing what `voxjet job`, torchrun and a training process import, one after another
    (as the job starts them)."""
    import subprocess
    import sys

    took = 0.0
    for module in ("voxjet.cli, torch", "torch.distributed.run", STARTUP_IMPORTS[domain]):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True,
                       capture_output=True)  # fmt: skip
        took += time.perf_counter() - t
    return took


def job_parts(profile: Profile, steps_s: float, validations_s: float,
              checkpoints_s: float) -> dict[str, float]:  # fmt: skip
    """A training job's wall time in its parts: the start (startup_probe's), the model built and
    the first batch,
    the steps and their warm-up, the validations, the checkpoints, the export (model.pt)."""
    return {"startup": profile.startup_s, "data": profile.data_ready_s,
            "steps": steps_s + profile.warmup_extra_s, "validation": validations_s,
            "checkpoints": checkpoints_s, "export": profile.checkpoint_s}  # fmt: skip


def profile_key(run: dict[str, Any]) -> str:
    """What decides a step's cost: runs equal in it share one profile."""
    train = run["config"].get("train", {})
    keep = {k: train.get(k) for k in ("batch_size", "pipeline_stages", "microbatches",
                                      "optimizer", "loader_workers", "prefetch", "grad_clip",
                                      "augment")}  # fmt: skip
    return json.dumps([run["data"], run["config"].get("model"), keep, profile_threads(run)],
                      sort_keys=True)  # fmt: skip


def profile_threads(run: dict[str, Any]) -> int:
    """The CPU threads each of the run's processes trains with (voxjet launch's share; the
    workflow's job holds as many: voxjet.config.planner_threads)."""
    return threads_per_process(int(run.get("threads", 1)), int(run.get("processes") or 1))


def plan_runs(runs: list[dict[str, Any]], site: Site, out_dir: str | Path,
              time_limit_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Profile, predict and allocate every run; write runs.json and runs.md into `out_dir`.
    `time_limit_s` (the job's): each profile gets an equal share of what is left, and a run
    whose profile cannot finish in it is named."""
    start = time.perf_counter()
    startup = {d: startup_probe(d) for d in sorted({r["domain"] for r in runs})}
    rt = init_runtime()
    measured = []
    sites = {"cuda": site, "cpu": site}
    wanted = []
    if rt.device.type == "cuda" and torch.cuda.device_count() > 1:
        wanted.append(("cuda", "nccl"))  # the job holds two GPUs: their link, not the site's
    if any(not r.get("gpu") and (r.get("processes") or 1) > 1 for r in runs):
        wanted.append(("cpu", "gloo"))  # processes of a CPU run talk through gloo, not a GPU link
    for device, backend in wanted:
        bw, lat = measure_link(backend)
        measured.append({"backend": backend, "bandwidth_gbps": bw / 1e9, "latency_us": lat * 1e6})
        sites[device] = replace(site, intra_node_gbps=bw / 1e9, latency_us=lat * 1e6)
        print(f"measured {backend} all-reduce between 2 processes: {bw / 1e9:.3g} GB/s, "
              f"{lat * 1e6:.3g} µs a message", flush=True)  # fmt: skip
    profiles: dict[str, Profile] = {}
    memory: dict[str, dict | None] = {}
    plans = []
    todo = len({profile_key(r) for r in runs})
    try:
        for run in runs:
            key = profile_key(run)
            if key not in profiles:
                torch.set_num_threads(profile_threads(run) if rt.device.type == "cpu" else
                                       int(run.get("threads", 1)))  # fmt: skip
                print(f"profiling {run['run']} ({run['domain']}, {torch.get_num_threads()} "
                      "threads)", flush=True)  # fmt: skip
                limits = ProfileLimits()
                if time_limit_s is not None:
                    left = time_limit_s - (time.perf_counter() - start)
                    limits.budget_s = left / max(1, todo - len(profiles))
                profiles[key], memory[key] = _profile(run, rt, limits)
                profiles[key].startup_s = startup[run["domain"]]
                p = profiles[key]
                print(f"  step {p.step_s * 1e3:.3g} ms (trimmed mean) over {p.steps_timed} steps "
                      f"(spread {100 * p.spread:.0f}%), validation {p.validation_s:.3g} s, "
                      f"checkpoint {p.checkpoint_s:.3g} s", flush=True)  # fmt: skip
            p = profiles[key]
            steps = int(run["config"].get("train", {}).get("steps", 0))
            plans.append({"run": run["run"], "experiment": run["experiment"], "steps": steps,
                          "profile": asdict(p),
                          "predictions": predict_run(p, run, sites[p.device]),
                          "parallelism": parallelism_of(p, run, sites[p.device])})  # fmt: skip
            if memory[key] is not None:
                plans[-1]["prediction_memory"] = memory[key]
    finally:
        shutdown(rt)
    result: dict[str, Any] = {"site": asdict(site), "measured_link": measured, "runs": plans}
    if site.gpu_budget:
        times = {p["run"]: {r["processes_total"]: r["time_to_steps_s"] for r in p["predictions"]}
                 for p in plans}  # fmt: skip
        result["allocation"] = allocate(times, site.gpu_budget)
    out = Path(out_dir)
    write_json(out / "runs.json", result)
    with atomic_path(out / "runs.md") as tmp:
        tmp.write_text(plan_markdown(result))
    return result


def prediction_memory(run: dict[str, Any], task: Any) -> dict[str, Any]:
    """What predicting a segmentation run's largest case needs, checked against the memory
    its evaluation job is given (the experiment's launch.mem_mb) before anything trains."""
    plan = task.plan
    case, shape, need = largest_case_need(task.fingerprint, plan.target_spacing, plan.outputs,
                                          plan.patch_size)  # fmt: skip
    mem_mb = int(run.get("mem_mb") or 0)
    if mem_mb:
        key = f"experiments.{run['experiment']}.launch.mem_mb"
        check_job_memory(f"run {run['run']}", case, shape, need, mem_mb, key)
    return {"case": case, "shape": list(shape), "need_bytes": need, "job_mem_mb": mem_mb or None}


def _profile(
    run: dict[str, Any], rt: Any, limits: ProfileLimits
) -> tuple[Profile, dict[str, Any] | None]:
    make_task = jets_task if run["domain"] == "jets" else seg_task
    try:
        task, s = make_task(run["data"], run["config"], run.get("read"))
        memory = None if run["domain"] == "jets" else prediction_memory(run, task)
        return profile_task(task, s, rt, limits, run["run"]), memory
    except torch.OutOfMemoryError as e:
        raise VoxjetError(f"run {run['run']}: one training step does not fit the device "
                          f"({e}); lower train.batch_size or the model's size") from e  # fmt: skip


def job_markdown(predictions: list[dict[str, Any]]) -> list[str]:
    """runs.md's line with the run's whole job at its own size, part by part."""
    own = next((r for r in predictions if r.get("own")), None)
    if own is None or "job_parts_s" not in own:
        return []
    parts = ", ".join(f"{k} {_h(v)}" for k, v in own["job_parts_s"].items())
    return [f"The training job at its own size ({own['processes_total']} process(es)): "
            f"{_h(own['job_s'])} — {parts}; {own['job_items_per_s']:.4g} items/s over the "
            "whole job (what its time limit and device-hours are sized by; the steady rate "
            "between validations is the table's).", ""]  # fmt: skip


def parallelism_markdown(par: dict[str, Any] | None) -> list[str]:
    """runs.md's lines comparing DDP, FSDP and pipeline stages for one run."""
    if not par:
        return []
    n = par["options"][0]["processes"]
    limit = par["limit_bytes"]
    dev = f"{limit / 2**30:.3g} GiB a process" if limit else "no memory limit known"
    out = [f"Data parallelism at {n} processes ({dev}): **{par['scheme']}** — {par['why']}"
           + (" (train.data_parallel: auto: the run trains so)" if par["configured"] == "auto"
              else f" (the config asks for {par['configured']})"
              if par["configured"] != par["scheme"] else "") + ".", "",
           "| scheme | memory a process | step | sent a step | fits |",
           "|---|---|---|---|---|"]  # fmt: skip
    for o in par["options"]:
        mark = " ★" if o["scheme"] == par["scheme"] else ""
        out.append(f"| {o['scheme']}{mark} | {o['memory_bytes'] / 2**30:.3g} GiB | "
                   f"{o['step_s'] * 1e3:.3g} ms | {o['sent_bytes'] / 2**20:.3g} MiB | "
                   f"{'yes' if o['fits'] else 'no'} |")  # fmt: skip
    return [*out, ""]


def _h(s: float) -> str:
    return f"{s / 3600:.3g} h" if s >= 360 else f"{s:.3g} s"


def plan_markdown(result: dict[str, Any]) -> str:
    """runs.md: per run its profile and predictions, then the sweep's allocation."""
    out = ["# Predicted cost of the runs", "",
           "Step times predicted from a profile on one device and a model of DDP's bucketed "
           "ring all-reduce overlapped with backward (site values in runs.json).", ""]  # fmt: skip
    for plan in result["runs"]:
        p = plan["profile"]
        out += [
            f"## {plan['run']} ({plan['steps']} steps)", "",
            f"Profile ({p['device']}): forward {p['forward_s'] * 1e3:.3g} ms, backward "
            f"{p['backward_s'] * 1e3:.3g} ms, optimiser {p['optimizer_s'] * 1e3:.3g} ms, "
            f"{p['grad_bytes'] / 2**20:.3g} MiB of gradients, batch {p['batch']}, "
            f"{p.get('threads', 1)} thread(s)", "",
            f"Step {(p.get('step_s') or 0) * 1e3:.3g} ms (trimmed mean) over "
            f"{p.get('steps_timed', 0)} steps after {p.get('warmup_steps', 0)} of warm-up; "
            "spread (interquartile range ÷ "
            f"median) {100 * p.get('spread', 0):.0f}%"
            + (" — a noisy profile: other work shared the device; the predictions are as "
               "uncertain" if p.get("spread", 0) > 0.25 else "")
            + f". A validation {p.get('validation_s', 0):.3g} s, a checkpoint "
            f"{p.get('checkpoint_s', 0):.3g} s (in the time to steps).", "",
            "| processes × nodes | step | exposed comm. | items/s | time to steps | device-hours "
            "| energy kWh |",
            "|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        mem = plan.get("prediction_memory")
        if mem:
            job = f"{mem['job_mem_mb']} MB" if mem["job_mem_mb"] else "no memory limit set"
            size = "×".join(map(str, mem["shape"]))
            out[-2:-2] = [f"Predicting the dataset's largest case, {mem['case']} ({size} voxels "
                          f"cropped), needs about {mem['need_bytes'] / 2**30:.2g} GiB; the "
                          f"evaluation job has {job}.", ""]  # fmt: skip
        for r in plan["predictions"]:
            e = r["energy_kwh"]
            out.append(
                f"| {r['processes']} × {r['nodes']} | {r['step_s'] * 1e3:.3g} ms | "
                f"{r['exposed_comm_s'] * 1e3:.3g} ms | {r['items_per_s']:.4g} | "
                f"{_h(r['time_to_steps_s'])} | {r['device_hours']:.3g} | "
                + (f"{e:.3g}" if e is not None else "– (no site.device_power_w)")
                + " |"
            )
        out.append("")
        out += job_markdown(plan["predictions"])
        out += parallelism_markdown(plan.get("parallelism"))
    alloc = result.get("allocation")
    if alloc:
        out += [f"## Sweep allocation for a budget of {alloc['budget']} GPUs", "",
                f"Chosen: {alloc['choice']} GPU(s) a run.", "",
                "| GPUs a run | runs side by side | makespan | device-hours |",
                "|---|---|---|---|"]  # fmt: skip
        for o in alloc["options"]:
            mark = " ★" if o["processes"] == alloc["choice"] else ""
            out.append(f"| {o['processes']}{mark} | {o['slots']} | {_h(o['makespan_s'])} | "
                       f"{o['device_hours']:.3g} |")  # fmt: skip
        out.append("")
    return "\n".join(out)
