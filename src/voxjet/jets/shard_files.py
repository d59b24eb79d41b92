"""How a shard file holds its arrays (`jets.storage`), and verifying what is read from it.

`mapped` (the default): every dataset uncompressed and contiguous, so a loader's read is one
copy out of the page cache, with a CRC32 of each unit of CHECK_JETS consecutive jets (every
dataset's rows of those jets) verified the first time a process reads the unit. HDF5's
fletcher32 filter, the other way to checksum, is computed on every read and costs more than
LZ4 decoding; checked once a process, a loader's later epochs are plain copies
(`benchmarks/jets_io.py`). `compressed`: LZ4 chunks with fletcher32 (about 0.7 of the disk),
verified by HDF5 on every read."""

from __future__ import annotations

import zlib

import h5py
import numpy as np

from voxjet.io.integrity import checked_lz4

STORAGES = ("mapped", "compressed")
CHECK_JETS = 1024  # jets a CRC32 covers: a loader block (2048 jets) is whole units
CRCS = "crc32"  # dataset [units, keys] of a mapped shard; attrs name its keys

# chunk rows of compressed shards: ~1 MB, a loader block of 2048 jets reads a few whole chunks
_CHUNK_ROWS = {"particles": 16384, "jets": 8192}


class ChecksumMismatch(ValueError):
    """A unit of a mapped shard whose bytes differ from those written."""


def _unit_slices(offsets: np.ndarray, lo: int, keys: list[str]) -> dict[str, slice]:
    """Each dataset's rows of the jets [lo, lo + len(offsets) - 1) whose bounds are `offsets`."""
    hi = lo + len(offsets) - 1
    rows = {"offsets": slice(lo, hi + 1), "particles": slice(int(offsets[0]), int(offsets[-1]))}
    return {k: rows.get(k, slice(lo, hi)) for k in keys}


def _crc(arr: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(arr))


def write_shard_arrays(f: h5py.File, data: dict[str, np.ndarray], storage: str) -> None:
    """The shard's datasets into an open file, laid out as `storage` says."""
    if storage == "compressed":
        comp = checked_lz4()
        for key, arr in data.items():
            chunk = (max(1, min(len(arr), _CHUNK_ROWS.get(key, 65536))), *arr.shape[1:])
            f.create_dataset(key, data=arr, chunks=chunk, **comp)
        return
    keys = ["offsets", *(k for k in data if k != "offsets")]  # offsets first: they place the rest
    for key in keys:
        f.create_dataset(key, data=data[key])  # no chunks, no filters: contiguous
    units = -(-(len(data["offsets"]) - 1) // CHECK_JETS)
    crcs = np.zeros((units, len(keys)), np.uint32)
    for u in range(units):
        lo = u * CHECK_JETS
        sl = _unit_slices(data["offsets"][lo : lo + CHECK_JETS + 1], lo, keys)
        crcs[u] = [_crc(data[k][sl[k]]) for k in keys]
    f.create_dataset(CRCS, data=crcs)
    f[CRCS].attrs["keys"] = keys
    f[CRCS].attrs["jets"] = CHECK_JETS


class ShardChecks:
    """Which units of one shard file this process has verified (a compressed shard's chunks
    are verified by HDF5 on every read: nothing to do)."""

    def __init__(self, f: h5py.File) -> None:
        self.mapped = CRCS in f
        if self.mapped:
            self.crcs = f[CRCS][...]
            self.keys = [str(k) for k in f[CRCS].attrs["keys"]]
            self.jets = f["offsets"].shape[0] - 1
            if int(f[CRCS].attrs["jets"]) != CHECK_JETS:
                raise ChecksumMismatch(f"checksums over {f[CRCS].attrs['jets']} jets, "
                                       f"this voxjet checks {CHECK_JETS}")  # fmt: skip
            self.done = np.zeros(self.crcs.shape, bool)  # [unit, dataset] verified

    def verify_offsets(self, offsets: np.ndarray) -> None:
        """Verify a whole offsets array read at once (reads are sized by it)."""
        if self.mapped:
            for u in range(len(self.crcs)):
                a = u * CHECK_JETS
                if _crc(offsets[a : a + CHECK_JETS + 1]) != self.crcs[u, 0]:
                    b = min(a + CHECK_JETS, len(offsets) - 1)
                    raise ChecksumMismatch(f"CRC32 mismatch in offsets of jets {a}-{b}")

    def verify(
        self,
        sets: dict[str, h5py.Dataset],
        lo: int,
        hi: int,
        have: dict[str, np.ndarray] | None = None,
        offsets: np.ndarray | None = None,
    ) -> None:
        """Verify the datasets in `sets` over the units holding jets [lo, hi) that this
        process has not verified yet; raises ChecksumMismatch naming the dataset and jets.
        `have`: their rows of jets [lo, hi) already read (particles: those jets'), with
        `offsets` the shard's whole offsets, verified: a unit inside is checked there, not
        read a second time."""
        if not self.mapped or hi <= lo:
            return
        source = have if have is not None and offsets is not None else {}
        wanted = [i for i, k in enumerate(self.keys) if k in sets or k in source]
        for u in range(lo // CHECK_JETS, (hi - 1) // CHECK_JETS + 1):
            if self.done[u, wanted].all():
                continue
            a = u * CHECK_JETS
            b = min(a + CHECK_JETS, self.jets)
            inside = bool(source) and lo <= a and b <= hi
            off = offsets[a : b + 1] if inside else sets["offsets"][a : b + 1]
            if _crc(off) != self.crcs[u, 0]:  # first: the particle rows are found by them
                raise ChecksumMismatch(f"CRC32 mismatch in offsets of jets {a}-{b}")
            rows = {"offsets": off}
            if inside:
                p0 = offsets[lo]
                rows.update({k: v[a - lo : b - lo] for k, v in have.items() if k != "particles"})
                if "particles" in have:
                    rows["particles"] = have["particles"][off[0] - p0 : off[-1] - p0]
            sl = _unit_slices(off, a, self.keys)
            rows.update({k: sets[k][sl[k]] for i, k in enumerate(self.keys)
                         if k in sets and k not in rows and not self.done[u, i]})  # fmt: skip
            for i, k in enumerate(self.keys):
                if k in rows and not self.done[u, i]:
                    if _crc(rows[k]) != self.crcs[u, i]:
                        raise ChecksumMismatch(f"CRC32 mismatch in {k} of jets {a}-{b}")
                    self.done[u, i] = True
