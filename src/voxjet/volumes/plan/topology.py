"""Network topology from the spacing and the patch: voxjet's planner's rule (`topology`) and
nnU-Net's `get_pool_and_conv_props` (`pool_and_conv_props`, what its ResEnc presets use); both
pool an axis only while its spacing is within 2x of the finest, with kernel 1 along an axis
still too coarse. `nnunet_axes` is nnU-Net's order of voxjet's RAS axes."""

from __future__ import annotations

import math

import numpy as np

MIN_FEATURE = 4  # nnU-Net stops pooling an axis before its feature map falls below this
MIN_EDGE = 4  # nnU-Net's presets: the bottleneck keeps at least this many voxels an axis


def topology(spacing: list[float], patch: list[int], max_levels: int) -> dict:
    """Kernel sizes and strides a level (the first level's stride 1), nnU-Net's rule; as many
    axes as the spacing has (3D, or a 2D configuration's in-plane two)."""
    sp = np.asarray(spacing, float)
    size = np.asarray(patch, int)

    def kernel(s: np.ndarray) -> list[int]:
        return [3 if si <= 2 * s.min() else 1 for si in s]

    kernels, strides = [kernel(sp)], [[1] * len(sp)]
    for _ in range(max_levels):
        can = [bool(sp[i] <= 2 * sp.min() and size[i] // 2 >= MIN_FEATURE) for i in range(len(sp))]
        if not any(can):
            break
        st = [2 if c else 1 for c in can]
        sp, size = sp * st, size // st
        strides.append(st)
        kernels.append(kernel(sp))
    return {"kernels": kernels, "strides": strides}


def divisors(strides: list[list[int]], min_divisor: int = 1) -> list[int]:
    """What each axis of a patch must divide by: the product of its strides (and `min_divisor`,
    so the plan's patch also suits a U-Net of `network_depth` isotropic levels)."""
    prod = np.prod(np.asarray(strides), axis=0)
    return [int(math.lcm(int(p), min_divisor)) for p in prod]


def nnunet_axes(spacing: list[float]) -> list[int]:
    """nnU-Net's order of voxjet's RAS axes: its arrays are (z, y, x) as SimpleITK reads a
    RAS-stored file, then transposed so the coarsest axis (the first of equals) leads."""
    zyx = [2, 1, 0]
    sp = [spacing[a] for a in zyx]
    worst = int(np.argmax(sp))
    return [zyx[worst]] + [a for i, a in enumerate(zyx) if i != worst]


def _pad(shape: list[float], divisor: np.ndarray) -> list[int]:
    # nnU-Net's pad_shape, float sizes (a median between two cases) included
    return [
        int(s + d - s % d - (d if s % d == 0 else 0)) for s, d in zip(shape, divisor, strict=True)
    ]


def pool_and_conv_props(
    spacing: list[float], patch: list[float], min_edge: int = MIN_EDGE
) -> tuple[list[list[int]], list[list[int]], list[int], list[int]]:
    """nnU-Net's `get_pool_and_conv_props` (unbounded depth): pool every axis within 2× of the
    finest spacing while its feature map keeps 2×`min_edge` voxels (3× when only one axis
    pools), kernels 3 once an axis is within 2× of the finest, 1 before. Returns (strides,
    kernels, the patch padded to the divisors, the divisors)."""
    dim = len(spacing)
    cur_sp, cur_size = list(map(float, spacing)), list(map(float, patch))
    strides, kernels = [[1] * dim], []
    pools, kernel = [0] * dim, [1] * dim
    while True:
        valid = [i for i in range(dim) if cur_size[i] >= 2 * min_edge]
        if not valid:
            break
        finest = min(cur_sp[i] for i in valid)
        valid = [i for i in valid if cur_sp[i] / finest < 2]
        if len(valid) == 1 and cur_size[valid[0]] < 3 * min_edge:
            break
        if not valid:
            break
        for d in range(dim):
            if kernel[d] != 3 and cur_sp[d] / min(cur_sp) < 2:
                kernel[d] = 3
        step = [1] * dim
        for v in valid:
            step[v] = 2
            pools[v] += 1
            cur_sp[v] *= 2
            cur_size[v] = math.ceil(cur_size[v] / 2)
        strides.append(step)
        kernels.append(list(kernel))
    divisor = 2 ** np.array(pools)
    kernels.append([3] * dim)  # the bottleneck's
    return strides, kernels, _pad(list(patch), divisor), [int(d) for d in divisor]
