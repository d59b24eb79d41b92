"""Case arrays packed for reads from disk: blosc2 frames inside the case's HDF5 file, images in
16-bit fixed point, a CRC32 a compressed chunk.

A random patch out of a memory-mapped float32 array touches every plane it crosses; once a
dataset outgrows the page cache those reads come from the disk, and nnU-Net's blosc2 files
read less. This store reads less still (benchmarks/README.md): the normalised image is kept as
int16 with a step of at most 2^-10 of the channel's standard deviation in the case, whatever
its normalisation (below float16's error for every value past half a standard deviation; half
the bytes of float32 before compression), in LZ4HC
blocks a quarter of the plan's patch on each axis, so a patch decodes little beyond itself.
The frame sits in a contiguous uint8 dataset of the case file, so a case stays one file for
staging, node-local copies and URLs, and blosc2 opens it in place by its offset.

blosc2 frames carry no checksum of their own and a flipped byte can decode to other numbers
without an error, so each compressed chunk's CRC32 is stored beside the frame and verified the
first time a process reads the chunk (one pass over the data a process, as the mapped store)."""

from __future__ import annotations

import zlib

import blosc2
import h5py
import numpy as np

from voxjet.io.integrity import corrupt_error

STEP_PER_STD = 2.0**-10  # the largest step, in standard deviations of the channel
LARGEST_CODE = 32767  # codes run -32767..32767


