"""Start torchrun for a training job (torchrun does the launching; this picks its arguments,
the devices, and passes preemption signals on): one process a GPU, or CPU processes on gloo.
On several nodes, `srun` starts one torchrun a node, meeting at a c10d rendezvous on the first."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from voxjet.distributed import slurm, worker_errors
from voxjet.distributed.devices import claim_devices
from voxjet.distributed.gpus import DEVICE_ENV, check_gpus
from voxjet.distributed.lifeline import die_with_parent
from voxjet.distributed.worker_errors import ERROR_DIR_ENV
from voxjet.errors import VoxjetError


def processes_per_node(gpus: int, cpu_processes: int = 1) -> int:
    """One process a GPU asked for (checked: torch must see them all), or `cpu_processes`
    processes on the gloo backend when the job asks for no GPU."""
    return check_gpus(gpus) or max(1, cpu_processes)


def threads_per_process(threads: int, nproc: int) -> int:
    """The job's CPU threads shared by the processes of a node (at least one each)."""
    return max(1, threads // max(1, nproc))


def torchrun_argv(voxjet_args: list[str], nproc: int) -> list[str]:
    """`torchrun --standalone --nproc-per-node=N --no-python voxjet ARGS...` for one node."""
    torchrun = shutil.which("torchrun") or "torchrun"
    voxjet = shutil.which("voxjet") or "voxjet"
    return [
        torchrun,
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--no-python",
        voxjet,
        *voxjet_args,
    ]


RDZV_PORT = 29400


def multinode_argv(
    voxjet_args: list[str], nodes: int, nproc: int, head: str, job: str, gpus_per_node: int = 0
) -> list[str]:
    """`srun` one task a node, each `torchrun` joining a c10d rendezvous on `head`."""
    torchrun = shutil.which("torchrun") or "torchrun"
    voxjet = shutil.which("voxjet") or "voxjet"
    # one port a job, so two jobs whose first node is the same host do not meet each other
    port = RDZV_PORT + (int(job) % 1000 if job.isdigit() else 0)
    srun = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
    ]
    if gpus_per_node > 0:
        srun.append(f"--gpus-per-node={gpus_per_node}")
    return [
        *srun,
        torchrun,
        f"--nnodes={nodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={head}:{port}",
        f"--rdzv-id=voxjet-{job}",
        "--no-python",
        voxjet,
        *voxjet_args,
    ]


def launch_argv(voxjet_args: list[str], gpus: int, nproc: int, nodes: int) -> list[str]:
    """The command line for this job: torchrun on one node, or srun + torchrun on several."""
    if nodes <= 1:
        return torchrun_argv(voxjet_args, nproc)

    job = slurm.job_id()
    if job is None:
        raise VoxjetError(
            f"launch --nodes {nodes}: a multi-node run needs a SLURM allocation (SLURM_JOB_ID "
            "is not set); run it through the slurm profile, or set launch.nodes: 1"
        )
    hosts = slurm.job_nodes(job)
    if len(hosts) < nodes:
        raise VoxjetError(
            f"launch --nodes {nodes}: SLURM job {job} has only {len(hosts)} node(s) {hosts}"
        )
    return multinode_argv(voxjet_args, nodes, nproc, hosts[0], job, gpus)


