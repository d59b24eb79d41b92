"""Augmentation on the training device (voxjet.volumes.training.augment): the draws follow nnU-Net's
probabilities and ranges, each transform does what batchgeneratorsv2's does, the two-pass
resampling matches trilinear inside the cut, the loader's mirrored cuts equal mirroring
afterwards, and training with it resumes exactly; the device feed (pinned buffers, one batch
ahead) hands over the same tensors as the plain path."""

from __future__ import annotations

import json
import os
import re
import signal

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage, stats

from voxjet.volumes.training import augment as A

N = 20000  # draws for the statistical tests: 4σ of a binomial share is ~0.012 at p = 0.5


@pytest.fixture(scope="module")
def draws() -> dict[str, np.ndarray]:
    g = A.AugmentGeometry(channels=2)
    return {k[4:]: v for k, v in A.draw_batch((7, 0, 0, 0), N, g).items()}


def _share_close(hits: np.ndarray, p: float) -> None:
    sigma = np.sqrt(p * (1 - p) / hits.size)
    assert abs(hits.mean() - p) < 4 * sigma + 1e-9, (hits.mean(), p)


def test_each_transform_is_drawn_with_nnunets_probability(draws):
    rotated = (draws["angles"] != 0).any(1)
    scaled = draws["scale"] != 1
    _share_close(rotated, A.P_ROTATE)
    _share_close(scaled, A.P_SCALE)
    assert np.array_equal(draws["spatial"], rotated | scaled)
    _share_close(draws["noise"] > 0, A.P_NOISE)
    blurred = (draws["blur"] > 0).any(-1)  # [N, C]
    _share_close(blurred.any(1), A.P_BLUR * (1 - (1 - A.P_BLUR_CHANNEL) ** 2))
    _share_close(blurred[blurred.any(1), 0], A.P_BLUR_CHANNEL / (1 - (1 - A.P_BLUR_CHANNEL) ** 2))
    _share_close((draws["brightness"] != 1).any(1), A.P_BRIGHTNESS)
    _share_close((draws["contrast"] != 1).any(1), A.P_CONTRAST)
    lowres = (draws["lowres"] != 1).any(1)
    _share_close(lowres, A.P_LOWRES * (1 - (1 - A.P_LOWRES_CHANNEL) ** 2))
    _share_close((draws["gamma_inverted"] != 1).any(1), A.P_GAMMA_INVERTED)
    _share_close((draws["gamma"] != 1).any(1), A.P_GAMMA)
    for axis in range(3):
        _share_close(draws["mirror"][:, axis], A.P_MIRROR)


def test_each_parameter_follows_its_range(draws):
    angles = draws["angles"][(draws["angles"] != 0).any(1)]
    assert np.abs(angles).max() <= A.ROTATE
    # uniform on ±30° about every axis (Kolmogorov–Smirnov)
    for axis in range(3):
        assert (
            stats.kstest(angles[:, axis], stats.uniform(-A.ROTATE, 2 * A.ROTATE).cdf).pvalue > 1e-3
        )
    scale = draws["scale"][draws["scale"] != 1]
    assert stats.kstest(scale, stats.uniform(A.SCALE[0], A.SCALE[1] - A.SCALE[0]).cdf).pvalue > 1e-3
    noise = draws["noise"][draws["noise"] > 0]
    assert noise.max() <= A.NOISE_STD[1]
    sig = draws["blur"][draws["blur"] > 0]
    assert A.BLUR_SIGMA[0] <= sig.min() and sig.max() <= A.BLUR_SIGMA[1]
    lowres = draws["lowres"][draws["lowres"] != 1]
    assert A.LOWRES[0] <= lowres.min() and lowres.max() <= A.LOWRES[1]
    # batchgeneratorsv2's BGContrast: half the factors below 1, uniform on each side
    for key, (lo, hi) in (("brightness", A.BRIGHTNESS), ("contrast", A.CONTRAST),
                          ("gamma", A.GAMMA), ("gamma_inverted", A.GAMMA)):  # fmt: skip
        f = draws[key][draws[key] != 1]
        assert lo <= f.min() and f.max() <= hi
        _share_close(f < 1, 0.5)
        assert stats.kstest(f[f < 1], stats.uniform(lo, 1 - lo).cdf).pvalue > 1e-3
        assert stats.kstest(f[f > 1], stats.uniform(1, hi - 1).cdf).pvalue > 1e-3