def block_layout(
    shape: tuple[int, ...], patch: tuple[int, ...], parts: int = 4
) -> tuple[tuple[int, ...], ...]:
    """(chunks, blocks) of a spatial array of `shape` read in patches of `patch`: blocks the
    largest power of two at most 1/`parts` of the patch on each axis (a quarter: a random patch
    decodes about 1.2 times itself an axis), chunks the patch rounded up to whole blocks."""
    blocks, chunks = [], []
    for s, p in zip(shape, patch, strict=True):
        b = min(s, 1 << max(0, (max(1, p // parts)).bit_length() - 1))
        blocks.append(b)
        chunks.append(min(s, -(-p // b) * b))
    return tuple(chunks), tuple(blocks)


def quantise(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An image [C, ...] as int16 codes and each channel's step: value = code * step (no
    offset, so a read converts in one multiplication), the step a power of two (exact in
    float32) at most STEP_PER_STD of the channel's standard deviation, coarser only for a
    channel reaching beyond LARGEST_CODE such steps from 0 (past ±32 standard deviations of a
    z-scored channel); errors at most step / 2."""
    codes = np.empty(image.shape, np.int16)
    steps = np.empty(len(image), np.float64)
    for c, ch in enumerate(image):
        reach = max(abs(float(ch.min())), abs(float(ch.max())))
        std = float(ch.std(dtype=np.float64))
        step = 2.0 ** np.floor(np.log2(STEP_PER_STD * std)) if std > 0 else 0.0
        need = reach / LARGEST_CODE  # the finest step whose codes reach the largest magnitude
        if step < need:  # (a constant channel too: its one value as closely as codes allow)
            step = 2.0 ** np.ceil(np.log2(need))
        step = step or 1.0  # all zeros
        codes[c] = np.clip(np.rint(ch / step), -LARGEST_CODE, LARGEST_CODE)
        steps[c] = step
    return codes, steps


def write_packed(f: h5py.File, name: str, data: np.ndarray, patch: tuple[int, ...]) -> float:
    """`data` (an image [C, X, Y, Z] of floats, quantised; or a label [X, Y, Z] of uint8, kept
    exactly) as a blosc2 frame in dataset `name` with its chunks' CRC32s beside it; returns the
    largest quantisation error (0 for a label)."""
    spatial = data.shape[1:] if data.ndim == 4 else data.shape
    # a label map compresses to almost nothing: what its reads cost is the blocks' overhead,
    # so half-patch blocks (measured faster than quarter-patch ones)
    chunks, blocks = block_layout(spatial, patch, 4 if data.dtype.kind == "f" else 2)
    error = 0.0
    attrs: dict = {"packed_shape": data.shape}
    if data.dtype.kind == "f":
        codes, steps = quantise(data)
        chunks, blocks = (1, *chunks), (1, *blocks)
        attrs.update({"packed_dtype": "float32", "step": steps})
        error = max(
            float(np.abs(q * np.float32(st) - ch).max())
            for q, st, ch in zip(codes, steps, data, strict=True)
        )
    else:
        codes = np.ascontiguousarray(data, np.uint8)
        attrs["packed_dtype"] = "uint8"
    # LZ4HC without a shuffle: measured faster to decode than with one, for 15% more bytes
    cparams = {"codec": blosc2.Codec.LZ4HC, "clevel": 5, "filters": [blosc2.Filter.NOFILTER],
               "nthreads": 1}  # fmt: skip
    frame = blosc2.asarray(codes, chunks=chunks, blocks=blocks, cparams=cparams).to_cframe()
    # the checksums of the chunks as a reader of the frame gets them (a chunk of zeros is
    # held otherwise in the array written than in its frame)
    stored = blosc2.ndarray_from_cframe(frame).schunk
    crcs = np.array([zlib.crc32(stored.get_chunk(i)) for i in range(stored.nchunks)], np.uint32)
    dset = f.create_dataset(name, data=np.frombuffer(frame, np.uint8))  # contiguous
    dset.attrs.update(attrs)
    f.create_dataset(f"{name}_crc32", data=crcs)
    return error


def is_packed(dset: h5py.Dataset) -> bool:
    """Whether a dataset was written by write_packed."""
    return "packed_shape" in dset.attrs


class PackedArray:
    """A write_packed dataset read box by box (decoded to float32 or uint8), each compressed
    chunk verified by its CRC32 the first time this process reads it."""

    def __init__(self, dset: h5py.Dataset, where: str, path: str | None) -> None:
        self.where, self.name = where, dset.name.lstrip("/")
        self.shape = tuple(int(s) for s in dset.attrs["packed_shape"])
        self.dtype = np.dtype(dset.attrs["packed_dtype"])
        self.quantised = self.dtype.kind == "f"
        if self.quantised:
            self.step = dset.attrs["step"].astype(np.float32)
        self.crcs = dset.file[f"{dset.name}_crc32"][...]
        self.verified = np.zeros(len(self.crcs), bool)
        self.all_verified = False
        dparams = {"nthreads": 1}  # a loader worker is a process of one thread
        offset = dset.id.get_offset()
        try:
            if path is not None and offset is not None:
                # read with the file's own reads, not a memory map: pages the loader no longer
                # needs leave the page cache as other data's would
                self.arr = blosc2.open(path, mode="r", offset=offset, dparams=dparams)
            else:  # a case file held in memory (fetched from a URL)
                self.arr = blosc2.ndarray_from_cframe(dset[...].tobytes())
        except (RuntimeError, ValueError, OSError) as e:
            raise corrupt_error(
                where, f"{self.name} (its blosc2 frame)", "preprocess_case", e
            ) from e
        if tuple(self.arr.shape) != self.shape or len(self.crcs) != self.arr.schunk.nchunks:
            raise corrupt_error(
                where,
                self.name,
                "preprocess_case",
                ValueError("frame shape or chunk count differs from its record"),
            )
        self.chunks = tuple(self.arr.chunks)
        self.grid = tuple(-(-s // c) for s, c in zip(self.shape, self.chunks, strict=True))

    def _verify(self, lo: tuple[int, ...], hi: tuple[int, ...]) -> None:
        if self.all_verified:  # the steady state of a long training: nothing to look up
            return
        ranges = [
            range(a // c, (b - 1) // c + 1) for a, b, c in zip(lo, hi, self.chunks, strict=True)
        ]
        for idx in np.ndindex(*(len(r) for r in ranges)):
            pos = tuple(r[i] for r, i in zip(ranges, idx, strict=True))
            n = int(np.ravel_multi_index(pos, self.grid))
            if self.verified[n]:
                continue
            try:
                ok = zlib.crc32(self.arr.schunk.get_chunk(n)) == self.crcs[n]
            except (RuntimeError, ValueError, OSError):
                ok = False
            if not ok:
                box = [f"{p * c}-{min((p + 1) * c, s) - 1}"
                       for p, c, s in zip(pos, self.chunks, self.shape, strict=True)]  # fmt: skip
                what = self.name if len(box) == 3 else f"{self.name} channel {pos[0]}"
                what += f" voxels [{', '.join(box[-3:])}] (chunk {n})"
                raise corrupt_error(self.where, what, "preprocess_case",
                                    ValueError("CRC32 mismatch"))  # fmt: skip
            self.verified[n] = True
        self.all_verified = bool(self.verified.all())

    def read(
        self, lo: tuple[int, ...], hi: tuple[int, ...], out: np.ndarray | None = None
    ) -> np.ndarray:
        """The box [lo, hi) (within the array's bounds), into `out` when given."""
        if all(b > a for a, b in zip(lo, hi, strict=True)):
            self._verify(lo, hi)
        box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
        try:
            codes = self.arr[box]
        except (RuntimeError, ValueError) as e:
            raise corrupt_error(self.where, self.name, "preprocess_case", e) from e
        if out is None:
            out = np.empty(codes.shape, self.dtype)
        if not self.quantised:
            out[...] = codes
            return out
        for c in range(codes.shape[0]):
            np.multiply(codes[c], self.step[lo[0] + c], out=out[c])
        return out

    def whole(self) -> np.ndarray:
        """The whole array, verified."""
        return self.read((0,) * len(self.shape), self.shape)
