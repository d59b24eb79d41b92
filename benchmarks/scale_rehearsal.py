"""A scale rehearsal: millions of jets in hundreds of files through the real workflow's stage,
shard and index jobs (`snakemake --until index_jets -c 2`), against the raw read rate of the
same files (uproot for ROOT, pyarrow for Parquet: what no converter can beat), with the disk a
jet takes, the DAG's jobs and the dry run's time; then what JetClass (100M jets) and
JetClass-II (134M jets, 188 classes) would take.

    .venv/bin/python benchmarks/scale_rehearsal.py --jets 2000000 --files 200 --format root
    .venv/bin/python benchmarks/scale_rehearsal.py --jets 2000000 --files 200 --format parquet

The files: toy jets of four classes (voxjet.jets.synth, one class a file as JetClass has) in the
JetClass schema; to write millions in minutes each file draws its jets from a pool the toy
generator made, each boosted by a few percent and its angles jittered (no two jets, so no two
files, are the same bytes), and Parquet files are the ROOT
files converted as weaver's `convert_to_parquet` does (lz4, row groups of 1000 jets). Rates are
jets a CPU-second: each job's cpu_time from its Snakemake benchmark file, the raw reads' from
the process; the jobs run two at a time on the two cores as a cluster's jobs would, each
alone on its core. The dry run is also timed with JetClass-II's file count (1,340 files of 100k
jets: links to the rehearsal's files) and the shard jobs its size needs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import awkward as ak
import numpy as np
import pyarrow.parquet as pq
import uproot
import yaml
from workflow_copy import copy_workflow

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from voxjet.jets.branch_reads import needed, reads_of  # noqa: E402
from voxjet.jets.data_config import JetDataConfig  # noqa: E402
from voxjet.jets.synth import ToyJetsConfig, file_seed, generate_jet, write_jets  # noqa: E402

CLASSES = ["QCD", "Hbb", "Wqq", "Tbqq"]
TARGETS = {"JetClass": (100_000_000, 1_000), "JetClass-II": (134_000_000, 1_340)}  # jets, files
JETS_PER_SHARD_JOB = 250_000  # the scatter's size: a shard job reads this many jets
BIN = Path(sys.executable).parent


KINEMATIC = ("px", "py", "pz", "energy")


def varied(jet: dict, rng: np.random.Generator) -> dict:
    """A pool jet made a new one: boosted along its axis by a few percent and its angles and
    impact parameters jittered, so that no two jets of a file are the same bytes (repeats
    would compress as real files do not)."""
    f = rng.normal(1.0, 0.03)
    part = dict(jet["part"])
    for k in KINEMATIC:
        part[k] = part[k] * f
    for k in ("deta", "dphi", "d0val", "dzval"):
        part[k] = part[k] + rng.normal(0.0, 1e-4, len(part[k])) * (part[k] != 0)
    out = {**jet, "part": part}
    for k in ("jet_pt", "jet_energy", "jet_sdmass"):
        out[k] = jet[k] * f
    return out


def make_sources(out: Path, n_jets: int, n_files: int, pool: int, fmt: str) -> list[Path]:
    """`n_files` files of one class each, jets drawn from a pool of `pool` toy jets a class."""
    out.mkdir(parents=True, exist_ok=True)
    per_file = n_jets // n_files
    cfg = ToyJetsConfig(classes=CLASSES)
    paths = []
    for k, cls in enumerate(CLASSES):
        rng = np.random.default_rng(file_seed(cfg.seed, cls, 10_000))
        jets = [generate_jet(rng, cls, cfg) for _ in range(pool)]
        for i in range(k, n_files, len(CLASSES)):
            root = out / f"{cls}_{i:04d}.root"
            draw = np.random.default_rng(file_seed(cfg.seed, cls, i)).integers(0, pool, per_file)
            write_jets(root, [varied(jets[j], rng) for j in draw], cls)
            if fmt == "parquet":
                with uproot.open(root) as f:
                    arrays = f["tree"].arrays()
                ak.to_parquet(arrays, root.with_suffix(".parquet"), compression="lz4",
                              row_group_size=1000)  # fmt: skip
                root.unlink()
                root = root.with_suffix(".parquet")
            paths.append(root)
        print(f"sources: {cls} written", file=sys.stderr)
    return sorted(paths)


def raw_read(paths: list[Path], branches: list[str], fmt: str) -> tuple[int, float, float]:
    """(jets, CPU seconds, wall seconds) of reading `branches` of every file, nothing else."""
    n, cpu, wall = 0, time.process_time(), time.perf_counter()
    for p in paths:
        if fmt == "root":
            with uproot.open(p) as f:
                for arrays in f["tree"].iterate(branches, step_size=50_000, library="ak"):
                    n += len(arrays)
        else:
            table = pq.read_table(p, columns=branches)
            n += ak.from_arrow(table).layout.length
    return n, time.process_time() - cpu, time.perf_counter() - wall


def workflow(d: Path, sources: Path, fmt: str, shard_jobs: int) -> Path:
    """A copy of the workflow whose config reads `sources`."""
    copy_workflow(d)
    config = {
        "datasets": {
            "big": {
                "domain": "jets",
                "source": {"path": str(sources), "patterns": [f"*.{fmt}"]},
                "jets": {
                    "labels": [f"label_{c}" for c in CLASSES],
                    "shard_jobs": shard_jobs,
                    "jets_per_shard": 100_000,
                },  # fmt: skip
            }
        },
        "experiments": {
            "pfn": {"dataset": "big", "model": {"name": "pfn"}, "launch": {"gpus": 0, "threads": 1}}
        },  # fmt: skip
    }
    (d / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return d / "config" / "config.yaml"


def snakemake(d: Path, *args: str) -> tuple[float, str]:
    """(wall seconds, stdout + stderr) of one snakemake command in `d`; exits on failure."""
    t = time.perf_counter()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run([str(BIN / "snakemake"), *args], cwd=d, capture_output=True, text=True,
                       env=env)  # fmt: skip
    took = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(r.stdout[-3000:] + r.stderr[-3000:])
    return took, r.stdout + r.stderr


def job_count(output: str) -> int:
    """The total of a dry run's job table."""
    hit = re.search(r"^total\s+(\d+)", output, re.M)
    return int(hit[1]) if hit else -1


