"""Particle Flow Network / Deep Sets (Komiske, Metodiev, Thaler 2019)."""

from __future__ import annotations

import torch
from torch import nn

from voxjet.jets.models.layers import Standardize, mlp


class PFN(nn.Module):
    """Particle Flow Network / Deep Sets (Komiske, Metodiev, Thaler 2019): a per-particle
    network, a masked sum (permutation-invariant, blind to padding), then a classifier."""

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        particle_mean: list[float],
        particle_std: list[float],
        phi_sizes: tuple[int, ...] = (128, 128, 128),
        f_sizes: tuple[int, ...] = (128, 128),
        dropout: float = 0.0,
        feature_names: list[str] | None = None,
        input_clip: float | None = None,
        particle_missing: list[float | None] | None = None,
    ) -> None:
        super().__init__()
        self.norm = Standardize(particle_mean, particle_std, input_clip, particle_missing)
        self.phi = mlp([n_features, *phi_sizes])
        self.f = nn.Sequential(
            mlp([phi_sizes[-1], *f_sizes]), nn.Dropout(dropout), nn.Linear(f_sizes[-1], n_classes)
        )

    def forward(self, particles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.phi(self.norm(particles)) * mask.unsqueeze(-1).to(particles.dtype)
        return self.f(h.sum(dim=1))
