"""Extra constituent collections (secondary vertices, leptons, …) joined to the particles as one
set, so every voxjet tagger (PFN, ParticleNet, ParT) reads several collections unchanged: each
object of a collection becomes a row in the particles' feature space. Features both have by
name after the prefix (`sv_deta` ↔ `part_deta`, `sv_pt_log` ↔ `part_pt_log`) are copied as
they are — so ParticleNet's neighbours and ParT's pair features see the object's true
direction and momentum — and the rest are a learned linear map of the collection's own
standardised features (which also tells the network which collection a row came from)."""

from __future__ import annotations

import torch
from torch import nn


def _suffix(name: str) -> str:
    return name.split("_", 1)[-1]


class CollectionEmbedding(nn.Module):
    """A tagger fed (particles, mask, x_1, mask_1, …): each collection's objects mapped into the
    particle features and appended to the particles before the tagger's own layers."""

    def __init__(self, base: nn.Module, feature_names: list[str], particle_mean: list[float],
                 particle_std: list[float], collections: list[dict],
                 clip: float | None = None) -> None:  # fmt: skip
        super().__init__()
        self.clip = clip  # the collections' standardised inputs, clipped as the particles
        self.base = base
        self.names = [c["name"] for c in collections]
        self.proj = nn.ModuleList()
        f = len(feature_names)
        mine = {_suffix(n): j for j, n in enumerate(feature_names)}
        for k, c in enumerate(collections):
            theirs = {_suffix(n): i for i, n in enumerate(c["features"])}
            shared = [s for s in mine if s in theirs]
            copied = [mine[s] for s in shared]
            learned = [j for j in range(f) if j not in copied]
            # rows are built as [copied | learned] columns, then put in the particles' order
            order = torch.argsort(torch.tensor(copied + learned, dtype=torch.long))
            self.register_buffer(f"src_{k}", torch.tensor([theirs[s] for s in shared],
                                                          dtype=torch.long))  # fmt: skip
            self.register_buffer(f"order_{k}", order)
            self.register_buffer(f"mean_{k}", torch.tensor(c["mean"], dtype=torch.float32))
            self.register_buffer(f"std_{k}", torch.tensor(c["std"], dtype=torch.float32))
            pm = torch.tensor(particle_mean, dtype=torch.float32)[learned]
            ps = torch.tensor(particle_std, dtype=torch.float32)[learned]
            # the learned columns land in the particles' raw units: the tagger standardises them
            # back to what the map produced
            self.register_buffer(f"pmean_{k}", pm)
            self.register_buffer(f"pstd_{k}", ps)
            self.proj.append(nn.Linear(len(c["features"]), len(learned)))

    def forward(self, particles: torch.Tensor, mask: torch.Tensor, *extra: torch.Tensor):
        rows, masks = [particles], [mask.bool()]
        for k, proj in enumerate(self.proj):
            x, m = extra[2 * k], extra[2 * k + 1].bool()
            z = (x - getattr(self, f"mean_{k}")) / getattr(self, f"std_{k}")
            if self.clip is not None:
                z = z.clamp(-self.clip, self.clip)
            learned = proj(z) * getattr(self, f"pstd_{k}") + getattr(self, f"pmean_{k}")
            copied = x.index_select(-1, getattr(self, f"src_{k}"))
            row = torch.cat([copied, learned], -1).index_select(-1, getattr(self, f"order_{k}"))
            rows.append(row * m.unsqueeze(-1).to(row.dtype))
            masks.append(m)
        return self.base(torch.cat(rows, 1), torch.cat(masks, 1))
