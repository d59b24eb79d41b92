"""Which device a job runs on, decided once and checked before any work: a job that asks for
GPUs and sees fewer stops with what torch reports and how to fix it, instead of training on the
CPU; a job that asks for none never touches a GPU."""

from __future__ import annotations

import os
import warnings

from voxjet.errors import VoxjetError

# set by `voxjet launch` for the processes it starts: "cuda" (GPUs asked for) or "cpu"
DEVICE_ENV = "VOXJET_DEVICE"


def cuda_problem() -> str | None:
    """Why torch cannot use CUDA here (None when it can): the build, the driver, the devices."""
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (
            f"this torch {torch.__version__} is a CPU-only build (torch.version.cuda is None); "
            "install a CUDA build of torch, e.g. `pip install torch --index-url "
            "https://download.pytorch.org/whl/cu126` (the CUDA version your driver supports)"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
    if available:
        return None
    reason = "; ".join(str(w.message).strip() for w in caught)
    if not reason:
        try:  # is_available() hides the reason; initialising CUDA raises it
            torch.cuda.init()
        except Exception as e:  # noqa: BLE001 - whatever CUDA says is the message
            reason = str(e).strip()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU"
        + (f": {reason}" if reason else "")
        + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else "")
        + "; run on a GPU node (the slurm profile asks for one), update the NVIDIA driver, or "
        "install a torch built for the CUDA version the driver supports (nvidia-smi shows it)"
    )


def check_gpus(gpus: int, what: str = "launch.gpus") -> int:
    """The number of CUDA devices to use: `gpus` when torch sees that many (0: the CPU);
    otherwise a VoxjetError naming what torch reports and the fix."""
    if gpus <= 0:
        return 0
    problem = cuda_problem()
    fix_cpu = f"or set {what}: 0 to run on the CPU"
    if problem is not None:
        raise VoxjetError(f"{what}: {gpus} GPU(s) asked for, but {problem}; {fix_cpu}")
    import torch

    seen = torch.cuda.device_count()
    if seen < gpus:
        raise VoxjetError(
            f"{what}: {gpus} GPU(s) asked for, but torch sees {seen} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); ask the "
            f"scheduler for {gpus}, lower {what}, {fix_cpu}"
        )
    return gpus


def job_device() -> str:
    """ "cuda" or "cpu" as `voxjet launch` decided for this process; run without the launcher,
    the GPU when torch sees one."""
    want = os.environ.get(DEVICE_ENV)
    if want == "cuda":
        check_gpus(1, "the job's GPUs")
        return "cuda"
    if want == "cpu":
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