def test_thick_slice_data_turns_in_plane_only():
    g = A.AugmentGeometry.from_spacing(1, [0.8, 0.8, 5.0])
    assert g.coarse_axis == 2
    d = {k[4:]: v for k, v in A.draw_batch((1, 0, 0, 0), 4000, g).items()}
    turned = d["angles"][(d["angles"] != 0).any(1)]
    assert (turned[:, :2] == 0).all() and np.abs(turned[:, 2]).max() <= A.ROTATE_IN_PLANE
    assert np.abs(turned[:, 2]).max() > A.ROTATE  # nnU-Net's ±180° for 2-D augmentation
    assert (d["coarse_axis"] == 2).all()
    assert A.AugmentGeometry.from_spacing(1, [1.0, 1.2, 2.0]).coarse_axis is None


def test_draws_are_a_pure_function_of_the_position():
    g = A.AugmentGeometry(channels=1)
    a, b = A.draw_batch((3, 1, 2, 5), 6, g), A.draw_batch((3, 1, 2, 5), 6, g)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    c = A.draw_batch((3, 1, 2, 6), 6, g)
    assert not np.array_equal(a["aug_noise_seed"], c["aug_noise_seed"])
    # each patch its own generator: a larger batch starts with the same patches
    d = A.draw_batch((3, 1, 2, 5), 9, g)
    assert all(np.array_equal(a[k], d[k][:6]) for k in a)


# ---- the transforms ------------------------------------------------------------------------


