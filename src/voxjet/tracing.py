"""What every export shares: a network traced to TorchScript, saved atomically and loaded back
(what is checked is what was written), and the check of an exported model's outputs against
the eager model's before it is kept."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path

TOLERANCE = 1e-4  # max |exported − eager| accepted (relative above 1)


def trace_saved(model: nn.Module, example: tuple, path: Path) -> torch.jit.ScriptModule:
    """`model` traced on `example` inputs, written to `path` atomically, and loaded back."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example, check_trace=False)
    with atomic_path(path) as tmp:
        torch.jit.save(traced, str(tmp))
    return torch.jit.load(str(path))


def deviation(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference between two outputs: relative where the eager value's size is
    above 1 (a mass in GeV), absolute below."""
    return float((np.abs(got - want) / np.maximum(np.abs(want), 1)).max())


def refuse_deviation(what: str, worst: float) -> None:
    """Stop an export whose outputs differ from the eager model's by more than TOLERANCE."""
    if worst > TOLERANCE:
        raise VoxjetError(f"export {what}: differs from the eager model by {worst:.2e} (more "
                          f"than {TOLERANCE}, relative above 1); not kept")  # fmt: skip
