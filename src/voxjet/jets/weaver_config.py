"""weaver-core data configs (the YAML files weaver's `--data-config` reads, e.g. JetClass's
published full/kin/kinpid ones) turned into a dataset's `jets:` settings: new variables (weaver's
np./ak./math. spellings go through voxjet's safe expression language, never eval), the
selection, the input groups with their manual standardisation (centre, scale, clip range, pad
value, length, pad mode; weaver's automatic standardisation computed from the training
jets), simple one-hot labels, custom labels (regression targets, learned beside the classes
the dataset's own `labels` give), observers and the reweighting (`weights`).
What voxjet cannot do as weaver does is refused with the key named, never approximated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.jets.expressions import Variables
from voxjet.jets.reweight import parse

# keys of a dataset's jets section a weaver config decides (giving both would be ambiguous)
DERIVED = ("labels", "particle_features", "new_variables", "selection", "sort_by",
           "max_particles", "tree", "test_time_selection", "collections")  # fmt: skip
PAD_MODES = ("constant", "wrap")


def _var_params(
    spec: Any, group: str, length: int, pad_mode: str, where: str, auto: bool
) -> dict[str, Any]:
    """weaver's [name, centre, scale, min, max, pad_value] (or a bare name) as a dict; a
    centre "auto" (the default under preprocess.method auto) is computed by the index job."""
    v = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not v or not isinstance(v[0], str) or len(v) > 6:
        raise VoxjetError(f"{where}: inputs.{group}.vars entry {spec!r} is not weaver's "
                          "[name, centre, scale, min, max, pad_value]")  # fmt: skip
    defaults = [None, "auto" if auto else None, 1, -5, 5, 0]
    name, center, scale, lo, hi, pad = v + defaults[len(v) :]
    if center == "auto" and group.endswith("_mask"):
        center = None  # as weaver: a mask is never standardised
    for label, x in (("centre", None if center == "auto" else center), ("scale", scale),
                     ("min", lo), ("max", hi), ("pad_value", pad)):  # fmt: skip
        if x is not None and not isinstance(x, (int, float)):
            raise VoxjetError(f"{where}: inputs.{group}.vars {name!r}: {label} {x!r} is no number")
    return {"name": name, "center": center, "scale": scale, "min": lo, "max": hi,
            "pad_value": pad, "length": length, "pad_mode": pad_mode}  # fmt: skip


WEAVER_KEYS = {"treename", "selection", "test_time_selection", "new_variables", "preprocess",
               "inputs", "labels", "observers", "monitor_variables", "weights", "branch_magic",
               "file_magic", "bucketing"}  # fmt: skip


def _check_document(doc: Any, where: str) -> str:
    """A weaver data config voxjet reads: its keys weaver's, nothing it does not support, one-hot
    or custom labels; returns the preprocessing method (manual or auto)."""
    if not isinstance(doc, dict):
        raise VoxjetError(f"{where}: not a weaver data config (a YAML mapping)")
    unknown = set(doc) - WEAVER_KEYS
    if unknown:
        raise VoxjetError(f"{where}: keys {sorted(unknown)} are not weaver data-config keys")
    for key in ("branch_magic", "file_magic", "bucketing"):
        if doc.get(key):
            raise VoxjetError(f"{where}: {key} is not supported; remove it")
    method = str((doc.get("preprocess") or {}).get("method", "manual")).lower()
    if method not in ("manual", "auto"):
        raise VoxjetError(f"{where}: preprocess.method {method!r}: manual or auto")
    labels = doc.get("labels") or {}
    if not is_custom(doc) and (
        labels.get("type") != "simple" or not isinstance(labels.get("value"), list)
    ):
        raise VoxjetError(
            f"{where}: labels of type {labels.get('type')!r}: voxjet reads one-hot label "
            "branches (labels: {type: simple, value: [label_A, label_B, ...]}) or regression "
            "targets (labels: {type: custom, value: {name: expression}})"
        )
    return method


def _input_groups(doc: dict[str, Any], where: str, auto: bool) -> dict[str, dict[str, Any]]:
    """weaver's `inputs:` as groups: length, pad mode and each variable's standardisation."""
    groups: dict[str, dict[str, Any]] = {}
    for group, spec in (doc.get("inputs") or {}).items():
        length = spec.get("length")
        if not isinstance(length, int) or length < 1:
            raise VoxjetError(f"{where}: inputs.{group}.length {length!r}: voxjet's inputs are "
                              "particle sequences of a fixed length")  # fmt: skip
        pad_mode = str(spec.get("pad_mode", "constant")).lower()
        if pad_mode not in PAD_MODES:
            raise VoxjetError(f"{where}: inputs.{group}.pad_mode {pad_mode!r}: one of {PAD_MODES}")
        if group.endswith("_mask") and pad_mode != "constant":
            raise VoxjetError(f"{where}: inputs.{group}: a mask is padded with constant")
        params = [_var_params(v, group, length, pad_mode, where, auto)
                  for v in spec.get("vars", [])]  # fmt: skip
        if not params:
            raise VoxjetError(f"{where}: inputs.{group} has no vars")
        groups[group] = {"length": length, "pad_mode": pad_mode, "vars": params,
                         "collection": None}  # fmt: skip
    if not groups:
        raise VoxjetError(f"{where}: no inputs")
    return groups


def _other_collections(groups: dict[str, Any], collections: dict[str, list[str]],
                       where: str) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The collections beside the particles' (CMS's sv_*): each one's features and length,
    its groups marked with it; `auto` standardisation refused there."""
    extra = {}
    for name, members in list(collections.items())[1:]:
        feats: list[str] = []
        for group in members:
            groups[group]["collection"] = name
            feats += [p["name"] for p in groups[group]["vars"] if p["name"] not in feats]
        extra[name] = {"features": feats, "length": groups[members[0]]["length"],
                       "sort_by": None, "count": None}  # fmt: skip
        auto = [v["name"] for g in members for v in groups[g]["vars"] if v["center"] == "auto"]
        if auto:
            raise VoxjetError(f"{where}: inputs {members}: the automatic standardisation of "
                              f"{auto} is computed for the particle groups only; give these "
                              "variables a centre and scale (as CMS's ak8 configs do)")  # fmt: skip
    return extra


