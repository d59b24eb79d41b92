"""Divergence caught: a run whose loss stays far above what training had reached (its running
minimum), above the loss of its own first step (a run that blew up inside its first logging
window never had a low to fall from), or above a classifier that guesses (the task's chance
loss), for several logging windows in a row is marked `diverged` — once, in the log,
metrics.jsonl and through it the summary — so that a ranked table never shows it as an
ordinary result. (A non-finite loss stops training at once: voxjet.training.loop.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

FACTOR = 10.0  # "far above": this many times the reference
PATIENCE = 3  # logging windows in a row


@dataclass
class DivergenceWatch:
    """Watches the windows' mean losses; `chance`: the task's loss when guessing, if known."""

    chance: float | None = None
    initial: float | None = None  # the loss of the first step (before any update counted)
    best: float = math.inf
    high: int = 0
    flagged: dict | None = None

    def update(self, step: int, loss: float) -> dict | None:
        """The divergence record the first time the run diverges at this window, else None."""
        if self.flagged is not None or not math.isfinite(loss):
            return None
        refs = [(self.best, "its lowest loss so far")]
        if self.initial is not None:
            refs.append((self.initial, "the loss of its first step"))
        if self.chance is not None:
            refs.append((self.chance, "the loss of guessing"))
        over = [(r, what) for r, what in refs if math.isfinite(r) and r > 0 and loss > FACTOR * r]
        self.best = min(self.best, loss)
        self.high = self.high + 1 if over else 0
        if self.high < PATIENCE:
            return None
        ref, what = over[0]
        self.flagged = {"step": step, "diverged": True, "window_loss": loss, "reference": ref,
                        "why": f"the loss stayed above {FACTOR:g} × {what} ({ref:.4g}) for "
                               f"{PATIENCE} logging windows"}  # fmt: skip
        return self.flagged
