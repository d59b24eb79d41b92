"""Learning-rate schedules as pure functions of the step (multipliers of the base rate)."""

from __future__ import annotations

import math


def warmup_cosine(step: int, total: int, warmup: int, floor: float = 0.0) -> float:
    """Linear warm-up to 1, then cosine decay to `floor` at `total`."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def poly(step: int, total: int, exponent: float = 0.9) -> float:
    """nnU-Net's polynomial decay: (1 - step/total) ** 0.9."""
    return (1 - min(step, total) / max(1, total)) ** exponent


def multiplier(name: str, step: int, total: int, warmup: int) -> float:
    """The named schedule's multiplier at `step`."""
    if name == "cosine":
        return warmup_cosine(step, total, warmup)
    if name == "poly":
        return poly(step, total)
    if name == "constant":
        return 1.0
    raise ValueError(f"unknown schedule {name!r}")
