"""Whole-case inference (voxjet.volumes.inference.segment) and its memory check
(voxjet.volumes.inference.case_memory): probabilities equal MONAI's sliding window, mirroring per
window equals the flips run one by one, labels straight from the logits equal the arg-max of the
probabilities, and a case too large for the job's memory is refused before any work."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.inferers import sliding_window_inference

from voxjet.errors import VoxjetError
from voxjet.volumes.inference.case_memory import (
    check_prediction_memory,
    prediction_need,
    read_header,
)
from voxjet.volumes.inference.segment import (
    Windows,
    logits_to_labels,
    mirror_axes,
    predict_logits,
    segment_image,
    to_labels,
    to_probs,
)
from voxjet.volumes.inference.sliding_window import stream_slabs, window_grid
from voxjet.volumes.networks.models import build_unet
from voxjet.volumes.plan.plan_file import LabelSet

THREE = LabelSet({0: "background", 1: "a", 2: "b"}, 3)
PATCH = [16, 16, 8]


@pytest.fixture(scope="module")
def net_and_image():
    torch.manual_seed(0)
    model = build_unet(1, 3, [4, 8, 16], num_res_units=1).eval()
    rng = np.random.default_rng(0)
    # a smooth image (a blob and a ramp), so the classes form regions rather than noise
    x, y, z = np.meshgrid(*(np.linspace(-1, 1, n) for n in (37, 30, 19)), indexing="ij")
    image = 2 * np.exp(-(x**2 + y**2 + z**2) * 4) + x + 0.1 * rng.normal(size=x.shape)
    return model, image[None].astype(np.float32)


def _monai(model, image, flips):
    def predictor(w):
        outs = [torch.flip(model(torch.flip(w, f)), f) if f else model(w) for f in flips]
        return sum(outs) / len(outs)

    with torch.no_grad():
        return sliding_window_inference(torch.from_numpy(image[None]), PATCH, 2, predictor, 0.5,
                                        mode="gaussian", padding_mode="constant")[0]  # fmt: skip


@pytest.mark.parametrize("mirror", [False, True])
def test_probabilities_equal_monais_sliding_window(net_and_image, mirror):
    """Without mirroring MONAI's sliding window itself; with it, each window's logits averaged
    over the 8 flips, run one flip at a time (nnU-Net's mirroring), to 1e-5."""
    model, image = net_and_image
    ref = torch.softmax(_monai(model, image, mirror_axes(PATCH, mirror)), 0)
    got = to_probs(predict_logits(model, image, Windows(PATCH, mirror=mirror), torch.device("cpu")))
    assert got.shape == ref.shape == (3, *image.shape[1:])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_labels_from_logits_equal_the_arg_max_of_the_probabilities(net_and_image):
    model, image = net_and_image
    dev = torch.device("cpu")
    logits = predict_logits(model, image, Windows(PATCH), dev)
    labels = segment_image(model, image, Windows(PATCH), dev, classes=THREE)[0]
    np.testing.assert_array_equal(labels, to_labels(torch.softmax(logits, 0), THREE))
    assert len(np.unique(labels)) == 3  # all three classes present: the test can fail
    regions = LabelSet({0: "background", 1: "a", 2: "b"}, 3, {"ab": [1, 2], "b": [2]}, [1, 2])
    np.testing.assert_array_equal(logits_to_labels(logits[1:], regions),
                                  to_labels(torch.sigmoid(logits[1:]), regions))  # fmt: skip


def _nifti(path, shape, zooms, channels=1):
    data = np.zeros((*shape, channels) if channels > 1 else shape, np.int16)
    nib.save(nib.Nifti1Image(data, np.diag([*zooms, 1.0])), path)
    return path


def test_a_case_too_large_for_the_jobs_memory_is_refused_before_any_work(tmp_path, monkeypatch):
    big = _nifti(tmp_path / "ct_0000.nii.gz", (256, 256, 200), (0.8, 0.8, 1.5))
    head = read_header([big])
    assert head.shape == (256, 256, 200) and head.channels == 1 and head.ras_axes == (0, 1, 2)
    need = prediction_need(head, [0.8, 0.8, 1.5], 14, False, [128, 128, 128])
    # image ×2 and plan-space ×2 (float32), three label maps, and 15 planes of logits and
    # weights over one window's depth (128 of the 256 planes along x: half the case)
    voxels = 256 * 256 * 200
    assert need - 1024**3 == 8 * voxels + 8 * voxels + 60 * voxels // 2 + 3 * voxels
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "2000")
    said = (
        r"ct_0000\.nii\.gz: predicting case 'ct' \(256×256×200 voxels, 1 channel\(s\), 14 "
        r"classes\) needs about 3\.6 GiB, more than the 2\.0 GiB of the SLURM allocation "
        r"\(2000 MB a node\).*--probabilities: an ensemble"
    )
    # an ensemble of configurations averages every class's probabilities on the case's grid
    with pytest.raises(VoxjetError, match=said):
        check_prediction_memory([("ct", [big])], [0.8, 0.8, 1.5], 14, True, [128] * 3, True)
    # one configuration's probabilities are streamed to their file a class at a time
    check_prediction_memory([("ct", [big])], [0.8, 0.8, 1.5], 14, True, [128, 128, 128])
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "1500")
    with pytest.raises(VoxjetError, match=r"needs about 1\.8 GiB, more than the 1\.5 GiB") as e:
        check_prediction_memory([("ct", [big])], [0.8, 0.8, 1.5], 14, True, [128, 128, 128])
    assert "--probabilities" not in str(e.value)
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "5000")
    check_prediction_memory([("ct", [big])], [0.8, 0.8, 1.5], 14, True, [128] * 3, True)
    # a finer plan spacing needs more: the prepared image is larger
    assert prediction_need(head, [0.4, 0.4, 1.5], 14, False, [128] * 3) > need


