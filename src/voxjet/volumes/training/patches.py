"""Patches drawn from preprocessed case files with foreground oversampling (nnU-Net: a third
of each batch forced to contain foreground). Reads only the HDF5 chunks a patch touches (kept
decoded in a bounded cache, voxjet.io.chunks); each
draw is a pure function of (seed, rank, epoch, batch index), so resuming is exact."""

from __future__ import annotations

import numpy as np
import torch

from voxjet.errors import VoxjetError
from voxjet.io.case_arrays import CaseArray
from voxjet.io.handover import SharedSlabs
from voxjet.volumes.preprocessing.store import CaseStore
from voxjet.volumes.training.augment import (
    MARGIN,
    P_ROTATE,
    P_SCALE,
    ROTATE,
    ROTATE_IN_PLANE,
    SCALE,
    AugmentGeometry,
    cut_sizes,
    draw_batch,
)


def read_patch(
    image: CaseArray,
    label: CaseArray,
    centre: np.ndarray,
    patch: np.ndarray,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The patch around `centre`, zero-padded where it leaves the volume; written into `out`
    (image [C, *patch] float32, label [*patch] uint8) when given, so a batch is filled in place."""
    shape = np.array(label.shape)
    lo = centre - patch // 2
    hi = lo + patch
    src_lo, src_hi = np.maximum(lo, 0), np.minimum(hi, shape)
    inside = bool((src_lo == lo).all() and (src_hi == hi).all())
    if out is None:
        # zero-filled only when the patch leaves the volume: inside, every voxel is overwritten
        alloc = np.empty if inside else np.zeros
        img, lbl = alloc((image.shape[0], *patch), np.float32), alloc(tuple(patch), np.uint8)
    else:
        img, lbl = out
        if not inside:
            img[...] = 0
            lbl[...] = 0
    dst = tuple(slice(a - b, c - b) for a, b, c in zip(src_lo, lo, src_hi, strict=True))
    image.read((0, *src_lo), (image.shape[0], *src_hi), out=img[(slice(None), *dst)])
    label.read(tuple(src_lo), tuple(src_hi), out=lbl[dst])
    return img, lbl


def draw_centre(
    rng: np.random.Generator,
    shape: np.ndarray,
    foreground: list[np.ndarray],
    patch: np.ndarray,
    force_foreground: bool,
) -> np.ndarray:
    """A patch centre: on a stored foreground voxel of a random present class, or uniform."""
    if force_foreground and foreground:
        coords = foreground[rng.integers(len(foreground))]
        return np.asarray(coords[rng.integers(coords.shape[0])], int)
    lo = np.minimum(patch // 2, shape // 2)
    hi = np.maximum(shape - (patch - patch // 2), lo + 1)
    return np.array([rng.integers(a, b) for a, b in zip(lo, hi, strict=True)])


# nnU-Net's augmentation in the loader, from MONAI transforms: (rotation, scaling) applied with
# these probabilities to a patch read larger (so turning it brings in no empty corners), then
# Gaussian noise and blur, brightness, contrast, low resolution simulated, gamma, and mirroring.
# `train.augment_on: device` applies the same recipe to whole batches
# (voxjet.volumes.training.augment).
def make_spatial(patch: np.ndarray, rotate: bool, scale: bool, coarse_axis: int | None = None,
                 thin: bool = False):  # fmt: skip
    """MONAI's RandAffined onto the patch's grid (its centre), applied for sure (the caller
    decided, so it could read a larger region only when needed). Thick-slice data (an axis much
    coarser) turns only about that axis, as nnU-Net does; a 2d configuration's patches (`thin`:
    one voxel along it) turn all the way round and are scaled in-plane only."""
    from monai.transforms import RandAffined

    angles = [ROTATE] * 3
    if coarse_axis is not None:
        angles = [0.0] * 3
        angles[coarse_axis] = ROTATE_IN_PLANE if thin else ROTATE
    scales = [(SCALE[0] - 1, SCALE[1] - 1)] * 3
    if thin:
        scales[coarse_axis] = (0.0, 0.0)
    return RandAffined(
        keys=["image", "label"],
        prob=1.0,
        rotate_range=angles if rotate else None,
        scale_range=scales if scale else None,
        spatial_size=[int(p) for p in patch],
        mode=("bilinear", "nearest"),
        padding_mode="zeros",
    )


def make_intensity(thin_axis: int | None = None):
    """The intensity and mirroring part of nnU-Net's augmentation (a 2d configuration's
    patches blurred in-plane only: `thin_axis` is one voxel thick)."""
    from monai.transforms import (
        Compose,
        RandAdjustContrastd,
        RandFlipd,
        RandGaussianNoised,
        RandGaussianSmoothd,
        RandScaleIntensityd,
        RandSimulateLowResolutiond,
    )

    keys = ["image", "label"]
    sigmas = {f"sigma_{a}": (0.0, 0.0) if i == thin_axis else (0.5, 1.0)
              for i, a in enumerate("xyz")}  # fmt: skip
    return Compose(
        [
            RandGaussianNoised("image", prob=0.1, std=0.1),
            RandGaussianSmoothd("image", prob=0.2, **sigmas),
            RandScaleIntensityd("image", factors=0.25, prob=0.15),  # brightness 0.75-1.25
            # the image alone, as nnU-Net does: a label is never interpolated
            RandSimulateLowResolutiond("image", prob=0.25, zoom_range=(0.5, 1.0)),
            RandAdjustContrastd("image", prob=0.3, gamma=(0.7, 1.5)),
            *(RandFlipd(keys, prob=0.5, spatial_axis=a) for a in range(3)),
        ]
    )


class PatchSampler:
    """Batches of (image, label) patches; the last `fg_fraction` of each batch hits foreground.
    A batch is a pure function of its position (rank, epoch, index): the same with or without
    loader workers, and after a resume."""

    PREFETCH_ORDER_BATCHES = 64  # batches whose cases a remote store fetches first, in order

    def __init__(
        self,
        store: CaseStore,
        patch_size: list[int],
        batch_size: int,
        fg_fraction: float = 1 / 3,
        seed: int = 0,
        augment: bool = False,
        spacing: list[float] | None = None,
        augment_on: str = "loader",
        slice_axis: int | None = None,
    ) -> None:
        self.store = store
        self.patch = np.array(patch_size, int)
        self.batch_size = batch_size
        self.n_fg = int(round(batch_size * fg_fraction))
        self.seed = seed
        self.augment = augment
        # "device": patches are only cut here (larger where the draw turns or scales them),
        # with the batch's augmentation parameters; the training device applies them
        self.on_device = augment and augment_on == "device"
        self.spacing = spacing
        self.big = np.ceil(self.patch * MARGIN).astype(int)
        # a 2d configuration's patches are slices: turned in their plane, nothing read beside
        self.thin = slice_axis is not None
        if self.thin:
            self.big[slice_axis] = self.patch[slice_axis]
            self.coarse: int | None = slice_axis
        else:  # thick-slice data as the device path decides it (one threshold for both paths)
            self.coarse = AugmentGeometry.from_spacing(1, spacing).coarse_axis
        self._spatial: dict = {}
        self._intensity = (make_intensity(slice_axis) if augment and not self.on_device
                           else None)  # fmt: skip
        previous = getattr(store, "previous", None)
        self.extra = previous.channels if previous is not None else 0
        if self.extra and self.on_device:
            raise VoxjetError("a cascade's batches are augmented in the loader (its previous "
                              "stage's channels move with the label there); set "
                              "train.augment_on: loader")  # fmt: skip

    def cases(self, rank: int, epoch: int, index: int) -> list[str]:
        """The cases the batch at this position draws its patches from (known before any
        file is read: a remote store fetches them first)."""
        rng = np.random.default_rng([self.seed, rank, epoch, index, 2])
        return [
            self.store.case_ids[i]
            for i in rng.integers(len(self.store.case_ids), size=self.batch_size)
        ]

    def _spatial_tf(self, rotate: bool, scale: bool):
        key = (rotate, scale)
        if key not in self._spatial:
            self._spatial[key] = make_spatial(self.patch, rotate, scale, self.coarse, self.thin)
        return self._spatial[key]

    def batch(self, rank: int, epoch: int, index: int, alloc=None) -> dict[str, torch.Tensor]:
        """The batch at this position; `alloc(specs)` gives its arrays (e.g. in shared memory)."""
        if self.store.remote and not self.store.prefetching:
            # the case files in the order the coming batches need them
            ahead = range(index, index + self.PREFETCH_ORDER_BATCHES)
            self.store.prefetch([c for i in ahead for c in self.cases(rank, epoch, i)])
        rng = np.random.default_rng([self.seed, rank, epoch, index])
        # separate streams for the cases and augmentation: switching augmentation on does not
        # move the patches, and the cases are known without drawing the centres
        aug_rng = np.random.default_rng([self.seed, rank, epoch, index, 1])
        source: list[str] = []
        out = params = None
        for i, case in enumerate(self.cases(rank, epoch, index)):
            image, label = self.store.volumes(case)
            if out is None:  # the batch is filled in place, patch by patch
                specs = {"image": ((self.batch_size, image.shape[0], *self.patch), np.float32),
                         "label": ((self.batch_size, 1, *self.patch), np.uint8)}  # fmt: skip
                if self.on_device:
                    geometry = AugmentGeometry(image.shape[0], self.coarse)
                    params = draw_batch((self.seed, rank, epoch, index), self.batch_size,
                                        geometry)  # fmt: skip
                    k = int(params["aug_spatial"].sum())
                    # cut as large as the draws need (no empty corners, no more read)
                    big = cut_sizes(params, self.patch)
                    specs["big_image"] = ((k, image.shape[0], *big), np.float32)
                    specs["big_label"] = ((k, 1, *big), np.uint8)
                    big_at = np.cumsum(params["aug_spatial"]) - 1
                    params["aug_mirror_cut"] = np.zeros(self.batch_size, bool)
                arrays = (alloc or _empty)(specs)
                out = (arrays["image"], arrays["label"][:, 0])
            imgs, lbls = out
            centre = draw_centre(
                rng,
                np.array(label.shape),
                self.store.foreground(case),
                self.patch,
                i >= self.batch_size - self.n_fg,
            )
            source.append(f"{case}.h5@{centre.tolist()}")
            if params is not None and params["aug_spatial"][i]:
                # the larger cut the device turns and scales; the patch's slot is filled there
                j = big_at[i]
                read_patch(image, label, centre, big,
                           out=(arrays["big_image"][j], arrays["big_label"][j, 0]))  # fmt: skip
                imgs[i], lbls[i] = 0, 0
                continue
            if params is not None:
                # cut mirrored (intensity transforms commute with mirroring): free here, a
                # copy a patch on the device
                flip = tuple(slice(None, None, -1) if f else slice(None)
                             for f in params["aug_mirror"][i])  # fmt: skip
                read_patch(image, label, centre, self.patch,
                           out=(imgs[i][(slice(None), *flip)], lbls[i][flip]))  # fmt: skip
                params["aug_mirror_cut"][i] = True
                continue
            if not self.augment:
                read_patch(image, label, centre, self.patch, out=(imgs[i], lbls[i]))
                continue
            # seeded from the batch's generator: the same position gives the same patch
            rotate, scale = aug_rng.random() < P_ROTATE, aug_rng.random() < P_SCALE
            seed = int(aug_rng.integers(2**31))
            # a cascade's previous-stage channels move with the label (nearest) and skip the
            # intensity transforms
            c = imgs.shape[1] - self.extra
            if rotate or scale:
                img, lbl = read_patch(image, label, centre, self.big)
                tf = self._spatial_tf(rotate, scale)
                tf.set_random_state(seed=seed)
                moved = tf({"image": img[:c], "label": _with_label(lbl, img[c:])})
                imgs[i, :c] = np.asarray(moved["image"], np.float32)
                imgs[i, c:] = np.asarray(moved["label"][1:], np.float32)
                lbls[i] = np.asarray(moved["label"][0], np.uint8)
            else:
                read_patch(image, label, centre, self.patch, out=(imgs[i], lbls[i]))
            self._intensity.set_random_state(seed=seed + 1)
            together = _with_label(lbls[i], imgs[i, c:])
            aug = self._intensity({"image": imgs[i, :c], "label": together})
            imgs[i, :c] = np.asarray(aug["image"], np.float32)
            imgs[i, c:] = np.asarray(aug["label"][1:], np.float32)
            lbls[i] = np.asarray(aug["label"][0], np.uint8)
        batch = {k: torch.from_numpy(v) for k, v in arrays.items()}
        # labels as stored (uint8): the task widens them on the device (8x fewer bytes to move)
        return {**batch, **(params or {}), "source": source}


def _with_label(label: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """[1 + k, …]: the label, then a cascade's k previous-stage channels (none: as it is)."""
    return label[None] if not len(previous) else np.concatenate([label[None], previous])


