"""Fully sharded data parallelism (torch's FSDP2, `fully_shard`): each process holds a 1/N share
of every parameter, its gradient and its optimiser state, gathered block by block for the
forward and backward passes, where DDP holds all of them in every process.

The units sharded are a model's natural blocks, the entries of its ModuleLists (a transformer's
blocks, a U-Net's stages), then the model itself (what is left: embeddings, heads). States are
saved whole (`full_state_dict`): a checkpoint and model.pt of an FSDP run are those of a DDP run,
read by evaluation, predict and export alike, and resumable with any number of processes' shards."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from voxjet.distributed.runtime import Runtime

OPTIMIZER_FORMAT = "fqn-full"  # a checkpoint's optimiser state keyed by parameter name, whole


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks sharded one by one: every entry of the model's ModuleLists (outermost lists
    only: a block's own sub-lists stay inside it)."""
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(child, nn.ModuleList):
                units.extend(m for m in child if any(p.requires_grad for p in m.parameters()))
            else:
                visit(child)

    visit(model)
    return units


def mixed_precision(device: torch.device) -> Any:
    """bf16 parameters and fp32 gradient reduction where the device computes in bf16 (CUDA
    from Ampere on), else None: full precision."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def shard_model(model: nn.Module, rt: Runtime, units: list[nn.Module] | None = None) -> nn.Module:
    """`model` fully sharded over the job's processes, in place: `units` (default
    shard_units'), then the rest."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    policy = mixed_precision(rt.device)
    kw = {"mesh": mesh, **({"mp_policy": policy} if policy is not None else {})}
    for unit in shard_units(model) if units is None else units:
        fully_shard(unit, **kw)
    fully_shard(model, **kw)
    return model


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on every process, on the CPU (a collective: every
    process calls it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return {k: v.detach().cpu() for k, v in get_model_state_dict(model, options=_options()).items()}


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's whole state keyed by parameter name (a collective)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return _to_cpu(get_optimizer_state_dict(model, optimizer, options=_options()))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                         state: dict[str, Any]) -> None:  # fmt: skip
    """A whole, name-keyed optimiser state (full_optimizer_state's) into the sharded optimiser:
    each process keeps its share."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=_options())


def named_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An unsharded model's optimiser state keyed by parameter name (what a resumed run holds
    before its model is sharded)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options())


def _to_cpu(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
