"""`voxjet plan-runs`: for each run, a short profile of real training steps on one device (runs
that differ only in learning rate or seed share one), the step time predicted at the sizes the
site allows (planner.model), time to `train.steps`, device-hours, energy where a power is known,
and, under a GPU budget, the sweep's allocation (planner.allocate). Written to runs.json and a
readable runs.md."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, write_json
from voxjet.planner.allocate import allocate
from voxjet.planner.model import Links, Prediction, Profile, predict_pipeline_step, predict_step


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
    device_power_w: float | None = None

    def links(self) -> Links:
        """The link values in bytes/s and seconds."""
        return Links(self.intra_node_gbps * 1e9, self.inter_node_gbps * 1e9,
                     self.latency_us * 1e-6, self.inter_latency_us * 1e-6)  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_task(task: Any, s: Any, rt: Any, steps: int = 6, warmup: int = 2) -> Profile:
    """Time real training steps of `task` on this process's device: forward (with the loss),
    backward and the optimiser separately, and how fast batches arrive from the loader."""
    from voxjet.training.loop import make_optimizer

    device = rt.device
    model = task.build_model().to(device)
    model.train()
    opt = make_optimizer(model.parameters(), s, s.lr)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sums = {"load": 0.0, "fwd": 0.0, "bwd": 0.0, "opt": 0.0}
    batch_items, epoch = 0, 0
    it = iter(task.batches(epoch, 0, rt))
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        batch = next(it, None)
        while batch is None:  # an epoch shorter than the profile: the next one
            epoch += 1
            it = iter(task.batches(epoch, 0, rt))
            batch = next(it, None)
        t1 = time.perf_counter()
        loss, n = task.loss(model, batch, device)
        _sync(device)
        t2 = time.perf_counter()
        loss.backward()
        _sync(device)
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        t4 = time.perf_counter()
        if i >= warmup:
            for k, dt in zip(sums, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                sums[k] += dt
            batch_items = int(n)
    grad = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    if device.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(device))
    else:
        import resource

        peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    load = sums["load"] / steps
    return Profile(sums["fwd"] / steps, sums["bwd"] / steps, sums["opt"] / steps, float(grad),
                   batch_items, 1 / load if load > 0 else None, peak, device.type)  # fmt: skip


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


def predict_run(profile: Profile, run: dict[str, Any], site: Site) -> list[dict]:
    """Predictions for one run at each size: step, time to its steps, device-hours, energy;
    the run's own size marked `own`. A CPU profile ran with the job's threads; at n processes
    each gets threads // n of them (compute taken to scale with threads), and processes that
    outnumber the node's cores share them."""
    threads = int(run.get("threads", 1))
    train = run["config"].get("train", {})
    steps = int(train.get("steps", 0))
    stages = int(train.get("pipeline_stages", 1) or 1)
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
            if not gpu:
                each = max(1, threads // per_node)
                slow = threads / each
                if site.cores_per_node and per_node * each > site.cores_per_node:
                    slow *= per_node * each / site.cores_per_node
                load = 1 / profile.loader_batches_per_s if profile.loader_batches_per_s else 0.0
                pred.step_s += (pred.compute_s + load) * (slow - 1)
                pred.compute_s *= slow
                pred.items_per_s = n * profile.batch / pred.step_s
        seconds = pred.step_s * steps
        row = {**asdict(pred), "processes_total": n, "time_to_steps_s": seconds,
               "device_hours": seconds * n / 3600, "own": n == run.get("processes")}  # fmt: skip
        row["energy_kwh"] = (seconds * n * site.device_power_w / 3.6e6
                             if site.device_power_w else None)  # fmt: skip
        out.append(row)
    return out


def profile_key(run: dict[str, Any]) -> str:
    """What decides a step's cost: runs equal in it share one profile."""
    train = run["config"].get("train", {})
    keep = {k: train.get(k) for k in ("batch_size", "pipeline_stages", "microbatches",
                                      "optimizer", "loader_workers")}  # fmt: skip
    return json.dumps([run["data"], run["config"].get("model"), keep, run.get("threads")],
                      sort_keys=True)  # fmt: skip


def plan_runs(runs: list[dict[str, Any]], site: Site, out_dir: str | Path) -> dict[str, Any]:
    """Profile, predict and allocate every run; write runs.json and runs.md into `out_dir`."""
    from voxjet.distributed.runtime import init_runtime, shutdown

    rt = init_runtime()
    profiles: dict[str, Profile] = {}
    plans = []
    try:
        for run in runs:
            key = profile_key(run)
            if key not in profiles:
                print(f"profiling {run['run']} ({run['domain']})", flush=True)
                torch.set_num_threads(int(run.get("threads", 1)))
                profiles[key] = _profile(run, rt)
            p = profiles[key]
            steps = int(run["config"].get("train", {}).get("steps", 0))
            plans.append({"run": run["run"], "experiment": run["experiment"], "steps": steps,
                          "profile": asdict(p),
                          "predictions": predict_run(p, run, site)})  # fmt: skip
    finally:
        shutdown(rt)
    result: dict[str, Any] = {"site": asdict(site), "runs": plans}
    if site.gpu_budget:
        times = {p["run"]: {r["processes_total"]: r["time_to_steps_s"] for r in p["predictions"]}
                 for p in plans}  # fmt: skip
        result["allocation"] = allocate(times, site.gpu_budget)
    out = Path(out_dir)
    write_json(out / "runs.json", result)
    with atomic_path(out / "runs.md") as tmp:
        tmp.write_text(plan_markdown(result))
    return result


def _profile(run: dict[str, Any], rt: Any) -> Profile:
    if run["domain"] == "jets":
        from voxjet.jets.train import make_task
    else:
        from voxjet.volumes.train import make_task
    try:
        task, s = make_task(run["data"], run["config"], run.get("read"))
        return profile_task(task, s, rt)
    except torch.OutOfMemoryError as e:
        raise VoxjetError(f"run {run['run']}: one training step does not fit the device "
                          f"({e}); lower train.batch_size or the model's size") from e  # fmt: skip


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
            f"{p['grad_bytes'] / 2**20:.3g} MiB of gradients, batch {p['batch']}", "",
            "| processes × nodes | step | exposed comm. | items/s | time to steps | device-hours "
            "| energy kWh |",
            "|---|---|---|---|---|---|---|",
        ]  # fmt: skip
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
