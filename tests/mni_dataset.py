"""The MNI152 brain as a small segmentation dataset (MSD layout) from the template nilearn
ships: what tests/test_volumes.py trains on (real anatomy that no
one here shaped for the code)."""

from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np


def mni_file(kind: str) -> Path:
    """The MNI ICBM152 2009a template that nilearn ships (t1, gm or wm), 1 mm, 197×233×189."""
    from importlib.metadata import distribution

    rel = f"nilearn/datasets/data/mni_icbm152_{kind}_tal_nlin_sym_09a_converted.nii.gz"
    path = Path(distribution("nilearn").locate_file(rel))
    assert path.is_file(), f"{rel}: not in the installed nilearn"
    return path


def mni_brain_dataset(root: Path) -> Path:
    """The MNI152 template at 3 mm with its brain (grey + white matter probability > 0.5) as
    the label: four cases that differ by intensity scale, a left-right mirror and axis order
    (one is not RAS), in the MSD layout."""
    t1_img = nib.load(mni_file("t1"))
    t1 = np.asarray(t1_img.dataobj, np.float32)[::3, ::3, ::3]
    brain = sum(
        np.asarray(nib.load(mni_file(t)).dataobj).astype(np.float32)[::3, ::3, ::3]
        for t in ("gm", "wm")
    )
    label = (brain > 127).astype(np.uint8)
    aff = t1_img.affine @ np.diag([3, 3, 3, 1])
    flip_x = np.diag([-1, 1, 1, 1]).astype(float)
    flip_x[0, 3] = t1.shape[0] - 1
    variants = [
        (t1, label, aff),
        (1.3 * t1, label, aff),
        (t1[::-1].copy(), label[::-1].copy(), aff @ flip_x),  # stored mirrored: L, not R
        (0.8 * t1.transpose(1, 0, 2).copy(), label.transpose(1, 0, 2).copy(), aff[:, [1, 0, 2, 3]]),
    ]
    for sub in ("imagesTr", "labelsTr"):
        (root / sub).mkdir(parents=True)
    for i, (img, lbl, a) in enumerate(variants):
        nib.save(nib.Nifti1Image(img, a), root / "imagesTr" / f"mni_{i}.nii.gz")
        nib.save(nib.Nifti1Image(lbl, a), root / "labelsTr" / f"mni_{i}.nii.gz")
    (root / "dataset.json").write_text(
        json.dumps(
            {
                "modality": {"0": "MRI"},
                "labels": {"0": "background", "1": "brain"},
                "training": [
                    {"image": f"./imagesTr/mni_{i}.nii.gz", "label": f"./labelsTr/mni_{i}.nii.gz"}
                    for i in range(len(variants))
                ],
            }
        )
    )
    return root
