"""A U-Net (MONAI's UNet or DynUNet) cut into K pipeline stages that share its parameters.

MONAI's UNet nests `Sequential(down, SkipConnection(inner), up)`; flattened, it is the op list
down_1 … down_L, bottom, up_L … up_1 where up_i sees `cat(h_i, z)` and h_i is down_i's output.
DynUNet flattens to input block and down-samplings (each a skip), bottleneck, up-samplings
that take (z, skip), and the output block.
A stage runs a contiguous range of ops; what crosses a cut is the running activation plus the
skip tensors that later ups still need, passed as extra tensors between stages. The cuts are
placed so that the activation memory each stage keeps for backward (estimated on the meta
device, no real memory) is as even as possible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from monai.networks.layers.simplelayers import SkipConnection
from torch import nn

from voxjet.errors import VoxjetError


@dataclass(frozen=True)
class Op:
    """One step of the flattened U-Net: 'down', 'bottom' or 'up'."""

    kind: str
    module: nn.Module


def unet_ops(unet: nn.Module) -> list[Op]:
    """The U-Net's blocks in execution order (the modules are the U-Net's own)."""
    seq = getattr(unet, "model", unet)
    downs, ups = [], []
    while isinstance(seq, nn.Sequential) and len(seq) == 3 and isinstance(seq[1], SkipConnection):
        if seq[1].mode != "cat":
            raise VoxjetError(f"U-Net skip mode {seq[1].mode!r} cannot be pipelined (cat only)")
        downs.append(seq[0])
        ups.append(seq[2])
        seq = seq[1].submodule
    if not downs:
        raise VoxjetError("not a MONAI U-Net (no Sequential(down, SkipConnection, up) levels)")
    return (
        [Op("down", m) for m in downs] + [Op("bottom", seq)] + [Op("up", m) for m in reversed(ups)]
    )


def dynunet_ops(net: nn.Module) -> list[Op]:
    """DynUNet's blocks in execution order (deep supervision off: one output)."""
    if getattr(net, "deep_supervision", False):
        raise VoxjetError("a DynUNet with deep supervision has several outputs; it cannot be "
                          "cut into pipeline stages")  # fmt: skip
    downs = [net.input_block, *net.downsamples]
    return (
        [Op("down", m) for m in downs]
        + [Op("bottom", net.bottleneck)]
        + [Op("upcall", m) for m in net.upsamples]
        + [Op("out", net.output_block)]
    )


def network_ops(net: nn.Module) -> list[Op]:
    """The op list of a MONAI UNet or DynUNet."""
    from monai.networks.nets import DynUNet

    return dynunet_ops(net) if isinstance(net, DynUNet) else unet_ops(net)


def run_ops(ops: list[Op], z: torch.Tensor, skips: list[torch.Tensor]) -> torch.Tensor:
    """Apply ops to the running activation `z`; `skips` (a stack) is updated in place."""
    for op in ops:
        if op.kind == "down":
            z = op.module(z)
            skips.append(z)
        elif op.kind in ("bottom", "out"):
            z = op.module(z)
        elif op.kind == "upcall":
            z = op.module(z, skips.pop())
        else:
            z = op.module(torch.cat([skips.pop(), z], dim=1))
    return z


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous. The gradient of a skip tensor
    comes out of `torch.cat`'s backward as a strided view, and sending a non-contiguous tensor
    to the previous stage fails on gloo."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class UNetStage(nn.Module):
    """Ops [start, stop) of a flattened U-Net. Takes (z, *skips), returns (z, *skips) — or the
    network output alone when it is the last stage."""

    def __init__(self, ops: list[Op], start: int, stop: int) -> None:
        super().__init__()
        self.kinds = [op.kind for op in ops[start:stop]]
        self.blocks = nn.ModuleList(op.module for op in ops[start:stop])
        self.last = stop == len(ops)

    def forward(self, *tensors: torch.Tensor):
        z, *skips = (_ContiguousGrad.apply(t) for t in tensors)
        z = run_ops([Op(k, m) for k, m in zip(self.kinds, self.blocks, strict=True)], z, skips)
        return z if self.last else (z, *skips)


def op_costs(ops: list[Op], in_channels: int, patch: list[int]) -> list[float]:
    """Activation elements each op keeps for backward (the outputs of its leaf layers, and an
    up op's concatenated input) for one sample of `patch`, measured on the meta device."""
    costs: list[float] = []
    seen: list[int] = []

    def count(module, inputs, output) -> None:
        seen.append(output.numel())

    z = torch.empty(1, in_channels, *patch, device="meta")
    skips: list[torch.Tensor] = []
    for op in ops:
        meta = _meta_copy(op.module)
        hooks = [m.register_forward_hook(count) for m in meta.modules() if not list(m.children())]
        seen.clear()
        # an up op's first layer also keeps its input, the concatenation (skip, z)
        cat = skips[-1].numel() + z.numel() if op.kind in ("up", "upcall") else 0
        z = run_ops([Op(op.kind, meta)], z, skips)
        for h in hooks:
            h.remove()
        costs.append(float(sum(seen) + cat))
    return costs


def _meta_copy(module: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(module).to("meta")


def balanced_cuts(costs: list[float], k: int) -> list[int]:
    """Boundaries 0 = b_0 < b_1 < … < b_k = n splitting `costs` into k contiguous parts with
    the smallest possible largest part (dynamic programming; n is a few dozen at most)."""
    n = len(costs)
    if not 1 <= k <= n:
        raise VoxjetError(f"cannot cut a network of {n} blocks into {k} pipeline stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    arg = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for p in range(j - 1, i):
                v = max(best[j - 1][p], prefix[i] - prefix[p])
                if v < best[j][i]:
                    best[j][i], arg[j][i] = v, p
    cuts = [n]
    for j in range(k, 0, -1):
        cuts.append(arg[j][cuts[-1]])
    return cuts[::-1]


def split_network(net: nn.Module, k: int, in_channels: int, patch: list[int]) -> list[UNetStage]:
    """The network as k stages balanced by activation memory (stage i's parameters are the
    network's own, so training the stages trains it)."""
    ops = network_ops(net)
    cuts = balanced_cuts(op_costs(ops, in_channels, patch), k)
    return [UNetStage(ops, a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
