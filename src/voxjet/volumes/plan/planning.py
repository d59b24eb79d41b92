"""The planning job (`plan_volumes`): check every case, leave out duplicates (by the stage's
checksums), split, fingerprint the training cases and plan; plan.json, fingerprint.json,
splits.json and skipped.json written into one folder, atomically."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, read_json
from voxjet.stage.transfer import name_sources
from voxjet.volumes.dataset.msd import Case, MSDDataset, load_dataset
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.dataset.splits import split_cases
from voxjet.volumes.plan.experiment import make_plan
from voxjet.volumes.plan.fingerprint import check_labels_seen, fingerprint_from, inspect_cases
from voxjet.volumes.plan.plan_file import Plan


def duplicate_cases(ds: MSDDataset, manifest: dict, on_duplicate: str) -> dict[str, str]:
    """Cases whose images are byte for byte another case's (the stage's checksums): with
    on_duplicate "fail" the first pair stops planning naming both; with "skip" the later case
    by id is returned with the reason it is left out."""
    sums = {os.path.normpath(f["path"]): tuple(sorted(f["checksum"].items()))
            for f in manifest.get("files", [])}  # fmt: skip
    first: dict[tuple, Case] = {}
    dropped = {}
    for case in sorted(ds.cases, key=lambda c: c.case_id):
        key = tuple(sums.get(os.path.normpath(i)) for i in case.images)
        if None in key:  # a file the stage did not check (not staged): nothing to compare
            continue
        if key not in first:
            first[key] = case
            continue
        other = first[key]
        if on_duplicate != "skip":
            raise VoxjetError(
                f"cases {other.case_id!r} ({', '.join(other.images)}) and {case.case_id!r} "
                f"({', '.join(case.images)}) have identical images: one case under two names "
                "can land in the training and the test split. Remove one from the dataset "
                "(and dataset.json), or set the dataset's source.on_duplicate: skip"
            )
        dropped[case.case_id] = f"its images are identical to case {other.case_id!r}'s"
    return dropped


def plan_dataset(ds: MSDDataset, cfg: VolumePrepConfig, manifest: dict | None = None,
                 on_duplicate: str = "fail") -> dict:  # fmt: skip
    """Check every case, split the good ones, fingerprint the training cases and plan (cases
    identical to another, found through the `manifest`'s checksums, are refused or skipped:
    the source's on_duplicate)."""
    duplicates = duplicate_cases(ds, manifest, on_duplicate) if manifest else {}
    if duplicates:
        print(f"{len(duplicates)} cases left out as duplicates: {sorted(duplicates)}",
              file=sys.stderr)  # fmt: skip
    ids = [c.case_id for c in ds.cases if c.case_id not in duplicates]
    stats, skipped = inspect_cases(ds, ids, cfg)
    check_labels_seen(stats, ds)
    skipped.update(duplicates)
    split = split_cases(list(stats), cfg, ds)
    training = split["train"] + split["val"] if ds.folds else split["train"]
    fp = fingerprint_from({c: stats[c] for c in training}, ds)
    plan = make_plan(fp, ds, cfg)
    print(f"volumes.storage: {plan.storage['store']} ({plan.storage['reason']})",
          file=sys.stderr)  # fmt: skip
    return {"fingerprint": fp, "plan": plan, "splits": split, "skipped": skipped}


def write_planned(folder: Path, planned: dict[str, object]) -> None:
    """The planning's files (plan.json in the plan's own layout) into `folder`."""
    for name, obj in planned.items():
        data = obj.to_dict() if name == "plan" else obj
        (folder / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")


@contextmanager
def naming_sources(manifest: dict) -> Iterator[None]:
    """Errors about staged files also name the user's own files."""
    try:
        yield
    except VoxjetError as e:
        renamed = name_sources(str(e), manifest)
        if renamed == str(e):
            raise
        raise VoxjetError(renamed) from e


def plan_volumes(
    manifest_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: VolumePrepConfig,
    on_duplicate: str = "fail",
) -> Plan:
    """The planning job: check every case, fingerprint, plan, split; one folder, atomically."""
    manifest = read_json(manifest_path)
    with naming_sources(manifest):
        ds = load_dataset(manifest["root"])
        planned = plan_dataset(ds, cfg, manifest, on_duplicate)
    with atomic_path(out_dir, directory=True) as tmp:
        write_planned(tmp, planned)
    return planned["plan"]
