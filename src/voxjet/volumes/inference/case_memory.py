"""What predicting one case holds in memory, known from the image headers before any voxel is
read, and the memory this job may use: so that a case too large for the node is refused with
the numbers instead of the job being killed by the kernel or SLURM half-way through a dataset.

The need is the sum of what `predict.segment` holds at its peak: the case as read (float32,
and its reoriented copy), the prepared image at the plan's spacing and its padded copy, the
streamed sliding window's band (one window's depth of the classes' logits and the weights, not
the whole case's: voxjet.volumes.inference.sliding_window), the label maps in plan and original
space, and with probabilities the classes' probabilities on both grids."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.images import NIFTI_ENDINGS, ending_of

GIB = 1024**3
# besides the arrays counted: the network's activations for a window batch, torch's and
# Python's own footprint
OVERHEAD = 1.0 * GIB


@dataclass(frozen=True)
class Header:
    """A case's grid as its header gives it: voxels along each axis, channels, voxel size."""

    shape: tuple[int, int, int]
    channels: int
    spacing: tuple[float, float, float]
    ras_axes: tuple[int, int, int]  # the RAS axis (the plan's order) of each stored axis


def read_header(files: list[Path]) -> Header | None:
    """The grid of a case's channel files from their headers (NIfTI only; None for formats
    whose header needs the whole file read)."""
    if not files or any(ending_of(f) not in NIFTI_ENDINGS for f in files):
        return None
    import nibabel as nib

    img = nib.load(str(files[0]))
    shape = tuple(int(s) for s in img.shape[:3])
    channels = sum(int(np.prod(nib.load(str(f)).shape[3:])) for f in files)
    zooms = tuple(float(z) for z in img.header.get_zooms()[:3])
    ras = tuple(int(a) for a in nib.orientations.io_orientation(img.affine)[:, 0])
    return Header(shape, channels, zooms, ras)


def prediction_need(
    head: Header,
    target_spacing: list[float],
    n_classes: int,
    probabilities: bool,
    patch: list[int],
    ensemble: bool = False,
) -> int:
    """Bytes predicting one case holds at its peak (an upper bound: no crop assumed); with
    probabilities, one class at a time on the original grid (predict streams them to their
    file), or every class on both grids for an `ensemble` of configurations (averaged there)."""
    original = int(np.prod(head.shape))
    # each axis at the plan's spacing (in the plan's RAS order), padded to a patch
    grid = [0, 0, 0]
    for n, s, a in zip(head.shape, head.spacing, head.ras_axes, strict=True):
        grid[a] = max(round(n * s / target_spacing[a]), patch[a])
    planned = int(np.prod(grid))
    # the stream's band: one window's depth along the axis where that is the smallest part
    band = planned * min(p / n for p, n in zip(patch, grid, strict=True))
    need = 2 * 4 * head.channels * original  # read as float32, its RAS copy
    need += 2 * 4 * head.channels * planned  # the prepared image, its padded copy
    need += 4 * (n_classes + 1) * band  # the band's logits and weights
    need += planned + 2 * original  # label maps: plan space, original space and its RAS copy
    if probabilities and ensemble:
        need += 4 * n_classes * (planned + 2 * original)
    elif probabilities:  # a class read back at the plan's spacing, resampled, reoriented
        need += 4 * (planned + 3 * original)
    return int(need + OVERHEAD)


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for "none"
            return int(text)
    return None


def memory_limit() -> tuple[int, str]:
    """(bytes this job may use, where that number comes from): the SLURM allocation
    (SLURM_MEM_PER_NODE, or SLURM_MEM_PER_CPU × CPUs; 0, the whole node, adds no limit), the
    cgroup's limit, the machine's available memory, whichever is smallest."""
    import psutil

    limits = [(int(psutil.virtual_memory().available), "the memory available on this machine")]
    cgroup = _cgroup_limit()
    if cgroup:
        limits.append((cgroup, "this job's cgroup memory limit"))
    per_node = os.environ.get("SLURM_MEM_PER_NODE")
    per_cpu, cpus = os.environ.get("SLURM_MEM_PER_CPU"), os.environ.get("SLURM_CPUS_ON_NODE")
    # `sbatch --mem=0` (SLURM_MEM_PER_NODE=0) asks for all of the node's memory: the cgroup's
    # limit and the machine's memory above say how much that is
    if per_node and per_node.isdigit() and int(per_node) > 0:
        limits.append((int(per_node) * 1024**2, f"the SLURM allocation ({per_node} MB a node)"))
    elif per_cpu and per_cpu.isdigit() and int(per_cpu) > 0 and cpus and cpus.isdigit():
        limits.append((int(per_cpu) * int(cpus) * 1024**2,
                       f"the SLURM allocation ({per_cpu} MB × {cpus} CPUs)"))  # fmt: skip
    return min(limits)


def check_prediction_memory(
    cases: list[tuple[str, list[Path]]],
    target_spacing: list[float],
    n_classes: int,
    probabilities: bool,
    patch: list[int],
    ensemble: bool = False,
) -> None:
    """Refuse, before any case is predicted, a case whose prediction needs more memory than
    this job may use, naming the case, the need and the limit."""
    limit, source = memory_limit()
    for case_id, files in cases:
        head = read_header(files)
        if head is None:
            continue
        need = prediction_need(head, target_spacing, n_classes, probabilities, patch, ensemble)
        if need > limit:
            hint = ("; or leave out --probabilities: an ensemble of configurations averages "
                    "every class at full resolution" if probabilities and ensemble
                    else "")  # fmt: skip
            raise VoxjetError(
                f"{files[0]}: predicting case {case_id!r} ({'×'.join(map(str, head.shape))} "
                f"voxels, {head.channels} channel(s), {n_classes} classes) needs about "
                f"{need / GIB:.1f} GiB, more than the {limit / GIB:.1f} GiB of {source}; run "
                f"predict with more memory (the experiment's launch.mem_mb, sbatch --mem)"
                f"{hint}"
            )


def largest_case_need(fingerprint: dict, target_spacing: list[float], n_classes: int,
                      patch: list[int]) -> tuple[str, tuple[int, ...], int]:  # fmt: skip
    """(the dataset's largest case, its voxels along R, A, S, the bytes predicting a case of
    that size needs): from the fingerprint's cropped shapes, so an image's uncropped border
    comes on top."""
    shapes, spacings = fingerprint["shapes"], fingerprint["spacings"]
    ids = fingerprint.get("case_ids") or [f"case {i + 1} of the fingerprint"
                                          for i in range(len(shapes))]  # fmt: skip
    i = int(np.argmax([np.prod(s) for s in shapes]))
    shape = tuple(int(v) for v in shapes[i])
    channels = len(fingerprint.get("channels") or [0])
    head = Header(shape, channels, tuple(float(v) for v in spacings[i]), (0, 1, 2))
    return ids[i], shape, prediction_need(head, target_spacing, n_classes, False, patch)


def check_job_memory(where: str, case_id: str, shape: tuple[int, ...], need: int,
                     mem_mb: int, key: str) -> None:  # fmt: skip
    """Refuse a plan whose evaluation job would be killed predicting its largest case."""
    if need > mem_mb * 1024**2:
        raise VoxjetError(
            f"{where}: predicting case {case_id!r} ({'×'.join(map(str, shape))} voxels after "
            f"cropping) needs about {need / GIB:.1f} GiB, more than the {mem_mb} MB the "
            f"evaluation job is given ({key}); raise {key} (the node must have it), or predict "
            "at a coarser spacing (a 3d_lowres configuration)"
        )
