"""Read and check a dataset.json in the MSD form (`modality`, `labels` int → name, `training`
[{image, label}], `test`) or nnU-Net v2's (`channel_names`, `labels` name → int or, for
region-based training, name → [ints] with `regions_class_order`, `file_ending`, channels as
`<case>_0000<ending>`, `<case>_0001<ending>`, … in imagesTr/ and imagesTs/), and nnU-Net's
`splits_final.json` (its cross-validation folds) when the dataset folder holds one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.io.atomic import read_json
from voxjet.volumes.dataset.images import ENDINGS, ending_of

# nnU-Net's normalisation schemes, by a channel's name in channel_names / modality
NORMALIZATIONS = ("ct", "zscore", "rescale_to_0_1", "none")


def normalization_of(channel_name: str) -> str:
    """nnU-Net's rule: "CT" → CT (dataset statistics), "noNorm" → none, "rescale_to_0_1",
    anything else (MRI, T1, T2, FLAIR, zscore, …) → z-score per image."""
    n = channel_name.strip().lower()
    if n == "ct":
        return "ct"
    if n in ("nonorm", "none", "no_norm"):
        return "none"
    if n in ("rescale_to_0_1", "rescale"):
        return "rescale_to_0_1"
    return "zscore"


@dataclass(frozen=True)
class Case:
    """One case: its id, its channel images and its label map (relative to the dataset root);
    one image holding every channel (a 4-D MSD image) is one entry."""

    case_id: str
    images: tuple[str, ...]
    label: str | None


@dataclass(frozen=True)
class MSDDataset:
    """What the pipeline needs from dataset.json."""

    root: Path
    channels: list[str]  # each channel's name (modality)
    labels: dict[int, str]  # label values declared (0: background)
    cases: list[Case]
    test_cases: list[Case] = field(default_factory=list)
    regions: dict[str, list[int]] | None = None  # region-based: name → label values
    region_order: list[int] | None = None  # the label value each region writes, in order
    folds: list[dict[str, list[str]]] | None = None  # splits_final.json
    ignore: int | None = None  # nnU-Net's ignore label: voxels nobody annotated (no class)

    @property
    def modality(self) -> str:
        """The first channel's modality (the MSD form's `modality["0"]`)."""
        return self.channels[0]

    @property
    def normalizations(self) -> list[str]:
        """The normalisation scheme of each channel."""
        return [normalization_of(c) for c in self.channels]

    @property
    def num_outputs(self) -> int:
        """Network outputs: one a class (softmax), or one a region (sigmoid)."""
        return len(self.regions) if self.regions else max(self.labels) + 1

    def path(self, rel: str) -> Path:
        """A dataset-relative path made absolute, refusing paths that escape the root."""
        p = (self.root / rel).resolve()
        if not p.is_relative_to(self.root.resolve()):
            raise VoxjetError(
                f"{self.root / 'dataset.json'}: path {rel!r} escapes the dataset "
                "folder; use paths relative to it"
            )
        return p


def case_id_of(rel: str) -> str:
    name = Path(rel).name
    ending = ending_of(name)
    return name[: -len(ending)] if ending else name


def check_consecutive(labels: dict[int, str], meta_path: Path) -> None:
    """Label values 0, 1, …, n−1, as nnU-Net's verify_dataset_integrity requires: a gap would
    give the network an output class no voxel ever has."""
    values = sorted(labels)
    if values != list(range(len(values))):
        want = list(range(len(values)))
        pairs = " ".join(f"{a}:{b}" for a, b in zip(values, want, strict=True) if a != b)
        raise VoxjetError(
            f"{meta_path}: label values {values} are not consecutive integers from 0 "
            f"(expected {want}); renumber them in dataset.json and the label files, e.g. "
            f"`voxjet relabel --dataset {meta_path.parent} --map {pairs} --out <new folder>`"
        )


def _ignore_label(raw: dict, meta_path: Path) -> int | None:
    """nnU-Net v2's ignore label (`"ignore": k`, sparse annotations: voxels nobody labelled),
    taken out of `raw`: it must be the highest value, and is no class of the network."""
    if "ignore" not in raw:
        return None
    value = raw.pop("ignore")
    others = [v for v in raw.values() if isinstance(v, int)]
    if not isinstance(value, int) or any(isinstance(v, list) for v in raw.values()):
        raise VoxjetError(
            f"{meta_path}: labels.ignore is {value!r}; nnU-Net's ignore label is one int, the "
            "highest label value, in a dataset of classes (voxjet trains no regions with it)"
        )
    if others and value <= max(others):
        raise VoxjetError(
            f"{meta_path}: labels.ignore is {value}, but the ignore label must be the highest "
            f"value (the classes go up to {max(others)}), as nnU-Net requires; renumber it to "
            f"{max(others) + 1} in dataset.json and the label files (`voxjet relabel`)"
        )
    return value


def _labels(meta: dict, meta_path: Path):
    """(label values → names, regions or None, region order or None, the ignore label or
    None) of either form."""
    raw = dict(meta["labels"]) if isinstance(meta["labels"], dict) else meta["labels"]
    if not isinstance(raw, dict) or not raw:
        raise VoxjetError(f"{meta_path}: labels must be a mapping")
    keys_are_ints = all(str(k).lstrip("-").isdigit() for k in raw)
    ignore = None if keys_are_ints else _ignore_label(raw, meta_path)
    if keys_are_ints:  # MSD: "0": "background"
        return {int(k): str(v) for k, v in raw.items()}, None, None, None
    regions, labels = {}, {}
    for name, v in raw.items():
        if isinstance(v, list):
            if not v or not all(isinstance(x, int) for x in v):
                raise VoxjetError(f"{meta_path}: region {name!r} must list label values (ints)")
            regions[name] = list(v)
            for x in v:
                labels.setdefault(int(x), str(name))
        elif isinstance(v, int):
            labels[int(v)] = str(name)
            if v:
                regions[name] = [v]
        else:
            raise VoxjetError(
                f"{meta_path}: label {name!r} has value {v!r}; expected an int or a list of "
                "ints (a region)"
            )
    if not any(isinstance(v, list) for v in raw.values()):
        return labels, None, None, ignore
    regions = {n: vs for n, vs in regions.items() if vs != [0]}
    if any(0 in vs for vs in regions.values()):
        bad = [n for n, vs in regions.items() if 0 in vs]
        raise VoxjetError(f"{meta_path}: regions {bad} include 0 (background); a region lists "
                          "foreground label values only")  # fmt: skip
    order = meta.get("regions_class_order")
    if order is None or len(order) != len(regions):
        raise VoxjetError(
            f"{meta_path}: region-based labels need regions_class_order, one label value a "
            f"region ({len(regions)} regions: {list(regions)}), as nnU-Net v2 asks"
        )
    for (name, vs), value in zip(regions.items(), order, strict=True):
        if value not in vs:
            raise VoxjetError(
                f"{meta_path}: regions_class_order gives region {name!r} the value {value}, "
                f"which it does not contain ({vs}); each region writes one of its own values"
            )
    # writing the regions in order onto a label map must give back every label value: each
    # value's region is the last region that contains it
    values = sorted({x for vs in regions.values() for x in vs})
    for x in values:
        last = [v for (n, vs), v in zip(regions.items(), order, strict=True) if x in vs][-1]
        if last != x:
            raise VoxjetError(
                f"{meta_path}: label value {x} would come back as {last} from the regions in "
                "regions_class_order's order; order the regions from the largest to the "
                "smallest, each value's smallest region last"
            )
    return labels, regions, [int(v) for v in order], None


def _v2_cases(root: Path, folder: str, ending: str, n_channels: int, labelled: bool,
              meta_path: Path) -> list[Case]:  # fmt: skip
    images = sorted((root / folder).glob(f"*_0000{ending}")) if (root / folder).is_dir() else []
    cases = []
    for first in images:
        cid = first.name[: -len(ending) - 5]
        chans = tuple(f"{folder}/{cid}_{c:04d}{ending}" for c in range(n_channels))
        missing = [c for c in chans if not (root / c).is_file()]
        if missing:
            raise VoxjetError(
                f"{meta_path}: case {cid!r} lacks its channel file(s) {missing}: "
                f"channel_names declares {n_channels} channel(s)"
            )
        cases.append(Case(cid, chans, f"labelsTr/{cid}{ending}" if labelled else None))
    return cases


def load_dataset(root: str | os.PathLike, check_labels: bool = True) -> MSDDataset:
    """Parse dataset.json in either form (and splits_final.json) and check that every
    referenced file exists."""
    root = Path(root)
    meta_path = root / "dataset.json"
    if not meta_path.is_file():
        has = sorted(p.name for p in root.iterdir())[:8] if root.is_dir() else []
        raise VoxjetError(
            f"{root}: no dataset.json (it holds {has or 'nothing'}); a volumes dataset is a "
            "Medical Segmentation Decathlon or nnU-Net raw folder: dataset.json beside "
            "imagesTr/ (and labelsTr/). Point source.path at such a folder, or write its "
            "dataset.json (config/README.md, `source`)"
        )
    meta = read_json(meta_path)
    if "channel_names" in meta:  # nnU-Net v2
        channels = [str(meta["channel_names"][k]) for k in sorted(meta["channel_names"], key=int)]
        ending = meta.get("file_ending", ".nii.gz")
        if ending not in ENDINGS:
            raise VoxjetError(f"{meta_path}: file_ending {ending!r}; readable: {list(ENDINGS)}")
        labels, regions, order, ignore = _labels(meta, meta_path)
        if check_labels:
            check_consecutive(labels, meta_path)
        cases = _v2_cases(root, "imagesTr", ending, len(channels), True, meta_path)
        tests = _v2_cases(root, "imagesTs", ending, len(channels), False, meta_path)
        n = meta.get("numTraining")
        if n is not None and n != len(cases):
            raise VoxjetError(f"{meta_path}: numTraining is {n} but imagesTr holds {len(cases)} "
                              f"cases (<case>_0000{ending})")  # fmt: skip
    elif "modality" in meta and "training" in meta:
        channels = [str(meta["modality"][k]) for k in sorted(meta["modality"], key=int)]
        labels, regions, order, ignore = _labels(meta, meta_path)
        if check_labels:
            check_consecutive(labels, meta_path)
        cases = [
            Case(case_id_of(t["image"]), (t["image"],), t.get("label")) for t in meta["training"]
        ]
        tests = [
            Case(case_id_of(t if isinstance(t, str) else t["image"]),
                 (t if isinstance(t, str) else t["image"],), None)
            for t in meta.get("test", [])
        ]  # fmt: skip
    else:
        raise VoxjetError(
            f"{meta_path}: neither the MSD form (modality, labels, training) nor "
            "nnU-Net v2's (channel_names, labels, file_ending)"
        )
    if 0 not in labels:
        raise VoxjetError(f"{meta_path}: labels must declare 0 (background)")
    if not cases:
        raise VoxjetError(f"{meta_path}: no training cases listed")
    ds = MSDDataset(root, channels, labels, cases, tests, regions, order,
                    _folds(root, [c.case_id for c in cases]), ignore)  # fmt: skip
    missing = [
        rel
        for c in [*cases, *tests]
        for rel in (*c.images, c.label)
        if rel and not ds.path(rel).is_file()
    ]
    if missing:
        raise VoxjetError(
            f"{meta_path}: {len(missing)} referenced files are missing, e.g. "
            f"{missing[:3]}; re-stage the dataset or fix dataset.json"
        )
    return ds


def _folds(root: Path, case_ids: list[str]) -> list[dict[str, list[str]]] | None:
    """nnU-Net's splits_final.json: a list of {train: [...], val: [...]} (its 5 folds)."""
    path = root / "splits_final.json"
    if not path.is_file():
        return None
    folds = read_json(path)
    known = set(case_ids)
    if not isinstance(folds, list) or not folds:
        raise VoxjetError(f"{path}: expected a list of {{train: [...], val: [...]}} folds")
    for k, f in enumerate(folds):
        if not isinstance(f, dict) or set(f) < {"train", "val"}:
            raise VoxjetError(f"{path}: fold {k} has no train and val lists")
        unknown = sorted((set(f["train"]) | set(f["val"])) - known)
        if unknown:
            raise VoxjetError(f"{path}: fold {k} names cases not in dataset.json: {unknown[:5]}")
        if set(f["train"]) & set(f["val"]):
            raise VoxjetError(f"{path}: fold {k} has cases in both train and val")
        if not f["val"] or not f["train"]:
            raise VoxjetError(f"{path}: fold {k} has an empty train or val list")
    return [{"train": list(f["train"]), "val": list(f["val"])} for f in folds]
