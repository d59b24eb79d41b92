"""A volumes dataset's cases as the dry run knows them (one preprocessing job a case), and the
digest of what the planning gives each case (voxjet.volumes.preprocessing.preprocess.plan_inputs),
read from the planning folder as it stands."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from voxjet.errors import VoxjetError


@dataclass(frozen=True)
class CaseList:
    """A dataset's training cases, and each one's files relative to the source (where the
    source is a local folder)."""

    ids: list[str]
    files: dict[str, list[str]] = field(default_factory=dict)


def case_list(name: str, ds: Mapping[str, Any]) -> CaseList:
    """The training cases of a volumes dataset: the generator's, or dataset.json's."""
    source = ds["source"]
    try:
        if "synthetic" in source:
            from voxjet.volumes.dataset.synth import ToyVolumesConfig, case_ids

            s = source["synthetic"]
            return CaseList(case_ids(ToyVolumesConfig(s["train_cases"], s["test_cases"])))
        if "path" in source and "://" not in source["path"]:
            from voxjet.volumes.dataset.msd import load_dataset

            cases = load_dataset(source["path"]).cases
            return CaseList([c.case_id for c in cases],
                            {c.case_id: [str(PurePosixPath(p)) for p in
                                         (*c.images, *([c.label] if c.label else []))]
                             for c in cases})  # fmt: skip
        if "path" in source:
            from voxjet.volumes.preprocessing.preprocess import dataset_case_ids

            return CaseList(dataset_case_ids(source["path"]))
        raise VoxjetError(
            "a volumes dataset is staged from source.path (a folder or URL with its "
            "dataset.json) or given as source.prepared; a file list flattens the "
            "imagesTr/labelsTr layout"
        )
    except VoxjetError as e:
        raise VoxjetError(f"config key 'datasets.{name}.source': {e}") from e


def plan_digest(plan_dir: str | os.PathLike, configuration: str, case: str,
                cache: dict[tuple, tuple]) -> str:  # fmt: skip
    """What the planning folder gives one case now ("" before it is planned). Read again (into
    `cache`) only when the folder's files change: a job's parameters are asked for at the dry
    run and just before the job runs."""
    from voxjet.volumes.preprocessing.plan_inputs import plan_inputs_digest, read_planning

    folder = Path(plan_dir)
    names = ("plan.json", "fingerprint.json", "skipped.json")
    try:
        stamp = tuple(os.stat(folder / n).st_mtime_ns for n in names)
    except OSError:
        return ""
    key = (str(folder), configuration)
    if cache.get(key, (None,))[0] != stamp:
        try:
            cache[key] = (stamp, read_planning(folder, configuration))
        except (OSError, ValueError, VoxjetError):
            return ""  # a torn or earlier planning: its job reruns, and it is asked again
    plan, fp, skipped = cache[key][1]
    return plan_inputs_digest(plan, fp, skipped.get(case))
