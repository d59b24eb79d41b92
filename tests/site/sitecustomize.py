"""Run at the start of every Python process the tests launch (snakemake, voxjet, torchrun:
tests put this folder on PYTHONPATH): registers the test-only `latency://` filesystem with
fsspec, by name, so it is imported only by a process that opens such a URL; and, where
HIDE_PACKAGES lists modules (comma-separated), makes them look not installed, as on a machine
without that extra."""

import os
import sys

import fsspec

fsspec.register_implementation("latency", "latency_fs.LatencyFileSystem", clobber=True)


class _Hidden:
    """A meta-path finder that refuses the hidden modules (and their submodules)."""

    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the tests)", name=name)
        return None


_HIDE = {n.strip() for n in os.environ.get("HIDE_PACKAGES", "").split(",") if n.strip()}
if _HIDE:
    sys.meta_path.insert(0, _Hidden(_HIDE))