def cpu_of(d: Path, rule: str) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, jobs) of a rule's jobs from their benchmark files."""
    cpu = wall = 0.0
    files = list((d / "results" / "benchmarks" / rule).rglob("*.tsv"))
    for f in files:
        with open(f) as fh:
            row = next(csv.DictReader(fh, delimiter="\t"))
        cpu += float(row["cpu_time"])
        wall += float(row["s"])
    return cpu, wall, len(files)


def size_of(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def dry_run_at(d: Path, sources: list[Path], fmt: str, files: int, shard_jobs: int) -> tuple:
    """(seconds, jobs) of `snakemake -n` over `files` links to the rehearsal's files."""
    links = d / "links"
    links.mkdir(parents=True)
    for i in range(files):
        src = sources[i % len(sources)]
        os.symlink(src, links / f"{src.stem}_{i:05d}{src.suffix}")
    run = d / "wf"
    workflow(run, links, fmt, shard_jobs)
    took, out = snakemake(run, "-n")
    return took, job_count(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jets", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--pool", type=int, default=4000, help="toy jets generated a class")
    ap.add_argument("--format", choices=["root", "parquet"], default="root")
    ap.add_argument("--work", type=Path, default=Path("/tmp/voxjet-scale"))
    ap.add_argument("--keep", action="store_true", help="keep the files for another run")
    a = ap.parse_args()
    work = a.work.resolve() / a.format
    src_dir = work / "sources"
    if src_dir.is_dir() and len(list(src_dir.glob(f"*.{a.format}"))) == a.files:
        sources = sorted(src_dir.glob(f"*.{a.format}"))
    else:
        shutil.rmtree(work, ignore_errors=True)
        t = time.perf_counter()
        sources = make_sources(src_dir, a.jets, a.files, a.pool, a.format)
        print(f"sources made in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    for stale in ("wf", "jetclass2"):
        shutil.rmtree(work / stale, ignore_errors=True)
    shard_jobs = max(2, a.jets // JETS_PER_SHARD_JOB)
    cfg = JetDataConfig(labels=[f"label_{c}" for c in CLASSES])
    branches = needed(cfg, reads_of(cfg))
    raw_n, raw_cpu, raw_wall = raw_read(sources, branches, a.format)
    run = work / "wf"
    workflow(run, src_dir, a.format, shard_jobs)
    dry, out = snakemake(run, "-n")
    jobs = job_count(out)
    wall, _ = snakemake(run, "--until", "index_jets", "-c", "2")
    index = json.loads((run / "results" / "big" / "shards" / "index.json").read_text())
    jets = sum(index["splits"][s]["jets"] for s in index["splits"])
    shards = size_of([p for p in (run / "results" / "big" / "shards").rglob("*") if p.is_file()])
    rates = {rule: cpu_of(run, rule) for rule in ("stage", "shard_jets", "index_jets")}
    raw_rate = raw_n / raw_cpu
    row = {
        "format": a.format, "files": len(sources), "jets": jets, "raw_jets": raw_n,
        "raw_jets_per_cpu_s": raw_rate, "raw_wall_s": raw_wall,
        **{f"{r}_jets_per_cpu_s": jets / c for r, (c, _, _) in rates.items()},
        **{f"{r}_cpu_s": c for r, (c, _, _) in rates.items()},
        **{f"{r}_jobs": n for r, (_, _, n) in rates.items()},
        "source_bytes_per_jet": size_of(sources) / jets, "shard_bytes_per_jet": shards / jets,
        "dag_jobs": jobs, "dry_run_s": dry, "until_index_wall_s": wall, "shard_jobs": shard_jobs,
        "branches": len(branches),
    }  # fmt: skip
    n2, files2 = TARGETS["JetClass-II"]
    jobs2 = n2 // JETS_PER_SHARD_JOB
    row["jetclass2_dry_run_s"], row["jetclass2_dag_jobs"] = dry_run_at(
        work / "jetclass2", sources, a.format, files2, jobs2
    )
    row["jetclass2_shard_jobs"] = jobs2
    print(json.dumps(row))
    report(row)
    if not a.keep:
        shutil.rmtree(work / "wf", ignore_errors=True)
        shutil.rmtree(work / "jetclass2", ignore_errors=True)


def report(row: dict) -> None:
    """The measured rates against the raw read, and the extrapolation to JetClass and II."""
    raw = row["raw_jets_per_cpu_s"]
    print(f"\n{row['format']}: {row['jets']:,} jets in {row['files']} files, {row['branches']} "
          f"branches read; raw read {raw:,.0f} jets per CPU-second")  # fmt: skip
    for rule in ("stage", "shard_jets", "index_jets"):
        rate = row[f"{rule}_jets_per_cpu_s"]
        print(f"  {rule:<10} {rate:>14,.0f} jets/CPU-s = {rate / raw:6.2f} x raw "
              f"({row[f'{rule}_jobs']} jobs, {row[f'{rule}_cpu_s']:.0f} CPU-s): "
              f"{'PASS' if rate >= 0.5 * raw else 'FAIL'} (goal >= 0.5 x raw)")  # fmt: skip
    print(f"  disk a jet: sources {row['source_bytes_per_jet']:.0f} B (staged copy the same), "
          f"shards {row['shard_bytes_per_jet']:.0f} B")  # fmt: skip
    print(f"  DAG: {row['dag_jobs']} jobs, dry run {row['dry_run_s']:.1f} s; JetClass-II's "
          f"1,340 files and {row['jetclass2_shard_jobs']} shard jobs: {row['jetclass2_dag_jobs']} "
          f"jobs, dry run {row['jetclass2_dry_run_s']:.1f} s")  # fmt: skip
    for name, (n, files) in TARGETS.items():
        hours = {r: n / row[f"{r}_jets_per_cpu_s"] / 3600 for r in ("stage", "shard_jets",
                                                                   "index_jets")}  # fmt: skip
        disk = n * (2 * row["source_bytes_per_jet"] + row["shard_bytes_per_jet"]) / 1e12
        print(f"  {name} ({n / 1e6:.0f}M jets, {files} files): stage {hours['stage']:.1f}, shard "
              f"{hours['shard_jets']:.1f}, index {hours['index_jets']:.2f} core-hours; disk "
              f"{disk:.2f} TB (sources, staged copy, shards); {n // JETS_PER_SHARD_JOB} shard "
              "jobs")  # fmt: skip


if __name__ == "__main__":
    main()