def _deadline_timer(margin_s: float, stop) -> threading.Timer | None:
    """Inside a SLURM job with a time limit: a timer that stops training `margin_s` before it.

    Snakemake's SLURM plugin has no way to pass `sbatch --signal` on to the rule's processes, so
    the launcher asks SLURM for the time left instead of waiting for a warning signal.
    """
    job = slurm.job_id()
    if job is None or margin_s <= 0:
        return None
    try:
        left = slurm.time_left_s(job)
    except VoxjetError as e:
        print(f"launch: time limit unknown ({e}); no stop before it", file=sys.stderr)
        return None
    if left is None:
        return None
    delay = slurm.stop_delay_s(left, margin_s)
    print(
        f"launch: SLURM job {job} has {left:.0f} s left; checkpointing and stopping in "
        f"{delay:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    timer = threading.Timer(delay, stop)
    timer.daemon = True
    timer.start()
    return timer


def run_torchrun(
    gpus: int,
    voxjet_args: list[str],
    cpu_processes: int = 1,
    nodes: int = 1,
    stop_margin_s: float = 0.0,
    threads: int | None = None,
) -> int:
    """Run torchrun with `voxjet ARGS` (on `nodes` nodes) and return the exit code to use.

    On a machine with GPUs and no scheduler-set CUDA_VISIBLE_DEVICES, free devices are
    claimed first. SIGTERM and SIGUSR1 (SLURM's warning before a time limit or preemption) are
    passed on to torchrun as SIGTERM, which it forwards to the training processes: they write a
    checkpoint and stop. In a SLURM job with a time limit the same happens `stop_margin_s`
    before the limit. The launcher then exits with PREEMPTED_EXIT_CODE, so a requeue or rerun
    resumes (torchrun itself does not handle SIGUSR1: it would die without a checkpoint).

    A job asking for GPUs that torch does not see fails here, before torchrun, naming what torch
    reports; a job asking for none runs with CUDA hidden. `threads` (the job's CPU threads) is
    shared among the processes of a node (OMP_NUM_THREADS a process).
    """
    import torch

    nproc = processes_per_node(gpus, cpu_processes)
    env = dict(os.environ)
    env[DEVICE_ENV] = "cuda" if gpus > 0 else "cpu"
    if gpus <= 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # asked for the CPU: nothing lands on a GPU
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads_per_process(threads, nproc))
    if nodes <= 1 and gpus > 0 and "CUDA_VISIBLE_DEVICES" not in env:
        devices, _ = claim_devices(nproc, torch.cuda.device_count())
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        print(f"launch: using GPUs {devices}", file=sys.stderr, flush=True)
    argv = launch_argv(voxjet_args, gpus, nproc, nodes)
    print(
        f"launch: {nproc} process(es) a node on {env[DEVICE_ENV]}"
        + (f", {env['OMP_NUM_THREADS']} thread(s) each" if threads is not None else ""),
        file=sys.stderr,
        flush=True,
    )
    print("launch:", " ".join(argv), file=sys.stderr, flush=True)

    # torchrun's agent would die of a SIGUSR1 sent to every process of the job step (as
    # `sbatch --signal=USR1@T` does); ignored there, it is inherited as ignored by nothing that
    # matters: the training processes install their own handler and checkpoint.
    def child_setup() -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        die_with_parent()  # torchrun (and through it the training processes) dies with us

    # where the processes leave their error lines: the job's folder on several nodes (shared)
    errors = tempfile.mkdtemp(prefix=".voxjet-errors-", dir="." if nodes > 1 else None)
    env[ERROR_DIR_ENV] = os.path.abspath(errors)
    try:
        return _wait(argv, env, child_setup, stop_margin_s, errors)
    finally:
        shutil.rmtree(errors, ignore_errors=True)


def _wait(argv: list[str], env: dict[str, str], child_setup, stop_margin_s: float,
          errors: str) -> int:  # fmt: skip
    """Run torchrun, forwarding stop signals; its exit code (PREEMPTED_EXIT_CODE if stopped),
    the processes' own error lines printed last when it failed."""
    from voxjet.distributed.checkpoint import PREEMPTED_EXIT_CODE

    proc = subprocess.Popen(argv, env=env, close_fds=False, preexec_fn=child_setup)
    stopped: list[int] = []

    def forward(signum, frame) -> None:
        stopped.append(signum)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)
    timer = _deadline_timer(stop_margin_s, lambda: forward(signal.SIGUSR1, None))
    code = proc.wait()
    if timer is not None:
        timer.cancel()
    if stopped:
        print(
            f"launch: stopped by signal {stopped[0]}; the checkpoint lets a rerun resume",
            file=sys.stderr,
            flush=True,
        )
        return PREEMPTED_EXIT_CODE
    if code != 0:
        for line in worker_errors.summary(errors):
            print(line, file=sys.stderr, flush=True)
    return code
