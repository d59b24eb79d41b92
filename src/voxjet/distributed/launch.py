"""Start torchrun for a training job (torchrun does the launching; this picks its arguments,
the devices, and passes preemption signals on): one process a GPU, or CPU processes on gloo."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys


def processes_per_node(gpus: int, cpu_processes: int = 1) -> int:
    """GPUs asked for when CUDA sees that many, else what it sees; without CUDA,
    `cpu_processes` processes on the gloo backend."""
    import torch

    if gpus > 0 and torch.cuda.is_available():
        return min(gpus, torch.cuda.device_count())
    return max(1, cpu_processes)


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


def run_torchrun(gpus: int, voxjet_args: list[str], cpu_processes: int = 1) -> int:
    """Run torchrun with `voxjet ARGS` on this node and return the exit code to use.

    On a machine with GPUs and no scheduler-set CUDA_VISIBLE_DEVICES, free devices are
    claimed first. SIGTERM and SIGUSR1 (SLURM's warning before a time limit or preemption) are
    passed on to torchrun as SIGTERM, which it forwards to the training processes: they write a
    checkpoint and stop. The launcher then exits with PREEMPTED_EXIT_CODE, so a requeue or
    rerun resumes (torchrun itself does not handle SIGUSR1: it would die without a checkpoint).
    """
    import torch

    from voxjet.distributed.checkpoint import PREEMPTED_EXIT_CODE

    nproc = processes_per_node(gpus, cpu_processes)
    env = dict(os.environ)
    if gpus > 0 and torch.cuda.is_available() and "CUDA_VISIBLE_DEVICES" not in env:
        from voxjet.distributed.devices import claim_devices

        devices, _ = claim_devices(nproc, torch.cuda.device_count())
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        print(f"launch: using GPUs {devices}", file=sys.stderr, flush=True)
    argv = torchrun_argv(voxjet_args, nproc)
    print("launch:", " ".join(argv), file=sys.stderr, flush=True)
    # torchrun's agent would die of a SIGUSR1 sent to every process of the job step (as
    # `sbatch --signal=USR1@T` does); ignored there, it is inherited as ignored by nothing that
    # matters: the training processes install their own handler and checkpoint.
    proc = subprocess.Popen(
        argv,
        env=env,
        close_fds=False,
        preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN),
    )
    stopped: list[int] = []

    def forward(signum, frame) -> None:
        stopped.append(signum)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)
    code = proc.wait()
    if stopped:
        print(
            f"launch: stopped by signal {stopped[0]}; the checkpoint lets a rerun resume",
            file=sys.stderr,
            flush=True,
        )
        return PREEMPTED_EXIT_CODE
    return code
