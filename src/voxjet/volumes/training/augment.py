"""nnU-Net's training augmentation on a whole batch at once, on the training device
(`train.augment_on: device`): the loader only cuts patches, and the step's device turns and
scales them (one batched affine grid and grid_sample), then adds noise, blurs, changes
brightness, contrast and gamma, simulates low resolution and mirrors, as batched tensor ops.

Probabilities and ranges are nnU-Net v2's (nnUNetTrainer.get_training_transforms, with
batchgeneratorsv2's parameter draws): rotation p 0.2 (±30° about each axis; thick-slice data
±180° in-plane only), scaling p 0.2 (0.7–1.4, one factor for every axis), Gaussian noise p 0.1
(std uniform in 0–0.1), blur p 0.2 (each channel p 0.5, σ 0.5–1 per axis), brightness p 0.15
and contrast p 0.15 (factor per channel, 0.75–1.25 drawn half below and half above 1),
low resolution p 0.25 (each channel p 0.5, zoom 0.5–1), inverted gamma p 0.1 and gamma p 0.3
(0.7–1.5, statistics kept), mirroring each axis p 0.5.

Every parameter of a patch is drawn on the host from a generator seeded by the patch's
position (seed, rank, epoch, batch index, patch): a batch is the same after a resume, with or
without loader workers, and on any device; noise comes from a device generator seeded the
same way. The draws (`draw_batch`) are pure and small; `augment_batch` applies them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

P_ROTATE, P_SCALE = 0.2, 0.2
ROTATE = np.pi / 6  # ±30°
ROTATE_IN_PLANE = np.pi  # thick-slice data: ±180° about the coarse axis, as nnU-Net's 2D DA
SCALE = (0.7, 1.4)  # > 1 samples a larger region: smaller objects
MARGIN = 1.45  # how much larger a patch is cut when it is turned or scaled
P_NOISE, NOISE_STD = 0.1, (0.0, 0.1)
P_BLUR, P_BLUR_CHANNEL, BLUR_SIGMA = 0.2, 0.5, (0.5, 1.0)
P_BRIGHTNESS, BRIGHTNESS = 0.15, (0.75, 1.25)
P_CONTRAST, CONTRAST = 0.15, (0.75, 1.25)
P_LOWRES, P_LOWRES_CHANNEL, LOWRES = 0.25, 0.5, (0.5, 1.0)
P_GAMMA_INVERTED, P_GAMMA, GAMMA = 0.1, 0.3, (0.7, 1.5)
P_MIRROR = 0.5
EPS = 1e-7


@dataclass(frozen=True)
class AugmentGeometry:
    """What the draws depend on besides the position: channels, and the coarse axis of
    thick-slice data (None: isotropic enough to turn about every axis)."""

    channels: int
    coarse_axis: int | None = None

    @classmethod
    def from_spacing(cls, channels: int, spacing: list[float] | None) -> AugmentGeometry:
        """Thick-slice data (an axis over 3× coarser than the finest) turns in-plane only."""
        sp = np.asarray(spacing or [1.0, 1.0, 1.0], float)
        coarse = int(np.argmax(sp)) if sp.max() > 3 * sp.min() else None
        return cls(channels, coarse)


def _bg_contrast(rng: np.random.Generator, lo: float, hi: float) -> float:
    """batchgeneratorsv2's BGContrast: half the draws below 1, half above."""
    if rng.random() < 0.5 and lo < 1:
        return float(rng.uniform(lo, 1.0))
    return float(rng.uniform(max(lo, 1.0), hi))


