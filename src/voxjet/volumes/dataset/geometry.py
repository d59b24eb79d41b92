"""Between an image's original voxel grid and the plan's: reorientation to RAS, cropping and
resampling, and their inverse, so predictions land on the original image (same shape, affine)."""

from __future__ import annotations

import nibabel as nib
import numpy as np

from voxjet.errors import VoxjetError


def to_ras(data: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Array axes reordered/flipped to RAS (the first three axes)."""
    return nib.orientations.apply_orientation(data, nib.io_orientation(affine))


def from_ras(data: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """Inverse of to_ras: a RAS array back into the original image's axis order and flips."""
    ras = nib.orientations.axcodes2ornt(("R", "A", "S"))
    back = nib.orientations.ornt_transform(ras, nib.io_orientation(affine))
    return nib.orientations.apply_orientation(data, back)


def ras_spacing(affine: np.ndarray) -> np.ndarray:
    """Voxel sizes along R, A, S."""
    ornt = nib.io_orientation(affine)
    zooms = np.sqrt((affine[:3, :3] ** 2).sum(0))
    out = np.zeros(3)
    for axis, (ras_axis, _) in enumerate(ornt):
        out[int(ras_axis)] = zooms[axis]
    return out


SHEAR_TOLERANCE_DEG = 0.05  # float32 headers of orthogonal grids stay far below this


def shear_degrees(affine: np.ndarray) -> tuple[float, int, int]:
    """How far two voxel axes are from perpendicular, and which (0 for any orthogonal grid,
    rotated or not)."""
    cols = np.asarray(affine, float)[:3, :3]
    cols = cols / np.linalg.norm(cols, axis=0)
    worst = (0.0, 0, 1)
    for i in range(3):
        for j in range(i + 1, 3):
            angle = np.degrees(np.arccos(np.clip(abs(cols[:, i] @ cols[:, j]), 0.0, 1.0)))
            worst = max(worst, (float(90.0 - angle), i, j))
    return worst


def refuse_shear(affine: np.ndarray, path, case: str) -> None:
    """Stop, naming the file, the case and the angle, when the grid is sheared: reorienting
    and resampling as if it were orthogonal would misplace voxels (and misstate spacing)."""
    shear, i, j = shear_degrees(affine)
    if shear > SHEAR_TOLERANCE_DEG:
        raise VoxjetError(
            f"{path}: sheared affine (voxel axes {i} and {j} meet at {90 - shear:.2f}° instead "
            f"of 90°; case {case}); voxjet resamples orthogonal grids only. Resample the image "
            "(and its label) onto an orthogonal grid first, e.g. SimpleITK's Resample or "
            "nibabel.processing.resample_from_to, or drop the case"
        )


def corner_distance_mm(a: np.ndarray, b: np.ndarray, shape) -> float:
    """The largest distance between where two affines put the corners of a grid of `shape`."""
    corners = np.array([[x, y, z, 1.0] for x in (0, shape[0] - 1) for y in (0, shape[1] - 1)
                        for z in (0, shape[2] - 1)])  # fmt: skip
    return float(np.linalg.norm((corners @ np.asarray(a).T - corners @ np.asarray(b).T)[:, :3],
                                axis=1).max())  # fmt: skip


def as_tensor(arr: np.ndarray):
    """A torch view of a numpy array, also when reorientation left it flipped (negative
    strides, which torch.from_numpy refuses): the flips are redone in torch, whose copy runs on
    every core, rather than in a single-threaded numpy copy."""
    import torch

    flips = [i for i, st in enumerate(arr.strides) if st < 0]
    if not flips:
        return torch.from_numpy(arr)
    return torch.from_numpy(np.flip(arr, flips)).flip(flips)


def zoom_to(arr: np.ndarray, shape: tuple[int, ...], order: int) -> np.ndarray:
    """Resample the last three axes to exactly `shape`: order 1 trilinear, 0 nearest (torch's
    interpolation: multi-threaded, several times faster than scipy's on a CT volume)."""
    import torch.nn.functional as F

    shape = tuple(int(s) for s in shape)
    if tuple(arr.shape[-3:]) == shape:
        return arr
    lead = arr.shape[:-3]
    t = as_tensor(arr.astype(np.float32, copy=False)).reshape(1, -1, *arr.shape[-3:])
    if order == 0:
        out = F.interpolate(t, size=shape, mode="nearest-exact")
    else:
        out = F.interpolate(t, size=shape, mode="trilinear", align_corners=False)
    return out.reshape(*lead, *shape).numpy().astype(arr.dtype, copy=False)


def _linear_taps(n_in: int, n_out: int):
    """Per output index along one axis: the two source indices and the weight of the second
    (torch's trilinear rule with align_corners=False)."""
    import torch

    x = ((torch.arange(n_out, dtype=torch.float64) + 0.5) * (n_in / n_out) - 0.5).clamp(min=0)
    i0 = x.floor().long().clamp(max=n_in - 1)
    i1 = (i0 + 1).clamp(max=n_in - 1)
    return i0, i1, (x - i0).float()


def _interp_box(ind, taps, out_box, src_lo):
    """Separable linear interpolation of `ind` (a source block starting at `src_lo`) onto the
    output block `out_box`."""
    import torch

    for axis in range(3):
        i0, i1, w = (t[out_box[axis][0] : out_box[axis][1]] for t in taps[axis])
        a = ind.index_select(axis, i0 - src_lo[axis])
        b = ind.index_select(axis, i1 - src_lo[axis])
        shape = [1, 1, 1]
        shape[axis] = -1
        w = w.reshape(shape)
        ind = torch.lerp(a, b, w)
    return ind


def resample_slabs(arr: np.ndarray, shape: tuple[int, ...], slab: int = 16) -> np.ndarray:
    """[C, X, Y, Z] (any dtype, any view) resampled linearly to [C, *shape] float32 (torch's
    trilinear rule), a slab of output planes along the last axis at a time: each source plane
    a slab needs is converted to float32 and resampled in-plane, then the planes are blended
    along the last axis (nnU-Net's separate-z order), so the case is never copied whole
    before it is resampled."""
    import torch
    import torch.nn.functional as F

    shape = tuple(int(s) for s in shape)
    out = np.empty((arr.shape[0], *shape), np.float32)
    i0, i1, w = _linear_taps(arr.shape[3], shape[2])
    for lo in range(0, shape[2], slab):
        hi = min(lo + slab, shape[2])
        first, last = int(i0[lo]), int(i1[hi - 1]) + 1
        for c in range(arr.shape[0]):
            planes = np.moveaxis(arr[c, :, :, first:last], -1, 0)  # [z, X, Y]
            block = torch.from_numpy(np.ascontiguousarray(planes, dtype=np.float32))[:, None]
            if tuple(block.shape[2:]) != shape[:2]:
                block = F.interpolate(block, size=shape[:2], mode="bilinear", align_corners=False)
            a = block[i0[lo:hi] - first, 0]
            b = block[i1[lo:hi] - first, 0]
            out[c, :, :, lo:hi] = torch.lerp(a, b, w[lo:hi, None, None]).permute(1, 2, 0).numpy()
    return out


def _extent(mask: np.ndarray) -> list[tuple[int, int]] | None:
    """[start, stop) of the True voxels along each axis of a 3-D mask, or None if none."""
    m01 = mask.any(2)
    hits = [m01.any(1), m01.any(0), mask.any(1).any(0)]
    idx = [np.flatnonzero(h) for h in hits]
    if any(len(i) == 0 for i in idx):
        return None
    return [(int(i[0]), int(i[-1]) + 1) for i in idx]


def zoom_labels(label: np.ndarray, shape: tuple[int, ...], n_classes: int) -> np.ndarray:
    """Labels resampled by interpolating each class's indicator linearly and taking the
    arg-max (smoother than nearest neighbour, as nnU-Net does).

    Only the bounding box of each foreground class is interpolated (an organ is a small part
    of a CT), and the background's indicator is one minus the sum of the others (linear
    interpolation is linear), so the work scales with the foreground, not the volume."""
    import torch

    shape = tuple(int(s) for s in shape)
    if tuple(label.shape) == shape:
        return label
    # masks and extents in numpy, which reads the (often flipped or transposed) view as it
    # is; only the small per-class blocks become torch tensors
    taps = [_linear_taps(n, m) for n, m in zip(label.shape, shape, strict=True)]
    out = torch.zeros(shape, dtype=torch.uint8)
    fg = _extent(label != 0)
    if fg is None:
        return out.numpy()
    sub = label[tuple(slice(a, b) for a, b in fg)]
    blocks = []
    for c in range(1, n_classes):
        ext = _extent(sub == c)
        if ext is None:
            continue
        out_box, src_lo, src_hi = [], [], []
        for axis, (a, b) in enumerate(ext):
            a, b = a + fg[axis][0], b + fg[axis][0]
            i0, i1, _ = taps[axis]
            # output voxels whose two taps touch the class's source range [a, b)
            lo = int(torch.searchsorted(i1, a))
            hi = int(torch.searchsorted(i0, b - 1, right=True))
            out_box.append((lo, hi))
            src_lo.append(int(i0[lo]))
            src_hi.append(int(i1[hi - 1]) + 1)
        box = tuple(slice(a, b) for a, b in zip(src_lo, src_hi, strict=True))
        block = torch.from_numpy(np.ascontiguousarray(label[box] == c)).float()
        blocks.append((c, out_box, _interp_box(block, taps, out_box, src_lo)))
    union = [(min(b[1][k][0] for b in blocks), max(b[1][k][1] for b in blocks)) for k in range(3)]
    size = [b - a for a, b in union]
    best = torch.zeros(size)  # highest foreground class probability so far
    fg_sum = torch.zeros(size)
    winner = torch.zeros(size, dtype=torch.uint8)
    for c, out_box, p in blocks:
        region = tuple(slice(a - u, b - u) for (a, b), (u, _) in zip(out_box, union, strict=True))
        take = p > best[region]
        best[region] = torch.where(take, p, best[region])
        winner[region][take] = c
        fg_sum[region] += p
    # background wins ties, as an arg-max over (background, classes...) would
    winner[(1.0 - fg_sum) >= best] = 0
    out[tuple(slice(a, b) for a, b in union)] = winner
    return out.numpy()


def plan_shape(shape: tuple[int, ...], spacing: np.ndarray, target: np.ndarray) -> tuple[int, ...]:
    """The voxel grid of a (cropped) region once resampled to `target` spacing."""
    return tuple(int(v) for v in np.maximum(1, np.round(np.array(shape) * spacing / target)))


def probs_to_original(probs: np.ndarray, attrs, background: float) -> np.ndarray:
    """Probabilities [C, ...] in the plan's space mapped back onto the original grid, channels
    last ([X, Y, Z, C] as stored, for a 4-D NIfTI): resampled linearly, and outside the crop
    box `background` for channel 0 (softmax classes: 1, the background is certain there) and 0
    for the others."""
    box = np.asarray(attrs["crop_box"])
    cropped = tuple(int(b - a) for a, b in box)
    full = np.zeros((probs.shape[0], *(int(s) for s in attrs["ras_shape"])), np.float32)
    full[0] = background
    full[(slice(None), *(slice(int(a), int(b)) for a, b in box))] = zoom_to(probs, cropped, 1)
    return from_ras(np.moveaxis(full, 0, -1), np.asarray(attrs["original_affine"]))


def labels_to_original(pred: np.ndarray, attrs, n_classes: int) -> np.ndarray:
    """A class map in the plan's space mapped back: un-resample, un-crop, un-reorient."""
    box = np.asarray(attrs["crop_box"])
    cropped = tuple(int(b - a) for a, b in box)
    full = np.zeros(tuple(int(s) for s in attrs["ras_shape"]), np.uint8)
    full[tuple(slice(int(a), int(b)) for a, b in box)] = zoom_labels(pred, cropped, n_classes)
    return from_ras(full, np.asarray(attrs["original_affine"]))


def labels_to_plan(label: np.ndarray, attrs, n_classes: int) -> np.ndarray:
    """Inverse of labels_to_original: a label map on a case's original grid in the plan's
    space (reoriented, cropped, resampled as the case file's image was)."""
    box = np.asarray(attrs["crop_box"])
    ras = to_ras(np.asarray(label), np.asarray(attrs["original_affine"]))
    cropped = ras[tuple(slice(int(a), int(b)) for a, b in box)]
    return zoom_labels(np.ascontiguousarray(cropped), tuple(attrs["shape"]), n_classes)
