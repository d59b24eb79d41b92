"""Typed configs from the validated YAML, the config check with readable messages, and the
expansion of experiments (with sweeps) into runs. Pure functions: the Snakefile and the CLI
both call them, and tests call them without Snakemake."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from voxjet.errors import VoxjetError

T = TypeVar("T")

_TYPE_WORDS = {
    "object": "a mapping (key: value)",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def from_dict(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build dataclass `cls` from a mapping, refusing keys it does not have."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise VoxjetError(f"{where}: unknown keys {unknown}; known: {sorted(names)}")
    return cls(**data)


def _key_path(path) -> str:
    parts = []
    for p in path:
        parts.append(f"[{p}]" if isinstance(p, int) else ("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


def _explain(error) -> str:
    where = _key_path(error.absolute_path)
    v = error.validator
    if v == "type":
        want = error.validator_value
        want = " or ".join(
            _TYPE_WORDS.get(t, t) for t in ([want] if isinstance(want, str) else want)
        )
        return f"config key '{where}': expected {want}, got {error.instance!r}"
    if v == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        known = sorted(error.schema.get("properties", {}))
        return (
            f"config key '{where}': unknown key(s) {extra}"
            + (f"; allowed: {known}" if known else "")
            + " (a typo? see config/README.md)"
        )
    if v == "required":
        return f"config key '{where}': {error.message} (see config/README.md)"
    if v == "enum":
        return f"config key '{where}': {error.instance!r} is not one of {error.validator_value}"
    return f"config key '{where}': {error.message}"


def check_config(config: Mapping[str, Any], schema_path: str | Path) -> None:
    """Validate against the JSON schema; raise one error that lists every problem by key path."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    leaf = []
    for e in errors:
        # if/then branches report the inner error as context; report the innermost ones.
        leaf.extend(e.context or [e])
    if leaf:
        msgs = sorted({_explain(e) for e in leaf})
        raise VoxjetError("invalid config:\n  " + "\n  ".join(msgs))
    for name, ds in config.get("datasets", {}).items():
        _refuse_secrets(ds.get("read", {}).get("storage_options", {}), f"datasets.{name}.read")
    for name, ds in config.get("datasets", {}).items():
        if isinstance(ds.get("jets"), Mapping):
            from voxjet.jets.weaver_config import check_not_both

            check_not_both(ds["jets"], f"config key 'datasets.{name}.jets'")
    for name, ds in _filled(config, schema_path).get("datasets", {}).items():
        if ds.get("domain") == "jets" and "jets" in ds:
            from voxjet.jets.leakage import check_inputs, reweight_labels
            from voxjet.jets.reweight import parse
            from voxjet.jets.weaver_config import resolve

            where = f"datasets.{name}.jets"
            jets = resolve(ds["jets"], where)
            check_inputs(jets, where)
            parse(
                jets.get("weights"),
                reweight_labels(jets["labels"]),
                f"config key '{where}.weights'",
            )
    for name, ds in config.get("datasets", {}).items():
        _check_preset_memory(name, ds.get("volumes") or {})
    for name, exp in config.get("experiments", {}).items():
        if exp["dataset"] not in config.get("datasets", {}):
            raise VoxjetError(
                f"config key 'experiments.{name}.dataset': no dataset named "
                f"{exp['dataset']!r}; defined: {sorted(config['datasets'])}"
            )
        _check_model_fits_dataset(name, exp, config["datasets"][exp["dataset"]],
                                  config["experiments"])  # fmt: skip
        _check_scaling(name, exp, config.get("site") or {})
        _check_auto(name, exp, config.get("site") or {})


def _check_preset_memory(name: str, volumes: Mapping[str, Any]) -> None:
    """A ResEnc preset's memory target must fit at least the smallest patch it can plan."""
    preset, gb = volumes.get("plan", "voxjet"), volumes.get("gpu_memory_gb")
    if preset == "voxjet" or gb is None:
        return
    from voxjet.volumes.plan.resenc import smallest_gpu_memory_gb

    floor = smallest_gpu_memory_gb(preset)
    if gb < floor:
        raise VoxjetError(
            f"config key 'datasets.{name}.volumes.gpu_memory_gb': {gb:g} GB fits no patch with "
            f"plan {preset} (its smallest network, an 8×8×8 patch, needs {floor:.2g} GB by the "
            "preset's reference); raise it, or null for the preset's own target"
        )


def on_gpus(launch: Mapping[str, Any]) -> bool:
    """Whether a `launch:` section trains on GPUs (a number above 0, or the planner's choice)."""
    gpus = launch.get("gpus", 1)
    return gpus == "auto" or int(gpus) > 0


