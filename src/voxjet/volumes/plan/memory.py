"""What a network's training step costs in memory, estimated for the network actually built
on the meta device (no memory used): the elements its layers output in a forward pass — what
autograd keeps for backward — plus weights, gradients and the optimiser's moments."""

from __future__ import annotations

import copy

import torch

GIB = 1024**3
# bytes a layer-output element costs in a training step: measured on CPU against the peak a
# forward and backward pass adds (tests/memory_probe.py; float32, InstanceNorm) it is 5.3-5.9
# for DynUNets and 4.3-7.1 for MONAI UNets of the sizes planned; the largest, so the estimate
# errs on the high side
BYTES_PER_OUTPUT = 7.0


def layer_output_elements(model, in_channels: int, patch: list[int]) -> float:
    """Elements every leaf layer outputs in one forward pass of one sample (meta device), an
    in-place layer's output (the same memory as its input) not counted twice."""
    seen: list[int] = []

    def count(module, inputs, output) -> None:
        if getattr(module, "inplace", False):
            return
        for o in output if isinstance(output, tuple | list) else [output]:
            if torch.is_tensor(o):
                seen.append(o.numel())

    meta = copy.deepcopy(model).to("meta").train()
    hooks = [m.register_forward_hook(count) for m in meta.modules() if not list(m.children())]
    with torch.no_grad():
        meta(torch.empty(1, in_channels, *patch, device="meta"))
    for h in hooks:
        h.remove()
    return float(sum(seen))


def estimate_bytes(model, in_channels: int, patch: list[int], batch: int,
                   gpu: bool = True) -> float:  # fmt: skip
    """Peak bytes of a training step of `model` on `batch` patches: layer outputs kept for
    backward, 16 bytes a parameter (weights, gradients, Adam's two moments), and on a GPU about
    1 GiB of CUDA context and workspaces."""
    acts = batch * layer_output_elements(model, in_channels, patch) * BYTES_PER_OUTPUT
    params = sum(p.numel() for p in model.parameters()) * 16
    return acts + params + (GIB if gpu else 0)