@pytest.mark.parametrize(
    ("shape", "patch", "axis"),
    [
        ((1, 37, 30, 19), [16, 16, 8], None),  # streamed along the last axis
        ((2, 10, 30, 21), [16, 16, 16], None),  # the first axis shorter than a window: padded
        ((1, 37, 30, 19), [16, 16, 8], 0),  # every axis can carry the band
        ((1, 37, 30, 19), [16, 16, 8], 1),
        ((1, 33, 17, 1), [16, 16, 1], None),  # a 2d configuration's one-voxel axis
    ],
)
def test_streamed_slabs_equal_monais_logits(shape, patch, axis):
    """Every slab the stream hands on equals MONAI's sliding_window_inference there (1e-5),
    the slabs tile the image exactly once."""
    torch.manual_seed(1)
    c_in = shape[0]
    if patch[2] == 1:
        model = torch.nn.Conv3d(c_in, 3, (3, 3, 1), padding=(1, 1, 0)).eval()
    else:
        model = build_unet(c_in, 3, [4, 8], num_res_units=1).eval()
    image = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    with torch.no_grad():
        ref = sliding_window_inference(torch.from_numpy(image[None]), patch, 2, model, 0.5,
                                       mode="gaussian", padding_mode="constant")[0]  # fmt: skip
        covered = torch.zeros(shape[1:], dtype=torch.int32)
        for a, lo, hi, slab in stream_slabs(model, image, patch, torch.device("cpu"), axis=axis):
            index = [slice(None)] * 3
            index[a] = slice(lo, hi)
            torch.testing.assert_close(slab, ref[(slice(None), *index)], atol=1e-5, rtol=0)
            covered[tuple(index)] += 1
    assert bool((covered == 1).all())


def test_a_half_precision_band_as_on_a_gpu_stays_close_to_monai():
    """The float16 accumulator a GPU gets (run here on the CPU, which CI has): logits within
    half precision's rounding of MONAI's float32 ones, the same arg-max almost everywhere."""
    torch.manual_seed(2)
    model = build_unet(1, 3, [4, 8], num_res_units=1).eval()
    image = np.random.default_rng(2).normal(size=(1, 40, 36, 30)).astype(np.float32)
    with torch.no_grad():
        ref = sliding_window_inference(torch.from_numpy(image[None]), [16, 16, 16], 2, model,
                                       0.5, mode="gaussian")[0]  # fmt: skip
        got = torch.empty_like(ref)
        for a, lo, hi, slab in stream_slabs(model, image, [16, 16, 16], torch.device("cpu"),
                                            dtype=torch.float16):  # fmt: skip
            assert slab.dtype == torch.float32
            got[(slice(None),) * (1 + a) + (slice(lo, hi),)] = slab
    scale = float(ref.abs().max())
    torch.testing.assert_close(got, ref, atol=4e-3 * scale, rtol=0)
    assert float((got.argmax(0) == ref.argmax(0)).float().mean()) > 0.99


