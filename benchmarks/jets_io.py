"""The jets data path, measured side by side in one run on generated JetClass-schema files:

1. shard conversion throughput ÷ plain `uproot.iterate` of the same branches, nothing written
   (target ≥ 0.7);
2. jets/s from the shards through voxjet's streaming loader ÷ a weaver-style loader that reads
   the ROOT files and computes and pads the features batch by batch (same batch size, same
   DataLoader workers, both warm: persistent workers, best of two passes; target ≥ 10);
3. loader jets/s ÷ a raw h5py read of every shard, one process each (target ≥ 0.5: the loader
   adds little);
4. loader jets/s with the shards' checksums verified (fletcher32, every read) ÷ the same shards
   written without checksums (target ≥ 0.9: verification costs at most a tenth);
5. against the real peer, weaver-core's `SimpleIterDataset` (its best setting: by files, the
   DataLoader's workers, batch 512) reading JetClass's full data config
   (config/examples/weaver/JetClass_full.yaml, the toy's four classes), beside voxjet's loader
   on shards made from the same data config (target ≥ 20, padded and not); and the conversion
   break-even: the shard conversion's time ÷ the time its shards save an epoch against weaver
   (target ≤ 0.5 epoch), with one shard job and with one a core side by side.

The shards store the particles jagged. For a GPU the loader hands out batches as stored (flat
rows + offsets; the GPU pads them); for a CPU model its workers pad (`pad_to`). Both are
measured; the weaver-style loader pads in its workers, as weaver does.

    python benchmarks/jets_io.py            # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import uproot
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from voxjet.io.handover import ReturningLoader
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.features import branches_needed, compute_features, variables
from voxjet.jets.jagged import pad_particles
from voxjet.jets.shard import shard_jets
from voxjet.jets.stream import JetStream
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage

REPO = Path(__file__).resolve().parent.parent


class WeaverStyle(torch.utils.data.IterableDataset):
    """Reads the ROOT files in steps of one batch and builds each batch's padded arrays from
    the branches (what a loader without a conversion step does), files split over workers."""

    def __init__(self, files: list[Path], cfg: JetDataConfig, batch: int) -> None:
        self.files, self.cfg, self.batch = files, cfg, batch
        self.v = variables(cfg.new_variables, cfg.selection)
        self.branches = branches_needed(
            self.v, cfg.particle_features, cfg.jet_features, cfg.sort_by
        ) + list(cfg.labels)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        mine = self.files[info.id :: info.num_workers] if info else self.files
        for arrays in uproot.iterate(
            [f"{f}:{self.cfg.tree}" for f in mine], self.branches, step_size=self.batch
        ):
            out = compute_features(
                arrays,
                self.v,
                self.cfg.particle_features,
                self.cfg.jet_features,
                self.cfg.max_particles,
                self.cfg.sort_by,
            )
            # what a loader without a conversion step hands the model: padded, with a mask
            counts = torch.from_numpy(np.asarray(out["counts"], np.int64))
            particles, mask = pad_particles(
                torch.from_numpy(out["particles"]), counts, self.cfg.max_particles
            )
            yield {"particles": particles, "mask": mask, "jets": torch.from_numpy(out["jets"])}


def weaver_loader(files: list[Path], config: Path, batch: int, workers: int):
    """weaver-core's own loader over the ROOT files, as weaver's train.py builds it."""
    from weaver.utils.dataset import SimpleIterDataset

    ds = SimpleIterDataset({"bench": [str(f) for f in files]}, str(config), for_training=True,
                           load_range_and_fraction=((0, 1), 1, 1), fetch_by_files=True,
                           fetch_step=1, infinity_mode=False, name="bench")  # fmt: skip
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers,
                                         persistent_workers=True, drop_last=False)  # fmt: skip

    def batches():
        for _inputs, y, _ in loader:
            yield {"jets": y["_label_"]}

    for _ in batches():  # start the workers
        break
    return batches


def _rate(make_iter, repeats: int = 2) -> float:
    """Jets a second, the best of `repeats` full passes."""
    best = 0.0
    for _ in range(repeats):
        t, n = time.perf_counter(), 0
        for b in make_iter():
            n += len(b["jets"])
        best = max(best, n / (time.perf_counter() - t))
    return best


def _workers(dataset, workers: int):
    """A DataLoader whose workers outlive a pass, so timed passes are not worker start-up
    (which costs both loaders the same and would dominate a dataset this small). voxjet's
    through the ReturningLoader that training uses (its workers reuse batch memory)."""
    kw = {"num_workers": workers, "persistent_workers": True}
    if isinstance(dataset, JetStream):
        loader = ReturningLoader(dataset, **kw)
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, **kw)
    for _ in loader:  # start the workers
        break
    return lambda: loader


def _part(args: tuple) -> None:
    from voxjet.jets.shard import shard_part

    manifest, out, config, k, n = args
    cfg = JetDataConfig(weaver_config=config, jets_per_shard=10000, step_size=20000,
                        val_fraction=0, test_fraction=0.01, shard_jobs=n)  # fmt: skip
    shard_part(manifest, out, cfg, k, n)


def _parallel_shard(manifest: Path, out: Path, config: Path, jobs: int) -> float:
    """Seconds for `jobs` shard jobs in as many processes side by side, then the index job (a
    fresh interpreter each, as Snakemake starts them, is left out on both sides)."""
    import multiprocessing as mp

    from voxjet.jets.shard import index_shards

    parts = [out / f"part_{k:04d}" for k in range(jobs)]
    with mp.get_context("spawn").Pool(jobs) as pool:
        pool.map(_part, [(manifest, out / f"warm{k}", str(config), k, 50) for k in range(jobs)])
        t = time.perf_counter()
        pool.map(_part, [(manifest, parts[k], str(config), k, jobs) for k in range(jobs)])
    cfg = JetDataConfig(weaver_config=str(config), jets_per_shard=10000, step_size=20000,
                        val_fraction=0, test_fraction=0.01, shard_jobs=jobs)  # fmt: skip
    index_shards(parts, out / "index.json", cfg)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jets-per-file", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cores", type=int, default=2, help="shard jobs side by side")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        generate_dataset(d / "raw", ToyJetsConfig(files_per_class=2, jets_per_file=a.jets_per_file),
                         progress=False)  # fmt: skip
        stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
        files = sorted((d / "staged").glob("*.root"))
        cfg = JetDataConfig(max_particles=128, jets_per_shard=10000, step_size=20000)
        n_jets = len(files) * a.jets_per_file
        v = variables(cfg.new_variables, cfg.selection)
        branches = branches_needed(v, cfg.particle_features, cfg.jet_features, cfg.sort_by)
        branches += list(cfg.labels)

        t = time.perf_counter()
        for arrays in uproot.iterate([f"{f}:tree" for f in files], branches, step_size=20000):
            len(arrays)
        t_read = time.perf_counter() - t
        # conversions timed first, with no loader's workers alive, each after a warm-up run
        # in its process (as the parallel jobs below: a fresh interpreter is left out on
        # both sides, the peer's worker start-up too)
        shard_jets(d / "m.json", d / "warm", cfg)
        t = time.perf_counter()
        shard_jets(d / "m.json", d / "shards", cfg)
        t_shard = time.perf_counter() - t
        wcfg = yaml.safe_load((REPO / "config/examples/weaver/JetClass_full.yaml").read_text())
        wcfg["labels"]["value"] = list(cfg.labels)
        wcfg["observers"] = []
        (d / "full.yaml").write_text(yaml.safe_dump(wcfg, sort_keys=False))
        full = JetDataConfig(weaver_config=str(d / "full.yaml"), jets_per_shard=10000,
                             step_size=20000, val_fraction=0, test_fraction=0.01)  # fmt: skip
        shard_jets(d / "m.json", d / "wwarm", full)
        t = time.perf_counter()
        shard_jets(d / "m.json", d / "wshards", full)
        t_wshard = time.perf_counter() - t
        # as the workflow runs it on a node of `cores` cores: one shard job a core side by side
        t_wpar = _parallel_shard(d / "m.json", d / "pshards", d / "full.yaml", a.cores)

        stream = JetStream(d / "shards", "train", a.batch, seed=0).at(0, 0)
        loader = _workers(stream, a.workers)
        padding = JetStream(d / "shards", "train", a.batch, seed=0, pad_to=128).at(0, 0)
        loader_padded = _workers(padding, a.workers)
        weaver = _workers(WeaverStyle(files, cfg, a.batch), a.workers)

        import h5py
        import hdf5plugin  # noqa: F401

        from voxjet.io.atomic import read_json

        shards = read_json(d / "shards" / "index.json")["splits"]["train"]["shards"]

        def raw():
            for s in shards:
                with h5py.File(d / "shards" / s["file"], "r") as f:
                    yield {k: f[k][...] for k in ("particles", "offsets", "jets", "labels")}

        from unchecked import copy_without_checksums

        plain = copy_without_checksums(d / "shards", d / "unchecked")
        unchecked = _workers(JetStream(plain, "train", a.batch, seed=0).at(0, 0), a.workers)
        # the real peer on the same files, beside voxjet's loader on shards of the same config
        n_train = read_json(d / "wshards" / "index.json")["splits"]["train"]["jets"]
        w_ours = _workers(JetStream(d / "wshards", "train", a.batch, seed=0).at(0, 0), a.workers)
        w_pad = _workers(JetStream(d / "wshards", "train", a.batch, seed=0, pad_to=128).at(0, 0),
                         a.workers)  # fmt: skip
        real = weaver_loader(files, d / "full.yaml", a.batch, a.workers)
        peer, w_mine, w_padded = _rate(real), _rate(w_ours), _rate(w_pad)
        saved = n_jets / peer - n_train / w_padded  # an epoch's data time saved against weaver
        ours, padded, theirs = _rate(loader), _rate(loader_padded), _rate(weaver)
        on, off = _rate(loader), _rate(unchecked)  # verification on and off, side by side
        # the disk comparison in one process each: the raw read has no workers either
        alone, bare = _rate(lambda: iter(stream)), _rate(raw)
    rows = [
        ("shard conversion ÷ uproot.iterate alone (throughput)", t_read / t_shard, 0.7,
         f"{n_jets / t_shard:,.0f} vs {n_jets / t_read:,.0f} jets/s"),
        (f"loader ÷ weaver-style ROOT loader (jets/s, batch {a.batch}, {a.workers} workers)",
         ours / theirs, 10, f"{ours:,.0f} vs {theirs:,.0f} jets/s"),
        ("  the same, the loader's workers padding (a CPU model's loader)", padded / theirs, 10,
         f"{padded:,.0f} vs {theirs:,.0f} jets/s"),
        ("loader ÷ raw h5py read of the shards (jets/s, one process each)", alone / bare, 0.5,
         f"{alone:,.0f} vs {bare:,.0f} jets/s"),
        ("loader, checksums verified ÷ shards without checksums (jets/s)", on / off, 0.9,
         f"{on:,.0f} vs {off:,.0f} jets/s"),
        ("loader ÷ weaver-core SimpleIterDataset, JetClass full config (jets/s)", w_mine / peer,
         20, f"{w_mine:,.0f} vs {peer:,.0f} jets/s"),
        ("  the same, the loader's workers padding", w_padded / peer, 20,
         f"{w_padded:,.0f} vs {peer:,.0f} jets/s"),
    ]  # fmt: skip
    # lower is better: epochs of weaver-core loading that the conversion costs
    break_even = t_wshard / saved if saved > 0 else float("inf")
    break_par = t_wpar / saved if saved > 0 else float("inf")
    print(f"{n_jets:,} toy jets in {len(files)} files, up to 128 particles x 17 features")
    for name, ratio, target, detail in rows:
        ok = "PASS" if ratio >= target else "FAIL"
        print(f"{name:<72} {ratio:6.2f} (target >= {target}) {ok}  [{detail}]")
    ok = "PASS" if break_even <= 0.5 else "FAIL"
    print(
        f"{'conversion break-even against weaver-core (epochs)':<72} {break_even:6.2f} "
        f"(target <= 0.5) {ok}  [{t_wshard:.1f} s to shard, {saved:.1f} s saved an epoch]"
    )
    ok = "PASS" if break_par <= 0.5 else "FAIL"
    print(
        f"{f'  the same, {a.cores} shard jobs side by side (one a core)':<72} {break_par:6.2f} "
        f"(target <= 0.5) {ok}  [{t_wpar:.1f} s to shard, {saved:.1f} s saved an epoch]"
    )


if __name__ == "__main__":
    main()