def _smooth(shape, seed=0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(ndimage.gaussian_filter(rng.normal(size=shape), 2.0).astype(np.float32))


def _neutral(b: int, c: int = 1) -> dict[str, np.ndarray]:
    return {"spatial": np.zeros(b, bool), "angles": np.zeros((b, 3)), "scale": np.ones(b),
            "noise": np.zeros(b), "noise_seed": np.zeros(b, np.int64),
            "blur": np.zeros((b, c, 3)), "brightness": np.ones((b, c)),
            "contrast": np.ones((b, c)), "lowres": np.ones((b, c)),
            "gamma_inverted": np.ones((b, c)), "gamma": np.ones((b, c)),
            "mirror": np.zeros((b, 3), bool), "coarse_axis": np.full(b, -1)}  # fmt: skip


PATCH = np.array([20, 18, 12])


def _turned(angles, scale=1.0, mirror=(0, 0, 0), seed=0):
    """A volume, its label, the cut for this map, and the resampled patch."""
    big = A.cut_size(np.asarray(angles, float), scale, PATCH)
    vol = _smooth(big, seed)[None]
    lab = (vol > 0).to(torch.uint8)
    m, b = A.voxel_map(np.asarray(angles, float), scale, np.asarray(mirror, bool), PATCH, big)
    ((img, lbl),) = A.resample(vol[None], lab[None], [(m, b)], PATCH)
    return vol, lab, big, (m, b), img, lbl


def test_an_unturned_map_cuts_the_centre():
    vol, lab, big, _, img, lbl = _turned((0, 0, 0))
    lo = big // 2 - PATCH // 2
    box = tuple(slice(a, a + p) for a, p in zip(lo, PATCH, strict=True))
    assert torch.allclose(img[0], vol[0][box], atol=1e-6)
    assert torch.equal(lbl[0], lab[0][box])
    _, _, _, _, flipped, flipped_lbl = _turned((0, 0, 0), mirror=(1, 0, 1))
    assert torch.allclose(flipped[0], vol[0][box].flip((0, 2)), atol=1e-6)
    assert torch.equal(flipped_lbl[0], lab[0][box].flip((0, 2)))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_a_quarter_turn_is_rot90(axis):
    cube = np.array([16, 16, 16])
    angles = np.zeros(3)
    angles[axis] = np.pi / 2
    big = A.cut_size(angles, 1.0, cube)
    assert (big == 18).all()
    vol = _smooth(big, axis)[None]
    lab = (vol > 0).to(torch.uint8)
    m, b = A.voxel_map(angles, 1.0, np.zeros(3, bool), cube, big)
    ((img, lbl),) = A.resample(vol[None], lab[None], [(m, b)], cube)
    box = (slice(1, 17),) * 3  # the centre 16³ of the 18³ cut
    # a turn by +90° about `axis` reads, in its plane, (x_a, x_b) = (−p_b, p_a): rot90 by −1
    # (about axis 1 the plane's order is (2, 0): +1 in (0, 2))
    plane = [a for a in range(3) if a != axis]
    k = 1 if axis == 1 else -1
    assert torch.allclose(img[0], torch.rot90(vol[0][box], k, plane), atol=1e-5)
    assert torch.equal(lbl[0], torch.rot90(lab[0][box], k, plane))


def test_two_passes_match_trilinear_inside_the_cut():
    angles, scale = (0.3, -0.25, 0.2), 1.2
    vol, lab, big, (m, b), img, lbl = _turned(angles, scale, seed=3)
    offs = [torch.arange(n, dtype=torch.float64) - (n - 1) / 2 for n in PATCH]
    p = torch.stack(torch.meshgrid(*offs, indexing="ij"), -1)
    x = p @ torch.tensor(m).T + torch.tensor(b)
    grid = torch.stack([(2 * x[..., c] + 1) / big[c] - 1 for c in (2, 1, 0)], -1).float()
    ref = F.grid_sample(vol[None], grid[None], mode="bilinear", align_corners=False)[0]
    span = float(vol.max() - vol.min())
    assert float((img - ref).abs().max()) < 0.01 * span
    ref_lbl = F.grid_sample(lab[None].float(), grid[None], mode="nearest", align_corners=False)[0]
    assert float((lbl.float() != ref_lbl).float().mean()) < 0.02
    # nothing sampled outside the cut: the cut holds every point the map reaches
    assert (x.min() >= -0.5).all() and all(float(x[..., c].max()) <= big[c] - 0.5 for c in range(3))


def _one(key, value, c=1):
    p = _neutral(1, c)
    p[key] = value
    return p


def test_intensity_transforms_do_what_batchgeneratorsv2s_do():
    x = _smooth((16, 14, 10), 1)[None, None] * 3 + 1
    lab = torch.zeros(1, 1, 16, 14, 10, dtype=torch.uint8)

    def run(params):
        img = x.clone()
        A.augment_batch(img, lab.clone(), params)
        return img[0, 0].double()

    v = x[0, 0].double()
    assert torch.allclose(run(_one("brightness", np.array([[1.2]]))), v * 1.2, atol=1e-5)
    c = run(_one("contrast", np.array([[1.2]])))
    assert torch.allclose(c, ((v - v.mean()) * 1.2 + v.mean()).clamp(v.min(), v.max()), atol=1e-5)
    for key, invert in (("gamma", False), ("gamma_inverted", True)):
        g = run(_one(key, np.array([[1.3]])))
        w = -v if invert else v
        y = ((w - w.min()) / (w.max() - w.min())) ** 1.3 * (w.max() - w.min()) + w.min()
        y = (y - y.mean()) * (w.std() / y.std()) + w.mean()
        assert torch.allclose(g, -y if invert else y, atol=1e-4)
    sig = np.array([[[0.6, 0.8, 1.0]]])
    blurred = run(_one("blur", sig))
    ref = v.numpy()
    for axis in range(3):  # torch's reflect padding is scipy's "mirror"
        ref = ndimage.gaussian_filter1d(ref, sig[0, 0, axis], axis=axis, mode="mirror", truncate=6)
    assert np.allclose(blurred.numpy(), ref, atol=1e-5)
    noisy = run({**_one("noise", np.array([0.05])), "noise_seed": np.array([11])})
    assert 0.045 < float((noisy - v).std()) < 0.055
    assert torch.equal(
        noisy, run({**_one("noise", np.array([0.05])), "noise_seed": np.array([11])})
    )
    low = run(_one("lowres", np.array([[0.5]])))
    assert torch.allclose(low, v, atol=float(v.abs().max())) and not torch.allclose(low, v)
    # one zoom on every axis: the coarse axis of thick-slice data keeps its resolution
    keep = run({**_one("lowres", np.array([[0.5]])), "coarse_axis": np.array([2])})
    down = F.interpolate(x[0:1, 0:1], [8, 7, 10], mode="nearest-exact")
    assert torch.allclose(keep, F.interpolate(down, [16, 14, 10], mode="trilinear")[0, 0].double(),
                          atol=1e-5)  # fmt: skip


def test_patches_not_turned_are_mirrored_unless_cut_mirrored():
    x = _smooth((10, 8, 6))[None, None].repeat(2, 1, 1, 1, 1)
    lab = (x > 0).to(torch.uint8)
    p = _neutral(2)
    p["mirror"] = np.array([[1, 0, 1], [0, 1, 0]], bool)
    img, lbl = x.clone(), lab.clone()
    A.augment_batch(img, lbl, {**p, "mirror_cut": np.array([False, True])})
    assert torch.equal(img[0], x[0].flip((1, 3))) and torch.equal(lbl[0], lab[0].flip((1, 3)))
    assert torch.equal(img[1], x[1]) and torch.equal(lbl[1], lab[1])


# ---- the sampler's cuts and training with them ---------------------------------------------


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    from conftest import toy_cases

    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig

    root = tmp_path_factory.mktemp("aug")
    cfg = ToyVolumesConfig(train_cases=4, test_cases=0, min_shape=(40, 40, 16),
                           max_shape=(44, 40, 18))  # fmt: skip
    return toy_cases(root, cfg, VolumePrepConfig(patch_size=[24, 24, 12], network_depth=2))


def _sampler(cases, batch=6):
    from voxjet.volumes.preprocessing.store import CaseStore
    from voxjet.volumes.training.patches import PatchSampler

    ids = sorted(p.stem for p in cases.glob("*.h5"))
    return PatchSampler(CaseStore(cases, ids), [24, 24, 12], batch, 1 / 3, seed=5, augment=True,
                        augment_on="device")  # fmt: skip


def test_the_loader_cuts_mirrored_patches_and_larger_cuts_for_turned_ones(cases):
    from voxjet.volumes.training.patches import read_patch

    sampler = _sampler(cases)
    seen_spatial = seen_flip = False
    for index in range(12):
        b = sampler.batch(0, 0, index)
        k = int(b["aug_spatial"].sum())
        assert b["big_image"].shape[0] == k and b["big_label"].shape[0] == k
        for i, src in enumerate(b["source"]):
            if b["aug_spatial"][i]:
                seen_spatial = True
                continue
            case, centre = re.match(r"(.+)\.h5@\[(.+)\]", src).groups()
            image, label = sampler.store.volumes(case)
            img, lbl = read_patch(image, label, np.array(json.loads(f"[{centre}]")),
                                  sampler.patch)  # fmt: skip
            dims = [a for a in range(3) if b["aug_mirror"][i, a]]
            seen_flip |= bool(dims)
            assert b["aug_mirror_cut"][i]
            assert np.array_equal(b["image"][i].numpy(), np.flip(img, [1 + a for a in dims]))
            assert np.array_equal(b["label"][i, 0].numpy(), np.flip(lbl, dims))
    assert seen_spatial and seen_flip


def test_loader_workers_hand_over_the_same_device_batches(cases):
    from voxjet.io.handover import ReturningLoader
    from voxjet.volumes.training.patches import PatchBatches

    sampler = _sampler(cases)
    plain = [sampler.batch(0, 1, i) for i in range(6)]
    loader = ReturningLoader(PatchBatches(sampler, 0, 1, 0, 6), 2, slots=4)
    for a, b in zip(plain, loader, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            elif key != "source":
                assert np.array_equal(a[key], b[key]), key


def _seg_run(cases, out, steps, workers, signal_at=None):
    from voxjet.distributed.runtime import init_runtime
    from voxjet.training.loop import train
    from voxjet.volumes.training.train import make_task

    cfg = {"model": {"name": "unet", "channels": [4, 8], "num_res_units": 0},
           "train": {"steps": steps, "batch_size": 4, "lr": 3e-3, "log_every": 4,
                     "eval_every": 0, "checkpoint_every": 4, "iterations_per_epoch": 6,
                     "augment_on": "device", "loader_workers": workers, "prefetch": 2}}  # fmt: skip
    task, s = make_task(str(cases), cfg)
    if signal_at is not None:
        real, seen = task.loss, [0]

        def loss(model, batch, device):
            seen[0] += 1
            if seen[0] == signal_at:
                os.kill(os.getpid(), signal.SIGUSR1)
            return real(model, batch, device)

        task.loss = loss
    return train(task, s, out, init_runtime("cpu"), rate_key="patches_per_s")


@pytest.mark.parametrize("workers", [0, 2])
def test_device_augmented_training_resumes_exactly(cases, tmp_path, workers):
    from voxjet.distributed.checkpoint import PREEMPTED_EXIT_CODE

    _seg_run(cases, tmp_path / "a", 14, workers)
    with pytest.raises(SystemExit) as stop:
        _seg_run(cases, tmp_path / "b", 14, workers, signal_at=7)
    assert stop.value.code == PREEMPTED_EXIT_CODE
    _seg_run(cases, tmp_path / "b", 14, workers)
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- the device feed -------------------------------------------------------------------------


def test_the_staged_feed_hands_over_the_plain_paths_tensors(cases):
    from voxjet.io.device_feed import DeviceFeed

    sampler = _sampler(cases)
    batches = [sampler.batch(0, 2, i) for i in range(5)] + [None]
    keys = ("image", "label", "big_image", "big_label")
    plain = list(DeviceFeed(torch.device("cpu"), keys, staging=False)(batches))
    # staged through reused host buffers, one batch ahead; every batch kept until the end, so
    # a buffer refilled while a handed-over batch still used it would show here
    staged = list(DeviceFeed(torch.device("cpu"), keys, staging=True, ahead=1)(batches))
    assert staged[-1] is None and plain[-1] is None
    for a, b in zip(plain[:-1], staged[:-1], strict=True):
        for key in keys:
            assert torch.equal(a[key], b[key])
            assert a[key].numel() == 0 or a[key].data_ptr() != b[key].data_ptr()
        assert a["source"] == b["source"] and np.array_equal(a["aug_angles"], b["aug_angles"])