def _check_auto(name: str, exp: Mapping[str, Any], site: Mapping[str, Any]) -> None:
    if exp.get("launch", {}).get("gpus") == "auto" and not site.get("gpu_budget"):
        raise VoxjetError(
            f"config key 'experiments.{name}.launch.gpus': auto takes the planner's sweep "
            "allocation, which needs site.gpu_budget (the GPUs the sweep may use at once); "
            "set it, or give a number of GPUs"
        )


def _check_scaling(name: str, exp: Mapping[str, Any], site: Mapping[str, Any]) -> None:
    """A scaling study's GPUs a node within what a node has and its sizes within the budget,
    more than one size."""
    sc = exp.get("scaling")
    if not sc:
        return
    gpus_per_node, budget = site.get("gpus_per_node"), site.get("gpu_budget")
    where = f"config key 'experiments.{name}.scaling"
    gpu = on_gpus(exp.get("launch", {}))
    if gpu and gpus_per_node and max(sc["gpus"]) > gpus_per_node:
        raise VoxjetError(
            f"{where}.gpus': {max(sc['gpus'])} GPUs a node, but site.gpus_per_node is "
            f"{gpus_per_node}; list at most {gpus_per_node} and add sizes with scaling.nodes"
        )
    sizes = {n * m for n in sc["gpus"] for m in sc.get("nodes", [1])}
    if gpu and budget and max(sizes) > budget:
        raise VoxjetError(
            f"{where}': its largest size is {max(sizes)} GPUs, but site.gpu_budget is "
            f"{budget}; leave that size out or raise the budget"
        )
    if len(sizes) < 2:
        raise VoxjetError(f"{where}': all its sizes are {sorted(sizes)} processes; a fit needs "
                          "at least two")  # fmt: skip


JET_MODELS = ("pfn", "particlenet", "part", "weaver_part", "weaver_pnet")
SEG_MODELS = ("unet", "dynunet", "resenc")


def _check_cascade(name: str, exp: Mapping[str, Any], experiments: Mapping[str, Any]) -> None:
    """A cascade names a 3d_lowres experiment of its dataset cross-validated on its folds."""
    where = f"config key 'experiments.{name}"
    prev = exp.get("previous")
    low = experiments.get(prev) if prev else None
    if low is None or low.get("configuration") != "3d_lowres":
        lows = [n for n, e in experiments.items() if e.get("configuration") == "3d_lowres"]
        which = lows or "none yet: add one with configuration: 3d_lowres"
        raise VoxjetError(
            f"{where}.previous': a 3d_cascade_fullres experiment is fed a 3d_lowres "
            f"experiment's segmentations; name one ({which}), not {prev!r}"
        )
    if (
        low["dataset"] != exp["dataset"]
        or not exp.get("folds")
        or (low.get("folds") != exp.get("folds"))
    ):
        raise VoxjetError(
            f"{where}': the cascade and its lowres experiment {prev!r} need the same dataset "
            f"and the same `folds:` (each training case's lowres segmentation comes from the "
            f"fold that validated it); now {exp['dataset']!r}/{exp.get('folds')} and "
            f"{low['dataset']!r}/{low.get('folds')}"
        )