def draw_patch(rng: np.random.Generator, g: AugmentGeometry) -> dict[str, np.ndarray]:
    """Every augmentation parameter of one patch (neutral values where one is not applied)."""
    c = g.channels
    angles, scale = np.zeros(3), 1.0
    rotate, scaled = rng.random() < P_ROTATE, rng.random() < P_SCALE
    if rotate:
        if g.coarse_axis is None:
            angles = rng.uniform(-ROTATE, ROTATE, 3)
        else:
            angles[g.coarse_axis] = rng.uniform(-ROTATE_IN_PLANE, ROTATE_IN_PLANE)
    if scaled:
        scale = float(rng.uniform(*SCALE))
    noise = float(rng.uniform(*NOISE_STD)) if rng.random() < P_NOISE else 0.0
    blur = np.zeros((c, 3))
    if rng.random() < P_BLUR:
        for ch in range(c):
            if rng.random() < P_BLUR_CHANNEL:
                blur[ch] = rng.uniform(*BLUR_SIGMA, 3)
    brightness = np.ones(c)
    if rng.random() < P_BRIGHTNESS:
        brightness = np.array([_bg_contrast(rng, *BRIGHTNESS) for _ in range(c)])
    contrast = np.ones(c)
    if rng.random() < P_CONTRAST:
        contrast = np.array([_bg_contrast(rng, *CONTRAST) for _ in range(c)])
    lowres = np.ones(c)
    if rng.random() < P_LOWRES:
        for ch in range(c):
            if rng.random() < P_LOWRES_CHANNEL:
                lowres[ch] = rng.uniform(*LOWRES)
    gammas = []
    for p in (P_GAMMA_INVERTED, P_GAMMA):
        gammas.append(np.array([_bg_contrast(rng, *GAMMA) for _ in range(c)])
                      if rng.random() < p else np.ones(c))  # fmt: skip
    mirror = rng.random(3) < P_MIRROR
    return {
        "spatial": np.array(rotate or scaled), "angles": angles, "scale": np.array(scale),
        "noise": np.array(noise), "noise_seed": np.array(rng.integers(2**62)),
        "blur": blur, "brightness": brightness, "contrast": contrast, "lowres": lowres,
        "gamma_inverted": gammas[0], "gamma": gammas[1], "mirror": mirror,
        "coarse_axis": np.array(-1 if g.coarse_axis is None else g.coarse_axis),
    }  # fmt: skip


def draw_batch(position: tuple[int, ...], size: int, g: AugmentGeometry) -> dict[str, np.ndarray]:
    """The parameters of a batch's patches, each drawn from its own position's generator,
    stacked (`aug_<name>` arrays with the patch first)."""
    draws = [draw_patch(np.random.default_rng([*position, 3, i]), g) for i in range(size)]
    return {f"aug_{k}": np.stack([d[k] for d in draws]) for k in draws[0]}


def params_of(batch: dict) -> dict[str, np.ndarray]:
    """The `aug_` entries of a batch, without the prefix."""
    return {k[4:]: np.asarray(v) for k, v in batch.items() if k.startswith("aug_")}


# ---- the geometry: one affine grid for the patches turned or scaled ----------------------------


def rotation_matrix(angles: np.ndarray) -> np.ndarray:
    """Rotation about array axes 0, 1, 2 by these angles (applied in that order)."""
    a0, a1, a2 = angles
    r0 = np.array([[1, 0, 0], [0, np.cos(a0), -np.sin(a0)], [0, np.sin(a0), np.cos(a0)]])
    r1 = np.array([[np.cos(a1), 0, np.sin(a1)], [0, 1, 0], [-np.sin(a1), 0, np.cos(a1)]])
    r2 = np.array([[np.cos(a2), -np.sin(a2), 0], [np.sin(a2), np.cos(a2), 0], [0, 0, 1]])
    return r2 @ r1 @ r0


