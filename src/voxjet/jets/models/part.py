"""Particle Transformer (Qu, Li, Qian 2022): self-attention over particles with pairwise
interaction features (ln Δ, ln kT, ln z, ln m²) added to the attention logits, then
class-attention blocks that pool into a class token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voxjet.jets.model_inputs import PART_PAIR_FEATURES
from voxjet.jets.models.layers import Standardize, feature_indices

_EPS = 1e-8


def pairwise_features(deta: torch.Tensor, dphi: torch.Tensor, pt: torch.Tensor) -> torch.Tensor:
    """[B, 4, P, P]: ln Δ, ln kT, ln z, ln m² of every particle pair (massless particles)."""
    d_eta = deta.unsqueeze(-1) - deta.unsqueeze(-2)
    d_phi = torch.remainder(dphi.unsqueeze(-1) - dphi.unsqueeze(-2) + torch.pi, 2 * torch.pi)
    d_phi = d_phi - torch.pi
    delta = torch.sqrt(d_eta**2 + d_phi**2 + _EPS)
    pa, pb = pt.unsqueeze(-1), pt.unsqueeze(-2)
    ptmin = torch.minimum(pa, pb)
    kt = ptmin * delta
    z = ptmin / (pa + pb + _EPS)
    # cosh as exponentials: ONNX has no cosh operator on the CPU runtime
    cosh = 0.5 * (torch.exp(d_eta) + torch.exp(-d_eta))
    m2 = 2 * pa * pb * (cosh - torch.cos(d_phi))
    return torch.stack(
        [torch.log(delta), torch.log(kt + _EPS), torch.log(z + _EPS), torch.log(m2 + _EPS)], dim=1
    )


class _Attention(nn.Module):
    """Multi-head attention with an additive bias [B·H, Q, K], written out (scaled dot-product)
    so that it exports to ONNX and torch.export with any batch and particle count."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)

    def forward(self, q: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, nq, d = q.shape
        h = self.heads

        def split(x: torch.Tensor) -> torch.Tensor:  # [B, N, D] -> [B, H, N, D/H]
            return x.reshape(b, x.shape[1], h, d // h).transpose(1, 2)

        att = F.scaled_dot_product_attention(
            split(self.q(q)),
            split(self.k(kv)),
            split(self.v(kv)),
            attn_mask=bias.reshape(b, h, nq, kv.shape[1]),
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.out(att.transpose(1, 2).reshape(b, nq, d))


class _Block(nn.Module):
    """Pre-norm attention block; `bias` [B*H, Q, K] is added to the attention logits."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * dim, dim)
        )

    def forward(self, q: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        kvn = self.ln1(kv)
        qn = kvn if q is kv else self.ln1(q)
        q = q + self.attn(qn, kvn, bias)
        return q + self.mlp(self.ln2(q))


class ParT(nn.Module):
    """Particle Transformer sized by config (the paper: dim 128, 8 heads, 8 + 2 blocks)."""

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        particle_mean: list[float],
        particle_std: list[float],
        feature_names: list[str],
        dim: int = 128,
        heads: int = 8,
        blocks: int = 8,
        class_blocks: int = 2,
        pair_dim: int = 64,
        dropout: float = 0.1,
        input_clip: float | None = None,
        particle_missing: list[float | None] | None = None,
    ) -> None:
        super().__init__()
        self.norm = Standardize(particle_mean, particle_std, input_clip, particle_missing)
        self.idx = feature_indices(feature_names, PART_PAIR_FEATURES, "part")
        self.heads = heads
        self.embed = nn.Sequential(
            nn.LayerNorm(n_features), nn.Linear(n_features, dim), nn.GELU(), nn.Linear(dim, dim)
        )
        self.pair_embed = nn.Sequential(
            nn.BatchNorm2d(4), nn.Conv2d(4, pair_dim, 1), nn.GELU(), nn.Conv2d(pair_dim, heads, 1)
        )
        self.blocks = nn.ModuleList(_Block(dim, heads, dropout) for _ in range(blocks))
        self.cls_blocks = nn.ModuleList(_Block(dim, heads, 0.0) for _ in range(class_blocks))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, n_classes))

    def forward(self, particles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, p, _ = particles.shape
        deta, dphi, ptlog = (particles[..., i] for i in self.idx)
        u = pairwise_features(deta, dphi, torch.exp(ptlog))
        pad = ~mask.bool()
        bias = self.pair_embed(u)  # [B, H, P, P]
        bias = bias.masked_fill(pad[:, None, None, :], float("-inf"))
        bias = bias.reshape(b * self.heads, p, p)
        x = self.embed(self.norm(particles)) * mask.unsqueeze(-1)
        for block in self.blocks:
            x = block(x, x, bias) * mask.unsqueeze(-1)
        cls = self.cls_token.expand(b, 1, -1)
        keypad = torch.cat([torch.zeros(b, 1, dtype=torch.bool, device=pad.device), pad], 1)
        cbias = torch.zeros(b, self.heads, 1, p + 1, device=x.device, dtype=x.dtype)
        cbias = cbias.masked_fill(keypad[:, None, None, :], float("-inf"))
        cbias = cbias.reshape(b * self.heads, 1, p + 1)
        for block in self.cls_blocks:
            cls = block(cls, torch.cat([cls, x], 1), cbias)
        return self.head(cls.squeeze(1))
