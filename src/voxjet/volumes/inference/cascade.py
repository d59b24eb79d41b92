"""nnU-Net's `3d_cascade_fullres`: the full-resolution network fed, beside the image, the
segmentation the `3d_lowres` stage made of the same case, one channel a foreground class.

The low-resolution segmentations come from where nnU-Net takes them: for the cases of the
cross-validation, the lowres fold that validated each case (so a training case is never
segmented by a model that trained on it), read from that fold's validation probabilities; for
the test cases, the lowres run's predictions. Both are on the case's original grid and are
mapped into the full-resolution plan's space as the case file's image was
(voxjet.volumes.dataset.geometry.labels_to_plan).

In training the previous stage's channels travel with the label through the spatial
augmentation (nearest, as nnU-Net moves its segmentation) and skip the intensity transforms
(`PreviousStage.split` / `join` in the sampler)."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.geometry import labels_to_plan
from voxjet.volumes.inference.probabilities import PROBABILITIES, labels_of, load_probabilities
from voxjet.volumes.plan.plan_file import Plan


def one_hot(seg: np.ndarray, num_classes: int) -> np.ndarray:
    """[k, …] float32 channels, one a foreground class (1 … num_classes − 1), of a label map."""
    return np.stack([(seg == c) for c in range(1, num_classes)]).astype(np.float32)


def cascade_input(prepared: np.ndarray, previous: np.ndarray, attrs: dict,
                  plan: Plan) -> np.ndarray:  # fmt: skip
    """A new image's network input for a cascade model: its prepared channels, then the
    previous stage's segmentation of it (on the image's original grid) in the plan's space."""
    n = plan.num_classes
    return np.concatenate([prepared, one_hot(labels_to_plan(previous, attrs, n), n)])


class PreviousStage:
    """Where each case's low-resolution segmentation is (validation probabilities of the
    lowres folds, then the lowres run's test predictions) and the plan-space one-hot channels
    made of it, kept once made."""

    def __init__(self, validations: list[str], predictions: list[str], plan: Plan) -> None:
        self.plan = plan
        self.classes = list(range(1, plan.num_classes))
        self.sources: dict[str, Path] = {}
        for folder in predictions:
            for p in sorted(Path(folder).glob("*.nii.gz")):
                self.sources[p.name[: -len(".nii.gz")]] = p
        for folder in validations:  # the validating fold's, over any test prediction
            for p in sorted((Path(folder) / PROBABILITIES).glob("*.npz")):
                self.sources[p.stem] = p
        self._seg: dict[str, np.ndarray] = {}

    @property
    def channels(self) -> int:
        """Input channels the previous stage adds (one a foreground class)."""
        return len(self.classes)

    def original_labels(self, case_id: str) -> np.ndarray:
        """The previous stage's label map of a case on its original grid."""
        path = self.sources.get(case_id)
        if path is None:
            raise VoxjetError(
                f"case {case_id!r}: no 3d_lowres segmentation of it (looked in "
                f"{sorted({str(p.parent) for p in self.sources.values()}) or 'nothing'}); the "
                "cascade's previous experiment must validate every fold (folds: as the "
                "cascade's) and predict the test cases: rerun its validate_seg / evaluate_seg"
            )
        if path.suffix == ".npz":
            return labels_of(load_probabilities(path), self.plan.label_set)
        return np.asarray(nib.load(path).dataobj).astype(np.uint8)

    def segmentation(self, case_id: str, attrs) -> np.ndarray:
        """The previous stage's label map of a case in the plan's space (uint8)."""
        if case_id not in self._seg:
            label = self.original_labels(case_id)
            want = tuple(int(s) for s in attrs["original_shape"])
            if label.shape != want:
                raise VoxjetError(
                    f"{self.sources[case_id]}: the 3d_lowres segmentation of {case_id!r} has "
                    f"shape {list(label.shape)}, the case {list(want)}; rerun the previous "
                    "experiment's validate_seg / evaluate_seg on these cases"
                )
            self._seg[case_id] = labels_to_plan(label, attrs, self.plan.num_classes)
        return self._seg[case_id]

    def with_image(self, image: np.ndarray, case_id: str, attrs) -> np.ndarray:
        """The network's input of a whole case: the image's channels, then the previous
        stage's."""
        seg = self.segmentation(case_id, attrs)
        return np.concatenate([image, one_hot(seg, self.plan.num_classes)])

    def joined(self, image, case_id: str, attrs) -> CascadeImage:
        """A case's stored image as the sampler reads it with this stage's channels after."""
        return CascadeImage(image, self.segmentation(case_id, attrs), self)


class CascadeImage:
    """A case's image as the sampler reads it ([C + k, X, Y, Z], `read(lo, hi, out)`): the
    stored channels, then the previous stage's one-hot channels cut from its segmentation."""

    def __init__(self, image, seg: np.ndarray, stage: PreviousStage) -> None:
        self.image, self.seg, self.stage = image, seg, stage
        self.stored = int(image.shape[0])
        self.shape = (self.stored + stage.channels, *image.shape[1:])
        self.dtype = np.float32

    def read(self, lo, hi, out=None):
        """The region [lo, hi) (channel axis first) into `out` (allocated when None)."""
        shape = tuple(int(b - a) for a, b in zip(lo, hi, strict=True))
        out = np.empty(shape, np.float32) if out is None else out
        c0, c1 = int(lo[0]), int(hi[0])
        space = tuple(slice(int(a), int(b)) for a, b in zip(lo[1:], hi[1:], strict=True))
        mine = min(c1, self.stored)
        if c0 < mine:
            self.image.read((c0, *lo[1:]), (mine, *hi[1:]), out=out[: mine - c0])
        for c in range(max(c0, self.stored), c1):
            value = self.stage.classes[c - self.stored]
            out[c - c0] = self.seg[space] == value
        return out
