"""Run at the start of every Python process the tests launch (snakemake, voxjet, torchrun:
tests put this folder on PYTHONPATH): registers the test-only `latency://` filesystem with
fsspec, by name, so it is imported only by a process that opens such a URL."""

import fsspec

fsspec.register_implementation("latency", "latency_fs.LatencyFileSystem", clobber=True)
