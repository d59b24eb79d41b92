"""Streaming jet shards from storage with latency (the latency-injecting fsspec filesystem),
measured side by side in one run:

1. jets/s with 20 ms a read request ÷ jets/s with none (target ≥ 0.5);
2. jets/s with 20 ms and 16 reads in flight ÷ the same with one read at a time (target ≥ 8);
3. the most bytes requested but not yet consumed ÷ the configured bound (target ≤ 1.2);
and jets/s against the injected latency (0, 1, 5, 20, 100 ms), plotted to
benchmarks/io_latency.png.

    python benchmarks/io_latency.py            # about two minutes
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import voxjet.io.latency  # noqa: F401  (registers latency://)
from voxjet.io.fetch import FetchConfig
from voxjet.jets.shard import JetDataConfig, shard_jets
from voxjet.jets.stream import JetStream
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage

THREADS = 16


def rate(shards: Path, delay_ms: float, threads: int, bound: int, block: int) -> tuple[float, int]:
    """(jets/s of one epoch, peak bytes in flight) streaming `shards` through latency://."""
    fetch = FetchConfig(threads=threads, block_bytes=block, max_bytes_in_flight=bound)
    s = JetStream(f"latency://{shards}", "train", 512, seed=0, fetch=fetch,
                  storage_options={"delay_s": delay_ms / 1000})  # fmt: skip
    t, n, peak = time.perf_counter(), 0, 0
    for b in s.at(0, 0):
        n += len(b["labels"])
        peak = max(peak, s._fetcher.peak_bytes_in_flight)
    return n / (time.perf_counter() - t), peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jets-per-file", type=int, default=4000)
    ap.add_argument("--block-kb", type=int, default=256)
    ap.add_argument("--bound-mb", type=int, default=8)
    a = ap.parse_args()
    block, bound = a.block_kb << 10, a.bound_mb << 20
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        generate_dataset(d / "raw", ToyJetsConfig(files_per_class=2, jets_per_file=a.jets_per_file),
                         progress=False)  # fmt: skip
        stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
        cfg = JetDataConfig(max_particles=64, jets_per_shard=4000, shard_jobs=2)
        shard_jets(d / "m.json", d / "shards", cfg)
        rate(d / "shards", 0, THREADS, bound, block)  # warm-up: imports, page cache
        curve = {
            ms: max((rate(d / "shards", ms, THREADS, bound, block) for _ in range(2)),
                    key=lambda x: x[0])
            for ms in (0, 1, 5, 20, 100)
        }  # fmt: skip
        serial, _ = rate(d / "shards", 20, 1, bound, block)
    peak = max(p for _, p in curve.values())
    rows = [
        (
            f"jets/s at 20 ms ÷ at 0 ms ({THREADS} reads in flight)",
            curve[20][0] / curve[0][0],
            0.5,
            ">=",
        ),
        (f"jets/s at 20 ms: {THREADS} reads in flight ÷ 1", curve[20][0] / serial, 8, ">="),
        ("peak bytes in flight ÷ bound", peak / bound, 1.2, "<="),
    ]
    print(f"toy jet shards, {block >> 10} KiB reads, bound {bound >> 20} MiB")
    for name, ratio, target, op in rows:
        ok = (ratio >= target) if op == ">=" else (ratio <= target)
        print(f"{name:<52} {ratio:6.2f} (target {op} {target}) {'PASS' if ok else 'FAIL'}")
    print("latency ms  jets/s")
    for ms, (r, _) in curve.items():
        print(f"{ms:>9}  {r:,.0f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    xs = [max(ms, 0.3) for ms in curve]
    ax.plot(xs, [r for r, _ in curve.values()], "o-", label=f"{THREADS} reads in flight")
    ax.plot([20], [serial], "s", label="1 read at a time")
    ax.set_xscale("log")
    ax.set_xlabel("injected latency a read (ms; 0 drawn at 0.3)")
    ax.set_ylabel("jets/s")
    ax.legend()
    fig.tight_layout()
    out = Path(__file__).with_name("io_latency.png")
    fig.savefig(out, dpi=120)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
