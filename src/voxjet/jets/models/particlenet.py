"""ParticleNet (Qu & Gouskos 2020): EdgeConv blocks on k-nearest neighbours, first in
(Δη, Δφ), then in the learned feature space; padded particles are never anyone's neighbour."""

from __future__ import annotations

import torch
from torch import nn

from voxjet.jets.model_inputs import PARTICLENET_POINTS
from voxjet.jets.models.layers import Standardize, feature_indices

_FAR = 1e9  # padded particles are moved this far away so kNN never picks them


def knn(points: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [B, P, k] of each point's k nearest other points; points is [B, D, P]."""
    inner = -2 * torch.matmul(points.transpose(1, 2), points)
    sq = (points**2).sum(dim=1, keepdim=True)
    dist = sq.transpose(1, 2) + inner + sq
    return dist.topk(k + 1, dim=-1, largest=False)[1][:, :, 1:]


def gather_neighbours(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Features [B, C, P, k] of each point's neighbours; x is [B, C, P]."""
    b, c, p = x.shape
    k = idx.shape[-1]
    flat = (idx + torch.arange(b, device=x.device).view(-1, 1, 1) * p).reshape(-1)
    return x.transpose(1, 2).reshape(b * p, c)[flat].view(b, p, k, c).permute(0, 3, 1, 2)


class EdgeConv(nn.Module):
    """h_i = mean_j MLP([x_i, x_j - x_i]) over the k nearest j, plus a shortcut."""

    def __init__(self, k: int, c_in: int, channels: tuple[int, ...]) -> None:
        super().__init__()
        self.k = k
        layers: list[nn.Module] = []
        c = 2 * c_in
        for out in channels:
            layers += [nn.Conv2d(c, out, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
            c = out
        self.mlp = nn.Sequential(*layers)
        self.shortcut = nn.Sequential(
            nn.Conv1d(c_in, channels[-1], 1, bias=False), nn.BatchNorm1d(channels[-1])
        )
        self.act = nn.ReLU()

    def forward(self, points: torch.Tensor, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        idx = knn(points, min(self.k, points.shape[-1] - 1))
        nb = gather_neighbours(x, idx)
        centre = x.unsqueeze(-1).expand_as(nb)
        h = self.mlp(torch.cat([centre, nb - centre], dim=1)).mean(dim=-1)
        return self.act(h + self.shortcut(x)) * mask


class ParticleNet(nn.Module):
    """EdgeConv blocks, fusion, masked average pooling, then a classifier."""

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        particle_mean: list[float],
        particle_std: list[float],
        feature_names: list[str],
        k: int = 16,
        conv_channels: tuple[tuple[int, ...], ...] = (
            (64, 64, 64),
            (128, 128, 128),
            (256, 256, 256),
        ),
        fc_size: int = 256,
        dropout: float = 0.1,
        points: tuple[str, ...] = PARTICLENET_POINTS,
        input_clip: float | None = None,
        particle_missing: list[float | None] | None = None,
    ) -> None:
        super().__init__()
        self.norm = Standardize(particle_mean, particle_std, input_clip, particle_missing)
        # the coordinates neighbours are found in (a weaver config's pf_points group's)
        self.coords = feature_indices(feature_names, tuple(points), "particlenet")
        self.input_bn = nn.BatchNorm1d(n_features)
        blocks, c = [], n_features
        for ch in conv_channels:
            blocks.append(EdgeConv(k, c, tuple(ch)))
            c = ch[-1]
        self.blocks = nn.ModuleList(blocks)
        fused = sum(ch[-1] for ch in conv_channels)
        self.fusion = nn.Sequential(
            nn.Conv1d(fused, fc_size, 1, bias=False), nn.BatchNorm1d(fc_size), nn.ReLU()
        )
        self.head = nn.Sequential(
            nn.Linear(fc_size, fc_size),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(fc_size, n_classes),
        )

    def forward(self, particles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(1).to(particles.dtype)  # [B, 1, P]
        shift = (1 - m) * _FAR
        points = particles[..., self.coords].transpose(1, 2) * m + shift
        x = self.input_bn(self.norm(particles).transpose(1, 2)) * m
        outs = []
        for i, block in enumerate(self.blocks):
            x = block(points if i == 0 else x * m + shift, x, m)
            outs.append(x)
        h = self.fusion(torch.cat(outs, dim=1)) * m
        pooled = h.sum(-1) / m.sum(-1).clamp(min=1)
        return self.head(pooled)
