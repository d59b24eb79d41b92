"""A streaming jet loader: whole batches from the shards, never the split in memory.

The split's shards are cut into blocks of consecutive jets (one contiguous HDF5 read each).
Each epoch a seeded permutation of the blocks is dealt out to the streams — one per (rank,
DataLoader worker) — so streams read disjoint data; a stream fills a shuffle buffer with
several blocks (so a batch mixes jets of several shards and files), permutes it, and emits
batches, carrying the remainder into the next buffer. Batches hold the particles as stored,
flat with offsets (a third of the padded bytes through the DataLoader's workers; a GPU pads
them with `voxjet.jets.jagged.pad_particles`), or padded by the worker (`pad_to`, for a model
on the CPU, whose cores are busy with the training step). Every stream yields the
same number of batches an epoch (what DDP needs), all of it fixed by (seed, epoch): a resumed
run that skips the first `start` batches sees exactly the batches an uninterrupted run would
have.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import h5py
import hdf5plugin  # noqa: F401  (registers the LZ4 filter the shards are written with)
import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.fetch import FetchConfig
from voxjet.io.handover import SharedSlabs, fresh_batch
from voxjet.io.integrity import corrupt_error
from voxjet.io.remote import ReadOptions, RemoteFiles
from voxjet.jets.dataset import collection_keys, load_index
from voxjet.jets.jagged import JaggedBuffer, SlabPool, Specs, pad_rows, take_rows
from voxjet.jets.reweight import jet_weights, resample
from voxjet.jets.shard_files import ChecksumMismatch, ShardChecks

KEYS = ("jets", "labels")


@dataclass(frozen=True)
class _Shard:
    """An open shard file: its datasets, all its offsets, its arrays' row shapes."""

    file: h5py.File
    sets: dict[str, h5py.Dataset]
    offsets: np.ndarray
    like: Specs
    number: int
    checks: ShardChecks


@dataclass(frozen=True)
class Block:
    """Jets [start, stop) of one shard file."""

    shard: str
    start: int
    stop: int


def split_blocks(index: dict, split: str, block_jets: int) -> list[Block]:
    """The split's shards cut into blocks of at most `block_jets` consecutive jets."""
    shards = index["splits"].get(split, {}).get("shards", [])
    return [
        Block(s["file"], lo, min(lo + block_jets, s["jets"]))
        for s in shards
        for lo in range(0, s["jets"], block_jets)
    ]


