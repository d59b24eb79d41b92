"""Step time of a data-parallel (or pipelined) run at n processes, predicted from a profile on
one device, in the manner of Echo (2024): compute measured, communication modelled. DDP reduces
gradients in buckets with a ring all-reduce while backward still runs; what backward cannot
hide is paid after it. Pure functions: the inputs are measured (planner.profile) or are the
site's link values (config `site:`)."""

from __future__ import annotations

from dataclasses import dataclass

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1 * 2**20  # its first bucket is small, to start reducing early


@dataclass
class Profile:
    """One process on one device, measured: seconds a step's parts take, the gradient bytes,
    the rate the loader delivers batches, and the step's peak memory."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    grad_bytes: float
    batch: int  # items a process's batch holds
    loader_batches_per_s: float | None = None
    peak_memory_bytes: float | None = None
    device: str = "cpu"
    step_s: float | None = None  # the step as timed (trimmed mean, data wait included)
    spread: float = 0.0  # interquartile range of the timed steps ÷ their median
    steps_timed: int = 0
    warmup_steps: int = 0
    validation_s: float = 0.0  # one validation pass on this device
    checkpoint_s: float = 0.0  # one checkpoint written
    threads: int = 1  # the CPU threads the profile ran with
    validation_shares: list | None = None  # [[n, seconds of rank 0's share at n processes]]
    loader_s: float = 0.0  # CPU time the loader takes to produce one batch, on its own
    cores: int | None = None  # CPUs the profiling process could use
    optimizer_bytes: float = 0.0  # the optimiser's state after a step (AdamW: 2× the params)
    unit_bytes: float = 0.0  # the largest block FSDP shards (voxjet.distributed.sharded)
    units: int = 1  # the blocks FSDP shards, the model's remainder counted
    device_memory_bytes: float | None = None  # the GPU's, where one profiled
    # the job around the steps: a process's start to its first line of work (imports), the
    # model built and the first batch read, the warm-up steps' time beyond settled steps
    startup_s: float = 0.0
    data_ready_s: float = 0.0
    warmup_extra_s: float = 0.0


@dataclass
class Links:
    """Bandwidth (bytes/s) and latency (s) of a process-to-process link inside a node and
    between nodes (the site's values)."""

    intra_bw: float
    inter_bw: float
    latency_s: float
    inter_latency_s: float | None = None


@dataclass
class Prediction:
    """A run's predicted step at one size and what it adds up to."""

    processes: int
    nodes: int
    step_s: float
    compute_s: float
    exposed_comm_s: float
    comm_s: float
    loader_bound: bool
    items_per_s: float


def buckets(grad_bytes: float, cap: float = DDP_BUCKET_BYTES) -> list[float]:
    """Gradient bucket sizes as DDP forms them (a small first bucket, then `cap` each)."""
    if grad_bytes <= 0:
        return []
    first = min(grad_bytes, DDP_FIRST_BUCKET_BYTES)
    rest = grad_bytes - first
    full, tail = divmod(rest, cap)
    return [first] + [cap] * int(full) + ([tail] if tail > 0 else [])


def ring_allreduce_s(nbytes: float, n: int, bw: float, latency_s: float) -> float:
    """A ring all-reduce of `nbytes` over n processes: 2(n−1) steps, each moving nbytes/n."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * (latency_s + nbytes / n / bw)


def link_for(nodes: int, links: Links) -> tuple[float, float]:
    """(bandwidth, latency) that bounds a ring across `nodes`: the slower link once it crosses."""
    if nodes > 1:
        return links.inter_bw, links.inter_latency_s or links.latency_s
    return links.intra_bw, links.latency_s


def predict_step(p: Profile, processes: int, nodes: int, links: Links,
                 loader_overlaps: bool = True) -> Prediction:  # fmt: skip
    """Step time at `processes` a node × `nodes`: forward, then backward with the buckets'
    all-reduces overlapping it (a bucket reduces once backward has produced it; the last one
    only after backward ends), then the optimiser; never faster than the loader, which runs
    beside the step (`loader_overlaps`: GPUs, whose loaders have the CPU) or adds to it (a CPU
    run whose cores the loader shares)."""
    n = processes * nodes
    bw, lat = link_for(nodes, links)
    sizes = buckets(p.grad_bytes)
    times = [ring_allreduce_s(b, n, bw, lat) for b in sizes]
    # DDP fills buckets in reverse parameter order as backward proceeds: bucket i is ready
    # after its share of the backward time; the link reduces them one after another
    done, ready_at, total = 0.0, 0.0, p.grad_bytes or 1.0
    for b, t in zip(sizes, times, strict=True):
        ready_at += p.backward_s * b / total
        done = max(done, ready_at) + t
    exposed = max(0.0, done - p.backward_s)
    compute = p.forward_s + p.backward_s + p.optimizer_s
    step = compute + exposed
    loader_bound = False
    if p.loader_batches_per_s:
        load = 1.0 / p.loader_batches_per_s  # each process's loader feeds its own batches
        if not loader_overlaps:
            step += load
        elif load > step:
            step, loader_bound = load, True
    return Prediction(processes, nodes, step, compute, exposed, sum(times), loader_bound,
                      n * p.batch / step)  # fmt: skip


def predict_pipeline_step(p: Profile, stages: int, microbatches: int) -> float:
    """A pipelined step: each stage's share of the compute, stretched by the schedule's bubble
    (K − 1)/(M + K − 1) of idle time."""
    per_stage = (p.forward_s + p.backward_s) / stages
    return per_stage * (microbatches + stages - 1) / microbatches + p.optimizer_s / stages


def cpu_step(compute_s: float, load_s: float, profiled_threads: int, threads: int,
             processes: int, cores: int) -> float:  # fmt: skip
    """Wall time of a CPU step: each process's compute on its `threads` (taken to scale with
    threads from the profile's), its loader thread producing the next batch beside it; once
    the processes' threads and loaders outnumber the `cores`, the step is their core-seconds
    over the cores (every process time-shares them)."""
    compute = compute_s * max(1, profiled_threads) / max(1, threads)
    work = processes * (compute_s * max(1, profiled_threads) + load_s)
    return max(compute, load_s, work / max(1, cores))


def cpu_slowdown(p: Profile, threads: int, processes: int, cores: int) -> float:
    """How much longer a CPU step takes at `processes` × `threads` on `cores` than in the
    profile (one process with its threads, on the cores it had)."""
    compute = p.forward_s + p.backward_s + p.optimizer_s
    here = cpu_step(compute, p.loader_s, p.threads, threads, processes, cores)
    there = cpu_step(compute, p.loader_s, p.threads, p.threads, 1, p.cores or p.threads + 1)
    return here / there if there > 0 else 1.0
