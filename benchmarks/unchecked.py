"""For the benchmarks: a copy of a folder of voxjet HDF5 files (shards, case files) with the
same chunks and compression but no checksums (fletcher32, a mapped shard's CRC32s), to
measure what verifying costs."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import hdf5plugin


def copy_without_checksums(src: Path, dst: Path) -> Path:
    """`src` copied to `dst`, every dataset of its .h5 files rewritten without fletcher32."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.h5"))
    for path in src.rglob("*.h5"):
        out = dst / path.relative_to(src)
        with h5py.File(path, "r") as fin, h5py.File(out, "w") as fout:
            fout.attrs.update(dict(fin.attrs))

            def copy(name, obj):
                if name == "crc32":  # a mapped jet shard's CRC32s: without them, none verified
                    return
                if isinstance(obj, h5py.Dataset):
                    lz4 = hdf5plugin.LZ4() if obj.compression or obj._filters else {}
                    fout.create_dataset(name, data=obj[...], chunks=obj.chunks, **lz4)

            fin.visititems(copy)
    return dst
