"""A dataset's label values renumbered into a new dataset folder (`voxjet relabel`): what a
user runs when dataset.json declares labels that are not 0, 1, …, n−1 (nnU-Net's rule, which
voxjet's planning enforces). Images are linked (or copied), label files rewritten with the new
values, dataset.json written with the new numbering; the source folder is left alone."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path
from voxjet.volumes.dataset.cases import read_label
from voxjet.volumes.dataset.msd import load_dataset


def parse_map(pairs: list[str]) -> dict[int, int]:
    """`3:2 5:3` as {3: 2, 5: 3}."""
    out = {}
    for p in pairs:
        a, sep, b = p.partition(":")
        if not sep or not a.strip().isdigit() or not b.strip().isdigit():
            raise VoxjetError(f"relabel --map {p!r}: give old:new label values, e.g. 3:2")
        out[int(a)] = int(b)
    return out


def _renumbered_meta(meta: dict, mapping: dict[int, int]) -> dict:
    labels = meta["labels"]
    if all(str(k).lstrip("-").isdigit() for k in labels):  # MSD: "3": "tumour"
        new = {str(mapping.get(int(k), int(k))): v for k, v in labels.items()}
    else:  # nnU-Net v2: "tumour": 3, or a region's list
        new = {n: ([mapping.get(x, x) for x in v] if isinstance(v, list) else mapping.get(v, v))
               for n, v in labels.items()}  # fmt: skip
    return {**meta, "labels": new}


def _place(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # no second copy of the images on the same filesystem
    except OSError:
        shutil.copy2(src, dst)


def relabel(dataset: str | os.PathLike, mapping: dict[int, int], out: str | os.PathLike) -> Path:
    """Write the dataset with its label values mapped into `out` (a new folder)."""
    src, out = Path(dataset), Path(out)
    if out.exists():
        raise VoxjetError(f"relabel --out {out}: exists; give a new folder")
    ds = load_dataset(src, check_labels=False)
    meta = json.loads((src / "dataset.json").read_text())
    values = sorted(mapping.get(v, v) for v in ds.labels)
    if values != list(range(len(values))) or len(set(values)) != len(values):
        raise VoxjetError(f"relabel --map: the labels would be {values}; map them onto "
                          f"0..{len(ds.labels) - 1}, each once")  # fmt: skip
    lut = np.arange(256, dtype=np.uint8)
    for a, b in mapping.items():
        lut[a] = b
    with atomic_path(out, directory=True) as tmp:
        for case in [*ds.cases, *ds.test_cases]:
            for image in case.images:
                _place(ds.path(image), tmp / image)
            if case.label:
                if not case.label.endswith((".nii", ".nii.gz")):
                    raise VoxjetError(f"{ds.path(case.label)}: relabel writes NIfTI labels only")
                label, affine = read_label(ds.path(case.label))
                target = tmp / case.label
                target.parent.mkdir(parents=True, exist_ok=True)
                nib.save(nib.Nifti1Image(lut[label], affine), target)
        (tmp / "dataset.json").write_text(json.dumps(_renumbered_meta(meta, mapping), indent=2))
    return out