def _check_model_fits_dataset(name: str, exp: Mapping[str, Any], ds: Mapping[str, Any],
                              experiments: Mapping[str, Any]) -> None:  # fmt: skip
    """A model of the dataset's domain, a U-Net no deeper than the plan's patch allows."""
    model, domain = exp["model"]["name"], ds["domain"]
    where = f"config key 'experiments.{name}"
    fits = JET_MODELS if domain == "jets" else SEG_MODELS
    if model not in fits:
        raise VoxjetError(
            f"{where}.model.name': {model!r} is a "
            f"{'jet tagger' if model in JET_MODELS else 'segmentation network'}, but dataset "
            f"{exp['dataset']!r} holds {domain}; use one of {list(fits)}"
        )
    if model.startswith("weaver_") and not (ds.get("jets") or {}).get("weaver_config"):
        raise VoxjetError(
            f"{where}.model.name': {model!r} reads the input groups of a weaver data config; "
            f"give dataset {exp['dataset']!r} jets.weaver_config (or use one of "
            f"{[m for m in JET_MODELS if not m.startswith('weaver_')]})"
        )
    if exp.get("folds") and domain != "volumes":
        raise VoxjetError(f"{where}.folds': cross-validation folds are for volumes datasets")
    conf = exp.get("configuration", "3d_fullres")
    if conf != "3d_fullres":
        if domain != "volumes":
            raise VoxjetError(f"{where}.configuration': {conf} is a segmentation configuration; "
                              f"dataset {exp['dataset']!r} holds {domain}")  # fmt: skip
        if conf == "3d_cascade_fullres":
            _check_cascade(name, exp, experiments)
        if conf == "3d_lowres" and ds.get("source", {}).get("prepared"):
            raise VoxjetError(
                f"{where}.configuration': 3d_lowres trains on cases preprocessed at its own "
                f"spacing, which dataset {exp['dataset']!r} (source.prepared) does not have; "
                "give the dataset's images as its source, or train 3d_fullres"
            )
        if int((exp.get("train") or {}).get("pipeline_stages") or 1) > 1:
            raise VoxjetError(
                f"{where}.train.pipeline_stages': a {conf} network is not cut into pipeline "
                "stages; set 1 (or configuration: 3d_fullres)"
            )
    if model == "resenc":
        import importlib.util

        if importlib.util.find_spec("dynamic_network_architectures") is None:
            raise VoxjetError(
                f"{where}.model.name': resenc is built by MIC-DKFZ's dynamic-network-"
                "architectures, which is not installed; pip install 'voxjet[resenc]'"
            )
    if model == "unet" and ds.get("volumes", {}).get("plan", "voxjet") == "voxjet":
        depth = ds.get("volumes", {}).get("network_depth", 3)
        levels = len(exp["model"]["channels"]) - 1
        if levels > depth:
            raise VoxjetError(
                f"{where}.model.channels': a U-Net of {levels + 1} levels halves each axis "
                f"{levels} times, but the plan's patch divides by 2^{depth} only "
                f"(datasets.{exp['dataset']}.volumes.network_depth: {depth}); give at most "
                f"{depth + 1} widths, or raise network_depth"
            )


def with_defaults(config: Mapping[str, Any], schema_path: str | Path) -> dict[str, Any]:
    """A copy of `config` checked and with the schema's defaults filled in, as Snakemake's
    validate() fills them (for code that reads a config outside the workflow)."""

    check_config(config, schema_path)
    return _filled(config, schema_path)


def _filled(config: Mapping[str, Any], schema_path: str | Path) -> dict[str, Any]:
    """A copy of a valid `config` with the schema's defaults filled in."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_path).read_text())
    base = jsonschema.Draft202012Validator

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(key, copy.deepcopy(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    filling = jsonschema.validators.extend(base, {"properties": set_defaults})
    out = copy.deepcopy(dict(config))
    filling(schema).validate(out)
    return out


SECRET_KEY = re.compile(r"(secret|password|passwd|token|credential|key)$", re.I)


def _refuse_secrets(options: Any, where: str) -> None:
    """Credentials in storage options would reach command lines and logs: refuse them."""
    if not isinstance(options, Mapping):
        return
    for k, v in options.items():
        if isinstance(v, Mapping):
            _refuse_secrets(v, f"{where}.{k}")
        elif SECRET_KEY.search(str(k)) and not str(k).endswith(("_file", "_path")):
            raise VoxjetError(
                f"config key '{where}.storage_options.{k}': credentials do not belong in the "
                "config (it reaches command lines and logs); give them to the storage library "
                "instead: for S3 the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a "
                "profile of ~/.aws/credentials (`storage_options: {profile: <name>}`); for "
                "XRootD a token file (BEARER_TOKEN_FILE) or your grid proxy"
            )


@dataclass(frozen=True)
class Run:
    """One training job: an experiment with one combination of its sweep values."""

    run_id: str
    experiment: str
    dataset: str
    domain: str
    params: dict[str, Any]
    config: dict[str, Any]
    role: str = "train"  # "scaling": a scaling study's run (trained, never evaluated)
    launch: dict[str, Any] = field(default_factory=dict)  # over the experiment's `launch:`

    @property
    def run_dir(self) -> str:
        """Where the workflow writes this run's outputs."""
        return f"results/{self.dataset}/runs/{self.run_id}"

    def as_json(self) -> str:
        """The resolved run config the training command reads."""
        return json.dumps(self.config, sort_keys=True)


def _slug(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]", "_", str(value))


_MISSING = object()


