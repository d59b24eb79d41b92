"""No truth into the inputs: a model input (a particle or jet feature, or the particle ordering)
must not read a label branch or a generator-level truth branch, directly or through any
variable it is computed from. Checked at the config check (the dry run) and again by the
shard job, naming the input, the branch and the fix; a branch a user really means to feed the
model goes in `jets.truth_inputs`. A regression target's expression may read anything (an input
feature too); a truth branch it reads is named beside the target when an input reads it."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.jets.targets import expression_names, parse_targets, variable_name
from voxjet.jets.variables import variables

# what counts as truth besides the configured label branches: JetClass's label_* and aux_*
# (generator particles), and the usual generator-level names
TRUTH_PATTERNS = (
    "label_*",
    "aux_*",
    "*genpart*",
    "gen_*",
    "*_truth*",
    "truth_*",
    "*_gen",
    "mc_*",
    "*_gen_*",
    "*genjet*",
)


def label_branches(labels: list[str] | Mapping[str, Any]) -> list[str]:
    """The branches a labels setting reads (none for labels by file)."""
    if isinstance(labels, list):
        return list(labels)
    return [labels["branch"]] if "branch" in labels else []


def class_names(labels: list[str] | Mapping[str, Any]) -> list[str]:
    """Class names: label_QCD → QCD for one-hot branches, else the listed classes."""
    if isinstance(labels, list):
        return [b.removeprefix("label_") for b in labels]
    if "branch" in labels:
        return list(labels["classes"])
    return list(labels["by_file"])


def reweight_labels(labels: list[str] | Mapping[str, Any]) -> list[str]:
    """What weights.reweight_classes names a class by: its label branch (one-hot labels, as
    weaver's configs do) or its class name."""
    return list(labels) if isinstance(labels, list) else class_names(labels)


def is_truth(branch: str, labels: list[str] | Mapping[str, Any]) -> bool:
    """Whether a branch holds the answer: a label branch, or a truth/generator-level one."""
    low = branch.lower()
    return branch in label_branches(labels) or any(fnmatch.fnmatch(low, p) for p in TRUTH_PATTERNS)


def check_inputs(jets: Mapping[str, Any], where: str) -> None:
    """Parse every expression (syntax, functions, limits) and refuse an input that reads a
    label or truth branch not listed in `truth_inputs`."""
    targets = parse_targets(jets.get("targets"), "jets.targets")
    v = variables({**(jets.get("new_variables") or {}), **expression_names(targets)},
                  jets.get("selection"), jets.get("test_time_selection"))  # fmt: skip
    read_by = {t.name: set(v.branches([variable_name(t.name)])) for t in targets}
    allowed = set(jets.get("truth_inputs") or [])
    labels = jets.get("labels") or []
    inputs = [("particle_features", f) for f in jets.get("particle_features") or []]
    inputs += [("jet_features", f) for f in jets.get("jet_features") or []]
    for name, c in (jets.get("collections") or {}).items():
        inputs += [(f"collections.{name}.features", f) for f in (c or {}).get("features") or []]
        if (c or {}).get("sort_by"):
            inputs.append((f"collections.{name}.sort_by", c["sort_by"]))
    if jets.get("sort_by"):
        inputs.append(("sort_by", jets["sort_by"]))
    for key, name in inputs:
        leaks = [
            b for b in v.branches([name])
            if b in label_branches(labels) or (is_truth(b, labels) and b not in allowed)
        ]  # fmt: skip
        if leaks:
            via = "" if leaks == [name] else f" (through jets.new_variables.{name})"
            named = sorted(t for t, bs in read_by.items() if bs & set(leaks))
            if named:
                via += f", the truth the regression target(s) {named} are computed from"
            labels_read = [b for b in leaks if b in label_branches(labels)]
            fix = (
                f"Remove it: {labels_read} {'is' if len(labels_read) == 1 else 'are'} the "
                f"dataset's label branch(es) ({where}.labels), never an input"
                if labels_read
                else f"Remove it, or list the branch in {where}.truth_inputs if it really is "
                "available at prediction time"
            )
            raise VoxjetError(
                f"config key '{where}.{key}': the input {name!r} reads {leaks}{via}, a label "
                "or generator-level truth branch: a model fed the answer learns nothing it can "
                f"use on data. {fix}"
            )
