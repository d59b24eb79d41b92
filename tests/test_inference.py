"""Whole-case inference (voxjet.volumes.inference) and its memory check
(voxjet.volumes.case_memory): probabilities equal MONAI's sliding window, mirroring per window
equals the flips run one by one, labels straight from the logits equal the arg-max of the
probabilities, and a case too large for the job's memory is refused before any work."""

from __future__ import annotations

import nibabel as nib
import numpy as np
import pytest
import torch
from monai.inferers import sliding_window_inference

from voxjet.errors import VoxjetError
from voxjet.volumes.case_memory import check_prediction_memory, prediction_need, read_header
from voxjet.volumes.inference import (
    logits_to_labels,
    mirror_axes,
    predict_case,
    predict_logits,
    to_labels,
    to_probs,
)
from voxjet.volumes.models import build_unet
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
    got = to_probs(predict_logits(model, image, PATCH, torch.device("cpu"), mirror=mirror))
    assert got.shape == ref.shape == (3, *image.shape[1:])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_labels_from_logits_equal_the_arg_max_of_the_probabilities(net_and_image):
    model, image = net_and_image
    dev = torch.device("cpu")
    logits = predict_logits(model, image, PATCH, dev)
    labels = predict_case(model, image, PATCH, dev, classes=THREE)
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
    # image ×2 and plan-space ×2 (float32), 15 planes of logits and weights, three label maps
    voxels = 256 * 256 * 200
    assert need - 1024**3 == 8 * voxels + 8 * voxels + 60 * voxels + 3 * voxels
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "2000")
    said = (
        r"ct_0000\.nii\.gz: predicting case 'ct' \(256×256×200 voxels, 1 channel\(s\), 14 "
        r"classes\) needs about 4\.0 GiB, more than the 2\.0 GiB of the SLURM allocation "
        r"\(2000 MB a node\).*--probabilities"
    )
    with pytest.raises(VoxjetError, match=said):
        check_prediction_memory([("ct", [big])], [0.8, 0.8, 1.5], 14, True, [128, 128, 128])
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "5000")
    check_prediction_memory([("ct", [big])], [0.8, 0.8, 1.5], 14, True, [128, 128, 128])
    # a finer plan spacing needs more: the prepared image is larger
    assert prediction_need(head, [0.4, 0.4, 1.5], 14, False, [128] * 3) > need
