"""Typed configs from the validated YAML, the config check with readable messages, and the
expansion of experiments (with sweeps) into runs. Pure functions: the Snakefile and the CLI
both call them, and tests call them without Snakemake."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from voxjet.distributed.launch import threads_per_process
from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.model_inputs import NEEDED_FEATURES
from voxjet.jets.weaver_config import check_not_both
from voxjet.schema import explain, load_schema, numbers_as_written
from voxjet.sweep_check import check_sweep
from voxjet.user_paths import expand_user_paths
from voxjet.volumes.dataset.settings import CASE_FOLDERS

T = TypeVar("T")


def from_dict(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build dataclass `cls` from a mapping, refusing keys it does not have."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise VoxjetError(f"{where}: unknown keys {unknown}; known: {sorted(names)}")
    return cls(**data)


def check_config(
    config: Mapping[str, Any], schema_path: str | Path | None = None
) -> dict[str, JetDataConfig]:
    """Validate against the JSON schema; raise one error that lists every problem by key path.
    Returns each jets dataset's data config, its weaver_config applied and its inputs checked
    (what the workflow's jobs are given)."""
    import jsonschema

    schema = load_schema(schema_path)
    validator = jsonschema.Draft202012Validator(schema)
    if isinstance(config, MutableMapping):
        numbers_as_written(config, validator)
        expand_user_paths(config)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    msgs = sorted({line for e in errors for line in explain(e)})
    if msgs:
        raise VoxjetError("invalid config:\n  " + "\n  ".join(msgs))
    for name, exp in config.get("experiments", {}).items():
        _refuse_set_by_workflow(name, exp)
        check_sweep(name, exp, schema)
    for name, ds in config.get("datasets", {}).items():
        _refuse_secrets(ds.get("read", {}).get("storage_options", {}), f"datasets.{name}.read")
    for name, ds in config.get("datasets", {}).items():
        if isinstance(ds.get("jets"), Mapping):
            check_not_both(ds["jets"], f"config key 'datasets.{name}.jets'")
    jets = {
        name: JetDataConfig.checked(ds["jets"], f"datasets.{name}.jets")
        for name, ds in _filled(config, schema_path).get("datasets", {}).items()
        if ds.get("domain") == "jets" and "jets" in ds
    }
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
        _check_launch_fits(name, exp, config.get("site") or {})
        _check_auto(name, exp, config.get("site") or {})
        _check_sharding(name, exp)
        _check_model_inputs(name, exp, config["datasets"][exp["dataset"]], jets)
    return jets


# train: keys the workflow sets in each run's config itself: a user's value would be ignored
SET_BY_WORKFLOW = {
    "fold": "folds: k under experiments.{name} trains each fold as its own run",
    "folds": "folds: k under experiments.{name} (cross-validation, one run a fold)",
}


def _refuse_set_by_workflow(name: str, exp: Mapping[str, Any]) -> None:
    """A `train:` key (or sweep key) the workflow sets for each run is refused, naming the key
    the user meant: `train: {folds: 2}` would train one run and no cross-validation."""
    given = [(f"experiments.{name}.train.{k}", k) for k in (exp.get("train") or {})
             if k in SET_BY_WORKFLOW]  # fmt: skip
    given += [(f"experiments.{name}.sweep.{k}", k.split(".", 1)[1])
              for k in (exp.get("sweep") or {})
              if k.startswith("train.") and k.split(".", 1)[1] in SET_BY_WORKFLOW]  # fmt: skip
    for where, key in given:
        raise VoxjetError(
            f"config key '{where}': the workflow sets train.{key} for each run itself, so "
            f"yours would do nothing; write {SET_BY_WORKFLOW[key].format(name=name)}"
        )


def _check_model_inputs(name: str, exp: Mapping[str, Any], ds: Mapping[str, Any],
                        jets: Mapping[str, JetDataConfig]) -> None:  # fmt: skip
    """A tagger's geometry features among its dataset's particle features (a weaver config's
    ParticleNet takes its points from the config's own group)."""
    model, data = exp["model"]["name"], jets.get(exp["dataset"])
    if data is None or model not in NEEDED_FEATURES or (ds.get("jets") or {}).get("weaver_config"):
        return
    missing = [f for f in NEEDED_FEATURES[model] if f not in data.particle_features]
    if missing:
        others = [m for m in JET_MODELS if m not in NEEDED_FEATURES and not m.startswith("weaver_")]
        raise VoxjetError(
            f"config key 'experiments.{name}.model.name': {model} computes its geometry from "
            f"{list(NEEDED_FEATURES[model])}, and datasets.{exp['dataset']}.jets."
            f"particle_features lacks {missing}; add them there, or use {' or '.join(others)}"
        )


def _check_sharding(name: str, exp: Mapping[str, Any]) -> None:
    """FSDP and pipeline stages are not combined (in `train:` or across a sweep's values)."""
    train, sweep = exp.get("train") or {}, exp.get("sweep") or {}
    dp = [train.get("data_parallel", "ddp"), *sweep.get("train.data_parallel", [])]
    stages = [train.get("pipeline_stages", 1), *sweep.get("train.pipeline_stages", [])]
    if any(d in ("fsdp", "auto") for d in dp) and any(int(k) > 1 for k in stages):
        raise VoxjetError(
            f"config key 'experiments.{name}.train.data_parallel': "
            f"{'fsdp' if 'fsdp' in dp else 'auto'} with pipeline_stages "
            f"{max(int(k) for k in stages)}: a pipeline's stages are not sharded as well (and "
            "auto chooses the stages itself); use data_parallel: ddp with pipeline stages, or "
            "fsdp or auto with pipeline_stages: 1"
        )


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


def _check_launch_fits(name: str, exp: Mapping[str, Any], site: Mapping[str, Any]) -> None:
    """A launch asks no more GPUs, cores or memory a node than the site's nodes have: a job
    asking more waits in the queue for ever or is refused by sbatch, hours after submission."""
    launch = launch_of(exp)
    where = f"config key 'experiments.{name}.launch"
    asks = [("gpus", None if launch.auto else launch.per_node if launch.on_gpus else 0,
             "gpus_per_node", "GPUs", "spread them over more nodes (launch.nodes)"),
            ("threads", launch.threads, "cores_per_node", "cores",
             "its processes share the job's threads"),
            ("mem_mb", launch.mem_mb, "mem_mb_per_node", "MB of memory",
             "a job's memory is each node's")]  # fmt: skip
    for key, asked, site_key, what, fix in asks:
        has = site.get(site_key)
        if asked is not None and has is not None and asked > has:
            raise VoxjetError(
                f"{where}.{key}': {asked} {what} a node, but site.{site_key} is {has}: no "
                f"node could run the job. Ask at most {has} ({fix}), or correct "
                f"site.{site_key}"
            )


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
    gpu = launch_of(exp).on_gpus
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
    points = math.prod(len(v) for v in (low.get("sweep") or {}).values())
    if points * int(low.get("repeats", 1)) > 1:
        raise VoxjetError(
            f"{where}.previous': {prev!r} trains several runs a fold (a sweep or repeats); a "
            "cascade needs one a fold: split the sweep into experiments"
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


def with_defaults(
    config: Mapping[str, Any], schema_path: str | Path | None = None
) -> dict[str, Any]:
    """A copy of `config` checked and with the schema's defaults filled in, as Snakemake's
    validate() fills them (for code that reads a config outside the workflow)."""

    check_config(config, schema_path)
    return _filled(config, schema_path)


def fill_defaults(config: MutableMapping[str, Any]) -> None:
    """Fill the schema's defaults into a valid `config` in place (what Snakemake's validate()
    does in the workflow)."""
    filled = _filled(config)
    config.clear()
    config.update(filled)


def _filled(config: Mapping[str, Any], schema_path: str | Path | None = None) -> dict[str, Any]:
    """A copy of a valid `config` with the schema's defaults filled in."""
    import jsonschema

    schema = load_schema(schema_path)
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
class SlurmSite:
    """The names a SLURM site gives its queues (the config's `site.slurm`): each job goes to the
    CPU or the GPU partition by what it uses; None: the cluster's default."""

    account: str | None = None
    cpu_partition: str | None = None
    gpu_partition: str | None = None
    gpu_model: str | None = None

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> SlurmSite:
        """The site of a (validated) config."""
        return cls(**((config.get("site") or {}).get("slurm") or {}))

    def resources(self, gpus: int, nodes: int = 1) -> dict[str, Any]:
        """Where a job of `gpus` GPUs a node on `nodes` nodes goes and what it asks for:
        partition, account and the GPUs (with the site's model) — None where the site or the
        job says nothing. One node asks `--gpus`; several ask their GPUs a node (`--gres`:
        `--gpus` is the job's total, which SLURM may spread 5 and 3 over two nodes). HTCondor
        asks `request_gpus` (a job is one machine)."""
        model = self.gpu_model if gpus else None
        gres = f"gpu:{model}:{gpus}" if model else f"gpu:{gpus}"
        return {
            "slurm_account": self.account,
            "slurm_partition": self.gpu_partition if gpus else self.cpu_partition,
            "gpu": (gpus or None) if nodes == 1 else None,
            "gpu_model": model if nodes == 1 else None,
            "gres": gres if gpus and nodes > 1 else None,
            # GPU jobs: one task a node (torchrun starts a process a GPU), not one a GPU
            "tasks_per_gpu": 0 if gpus else None,
            "request_gpus": gpus or None,
        }


def job_needs(mem_mb: int, runtime: int) -> dict[str, Any]:
    """A job's memory (MB) and time limit (minutes) in the names Snakemake's SLURM and HTCondor
    executors read: mem_mb and runtime; htcondor_request_mem_mb and the classad MaxRuntime in
    seconds (CERN's batch enforces it)."""
    return {"mem_mb": mem_mb, "runtime": runtime, "htcondor_request_mem_mb": mem_mb,
            "classad_MaxRuntime": 60 * runtime}  # fmt: skip


RESOURCE_KEYS = ("slurm_account", "slurm_partition", "gpu", "gpu_model", "gres", "tasks_per_gpu",
                 "request_gpus", "cpus_per_task", "nodes", "tasks", "mpi", "mem_mb", "runtime",
                 "htcondor_request_mem_mb", "classad_MaxRuntime")  # fmt: skip


@dataclass(frozen=True)
class Launch:
    """An experiment's `launch:` section (defaults: the schema's, tested equal), with a
    scaling run's size over it: the processes, threads, memory and time of its jobs."""

    gpus: int | str = 1  # a node's; "auto": the planner's allocation decides
    cpu_processes: int = 1
    threads: int = 2
    mem_mb: int = 16000
    runtime: int = 120
    nodes: int = 1
    stop_margin: int = 300

    @property
    def auto(self) -> bool:
        """Whether the planner's sweep allocation decides the GPUs."""
        return self.gpus == "auto"

    @property
    def on_gpus(self) -> bool:
        """Whether the job's processes run on GPUs (an undecided `auto` will)."""
        return self.auto or int(self.gpus) > 0

    @property
    def per_node(self) -> int:
        """Processes a node: one a GPU, or the CPU processes."""
        return int(self.gpus) if self.on_gpus else self.cpu_processes

    @property
    def processes(self) -> int:
        """Processes of the whole job."""
        return self.per_node * self.nodes

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole job (sbatch's --gpus counts every node's)."""
        return int(self.gpus) * self.nodes if self.on_gpus else 0

    def allocated(self, choice: int, gpus_per_node: int | None) -> Launch:
        """`gpus: auto` as the planner chose: `choice` GPUs, across nodes of
        `gpus_per_node` (None: one node)."""
        per_node = gpus_per_node or choice
        return dataclasses.replace(self, gpus=min(choice, per_node), nodes=-(-choice // per_node))

    def resources(self, site: SlurmSite) -> dict[str, Any]:
        """The job's resources as snakemake-executor-plugin-slurm and -htcondor read them (None:
        not asked for): its partition and GPUs by what it uses, as many CPUs as its command's
        threads, one task a node; local runs read `gpu`, `mem_mb` and `runtime`."""
        return {
            **site.resources(self.per_node if self.on_gpus else 0, self.nodes),
            "cpus_per_task": self.threads,  # the command's --threads, on every node
            "nodes": self.nodes,
            "tasks": self.nodes,  # one torchrun a node
            # a multi-node job starts its own `srun` (one torchrun a node), so the jobstep runs
            # the rule as it is instead of inside `srun -n1`; the plugin reads that from `mpi`
            "mpi": "srun" if self.nodes > 1 else None,
            **job_needs(self.mem_mb, self.runtime),
        }

    def args(self) -> str:
        """The `voxjet launch` options of the job (its threads are the rule's)."""
        return (f"--gpus {self.gpus} --cpu-processes {self.cpu_processes} --nodes {self.nodes}"
                f" --stop-margin {self.stop_margin}")  # fmt: skip


def launch_of(experiment: Mapping[str, Any], override: Mapping[str, Any] = ()) -> Launch:
    """An experiment's launch, with a run's size (a scaling run's) over it."""
    return Launch(**{**(experiment.get("launch") or {}), **dict(override)})


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
    launch: Launch = field(default_factory=Launch)
    configuration: str = "3d_fullres"  # a segmentation run's nnU-Net configuration
    # what find-best compares (the experiment and sweep point, the fold left out)
    candidate: str = ""

    @property
    def run_dir(self) -> str:
        """Where the workflow writes this run's outputs."""
        return f"results/{self.dataset}/runs/{self.run_id}"

    @property
    def fold(self) -> int | None:
        """The cross-validation fold it trains (None: not a fold run)."""
        return self.params.get("fold")

    @property
    def cases_folder(self) -> str:
        """The folder under results/<dataset>/ of the case files it reads."""
        return CASE_FOLDERS.get(self.configuration, CASE_FOLDERS["3d_fullres"])

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
    (repeat k trains with train.seed + k), each fold of a cross-validation, and the runs of
    its scaling study."""
    runs: dict[str, Run] = {}
    for name, exp in config.get("experiments", {}).items():
        domain = config["datasets"][exp["dataset"]]["domain"]
        for run in [*_sweep_runs(name, exp, domain), *scaling_runs(name, exp, domain)]:
            if run.run_id in runs:
                why = ("a sweep run is named {!r} like a scaling run; rename the experiment's "
                       "sweep values" if run.role == "scaling" else "two runs would be named "
                       "{!r}; give the sweep values that differ only in punctuation distinct "
                       "names")  # fmt: skip
                raise VoxjetError(f"experiments.{name}: " + why.format(run.run_id))
            runs[run.run_id] = run
    return runs


def _base(exp: Mapping[str, Any]) -> dict[str, Any]:
    """The settings an experiment's runs start from (the sweep sets its keys over them)."""
    return {"model": exp.get("model", {}), "train": exp.get("train", {})}


def _sweep_runs(name: str, exp: Mapping[str, Any], domain: str) -> list[Run]:
    """The runs of an experiment's sweep points, repeats and folds."""
    sweep = exp.get("sweep") or {}
    keys = sorted(sweep)
    base = _base(exp)
    folds = [None] if not exp.get("folds") else list(range(int(exp["folds"])))
    configuration = exp.get("configuration", "3d_fullres")
    launch = launch_of(exp)
    out = []
    for combo in itertools.product(*(sweep[k] for k in keys)) if keys else [()]:
        params = dict(zip(keys, combo, strict=True))
        for fold, repeat in itertools.product(folds, range(int(exp.get("repeats", 1)))):
            cfg = copy.deepcopy(base)
            for k, v in params.items():
                _set_dotted(cfg, k, v, f"experiments.{name}.sweep")
            if repeat:
                cfg["train"]["seed"] = int(cfg["train"].get("seed", 0)) + repeat
            candidate = run_id = run_name(name, base, params, repeat)
            if fold is not None:
                cfg["train"]["fold"] = fold
                cfg["train"]["folds"] = int(exp["folds"])
                run_id = run_id.replace(name, f"{name}_fold-{fold}", 1)
            cfg.update({"experiment": name, "run": run_id, "dataset": exp["dataset"]})
            if configuration != "3d_fullres":
                cfg["configuration"] = configuration
            info = {**params, **({"repeat": repeat} if repeat else {}),
                    **({"fold": fold} if fold is not None else {})}  # fmt: skip
            out.append(Run(run_id, name, exp["dataset"], domain, info, cfg, launch=launch,
                           configuration=configuration, candidate=candidate))  # fmt: skip
    return out


def scaling_runs(name: str, exp: Mapping[str, Any], domain: str) -> list[Run]:
    """The runs of an experiment's scaling study: its own settings for `scaling.steps` steps at
    each (processes a node, nodes), as GPUs or, with `launch.gpus` 0, CPU processes."""
    sc = exp.get("scaling")
    if not sc:
        return []
    gpu = launch_of(exp).on_gpus
    out = []
    for nodes in sc.get("nodes", [1]):
        for n in sc["gpus"]:
            cfg = copy.deepcopy(_base(exp))
            steps = int(sc.get("steps", 50))
            # validation and checkpoint once, at the end: outside the windows the rate is from
            cfg["train"].update(steps=steps, schedule_steps=steps, log_every=max(1, steps // 10),
                                eval_every=steps, checkpoint_every=steps)  # fmt: skip
            run_id = f"{name}_scale-{n}" + (f"x{nodes}" if nodes > 1 else "")
            cfg.update({"experiment": name, "run": run_id, "dataset": exp["dataset"]})
            launch = launch_of(exp, {"gpus" if gpu else "cpu_processes": n, "nodes": nodes})
            params = {"processes": n * nodes, "nodes": nodes}
            if not gpu:  # CPU processes share the job's threads: the cores each size has
                params["cores"] = threads_per_process(launch.threads, n) * n * nodes
            out.append(Run(run_id, name, exp["dataset"], domain, params, cfg, "scaling", launch,
                           candidate=run_id))  # fmt: skip
    return out


def data_location(run: Run, dataset: Mapping[str, Any]) -> str:
    """Where a run's jobs read its dataset: the dataset's source.prepared (a folder or URL of
    shards or cases an earlier run made), else the workflow's own under results/."""
    local = "shards" if run.domain == "jets" else run.cases_folder
    return dataset["source"].get("prepared") or f"results/{run.dataset}/{local}"


def planner_runs(runs: Mapping[str, Run], datasets: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the planner needs of every run (scaling runs too: their measured rates check it):
    its config, data, processes (None: `auto`, the planner decides), GPUs or not, threads."""
    out = []
    for r in runs.values():
        ds = datasets[r.dataset]
        out.append({"run": r.run_id, "experiment": r.experiment, "domain": r.domain,
                    "data": data_location(r, ds), "read": ds["read"], "config": r.config,
                    "processes": None if r.launch.auto else r.launch.processes,
                    "gpu": r.launch.on_gpus, "threads": r.launch.threads,
                    "mem_mb": r.launch.mem_mb})  # fmt: skip
    return out


def planner_threads(runs: Mapping[str, Run]) -> int:
    """The most threads any run's process trains with (voxjet launch's share of
    launch.threads): what the planner profiles each run with."""
    return max([threads_per_process(r.launch.threads, r.launch.processes if not r.launch.auto
                                    else 1) for r in runs.values()] or [1])  # fmt: skip


def planner_gpus(runs: Mapping[str, Run], gpus_per_node: int | None) -> int:
    """GPUs the planner's job holds: one when any run trains on GPUs, two when a run trains on
    several a node (it measures their link then)."""
    gpus = 0
    for r in runs.values():
        if r.launch.auto:
            gpus = max(gpus, 2 if (gpus_per_node or 2) > 1 else 1)
        elif r.launch.on_gpus:
            gpus = max(gpus, min(2, int(r.launch.gpus)))
    return gpus


def fold_runs(runs: Mapping[str, Run], dataset: str | None = None) -> list[Run]:
    """Runs trained as a fold of a cross-validation (`folds:`), of one dataset or all."""
    return [r for r in runs.values() if r.role == "train" and r.fold is not None
            and (dataset is None or r.dataset == dataset)]  # fmt: skip


def previous_runs(run: Run, runs: Mapping[str, Run], experiments: Mapping[str, Any]) -> list[Run]:
    """A 3d_cascade_fullres run's 3d_lowres fold runs (one a fold: the config check made
    sure), or none."""
    if run.configuration != "3d_cascade_fullres":
        return []
    previous = experiments[run.experiment]["previous"]
    return [r for r in fold_runs(runs, run.dataset) if r.experiment == previous]


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