def voxel_map(angles: np.ndarray, scale: float, mirror: np.ndarray, patch: np.ndarray,
              big: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(M [3, 3], b [3]) taking an output voxel's offset p from the patch's geometric centre
    (i − (P − 1) / 2 along each axis) to the voxel coordinate x = M p + b in the larger cut:
    mirrored, turned and scaled about the patch's centre, the two cuts' centres (read_patch's
    `centre − size // 2` corners) aligned to the half voxel."""
    m = rotation_matrix(angles) * scale * np.where(mirror, -1.0, 1.0)[None, :]
    centre_p = -(patch // 2) + (patch - 1) / 2.0
    centre_b = -(big // 2) + (big - 1) / 2.0
    return m, (big - 1) / 2.0 + centre_p - centre_b


def cut_size(angles: np.ndarray, scale: float, patch: np.ndarray) -> np.ndarray:
    """The smallest cut around the patch's centre that holds every point a turned and scaled
    patch samples, with the neighbour linear interpolation reads (no corner left empty)."""
    m = np.abs(rotation_matrix(angles) * scale)
    half = m @ ((np.asarray(patch) - 1) / 2.0)
    return (np.ceil(2 * half - 1e-9) + 3).astype(int)  # (cos 90° is 6e-17, not 0)


def cut_sizes(params: dict[str, np.ndarray], patch: np.ndarray) -> np.ndarray:
    """One cut size for a batch's turned or scaled patches (they are stacked): the largest
    each axis needs."""
    sizes = [cut_size(params["aug_angles"][i], float(params["aug_scale"][i]), patch)
             for i in np.flatnonzero(params["aug_spatial"])]  # fmt: skip
    return np.max(sizes, axis=0) if sizes else np.asarray(patch, int)


def _along(coef: np.ndarray, const: float, axes: list[torch.Tensor],
           out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """coef · (axes[0][i], axes[1][j], axes[2][k]) + const over the grid (1-D pieces summed:
    one full-size pass), into `out` when given."""
    a0, a1, a2 = axes
    plane = (float(coef[0]) * a0)[:, None, None] + (float(coef[1]) * a1)[None, :, None] + const
    line = (float(coef[2]) * a2)[None, None, :]
    return torch.add(plane, line) if out is None else torch.add(plane, line, out=out)


def _two_pass(vol: torch.Tensor, lab: torch.Tensor, m: np.ndarray, b: np.ndarray,
              patch: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """vol [C, G0, G1, G2] and its label [1, G0, G1, G2] sampled at x = M p + b for every
    output voxel, in two passes: each slice of axis 0 that the patch reaches resampled
    in-plane (a batched 2-D grid_sample, at the in-plane point where the output's line
    crosses that slice), then each output voxel interpolated between the two slices around
    its x0 (the label: nearest in both passes). Linear interpolation on the sheared lattice of
    the slices rather than trilinear: the same accuracy inside the cut, several times cheaper
    on a CPU (2-D grid_sample is vectorised there, 3-D is not). Needs M[0, 0] away from 0
    (the caller puts a suitable axis first); zeros outside the cut."""
    dev, dt = vol.device, torch.float32
    g = vol.shape[1:]
    offs = [torch.arange(n, device=dev, dtype=dt) - (n - 1) / 2.0 for n in patch]
    # the slices x0 spans over the patch's corners
    corners = np.array(np.meshgrid(*[[-(n - 1) / 2.0, (n - 1) / 2.0] for n in patch]))
    x0 = m[0] @ corners.reshape(3, -1) + b[0]
    lo = int(max(0, np.floor(x0.min())))
    hi = int(min(g[0] - 1, np.ceil(x0.max())))
    if hi < lo:  # the patch lies wholly outside the cut
        return vol.new_zeros((vol.shape[0], *patch)), lab.new_zeros((1, *patch))
    w = torch.arange(lo, hi + 1, device=dev, dtype=dt)
    # on slice w, the output voxel (·, p1, p2) whose x0 is w has
    # p0 = (w − b0 − m01 p1 − m02 p2) / m00 and lands in-plane at
    # x_c = m_c0 p0 + m_c1 p1 + m_c2 p2 + b_c (c = 1, 2): affine in (w, p1, p2)
    r = m[1:, 0] / m[0, 0]
    coef = m[1:, 1:] - r[:, None] * m[0, 1:][None, :]
    const = b[1:] - r * b[0]
    grid = torch.empty((1, len(w), patch[1], patch[2], 2), device=dev, dtype=dt)
    for k, c in enumerate((1, 0)):  # grid_sample's last dimension: (x, y) = (axis 2, axis 1)
        # normalised (align_corners False): (2 x + 1) / G − 1
        size = g[2 - k]
        norm = 2.0 / size * np.array([r[c], coef[c, 0], coef[c, 1]])
        _along(norm, 2.0 / size * const[c] + 1.0 / size - 1, [w, offs[1], offs[2]],
               out=grid[0, ..., k])  # fmt: skip
    grid = grid[0]

    def planes(src: torch.Tensor, mode: str) -> torch.Tensor:
        out = F.grid_sample(src[:, lo : hi + 1].transpose(0, 1).to(dt), grid, mode=mode,
                            padding_mode="zeros", align_corners=False)  # fmt: skip
        return out.permute(2, 1, 0, 3)  # [slices, C, P1, P2] → [P1, C, slices, P2]

    img_planes, lab_planes = planes(vol, "bilinear"), planes(lab, "nearest")

    # pass 2, again a 2-D grid_sample (batched over p1): in the (slice, p2) plane each output
    # voxel sits at its own x0 and exactly on its p2 column, so bilinear is linear between the
    # two slices around x0, and nearest the nearest slice; outside the slices, zeros
    n = hi - lo + 1
    grid = torch.empty((patch[1], patch[0], patch[2], 2), device=dev, dtype=dt)
    grid[..., 0] = (2 * torch.arange(patch[2], device=dev, dtype=dt) + 1) / patch[2] - 1
    coef = np.array([m[0, 1], m[0, 0], m[0, 2]]) * 2.0 / n  # (p1, p0, p2) order, normalised
    _along(coef, (2.0 * (b[0] - lo) + 1) / n - 1, [offs[1], offs[0], offs[2]], out=grid[..., 1])
    image = F.grid_sample(img_planes, grid, mode="bilinear", padding_mode="zeros",
                          align_corners=False)  # fmt: skip
    label = F.grid_sample(lab_planes, grid, mode="nearest", padding_mode="zeros",
                          align_corners=False)  # fmt: skip
    # [P1, C, P0, P2] → [C, P0, P1, P2]
    return image.permute(1, 2, 0, 3).to(vol.dtype), label.permute(1, 2, 0, 3).to(lab.dtype)


def resample(big: torch.Tensor, big_label: torch.Tensor, maps: list[tuple[np.ndarray, np.ndarray]],
             patch: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """The turned and scaled patches from their larger cuts, one (image [C, *patch], label
    [1, *patch]) a map: images linear, labels nearest (a label is never interpolated);
    outside the cut, zeros. The slice axis of the two passes is the one the map keeps most
    nearly in place (axis 0 when it is about as good: no copy to reorder the cut)."""
    shape = tuple(int(p) for p in patch)
    out = []
    for j, (m, b) in enumerate(maps):
        diag = np.abs(np.diag(m))
        first = 0 if diag[0] >= 0.5 * diag.max() else int(diag.argmax())
        order = [first] + [a for a in range(3) if a != first]
        back = [order.index(a) for a in range(3)]  # output axes back in array order
        vol = big[j].permute(0, *(1 + a for a in order))
        lab = big_label[j].permute(0, *(1 + a for a in order))
        img, lbl = _two_pass(vol, lab, m[np.ix_(order, order)], b[order],
                             tuple(shape[a] for a in order))  # fmt: skip
        out.append((img.permute(0, *(1 + a for a in back)), lbl.permute(0, *(1 + a for a in back))))
    return out


# ---- intensity: on the (patch, channel) pairs each transform picked --------------------------


def blur_axis(x: torch.Tensor, sigma: float, axis: int) -> torch.Tensor:
    """One volume blurred along `axis` by a Gaussian of σ truncated at 6σ with reflect
    padding, as batchgeneratorsv2's blur_dimension: a sum of shifted copies (a few taps a
    voxel; a depthwise conv3d is several times slower on the CPU)."""
    r = int(6 * sigma + 0.5)
    taps = np.arange(-r, r + 1)
    k = np.exp(-0.5 * (taps / sigma) ** 2)
    k = (k / k.sum()).tolist()
    pad = [0] * 6
    pad[2 * (2 - axis)] = pad[2 * (2 - axis) + 1] = r
    padded = F.pad(x[None, None], pad, mode="reflect")[0, 0]
    n = x.shape[axis]
    out = padded.narrow(axis, 0, n) * k[0]
    for i in range(1, 2 * r + 1):
        out.add_(padded.narrow(axis, i, n), alpha=k[i])
    return out


def _pairs(mask: np.ndarray) -> list[tuple[int, int]]:
    return [(int(b), int(c)) for b, c in zip(*np.nonzero(mask), strict=True)]


def _gamma_(x: torch.Tensor, gamma: float, invert: bool) -> None:
    """batchgeneratorsv2's GammaTransform on one volume, in place, mean and std kept (the
    inversion folded into the rescaling: −x's range is [−hi, −lo])."""
    mean, std = x.mean(), x.std()
    lo, hi = torch.aminmax(x)
    span = (hi - lo).clamp(min=EPS)
    if invert:  # ((−x − (−hi)) / span) ** γ = ((hi − x) / span) ** γ, then negated back
        x.sub_(hi).div_(-span)
    else:
        x.sub_(lo).div_(span)
    x.pow_(gamma)
    # keep the mean and std: the affine rescaling of the range cancels out in them (and the
    # inversion flips the sign)
    scale = std / x.std().clamp(min=EPS)
    x.sub_(x.mean()).mul_(-scale if invert else scale).add_(mean)