class JetStream(torch.utils.data.IterableDataset):
    """Batches of one split for one rank; under a DataLoader, its workers split the rank's
    share again. Set the epoch and the starting batch with `at(epoch, start)`."""

    def __init__(
        self,
        shard_dir: str | os.PathLike,
        split: str,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world: int = 1,
        block_jets: int | None = 2048,
        buffer_blocks: int = 8,
        fetch: FetchConfig | None = None,
        lookahead: int = 2,
        storage_options: dict | None = None,
        pad_to: int | None = None,
    ) -> None:
        # a local folder, or an fsspec URL (s3://, root://, https://, latency::file://...):
        # remote shards are fetched whole, in concurrent ranges, `lookahead` files ahead
        self.url = str(shard_dir)
        self.remote = "://" in self.url
        self.fetch, self.lookahead = fetch or FetchConfig(), lookahead
        self.storage_options = storage_options or {}
        self.index = self._index()
        if block_jets is None or self.remote:
            # remote: whole shards are the units, so each file is fetched once an epoch; the
            # shuffle buffer keeps about as many jets as a local one (at least two shards)
            largest = max(s["jets"] for s in self.index["splits"][split]["shards"] or [{"jets": 1}])
            buffer_blocks = max(2, round(buffer_blocks * (block_jets or largest) / largest))
            block_jets = largest
        self.blocks = split_blocks(self.index, split, block_jets)
        shards = self.index["splits"].get(split, {}).get("shards", [])
        self.shard_numbers = {s["file"]: i for i, s in enumerate(shards)}
        self.shard_bytes = {s["file"]: s.get("bytes") for s in shards}  # absent: asked for
        if not self.blocks:
            raise VoxjetError(f"{self.url}/index.json: split {split!r} has no jets")
        self.split, self.batch_size, self.seed = split, batch_size, seed
        # jets.weights: training batches are drawn by each jet's sampling weight
        self.reweight = self.index.get("reweight") if split == "train" else None
        self.tables = (np.asarray(self.reweight["tables"])
                       if self.reweight and not self.reweight["precomputed"] else None)  # fmt: skip
        self.keys = (
            *KEYS,
            *(("targets",) if self.index.get("targets") else ()),
            *collection_keys(self.index),
            *(("reweight",) if self.reweight else ()),
        )
        # what a padded batch carries row by row besides the particles and their mask
        self.row_keys = (*(k for k in self.keys if k != "reweight"), "source")
        self.rank, self.world = rank, world
        self.buffer_blocks = buffer_blocks
        self.epoch, self.start = 0, 0
        self.pad_to = pad_to  # None: batches keep the particles flat, with offsets
        self._spare: JaggedBuffer | None = None
        self._slabs = SlabPool()  # a CPU model's padded buffers, reused once their batches go
        self._batches = SlabPool(keep=8)  # batches made in this process, reused alike
        # set by voxjet.io.handover.ReturningLoader: workers then reuse their batches' memory
        self.slot_table: torch.Tensor | None = None
        self._shared: SharedSlabs | None = None
        # what this process verified of each shard: a persistent worker checks a unit once
        self._checks: dict[str, ShardChecks] = {}

    def __getstate__(self) -> dict:
        # a DataLoader pickles the dataset into each worker: not the read buffer with it
        return {**self.__dict__, "_spare": None, "_slabs": SlabPool(), "_shared": None,
                "_batches": SlabPool(keep=8),
                "_checks": {}}  # fmt: skip

    def _index(self) -> dict:
        return load_index(self.url, ReadOptions(self.storage_options, self.fetch))

    def at(self, epoch: int, start: int) -> JetStream:
        """Iterate epoch `epoch` from its batch `start` (a checkpoint's position)."""
        self.epoch, self.start = epoch, start
        return self

    def _streams(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        return self.rank * workers + worker, self.world * workers

    def _deal(self, n_streams: int) -> list[list[Block]]:
        """The epoch's blocks in a seeded order, each to the stream with the fewest jets so
        far (shards of a split differ in size: dealing by count could starve a stream)."""
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.blocks))
        dealt: list[list[Block]] = [[] for _ in range(n_streams)]
        jets = np.zeros(n_streams, np.int64)
        for i in order:
            s = int(np.argmin(jets))
            dealt[s].append(self.blocks[i])
            jets[s] += self.blocks[i].stop - self.blocks[i].start
        return dealt

    def _quota(self, dealt: list[list[Block]]) -> int:
        per = min(sum(b.stop - b.start for b in blocks) // self.batch_size for blocks in dealt)
        if per == 0:
            raise VoxjetError(
                f"{self.url}: {sum(b.stop - b.start for b in self.blocks)} {self.split} jets "
                f"over {len(dealt)} loader streams is less than one batch of "
                f"{self.batch_size} each: lower train.batch_size"
            )
        return per

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        stream, n_streams = self._streams()
        in_worker = torch.utils.data.get_worker_info() is not None
        workers = n_streams // self.world
        dealt = self._deal(n_streams)  # once an epoch: every stream deals the same way
        quota = self._quota(dealt)
        # A DataLoader takes batches from its workers in turn, starting with worker 0: batch i
        # of the rank is logical stream i % workers. Resuming at batch `start`, worker w plays
        # logical stream (w + start) % workers, so the order goes on where it stopped.
        logical = (stream - self.rank * workers + self.start) % workers
        stream = self.rank * workers + logical
        skip = max(0, -(-(self.start - logical) // workers))
        mine = dealt[stream]
        rng = np.random.default_rng([self.seed, self.epoch, stream])
        files: OrderedDict[str, _Shard] = OrderedDict()
        if self.remote:
            self._start_prefetch([b.shard for b in mine])
        # one buffer for the whole pass (and the next, in a persistent worker): blocks are
        # read into it in place, the carry moved to its front
        buf, self._spare = self._spare or JaggedBuffer(), None
        carry: dict[str, np.ndarray] | None = None
        made = 0
        try:
            for lo in range(0, len(mine), self.buffer_blocks):
                group = mine[lo : lo + self.buffer_blocks]
                shards = [self._shard(files, b) for b in group]
                # room for all of it at once: growing block by block would copy it again
                kept = len(carry["labels"]) if carry else 0  # drawn already: not drawn again
                n = sum(b.stop - b.start for b in group) + kept
                m = sum(
                    int(sh.offsets[b.stop] - sh.offsets[b.start])
                    for sh, b in zip(shards, group, strict=True)
                )
                buf.clear()
                buf.reserve(n, m + (len(carry["particles"]) if carry else 0), shards[0].like)
                if carry is not None:
                    buf.append(carry)
                for sh, b in zip(shards, group, strict=True):
                    self._read(sh, b, buf)
                view = buf.view()
                if self.reweight:
                    perm = rng.permutation(self._drawn(view, kept, rng))
                    rows_view = {k: v for k, v in view.items() if k != "reweight"}
                else:
                    perm, rows_view = rng.permutation(buf.jets), view
                n_full = len(perm) // self.batch_size
                if self.pad_to is not None and not in_worker:
                    # the whole buffer padded in one gather (batches are then views): per-batch
                    # work in this thread would compete with the training step for the GIL
                    padded = self._padded(buf, perm[: n_full * self.batch_size], self._slabs.arrays)
                for b in range(n_full):
                    if made >= quota:
                        return
                    if made >= skip:
                        sl = slice(b * self.batch_size, (b + 1) * self.batch_size)
                        if self.pad_to is None:
                            yield self._batch(rows_view, perm[sl], in_worker)
                        elif in_worker:
                            # padded straight into shared memory: a view of a padded buffer
                            # would be copied there once more when it is handed over
                            yield self._padded_batch(buf, perm[sl])
                        else:
                            yield {k: torch.from_numpy(v[sl]) for k, v in padded.items()}
                    made += 1
                carry = take_rows(view, perm[n_full * self.batch_size :])
        finally:
            self._spare = buf
            for sh in files.values():
                sh.file.close()
            if self.remote:
                self._files.close()

    def _drawn(self, view: dict[str, np.ndarray], kept: int, rng: np.random.Generator
               ) -> np.ndarray:  # fmt: skip
        """The buffer's rows for this pass: the carried `kept` once each, the new ones drawn
        with replacement by their sampling weight (voxjet.jets.reweight), as many as came."""
        new = slice(kept, len(view["labels"]))
        w = jet_weights(view["reweight"][new], view["labels"][new], self.reweight, self.tables)
        drawn = resample(w, rng, f"{self.url}: a shuffle buffer of {self.split} jets")
        return np.concatenate([np.arange(kept), kept + drawn])

    def _start_prefetch(self, shards: list[str]) -> None:
        # keep the files of the next shuffle buffer on their way while this buffer's batches
        # are made (waiting for a buffer's files only when it starts would take turns with
        # the compute, not overlap it), all of them side by side: a buffer needs every one
        window = max(self.lookahead, self.buffer_blocks)
        opts = ReadOptions(self.storage_options, self.fetch)
        self._files = RemoteFiles(self.url, opts, self.shard_bytes, side_by_side=window)
        self._files.fetch_ahead(shards, window=window)

    def _open(self, shard: str) -> _Shard:
        f = (
            h5py.File(self._files.take(shard), "r")
            if self.remote
            # a chunk cache that holds a whole chunk: blocks end mid-chunk, and the next block
            # must not decompress that chunk again
            else h5py.File(f"{self.url}/{shard}", "r", rdcc_nbytes=4 << 20)
        )
        # h5py's lookups cost tens of µs each: done once a file, not once a block
        sets = {k: f[k] for k in (*self.keys, "particles", "offsets")}
        like = {k: (d.shape[1:], d.dtype) for k, d in sets.items()}
        like["source"] = ((2,), np.dtype(np.int64))
        if shard not in self._checks:
            self._checks[shard] = ShardChecks(f)
        checks = self._checks[shard]
        offsets = sets["offsets"][...]
        checks.verify_offsets(offsets)  # reads are sized by them before they are verified
        return _Shard(f, sets, offsets, like, self.shard_numbers[shard], checks)

    def _shard(self, files: OrderedDict[str, _Shard], block: Block) -> _Shard:
        """The block's shard file, opened (fetched, if remote) once."""
        sh = files.get(block.shard)
        if sh is not None:
            files.move_to_end(block.shard)  # least recently used first out: never one in use
        else:
            try:
                sh = files[block.shard] = self._open(block.shard)
            except (OSError, KeyError, ChecksumMismatch) as e:
                raise corrupt_error(
                    f"{self.url}/{block.shard}", "the shard", "shard_jets", e
                ) from e
            while len(files) > max(2, self.buffer_blocks):  # bounded open files / memory
                files.popitem(last=False)[1].file.close()
        return sh

    def _read(self, sh: _Shard, block: Block, buf: JaggedBuffer) -> None:
        """Append the block's jets to `buf`, read in place (h5py read_direct)."""
        n = block.stop - block.start
        off = sh.offsets[block.start : block.stop + 1]
        m = int(off[-1] - off[0])
        buf.reserve(n, m, sh.like)
        j, p, a = buf.jets, buf.particles, buf.arrays
        try:
            for k in self.keys:
                sh.sets[k].read_direct(a[k], np.s_[block.start : block.stop], np.s_[j : j + n])
            if m:
                sh.sets["particles"].read_direct(
                    a["particles"], np.s_[off[0] : off[-1]], np.s_[p : p + m]
                )
            # checked where it was read to (the first time this process reads these jets)
            have = {k: a[k][j : j + n] for k in self.keys}
            have["particles"] = a["particles"][p : p + m]
            sh.checks.verify(sh.sets, block.start, block.stop, have, sh.offsets)
        except (OSError, TypeError, ChecksumMismatch) as e:
            where = f"{self.url}/{block.shard}"
            raise corrupt_error(where, f"jets {block.start}-{block.stop}", "shard_jets", e) from e
        a["offsets"][j + 1 : j + n + 1] = off[1:] - off[0] + p
        # where each jet came from, for error messages: (shard number, row)
        a["source"][j : j + n, 0] = sh.number
        a["source"][j : j + n, 1] = np.arange(block.start, block.stop)
        buf.jets, buf.particles = j + n, p + m

    def _batch(
        self, buf: dict[str, np.ndarray], rows: np.ndarray, shared: bool
    ) -> dict[str, torch.Tensor]:
        """Jets `rows` of the shuffle buffer as a batch: particles flat with offsets (pad them
        with voxjet.jets.jagged.pad_particles), jets, labels, source. In a DataLoader worker
        (`shared`) it is gathered straight into one shared-memory buffer: handing it to the
        training process then copies nothing and sends one handle."""
        tensors: dict[str, torch.Tensor] = {}
        take_rows(buf, rows, lambda specs: self._arrays(specs, tensors, shared))
        return tensors

    def _padded_batch(self, buf: JaggedBuffer, rows: np.ndarray) -> dict[str, torch.Tensor]:
        """Jets `rows` padded, in one shared-memory buffer (in a DataLoader worker)."""
        tensors: dict[str, torch.Tensor] = {}
        self._padded(buf, rows, lambda specs: self._arrays(specs, tensors, True))
        return tensors

    def _arrays(self, specs: Specs, batch: dict, shared: bool) -> dict[str, np.ndarray]:
        """Arrays for `specs` in one storage — shared memory in a DataLoader worker, a reused
        slab under a ReturningLoader — to fill; what to yield of them goes into `batch`."""
        if shared and self.slot_table is not None:
            if self._shared is None:
                self._shared = SharedSlabs(self.slot_table, torch.utils.data.get_worker_info().id)
            arrays, out = self._shared.batch(specs)
        elif shared:
            arrays, out = fresh_batch(specs, shared)
        else:  # in this process: memory of batches no longer referenced, not fresh pages
            arrays = self._batches.arrays(specs)
            out = {k: torch.from_numpy(v) for k, v in arrays.items()}
        batch.update(out)
        return arrays

    def _padded(
        self, buf: JaggedBuffer, rows: np.ndarray, alloc: Callable[[Specs], dict[str, np.ndarray]]
    ) -> dict[str, np.ndarray]:
        """Jets `rows` of the buffer with particles padded to pad_to, and a mask, into arrays
        from `alloc` (the pad slots gather a zero row kept just past the buffer's particles)."""
        view = buf.view()
        off, zero = view["offsets"], buf.particles
        flat = buf.arrays["particles"]
        flat[zero] = 0  # the spare row reserve() keeps
        n, p = len(rows), self.pad_to
        specs = {k: ((n, *view[k].shape[1:]), view[k].dtype) for k in self.row_keys}
        specs["particles"] = ((n, p, *flat.shape[1:]), flat.dtype)
        specs["mask"] = ((n, p), np.dtype(bool))
        out = alloc(specs)
        idx = self._slabs.arrays({"idx": ((n, p), np.dtype(np.int64))})["idx"]
        pad_rows(flat, off, rows, zero, out["particles"], out["mask"], idx)
        for k in self.row_keys:
            np.take(view[k], rows, axis=0, out=out[k])
        return out

    def describe(self, batch: dict[str, torch.Tensor]) -> str:
        """Which shards and rows a batch came from."""
        shards = self.index["splits"][self.split]["shards"]
        src = batch["source"].numpy()
        files = sorted({shards[int(i)]["file"] for i in src[:, 0]})
        return f"{self.split} jets {src[:3].tolist()}... of shards {files}"
