"""Plotting primitives every part of voxjet draws with: matplotlib on the file-only Agg
backend (cluster nodes have no display) and PNGs written atomically."""

from __future__ import annotations

import os

from voxjet.io.atomic import atomic_path


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display on cluster nodes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """Lay out, write a PNG atomically, close."""
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    pyplot().close(fig)
