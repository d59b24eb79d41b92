"""Several arrays laid out in one byte buffer (what a batch slab holds): each array's start and
size, aligned."""

from __future__ import annotations

import math

import numpy as np

Specs = dict[str, tuple[tuple[int, ...], np.dtype]]


def pack_layout(specs: Specs, align: int = 64) -> tuple[dict[str, tuple[int, int]], int]:
    """Where each array of `specs` sits in one byte buffer: {key: (start, nbytes)}, each start
    aligned (a cache line by default), and the buffer's size."""
    layout, total = {}, 0
    for k, (shape, dtype) in specs.items():
        n = math.prod(shape) * np.dtype(dtype).itemsize
        layout[k] = (total, n)
        total += -(-n // align) * align
    return layout, total
