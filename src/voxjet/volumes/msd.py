"""Read and check a dataset.json in the MSD form (`modality`, `labels` int → name, `training`
[{image, label}]) or nnU-Net v2's (`channel_names`, `labels` name → int, `file_ending`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.io.atomic import read_json


@dataclass(frozen=True)
class Case:
    """One training case: its id and files relative to the dataset root."""

    case_id: str
    image: str
    label: str | None


@dataclass(frozen=True)
class MSDDataset:
    """What the pipeline needs from dataset.json."""

    root: Path
    modality: str  # "CT" or another (MR...): decides the normalisation
    labels: dict[int, str]
    cases: list[Case]

    def path(self, rel: str) -> Path:
        """A dataset-relative path made absolute, refusing paths that escape the root."""
        p = (self.root / rel).resolve()
        if not p.is_relative_to(self.root.resolve()):
            raise VoxjetError(
                f"{self.root / 'dataset.json'}: path {rel!r} escapes the dataset "
                "folder; use paths relative to it"
            )
        return p


def _case_id(rel: str) -> str:
    name = Path(rel).name
    for ext in (".nii.gz", ".nii"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def load_dataset(root: str | os.PathLike) -> MSDDataset:
    """Parse dataset.json in either form and check that every referenced file exists."""
    root = Path(root)
    meta_path = root / "dataset.json"
    meta = read_json(meta_path)
    if "channel_names" in meta:  # nnU-Net v2
        modality = str(next(iter(meta["channel_names"].values())))
        labels = {int(v): str(k) for k, v in meta["labels"].items()}
        ending = meta.get("file_ending", ".nii.gz")
        cases = [
            Case(
                p.name[: -len(ending)],
                f"imagesTr/{p.name}",
                f"labelsTr/{p.name[: -len(ending) - 5]}{ending}",
            )
            for p in sorted((root / "imagesTr").glob(f"*_0000{ending}"))
        ]
        cases = [Case(c.case_id[:-5], c.image, c.label) for c in cases]
    elif "modality" in meta and "training" in meta:
        modality = str(meta["modality"].get("0", "CT"))
        labels = {int(k): str(v) for k, v in meta["labels"].items()}
        cases = [Case(_case_id(t["image"]), t["image"], t.get("label")) for t in meta["training"]]
    else:
        raise VoxjetError(
            f"{meta_path}: neither the MSD form (modality, labels, training) nor "
            "nnU-Net v2's (channel_names, labels, file_ending)"
        )
    if 0 not in labels:
        raise VoxjetError(f"{meta_path}: labels must declare 0 (background)")
    ds = MSDDataset(root=root, modality=modality, labels=labels, cases=cases)
    if not cases:
        raise VoxjetError(f"{meta_path}: no training cases listed")
    missing = [
        rel for c in cases for rel in (c.image, c.label) if rel and not ds.path(rel).is_file()
    ]
    if missing:
        raise VoxjetError(
            f"{meta_path}: {len(missing)} referenced files are missing, e.g. "
            f"{missing[:3]}; re-stage the dataset or fix dataset.json"
        )
    return ds