def test_slabs_finish_before_the_last_window():
    """The stream hands a slab on while windows further along are still to run: the case's
    logits are never held whole."""
    image = np.zeros((1, 16, 16, 64), np.float32)
    calls, first_yield = [], None

    def predictor(w):
        calls.append(len(w))
        return torch.zeros((len(w), 2, *w.shape[2:]))

    grid = window_grid(image.shape[1:], [16, 16, 16], 0.5)
    for i, (a, lo, _, _) in enumerate(stream_slabs(predictor, image, [16, 16, 16],
                                                    torch.device("cpu"))):  # fmt: skip
        assert a == 2
        if i == 0:
            first_yield, first_lo = sum(calls), lo
    assert first_lo == 0 and first_yield < len(grid.starts) == sum(calls)


def test_folds_and_probabilities_in_one_pass(net_and_image):
    """Several models averaged window by window equal their whole-case logits averaged; the
    probabilities segment_image builds slab by slab equal the softmax of those logits."""
    model, image = net_and_image
    torch.manual_seed(5)
    other = build_unet(1, 3, [4, 8, 16], num_res_units=1).eval()
    dev = torch.device("cpu")
    apart = (
        predict_logits(model, image, Windows(PATCH), dev)
        + predict_logits(other, image, Windows(PATCH), dev)
    ) / 2
    together = predict_logits([model, other], image, Windows(PATCH), dev)
    torch.testing.assert_close(together, apart, atol=1e-5, rtol=0)
    labels, probs = segment_image([model, other], image, Windows(PATCH), dev, classes=THREE,
                                  probabilities=True)  # fmt: skip
    torch.testing.assert_close(torch.from_numpy(probs), torch.softmax(apart, 0), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(labels, to_labels(torch.softmax(apart, 0), THREE))


@pytest.mark.parametrize("background", [1.0, 0.0])
def test_probabilities_streamed_class_by_class_equal_the_whole_array_written(tmp_path, background):
    """predict's --probabilities through the chunked file and gzip stream: the same 4-D NIfTI
    (values, shape, affine) as mapping all classes back at once, on a flipped, permuted
    (non-RAS) grid with a crop box and resampling."""
    from voxjet.volumes.dataset.geometry import probs_to_original, to_ras
    from voxjet.volumes.inference.probability_file import (
        plan_space_buffer,
        stream_to_nifti,
        write_slab,
    )

    affine = np.array([[0, 0, -1.5, 10], [-0.8, 0, 0, 5], [0, 0.9, 0, -3], [0, 0, 0, 1.0]])
    original = (21, 17, 12)  # stored axes: S, R, A
    ras_shape = to_ras(np.zeros(original), affine).shape
    attrs = {"crop_box": [[2, 11], [1, 19], [3, 16]], "ras_shape": ras_shape,
             "original_affine": affine}  # fmt: skip
    plan_shape = (16, 9, 25)
    probs = torch.softmax(torch.from_numpy(np.random.default_rng(0).normal(
        size=(4, *plan_shape)).astype(np.float32)), 0)  # fmt: skip
    with plan_space_buffer(tmp_path, "c", 4, plan_shape) as buffer:
        for lo in range(0, plan_shape[2], 7):  # slabs along the last axis, as the stream hands on
            write_slab(buffer, 2, lo, min(lo + 7, plan_shape[2]), probs[:, :, :, lo : lo + 7])
        stream_to_nifti(tmp_path / "c_probabilities.nii.gz", buffer, attrs, background)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c_probabilities.nii.gz"]
    img = nib.load(tmp_path / "c_probabilities.nii.gz")
    want = probs_to_original(probs.numpy(), attrs, background)
    assert img.shape == (*original, 4) == want.shape
    np.testing.assert_allclose(img.affine, affine, atol=1e-6)
    np.testing.assert_allclose(np.asarray(img.dataobj), want, atol=1e-6)
