"""Jet taggers that read padded, masked particle clouds. Inputs are standardised inside the
model (buffers from index.json) so a checkpoint is self-contained."""

from __future__ import annotations

import torch
from torch import nn


def _mlp(sizes: list[int], final_act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if final_act or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def feature_indices(feature_names: list[str], needed: tuple[str, ...], model: str) -> list[int]:
    """Positions of the features a model computes geometry from; a clear error if absent."""
    from voxjet.errors import VoxjetError

    missing = [n for n in needed if n not in feature_names]
    if missing:
        raise VoxjetError(
            f"model {model!r} needs particle features {missing}: add them to the "
            "dataset's jets.particle_features"
        )
    return [feature_names.index(n) for n in needed]


class Standardize(nn.Module):
    """(x - mean) / std with statistics stored as buffers."""

    def __init__(self, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


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
    ) -> None:
        super().__init__()
        self.norm = Standardize(particle_mean, particle_std)
        self.phi = _mlp([n_features, *phi_sizes])
        self.f = nn.Sequential(
            _mlp([phi_sizes[-1], *f_sizes]), nn.Dropout(dropout), nn.Linear(f_sizes[-1], n_classes)
        )

    def forward(self, particles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.phi(self.norm(particles)) * mask.unsqueeze(-1).to(particles.dtype)
        return self.f(h.sum(dim=1))


def build_model(name: str, **kwargs) -> nn.Module:
    """A jet model by its config name: pfn, particlenet or part."""
    from voxjet.jets.part import ParT
    from voxjet.jets.particlenet import ParticleNet

    models = {"pfn": PFN, "particlenet": ParticleNet, "part": ParT}
    if name not in models:
        raise ValueError(f"unknown jet model {name!r}; known: {sorted(models)}")
    return models[name](**kwargs)