def _contrast_(x: torch.Tensor, factor: float) -> None:
    """batchgeneratorsv2's ContrastTransform on one volume, in place, its range kept."""
    mean = x.mean()
    lo, hi = torch.aminmax(x)
    x.sub_(mean).mul_(factor).add_(mean).clamp_(lo, hi)


def augment_batch(image: torch.Tensor, label: torch.Tensor, params: dict[str, np.ndarray],
                  big: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:  # fmt: skip
    """Augment the batch in place with its drawn `params` (draw_batch's, without the prefix):
    image [B, C, *patch] float, label [B, 1, *patch]; `big` holds the larger cuts of the
    patches turned or scaled (in batch order of `params["spatial"]`), whose slots in `image`
    and `label` are filled here. Per-patch loops where a transform touches few patches (most
    apply to a fraction of them), batched where all take part."""
    dev = image.device
    patch = np.array(image.shape[2:], int)
    spatial = np.flatnonzero(params["spatial"])
    if len(spatial):  # mirroring folded into the map
        big_img, big_lbl = big
        grid_to = np.array(big_img.shape[2:], int)
        maps = [voxel_map(params["angles"][i], float(params["scale"][i]), params["mirror"][i],
                          patch, grid_to) for i in spatial]  # fmt: skip
        for i, (img, lbl) in zip(spatial.tolist(), resample(big_img, big_lbl, maps, patch),
                                 strict=True):  # fmt: skip
            image[i], label[i] = img, lbl
    for i in np.flatnonzero(params["noise"] > 0).tolist():
        gen = torch.Generator(dev).manual_seed(int(params["noise_seed"][i]) % 2**63)
        noise = torch.randn(image.shape[1:], generator=gen, device=dev, dtype=image.dtype)
        image[i].add_(noise, alpha=float(params["noise"][i]))
    for i, ch in _pairs((params["blur"] > 0).any(-1)):
        x = image[i, ch]
        for axis in range(3):
            if patch[axis] > 1:  # a 2d configuration's slices blur in-plane
                x = blur_axis(x, float(params["blur"][i, ch, axis]), axis)
        image[i, ch] = x
    for i, ch in _pairs(params["brightness"] != 1):
        image[i, ch].mul_(float(params["brightness"][i, ch]))
    for i, ch in _pairs(params["contrast"] != 1):
        _contrast_(image[i, ch], float(params["contrast"][i, ch]))
    for i, ch in _pairs(params["lowres"] != 1):
        shape = list(image.shape[2:])
        # one zoom for every axis; thick-slice data keeps its coarse axis (nnU-Net's ignore_axes)
        z = float(params["lowres"][i, ch])
        small = [max(1, round(s * z)) for s in shape]
        coarse = int(params["coarse_axis"][i])
        if coarse >= 0:
            small[coarse] = shape[coarse]
        down = F.interpolate(image[i, ch][None, None], small, mode="nearest-exact")
        image[i, ch] = F.interpolate(down, shape, mode="trilinear", align_corners=False)[0, 0]
    for key, invert in (("gamma_inverted", True), ("gamma", False)):
        for i, ch in _pairs(params[key] != 1):
            _gamma_(image[i, ch], float(params[key][i, ch]), invert)
    # the others mirrored last, unless the loader cut them mirrored already
    cut = params.get("mirror_cut", np.zeros(len(image), bool))
    todo = params["mirror"].any(1) & ~params["spatial"].astype(bool) & ~cut
    for i in np.flatnonzero(todo).tolist():
        dims = [1 + a for a in np.flatnonzero(params["mirror"][i]).tolist()]
        image[i] = image[i].flip(dims)
        label[i] = label[i].flip(dims)
