"""The case store a dataset's preprocessed cases are written in (`volumes.storage`)."""

from __future__ import annotations

import os

from voxjet.volumes.plan.memory import GIB

# the page cache must hold a mapped dataset beside the training processes' own memory
MAPPED_SHARE = 0.5


def node_memory_bytes() -> int:
    """Physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_storage(requested: str, decoded_bytes: float, node_memory: float) -> dict:
    """The case store (`volumes.storage`) and why: `auto` takes `mapped` (the fastest while
    the page cache holds the data) when the training cases' decoded arrays fit in MAPPED_SHARE
    of a node's memory, else `blosc2` (the fewest bytes a patch from disk); benchmarks/README.md
    has the measurements behind the rule."""
    sizes = {"decoded_dataset_gb": decoded_bytes / GIB, "node_memory_gb": node_memory / GIB}
    if requested != "auto":
        return {"store": requested, "reason": "set by volumes.storage", **sizes}
    fits = decoded_bytes <= MAPPED_SHARE * node_memory
    reason = (
        f"the training cases' decoded arrays ({decoded_bytes / GIB:.2f} GiB) "
        + ("fit in" if fits else "exceed")
        + f" {MAPPED_SHARE:.0%} of a node's memory ({node_memory / GIB:.1f} GiB): "
        + (
            "mapped files are read from the page cache"
            if fits
            else "blosc2 files read the fewest bytes a patch from disk"
        )  # fmt: skip
    )
    return {"store": "mapped" if fits else "blosc2", "reason": reason, **sizes}
