"""Batches moved to the training device one step ahead: on CUDA each tensor is copied into a
reused pinned host buffer, sent on a side stream while the current step runs, and the step's
stream waits on an event (no host synchronisation). On the CPU the same code runs with plain
buffers and no streams, which is how the tests exercise it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from typing import Any

import torch


class _Staging:
    """One batch's host buffers (pinned on CUDA), grown as needed and reused once the copy
    that read them has finished."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.storage: dict[str, torch.Tensor] = {}
        self.done: Any = None  # the event of the last copy that read these buffers

    def fill(self, key: str, t: torch.Tensor) -> torch.Tensor:
        """`t` copied into this key's buffer (a view of its first numel elements)."""
        buf = self.storage.get(key)
        n = t.numel()
        if buf is None or buf.dtype != t.dtype or buf.numel() < n:
            # some headroom: unpadded jet batches vary a little in size from batch to batch
            buf = torch.empty(max(n, int(n * 1.25)), dtype=t.dtype, pin_memory=self.pin)
            self.storage[key] = buf
        view = buf[:n].view(t.shape)
        view.copy_(t)
        return view


class DeviceFeed:
    """Iterate `batches` (dicts of tensors, or None at an epoch's end) with the tensors under
    `keys` on `device`, the next batch's copy under way while the current one is used; other
    entries (e.g. where the items came from) stay where they are."""

    def __init__(
        self,
        device: torch.device,
        keys: Iterable[str] | None = None,
        staging: bool | None = None,
        ahead: int = 1,
    ) -> None:
        self.device = device
        self.keys = None if keys is None else frozenset(keys)
        self.cuda = device.type == "cuda"
        # staging through pinned buffers is what makes a CUDA copy asynchronous; on the CPU it
        # is only a copy, used when asked (the tests compare it with the plain path)
        self.staging = self.cuda if staging is None else staging
        self.ahead = max(0, ahead)
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.ring = [_Staging(pin=self.cuda) for _ in range(self.ahead + 1)]
        self._sent = 0

    def _moves(self, key: str, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and (self.keys is None or key in self.keys)

    def send(self, batch: dict | None) -> tuple[dict | None, Any]:
        """Start moving one batch; returns it (its tensors on the device once the event has
        completed) and that event (None on the CPU)."""
        if batch is None:
            return None, None
        slot = self.ring[self._sent % len(self.ring)]
        self._sent += 1
        if slot.done is not None:  # its buffers are still being read by an earlier copy
            slot.done.synchronize()
        out = dict(batch)
        with torch.cuda.stream(self.stream) if self.cuda else nullcontext():
            for k, v in batch.items():
                if not self._moves(k, v):
                    continue
                src = slot.fill(k, v) if self.staging else v
                out[k] = src.to(self.device, non_blocking=self.cuda, copy=self.staging)
            event = None
            if self.cuda:
                event = torch.cuda.Event()
                event.record(self.stream)
        slot.done = event
        return out, event

    def receive(self, sent: tuple[dict | None, Any]) -> dict | None:
        """A sent batch, ready for the step: its stream waits for the copy, and the caching
        allocator is told the step's stream uses the tensors."""
        batch, event = sent
        if batch is None:
            return None
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for k, v in batch.items():
                if self._moves(k, v):
                    v.record_stream(current)
        return batch

    def __call__(self, batches: Iterable[dict | None]) -> Iterator[dict | None]:
        pending: deque = deque()
        try:
            for batch in batches:
                pending.append(self.send(batch))
                if len(pending) > self.ahead:
                    yield self.receive(pending.popleft())
            while pending:
                yield self.receive(pending.popleft())
        finally:  # closing the feed closes its source (a prefetch thread stops)
            close = getattr(batches, "close", None)
            if close is not None:
                close()