def _empty(specs: dict) -> dict[str, np.ndarray]:
    return {k: np.empty(shape, dtype) for k, (shape, dtype) in specs.items()}


class PatchBatches(torch.utils.data.IterableDataset):
    """The batches of one epoch from a start position, for a DataLoader: its workers make
    batches side by side (worker w those at positions start + w, start + w + workers, …, which
    the DataLoader hands out in order: the same sequence as without workers), each in a shared
    memory slab that is used again once training lets go of it (voxjet.io.handover)."""

    def __init__(self, sampler: PatchSampler, rank: int, epoch: int, start: int, stop: int) -> None:
        self.sampler, self.rank = sampler, rank
        self.epoch, self.start, self.stop = epoch, start, stop
        self.slot_table: torch.Tensor | None = None  # set by ReturningLoader

    def __iter__(self):

        info = torch.utils.data.get_worker_info()
        w, n = (info.id, info.num_workers) if info else (0, 1)
        slabs = SharedSlabs(self.slot_table, w) if info and self.slot_table is not None else None
        for index in range(self.start + w, self.stop, n):
            if slabs is None:
                yield self.sampler.batch(self.rank, self.epoch, index)
                continue
            handed: dict = {}

            def alloc(specs, handed=handed):
                arrays, out = slabs.batch(specs)
                handed.update(out)
                return arrays

            # the slab's own tensors (or its slot) travel, not views made of the arrays
            batch = self.sampler.batch(self.rank, self.epoch, index, alloc=alloc)
            drawn = {k: v for k, v in batch.items() if k.startswith("aug_")}
            yield {**handed, **drawn, "source": batch["source"]}
