"""The blosc2 case store (voxjet.io.packed): layout, fixed-point error, reads, integrity."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from voxjet.errors import VoxjetError
from voxjet.io.packed import STEP_PER_STD, PackedArray, block_layout, quantise, write_packed


def test_layout_blocks_a_quarter_patch_chunks_a_patch():
    assert block_layout((203, 203, 100), (128, 128, 64)) == ((128, 128, 64), (32, 32, 16))
    # short axes and 2-D-like patches: blocks and chunks never beyond the array
    assert block_layout((10, 200, 3), (8, 96, 1)) == ((8, 96, 1), (2, 16, 1))
    assert block_layout((5, 5, 5), (64, 64, 64)) == ((5, 5, 5), (5, 5, 5))
    # labels: half-patch blocks
    assert block_layout((203, 203, 100), (128, 128, 64), 2) == ((128, 128, 64), (64, 64, 32))


def test_quantise_step_follows_each_channels_spread_and_grows_only_for_its_range():
    rng = np.random.default_rng(0)
    zscored = rng.normal(size=(20, 20, 20)).astype(np.float32)
    unit = rng.random((20, 20, 20)).astype(np.float32)  # rescale_to_0_1
    spiked = zscored.copy()
    spiked[0, 0, 0] = 500  # one voxel 500 σ out: 2^-10 σ steps from 0 do not reach it
    flat = np.full((20, 20, 20), 3.25, np.float32)
    codes, steps = quantise(np.stack([zscored, unit, spiked, flat]))
    assert codes.dtype == np.int16 and (np.log2(steps) == np.round(np.log2(steps))).all()
    for c in (0, 1):  # the finest power of two within 2^-10 of the channel's spread
        std = float(np.std([zscored, unit][c], dtype=np.float64))
        assert STEP_PER_STD * std / 2 < steps[c] <= STEP_PER_STD * std
    assert 500 / steps[2] <= 32767 < 500 / (steps[2] / 2)
    for c, ch in enumerate((zscored, unit, spiked, flat)):
        back = codes[c] * np.float32(steps[c])
        assert np.abs(back - ch).max() <= steps[c] / 2 * 1.01  # and float32 rounding
    assert (codes[3] * np.float32(steps[3]) == flat).all()


def _write(path, image, label, patch=(16, 16, 8)) -> float:
    with h5py.File(path, "w") as f:
        err = write_packed(f, "image", image, patch)
        write_packed(f, "label", label, patch)
    return err


@pytest.fixture
def arrays():
    rng = np.random.default_rng(1)
    image = rng.normal(size=(2, 37, 29, 21)).astype(np.float32)
    image[1] *= 3
    image[:, :10] = image.min()  # a clipped, constant background as CT has
    label = (rng.random((37, 29, 21)) > 0.8).astype(np.uint8) * 2
    label[:, :, :9] = 0  # whole chunks of zeros, held otherwise in a frame
    return image, label


def test_boxes_read_back_within_the_error_labels_exactly(tmp_path, arrays):
    image, label = arrays
    err = _write(tmp_path / "c.h5", image, label)
    spread = max(float(np.std(ch, dtype=np.float64)) for ch in image)
    assert 0 < err <= STEP_PER_STD * spread / 2 * 1.01  # half a step, and float32 rounding
    with h5py.File(tmp_path / "c.h5") as f:
        on_disk = PackedArray(f["image"], "c.h5", str(tmp_path / "c.h5"))
        in_memory = PackedArray(f["image"], "c.h5", None)  # a case file fetched from a URL
        lbl = PackedArray(f["label"], "c.h5", str(tmp_path / "c.h5"))
        assert on_disk.shape == image.shape and on_disk.dtype == np.float32
        rng = np.random.default_rng(2)
        for _ in range(30):  # boxes across chunk borders, into a given buffer or not
            lo = [int(rng.integers(0, s)) for s in label.shape]
            hi = [int(rng.integers(a + 1, s + 1)) for a, s in zip(lo, label.shape, strict=True)]
            sl = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
            out = np.empty((1, *(b - a for a, b in zip(lo, hi, strict=True))), np.float32)
            got = on_disk.read((1, *lo), (2, *hi), out=out)
            assert got is out and np.abs(out[0] - image[1][sl]).max() <= err
            assert np.array_equal(
                in_memory.read((0, *lo), (2, *hi)), on_disk.read((0, *lo), (2, *hi))
            )
            assert np.array_equal(lbl.read(tuple(lo), tuple(hi)), label[sl])
        assert np.abs(on_disk.whole() - image).max() <= err and on_disk.verified.all()


def test_a_flipped_byte_is_named_by_file_array_and_voxels(tmp_path, arrays):
    image, label = arrays
    path = tmp_path / "case.h5"
    _write(path, image, label)
    with h5py.File(path) as f:
        start = f["image"].id.get_offset()
        size = f["image"].size
    raw = bytearray(path.read_bytes())
    raw[start + size // 2] ^= 0x04  # inside a compressed chunk of the image
    path.write_bytes(bytes(raw))
    with h5py.File(path) as f:
        arr = PackedArray(f["image"], str(path), str(path))
        with pytest.raises(VoxjetError) as e:
            arr.whole()
    msg = str(e.value)
    assert "case.h5" in msg and "rerun preprocess_case" in msg
    assert "image channel" in msg and "voxels [" in msg and "CRC32" in msg


def test_a_truncated_frame_is_refused(tmp_path, arrays):
    image, label = arrays
    with h5py.File(tmp_path / "whole.h5", "w") as f:
        write_packed(f, "image", image, (16, 16, 8))
        frame, attrs, crcs = f["image"][...], dict(f["image"].attrs), f["image_crc32"][...]
    with h5py.File(tmp_path / "c.h5", "w") as f:  # the frame cut short, the record intact
        f.create_dataset("image_crc32", data=crcs)
        f.create_dataset("image", data=frame[: len(frame) // 3]).attrs.update(attrs)
    with h5py.File(tmp_path / "c.h5") as f, pytest.raises(VoxjetError, match=r"c.h5: image"):
        PackedArray(f["image"], "c.h5", str(tmp_path / "c.h5")).whole()
