"""`train.compile`: the model a training step calls, compiled with torch.compile (inductor),
and the way back to eager, with the reason, when torch cannot compile it."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch
from torch import nn


def compile_wanted(setting: bool | None, device: torch.device) -> bool:
    """Whether to compile: as configured, else on CUDA only (on CPU the compile takes longer
    than the short runs it would speed up)."""
    return device.type == "cuda" if setting is None else bool(setting)


def compile_errors() -> tuple[type[BaseException], ...]:
    """What torch raises when it cannot trace or compile a model (not the model's own errors,
    which surface again, unwrapped, when the step reruns eagerly)."""
    from torch._dynamo.exc import TorchDynamoException

    errors: list[type[BaseException]] = [TorchDynamoException]
    try:
        from torch._inductor.exc import InductorError

        errors.append(InductorError)
    except ImportError:  # older torch: inductor's failures are dynamo's BackendCompilerFailed
        pass
    return tuple(errors)


def first_line(error: BaseException) -> str:
    """An error's message up to its first complete line (torch's often ends its first line
    with "raised:" and gives the reason on the next), prefixed with its type."""
    said = []
    for line in (ln.strip() for ln in str(error).splitlines() if ln.strip()):
        said.append(line)
        if not line.endswith(":") or len(said) == 3:
            break
    return f"{type(error).__name__}: {' '.join(said)}"[:400]


@dataclass
class CompiledModule:
    """The eager module and its compiled form; `module` is what the step calls now."""

    eager: nn.Module
    compiled: nn.Module | None = None
    announce: bool = True
    first_step_s: float | None = None
    fallback: str | None = None
    _started: float | None = field(default=None, repr=False)

    @classmethod
    def wrap(cls, module: nn.Module, announce: bool, **options) -> CompiledModule:
        """Compile `module` lazily (torch compiles at the first call)."""
        return cls(module, torch.compile(module, **options), announce)

    @property
    def module(self) -> nn.Module:
        """The compiled module until a fallback, then the eager one."""
        return self.eager if self.compiled is None else self.compiled

    def step_started(self) -> None:
        """Before a step: time the first one, which compiles."""
        if self.compiled is not None and self.first_step_s is None:
            self._started = time.perf_counter()

    def step_done(self) -> None:
        """After a step: say once how long the compiling step took."""
        if self._started is not None and self.first_step_s is None:
            self.first_step_s = time.perf_counter() - self._started
            if self.announce:
                print(f"train.compile: compiled the training step in {self.first_step_s:.1f} s "
                      "(its first step, compile included)", file=sys.stderr)  # fmt: skip

    def fall_back(self, error: BaseException) -> None:
        """Use the eager module from now on, saying why."""
        self.compiled, self.fallback = None, first_line(error)
        if self.announce:
            print(f"train.compile: fell back to eager ({self.fallback}); set train.compile: "
                  "false to skip the attempt", file=sys.stderr)  # fmt: skip