def translate(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The jets settings a weaver data config means: {labels, particle_features, jet_features,
    new_variables, selection, sort_by, max_particles, tree, weaver_inputs}."""
    method = _check_document(doc, where)
    labels, custom = doc.get("labels") or {}, is_custom(doc)
    groups = _input_groups(doc, where, method == "auto")
    collections = _collections(groups, where)
    main = next(iter(collections))
    features: list[str] = []
    for group in collections[main]:
        features += [p["name"] for p in groups[group]["vars"] if p["name"] not in features]
    extra = _other_collections(groups, collections, where)
    new = {k: str(v) for k, v in (doc.get("new_variables") or {}).items() if k != v}
    observers = list(doc.get("observers") or []) + list(doc.get("monitor_variables") or [])
    out: dict[str, Any] = {
        # custom labels are regression targets; the classes then come from the section's labels
        **(
            {"targets": {k: str(e) for k, e in labels["value"].items()}}
            if custom
            else {"labels": list(labels["value"])}
        ),
        "particle_features": features,
        "new_variables": new,
        "selection": doc.get("selection"),
        # the test split's jets (and new data at predict) pass this one instead, as in weaver
        "test_time_selection": doc.get("test_time_selection") or None,
        # weaver keeps each jet's particles in the file's order and cuts at `length`
        "sort_by": None,
        "max_particles": groups[collections[main][0]]["length"],
        "weaver_inputs": groups,
        # the other collections' groups (CMS's sv_*): each its own collection, in file order
        "collections": extra,
    }
    if observers:
        out["observers"] = observers
    if doc.get("weights"):
        if not custom:  # else checked against the section's labels, once resolved
            parse(doc["weights"], list(labels["value"]), f"{where}: weights")
        out["weights"] = dict(doc["weights"])
    if doc.get("treename"):
        out["tree"] = doc["treename"]
    return out


def is_custom(doc: dict[str, Any]) -> bool:
    """Whether a weaver config's labels are regression targets (type custom, a mapping)."""
    labels = (doc or {}).get("labels") or {}
    return labels.get("type") == "custom" and isinstance(labels.get("value"), dict)


def _collections(groups: dict[str, Any], where: str) -> dict[str, list[str]]:
    """The input groups by the collection they read: the name's prefix before "_" (pf_points,
    pf_features, pf_mask → pf; sv_* → sv), the first group's being the particles. A
    collection's groups must share a length (weaver pads each to it); when they do not, which
    collection a group reads is ambiguous and the group is named."""
    out: dict[str, list[str]] = {}
    for g in groups:
        out.setdefault(g.split("_", 1)[0], []).append(g)
    for name, members in out.items():
        first = members[0]
        for g in members[1:]:
            if groups[g]["length"] != groups[first]["length"]:
                raise VoxjetError(
                    f"{where}: inputs.{g} has length {groups[g]['length']}, but inputs.{first} "
                    f"{groups[first]['length']}: groups named {name}_* read one collection and "
                    "share its length; rename the group after the collection it reads (e.g. "
                    "sv_features for secondary vertices) or give it that length"
                )
    return out


def auto_variables(groups: dict[str, Any] | None) -> list[str]:
    """The variables whose centre and scale are computed from the training jets ("auto")."""
    names = [v["name"] for g in (groups or {}).values() for v in g["vars"] if v["center"] == "auto"]
    return list(dict.fromkeys(names))


def standardise(groups: dict[str, Any], samples: dict[str, Any]) -> dict[str, Any]:
    """The groups with every "auto" centre and scale computed as weaver's AutoStandardizer
    does (the median; 1 / the larger distance from it to the 16th or 84th percentile) from a
    sample of the training split's particle values {name: array}."""
    import numpy as np

    out = {}
    for name, g in groups.items():
        params = []
        for v in g["vars"]:
            if v["center"] == "auto":
                low, center, high = np.percentile(samples[v["name"]], [16, 50, 84])
                spread = max(high - center, center - low)
                v = {**v, "center": float(center), "scale": 1.0 if spread == 0 else 1.0 / spread}
            params.append(v)
        out[name] = {**g, "vars": params}
    return out


def read(path: str | os.PathLike) -> dict[str, Any]:
    """A weaver data config file, parsed (its errors name the file)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise VoxjetError(f"{p}: no such weaver data config; check jets.weaver_config")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise VoxjetError(f"{p}: not valid YAML ({e})") from e


def check_not_both(given: dict[str, Any], where: str) -> None:
    """A jets section as the user wrote it: with weaver_config, none of the keys it decides —
    except a `tree` that names the config's own `treename` (or that a config without one
    leaves to the section)."""
    if not given.get("weaver_config"):
        return
    both = [k for k in DERIVED if given.get(k) is not None]
    doc = read(given["weaver_config"]) or {}
    if is_custom(doc):
        if "labels" in both:
            both.remove("labels")  # its labels are targets: the classes are the section's
        else:
            raise VoxjetError(
                f"{where}: weaver_config {given['weaver_config']} has custom labels "
                f"(regression targets {sorted(doc['labels']['value'])}), which voxjet learns "
                "beside classes: give the classes in the section's `labels` (one-hot "
                "branches, {branch, classes} or {by_file: ...})"
            )
        if given.get("targets"):
            raise VoxjetError(
                f"{where}: `targets` beside weaver_config {given['weaver_config']}, which "
                "has its own targets (custom labels); give them in one place"
            )
    if "tree" in both:
        treename = doc.get("treename")
        if treename in (None, given["tree"]):
            both.remove("tree")
        else:
            raise VoxjetError(
                f"{where}.tree is {given['tree']!r}, but weaver_config "
                f"{given['weaver_config']} reads the tree {treename!r} (its treename); remove "
                "jets.tree or make the two agree"
            )
    if both:
        raise VoxjetError(
            f"{where}: {both} are set by weaver_config {given['weaver_config']}; remove "
            "them from the section"
        )


def resolve(jets: dict[str, Any], where: str) -> dict[str, Any]:
    """The dataset's jets section (defaults filled) with its weaver_config applied, if any."""
    path = jets.get("weaver_config")
    if not path or jets.get("weaver_inputs"):
        return jets
    derived = translate(read(path), f"config key '{where}.weaver_config' ({path})")
    # its expressions parsed here, so that a mistake in one is said as the file's own key
    Variables(derived.get("new_variables") or {}, where=f"{path}: new_variables")
    observers = derived.pop("observers", [])
    if derived.get("weights") and jets.get("weights"):
        raise VoxjetError(f"config key '{where}.weights': weaver_config {path} has its own "
                          "weights section; give the reweighting in one place")  # fmt: skip
    derived["weights"] = derived.get("weights") or jets.get("weights")
    out = {**jets, **derived}
    out["observers"] = list(dict.fromkeys([*(jets.get("observers") or []), *observers]))
    return out
