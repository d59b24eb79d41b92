"""Building blocks the jet taggers share: MLPs, in-model standardisation (the statistics are
buffers, so a checkpoint is self-contained) and the lookup of geometry features by name."""

from __future__ import annotations

import torch
from torch import nn

from voxjet.errors import VoxjetError


def mlp(sizes: list[int], final_act: bool = True) -> nn.Sequential:
    """Linear layers of the given widths with ReLUs between (and after the last if final_act)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if final_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def feature_indices(feature_names: list[str], needed: tuple[str, ...], model: str) -> list[int]:
    """Positions of the features a model computes geometry from; a clear error if absent."""
    missing = [n for n in needed if n not in feature_names]
    if missing:
        raise VoxjetError(
            f"model {model!r} needs particle features {missing}: add them to the "
            "dataset's jets.particle_features"
        )
    return [feature_names.index(n) for n in needed]


class Standardize(nn.Module):
    """(x - centre) / scale with statistics stored as buffers (voxjet.jets.robust: the median
    and the 16-84% spread); with `clip`, clipped to ±clip, and with `missing`, a feature's
    declared missing value (None: none) replaced by its centre first."""

    def __init__(self, mean: list[float], std: list[float], clip: float | None = None,
                 missing: list[float | None] | None = None) -> None:  # fmt: skip
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))
        self.clip = clip
        self.has_missing = missing is not None and any(m is not None for m in missing)
        if self.has_missing:
            values = [float("nan") if m is None else m for m in missing]
            self.register_buffer("missing", torch.tensor(values, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_missing:
            x = torch.where(x == self.missing, self.mean.to(x.dtype), x)
        z = (x - self.mean) / self.std
        return z.clamp(-self.clip, self.clip) if self.clip is not None else z