def _get_dotted(d: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = d
    for p in dotted.split("."):
        if not isinstance(cur, Mapping) or p not in cur:
            return _MISSING
        cur = cur[p]
    return cur


def _set_dotted(d: dict[str, Any], dotted: str, value: Any, where: str) -> None:
    *parents, last = dotted.split(".")
    cur = d
    for p in parents:
        if not isinstance(cur.get(p), dict):
            raise VoxjetError(
                f"{where}: sweep key {dotted!r} does not name a setting; use e.g. "
                "'train.lr' or 'model.phi_sizes'"
            )
        cur = cur[p]
    cur[last] = value


def _short_names(keys: list[str]) -> dict[str, str]:
    """A sweep key's name in run names: its last part, or all of it where two share one."""
    last = [k.split(".")[-1] for k in keys]
    return {
        k: (s if last.count(s) == 1 else k.replace(".", "-"))
        for k, s in zip(keys, last, strict=True)
    }


def run_name(
    experiment: str, base: Mapping[str, Any], params: Mapping[str, Any], repeat: int
) -> str:
    """`experiment`, then `_<key>-<value>` for each swept setting whose value differs from the
    experiment's own (so a sweep that grows, or a new key whose list holds the current value,
    leaves existing names alone), then `_rep-<k>` for repeats after the first."""
    short = _short_names(sorted(params))
    parts = [experiment]
    for k in sorted(params):
        if _get_dotted(base, k) is _MISSING or _get_dotted(base, k) != params[k]:
            parts.append(f"{short[k]}-{_slug(params[k])}")
    if repeat:
        parts.append(f"rep-{repeat}")
    return "_".join(parts)


def expand_runs(config: Mapping[str, Any]) -> dict[str, Run]:
    """Every run of every experiment: each combination of the sweep's values, `repeats` times
    (repeat k trains with train.seed + k)."""
    runs: dict[str, Run] = {}
    for name, exp in config.get("experiments", {}).items():
        domain = config["datasets"][exp["dataset"]]["domain"]
        sweep = exp.get("sweep") or {}
        keys = sorted(sweep)
        base = {"model": exp.get("model", {}), "train": exp.get("train", {})}
        folds = [None] if not exp.get("folds") else list(range(int(exp["folds"])))
        for combo in itertools.product(*(sweep[k] for k in keys)) if keys else [()]:
            params = dict(zip(keys, combo, strict=True))
            for fold, repeat in itertools.product(folds, range(int(exp.get("repeats", 1)))):
                cfg = copy.deepcopy(base)
                for k, v in params.items():
                    _set_dotted(cfg, k, v, f"experiments.{name}.sweep")
                if repeat:
                    cfg["train"]["seed"] = int(cfg["train"].get("seed", 0)) + repeat
                run_id = run_name(name, base, params, repeat)
                if fold is not None:
                    cfg["train"]["fold"] = fold
                    cfg["train"]["folds"] = int(exp["folds"])
                    run_id = run_id.replace(name, f"{name}_fold-{fold}", 1)
                if run_id in runs:
                    raise VoxjetError(
                        f"experiments.{name}: two runs would be named {run_id!r}; give the "
                        "sweep values that differ only in punctuation distinct names"
                    )
                cfg.update({"experiment": name, "run": run_id, "dataset": exp["dataset"]})
                if exp.get("configuration", "3d_fullres") != "3d_fullres":
                    cfg["configuration"] = exp["configuration"]
                info = {**params, **({"repeat": repeat} if repeat else {}),
                        **({"fold": fold} if fold is not None else {})}  # fmt: skip
                runs[run_id] = Run(run_id, name, exp["dataset"], domain, info, cfg)
        for run in scaling_runs(name, exp, base, domain):
            if run.run_id in runs:
                raise VoxjetError(
                    f"experiments.{name}: a sweep run is named {run.run_id!r} like a scaling "
                    "run; rename the experiment's sweep values"
                )
            runs[run.run_id] = run
    return runs


def scaling_runs(name: str, exp: Mapping[str, Any], base: Mapping[str, Any],
                 domain: str) -> list[Run]:  # fmt: skip
    """The runs of an experiment's scaling study: its own settings for `scaling.steps` steps at
    each (processes a node, nodes), as GPUs or, with `launch.gpus` 0, CPU processes."""
    sc = exp.get("scaling")
    if not sc:
        return []
    gpu = on_gpus(exp.get("launch", {}))
    out = []
    for nodes in sc.get("nodes", [1]):
        for n in sc["gpus"]:
            cfg = copy.deepcopy(dict(base))
            steps = int(sc.get("steps", 50))
            # validation and checkpoint once, at the end: outside the windows the rate is from
            cfg["train"].update(steps=steps, schedule_steps=steps, log_every=max(1, steps // 10),
                                eval_every=steps, checkpoint_every=steps)  # fmt: skip
            run_id = f"{name}_scale-{n}" + (f"x{nodes}" if nodes > 1 else "")
            cfg.update({"experiment": name, "run": run_id, "dataset": exp["dataset"]})
            launch = {"gpus" if gpu else "cpu_processes": n, "nodes": nodes}
            params = {"processes": n * nodes, "nodes": nodes}
            out.append(Run(run_id, name, exp["dataset"], domain, params, cfg, "scaling", launch))
    return out


def best_runs(p: Mapping[str, Any], runs: Mapping[str, Run], where: str) -> list[Run]:
    """`run: best`: every cross-validation fold run of the dataset whose best configuration
    is applied (find_best chooses among them)."""
    folds = [r for r in runs.values() if r.role == "train" and "fold" in r.params]
    datasets = sorted({r.dataset for r in folds})
    ds = p.get("dataset") or (datasets[0] if len(datasets) == 1 else None)
    if ds is None:
        raise VoxjetError(
            f"{where}.run': best needs a dataset with cross-validated experiments; "
            + (f"several have them ({datasets}): name one with predict.<name>.dataset"
               if datasets else "give an experiment `folds:` (e.g. 5), or name a run")
        )  # fmt: skip
    mine = [r for r in folds if r.dataset == ds]
    if not mine:
        raise VoxjetError(
            f"{where}.dataset': {ds!r} has no cross-validated experiment, so no best "
            f"configuration can be chosen; give one of its experiments `folds:` (datasets "
            f"with them: {datasets})"
        )
    return mine


def prediction_runs(config: Mapping[str, Any], runs: Mapping[str, Run]) -> dict[str, list[Run]]:
    """For each entry of `predict`, the runs whose model it may use (one named run, or every
    run of an experiment: the best of them is picked when the job runs); a name that is no
    run or experiment is an error naming the key."""
    out = {}
    for name, p in (config.get("predict") or {}).items():
        where = f"config key 'predict.{name}"
        if p.get("run") == "best" and "best" not in runs:
            out[name] = best_runs(p, runs, where)
        elif "run" in p:
            if p["run"] not in runs or runs[p["run"]].role != "train":
                raise VoxjetError(f"{where}.run': no run named {p['run']!r}; runs: {sorted(runs)}")
            out[name] = [runs[p["run"]]]
        else:
            mine = [r for r in runs.values()
                    if r.experiment == p["experiment"] and r.role == "train"]  # fmt: skip
            if not mine:
                raise VoxjetError(
                    f"{where}.experiment': no experiment named {p['experiment']!r}; "
                    f"defined: {sorted(config.get('experiments', {}))}"
                )
            out[name] = mine
    return out


def parse_json_arg(value: str, what: str) -> Any:
    """A CLI argument that is JSON text or @path to a JSON file."""
    try:
        if value.startswith("@"):
            return json.loads(Path(value[1:]).read_text())
        return json.loads(value)
    except (OSError, json.JSONDecodeError) as e:
        raise VoxjetError(f"{what}: not valid JSON ({e})") from e


def check_sources(config: Mapping[str, Any]) -> None:
    """Local source paths of real datasets must exist (checked at parse time, `-n` included).
    Only the path itself is looked at: no directory scans, however many files it holds."""
    for name, ds in config.get("datasets", {}).items():
        listing = ds.get("source", {}).get("file_list")
        if listing and not Path(listing).is_file():
            raise VoxjetError(
                f"config key 'datasets.{name}.source.file_list': {listing!r} does not exist; "
                "point it at a text file with one path or URL a line"
            )
        prepared = ds.get("source", {}).get("prepared")
        if prepared and "://" not in prepared:
            marker = "index.json" if ds.get("domain") == "jets" else "splits.json"
            if not (Path(prepared) / marker).is_file():
                raise VoxjetError(
                    f"config key 'datasets.{name}.source.prepared': {prepared!r} has no "
                    f"{marker}; point it at the results/<dataset>/"
                    f"{'shards' if marker == 'index.json' else 'cases'} folder of an earlier run"
                )
        path = ds.get("source", {}).get("path")
        if not path or "://" in path:
            continue
        probe = Path(path)
        if any(c in path for c in "*?["):
            probe = Path(os.path.dirname(re.split(r"[*?\[]", path)[0]) or ".")
        if not probe.exists():
            raise VoxjetError(
                f"config key 'datasets.{name}.source.path': {path!r} does not exist; "
                "point it at the dataset's directory (or a glob / URL)"
            )
