"""A sweep checked like the keys it sweeps: each swept key a setting of the schema and each
value valid there, the run's whole config validated as the experiment's own is, before any
job (a typo like `train.lrr` would otherwise become runs that die in training)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.schema import did_you_mean, explain, key_path, numbers_as_written

SWEPT_SECTIONS = ("model", "train")


def _experiment_validator(schema: Mapping[str, Any]) -> Any:
    import jsonschema

    root = {"$defs": schema["$defs"], **schema["$defs"]["experiment"]}
    return jsonschema.Draft202012Validator(root)


def _with_value(exp: Mapping[str, Any], key: str, value: Any, where: str) -> dict[str, Any]:
    """The experiment (its sweep left out) with the dotted setting `key` set to `value`."""
    trial = {k: copy.deepcopy(v) for k, v in exp.items() if k != "sweep"}
    *parents, last = key.split(".")
    cur: MutableMapping[str, Any] = trial
    for p in parents:
        cur = cur.setdefault(p, {})
        if not isinstance(cur, MutableMapping):
            raise VoxjetError(f"{where}: {p!r} of {key!r} is not a section of settings")
    cur[last] = value
    return trial


def _unknown_key_message(error: Any, key: str, where: str) -> str | None:
    """An unknown key the sweep added, said as a sweep key that names no setting."""
    if error.validator != "additionalProperties":
        return None
    known = sorted(error.schema.get("properties", {}))
    section, last = key_path(error.absolute_path), key.split(".")[-1]
    return (f"{where}: names no setting (no {last!r} in {section}){did_you_mean([last], known)}; "
            f"the {section} settings are {known} (see config/README.md)")  # fmt: skip


def check_sweep(name: str, exp: MutableMapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Refuse a sweep key that names no setting or a value that is not valid at its key,
    naming the experiment, the key and the value; numbers written like `1e-3` become numbers
    in place."""
    sweep = exp.get("sweep") or {}
    validator = _experiment_validator(schema)
    problems: list[str] = []
    for key, values in sweep.items():
        where = f"config key 'experiments.{name}.sweep.{key}'"
        if key.split(".")[0] not in SWEPT_SECTIONS:
            problems.append(
                f"{where}: a sweep sets model or train settings (e.g. train.lr, "
                "model.phi_sizes); give the others in the experiment itself"
            )
            continue
        for i, value in enumerate(values):
            trial = _with_value(exp, key, value, where)
            numbers_as_written(trial, validator)
            values[i] = value = _get(trial, key)
            for e in validator.iter_errors(trial):
                said = _unknown_key_message(e, key, where)
                if said:
                    problems.append(said)
                    continue
                for line in explain(e):
                    what = line.split("': ", 1)[-1]
                    problems.append(f"{where}: value {value!r}: {what}")
    if problems:
        raise VoxjetError("invalid sweep:\n  " + "\n  ".join(sorted(set(problems))))


def _get(d: Mapping[str, Any], dotted: str) -> Any:
    for p in dotted.split("."):
        d = d[p]
    return d
