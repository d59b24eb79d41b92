"""How a run's processes should share it — DDP, FSDP (train.data_parallel: fsdp) or pipeline
stages — from its one-device profile: the memory each scheme needs a process and its predicted
step, the fastest scheme that fits the device chosen, and why. Pure functions, as planner.model.

Memory a process, from what the profile measured (parameters P, their gradients G, the
optimiser's state O, the step's peak) and the rest R = peak − (P + G + O) (activations, and on
a CPU the process itself): DDP holds P + G + O, a bucketed copy of G, and R; FSDP over n holds
(P + G + O)/n, the largest block's parameters gathered twice over (the one computing, the next
prefetched) and R; K pipeline stages (voxjet keeps every parameter on every stage, each stage
its own gradients and optimiser state) P + (G + O)/K and R/K of the activations on a GPU.
Step: DDP's as planner.model predicts it; FSDP's compute with the all-gathers (forward and
backward) and the reduce-scatter of a ring, overlapped with the compute but the first block's
gather; the pipeline's with its bubble."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from voxjet.errors import VoxjetError
from voxjet.planner.model import Links, Profile, link_for, predict_pipeline_step, predict_step

SCHEMES = ("ddp", "fsdp", "pipeline")
PREFER_DDP = 1.05  # DDP kept unless another scheme is faster by more than this: fewer moving parts


@dataclass
class SchemeEstimate:
    """One scheme at n processes: memory a process, the step, the bytes a process sends a
    step, whether it fits the device."""

    scheme: str
    processes: int
    memory_bytes: float
    step_s: float
    sent_bytes: float
    fits: bool


def memory_a_process(p: Profile, scheme: str, n: int) -> float:
    """The bytes one of n processes holds at its peak under `scheme` (see the module)."""
    params = p.grad_bytes
    state = params + p.grad_bytes + p.optimizer_bytes
    rest = max(0.0, (p.peak_memory_bytes or state) - state)
    if scheme == "ddp" or n <= 1:
        return state + (p.grad_bytes if n > 1 else 0.0) + rest
    if scheme == "fsdp":
        return state / n + 2 * p.unit_bytes + rest
    activations = rest / n if p.device == "cuda" else rest
    return params + (p.grad_bytes + p.optimizer_bytes) / n + activations


def fsdp_step(p: Profile, n: int, nodes: int, links: Links) -> tuple[float, float]:
    """(step seconds, bytes a process sends) of FSDP over n processes × nodes."""
    total = n * nodes
    if total <= 1:
        return p.forward_s + p.backward_s + p.optimizer_s, 0.0
    bw, lat = link_for(nodes, links)
    units = max(1, p.units)
    one = (total - 1) * (units * lat + p.grad_bytes / total / bw)  # one ring pass over P
    comm = 3 * one  # all-gather for forward, again for backward, reduce-scatter of gradients
    first = one / units  # the first block's gather: nothing to hide it behind
    compute = p.forward_s + p.backward_s + p.optimizer_s / total
    exposed = max(0.0, comm - (p.forward_s + p.backward_s)) + first
    return compute + exposed, 3 * (total - 1) / total * p.grad_bytes


def compare(p: Profile, per_node: int, nodes: int, links: Links, limit_bytes: float | None,
            pipelinable: bool, microbatches: int = 4) -> list[SchemeEstimate]:  # fmt: skip
    """Every scheme the run could use at per_node × nodes processes."""
    n = per_node * nodes
    ddp = predict_step(p, per_node, nodes, links, loader_overlaps=p.device == "cuda")
    out = [("ddp", ddp.step_s, 2 * (n - 1) / n * p.grad_bytes)]
    out.append(("fsdp", *fsdp_step(p, per_node, nodes, links)))
    if pipelinable and n > 1:
        out.append(("pipeline", predict_pipeline_step(p, n, microbatches), 0.0))
    rows = []
    for scheme, step, sent in out:
        mem = memory_a_process(p, scheme, n)
        rows.append(SchemeEstimate(scheme, n, mem, step, sent,
                                   limit_bytes is None or mem <= limit_bytes))  # fmt: skip
    return rows


def choose(rows: list[SchemeEstimate], limit_bytes: float | None, run: str) -> dict:
    """The fastest scheme that fits (DDP unless another is faster by PREFER_DDP), and why; a
    run that fits under none is refused with the numbers."""
    fits = [r for r in rows if r.fits]
    gib = 2**30
    if not fits:
        said = ", ".join(f"{r.scheme} {r.memory_bytes / gib:.3g} GiB" for r in rows)
        raise VoxjetError(
            f"run {run}: fits the device under no scheme at {rows[0].processes} processes "
            f"({said} a process; the device has {limit_bytes / gib:.3g} GiB): lower "
            "train.batch_size or the model's size, or give the run more processes"
        )
    ddp = next((r for r in fits if r.scheme == "ddp"), None)
    best = min(fits, key=lambda r: r.step_s)
    if ddp is not None and ddp.step_s <= best.step_s * PREFER_DDP:
        best = ddp
    if ddp is None:
        need = next(r for r in rows if r.scheme == "ddp").memory_bytes
        why = (f"DDP needs {need / gib:.3g} GiB a process, more than the device's "
               f"{limit_bytes / gib:.3g} GiB; {best.scheme} needs "
               f"{best.memory_bytes / gib:.3g}")  # fmt: skip
    elif best.scheme == "ddp":
        why = "every scheme that fits is no faster than DDP"
    else:
        why = f"fits and steps {ddp.step_s / best.step_s:.2g}× faster than DDP"
    return {"scheme": best.scheme, "why": why, "options": [asdict(r) for r in rows],
            "limit_bytes": limit_bytes}  # fmt: skip
