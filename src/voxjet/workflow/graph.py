"""The run graph: what every rule of the workflow needs, from the validated config — the
datasets and their sources, the runs of every experiment, the predictions, and for each job
its input paths, command options and resources. workflow/rules/common.smk passes wildcards to
a Graph and nothing else; everything decided here is tested without Snakemake.

No job decides what a later job does: the graph is whole at the dry run (no checkpoints), so
`--until`, `--omit-from` and `-R` act on exactly the jobs the dry run lists."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import h5py

from voxjet.config import (
    RESOURCE_KEYS,
    Launch,
    Run,
    SlurmSite,
    check_config,
    check_sources,
    data_location,
    expand_runs,
    fold_runs,
    job_needs,
    planner_gpus,
    planner_runs,
    planner_threads,
    prediction_runs,
    previous_runs,
)
from voxjet.errors import VoxjetError
from voxjet.extras import check_extras
from voxjet.io.ledger import ensure, existing_states
from voxjet.jets.branch_reads import check_source_file
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.shard import jet_files
from voxjet.job_params import Digested, DigestedList, json_param
from voxjet.planner.allocate import allocation_choice
from voxjet.report.runs import run_infos
from voxjet.stage.fingerprint import digest
from voxjet.volumes.dataset.settings import CASE_FOLDERS
from voxjet.workflow import paths
from voxjet.workflow.cases import CaseList, case_list, plan_digest
from voxjet.workflow.sources import DatasetSources, stage_patterns


def _parallel_auto(run: Run) -> bool:
    return (run.config.get("train") or {}).get("data_parallel") == "auto"


# the configuration whose spacing each folder of case files under results/<dataset>/ holds
CONFIGURATION_OF_CASES = {folder: c for c, folder in CASE_FOLDERS.items()}


def exit_with(error: VoxjetError) -> NoReturn:
    """voxjet's message, naming the key or file and the fix, as the last thing on the console
    (no traceback through the workflow's files), and a non-zero exit before any job."""
    print(f"voxjet: {error}", file=sys.stderr)
    raise SystemExit(1)


def one_of(names: Iterable[str]) -> str:
    """A wildcard regex matching exactly these names (or nothing)."""
    import re

    return "|".join(re.escape(n) for n in names) or "(?!)"


def resource_functions(of: Callable[[Any], Mapping[str, Any]]) -> dict[str, Callable]:
    """A rule's `resources:` block, one function of the wildcards a resource, from `of`
    (wildcards → the job's resources); None: not asked for."""
    return {k: (lambda wildcards, k=k: of(wildcards)[k]) for k in RESOURCE_KEYS}


@dataclass
class Graph:
    """The workflow's datasets, runs and predictions, and what each job needs."""

    config: dict[str, Any]
    jets: dict[str, JetDataConfig]
    runs: dict[str, Run]
    predictions: dict[str, list[Run]]
    sources: dict[str, DatasetSources]
    cases: dict[str, CaseList]
    chunks: dict[str, list[list[str]]]
    site: SlurmSite = field(default_factory=SlurmSite)
    _plans: dict[tuple, tuple] = field(default_factory=dict)  # planning folders read

    # --- datasets -------------------------------------------------------------------------
    def dataset(self, name: str) -> dict[str, Any]:
        """A dataset's section of the config."""
        return self.config["datasets"][name]

    def datasets_of(self, domain: str) -> list[str]:
        """The datasets of a domain (jets, volumes)."""
        return [d for d, c in self.config["datasets"].items() if c["domain"] == domain]

    def runs_of(self, domain: str) -> list[str]:
        """The run ids of a domain."""
        return [r.run_id for r in self.runs.values() if r.domain == domain]

    def prepared(self, name: str) -> str | None:
        """The folder or URL of a dataset given as already-prepared shards/cases (else None)."""
        return self.dataset(name)["source"].get("prepared")

    def notices(self) -> list[str]:
        """What a user should know before the run: a dataset the Pythia generator should make
        that the toy generator will (its numbers then differ from README's demo table)."""
        from voxjet.jets.pythia import not_installed

        out = []
        for name in self.datasets_of("jets"):
            synthetic = self.dataset(name)["source"].get("synthetic")
            if synthetic and synthetic.get("generator") == "pythia":
                why = not_installed()
                if why:
                    out.append(f"voxjet: dataset {name}: its jets will come from the toy "
                               f"generator, not Pythia, because {why}. The numbers will differ "
                               "from README's demo table.")  # fmt: skip
        return out

    def synth_args(self, name: str) -> str:
        """The generator's options of a synthetic dataset."""
        s = self.dataset(name)["source"]["synthetic"]
        return " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in s.items()
        )

    def stage_input(self, name: str) -> list[str]:
        """The stage's input files (voxjet.workflow.sources)."""
        return self.sources[name].stage_input()

    def generated(self, name: str) -> list[str]:
        """The generated folder a synthetic dataset stages from."""
        return self.sources[name].generated()

    def stage_source(self, name: str) -> str:
        """The stage command's source option."""
        return self.sources[name].stage_source()

    def untimed_sources(self, name: str) -> bool:
        """Whether a dataset's source files' times do not matter to the stage (a local source:
        their content keys, in its params, decide)."""
        return self.sources[name].tracked

    def stage_patterns(self, name: str) -> list[str]:
        """The file patterns a dataset stages."""
        return stage_patterns(self.dataset(name))

    def source_digest(self, name: str) -> str:
        """What every source file's content is known as (what the shards are made from)."""
        return self.sources[name].digest()

    def plan_digest(self, name: str) -> str:
        """What the planning is made from: every file's content and the volumes section."""
        return digest([self.source_digest(name), json_param(self.dataset(name)["volumes"])])

    def staged_folder(self, name: str) -> str:
        """Where the stage copies a dataset."""
        return paths.fill(paths.STAGED, dataset=name)

    def stage_options(self, name: str) -> str:
        """Patterns, checksum manifest and (for ROOT) the tree the manifest records entries of."""
        ds = self.dataset(name)
        opts = ["--pattern", *stage_patterns(ds)]
        if ds["source"].get("checksums"):
            opts += ["--checksums", ds["source"]["checksums"]]
        if ds["domain"] == "jets":
            data = self.jets[name]
            key = (f"the treename of weaver_config {data.weaver_config}" if data.weaver_config
                   else f"datasets.{name}.jets.tree")  # fmt: skip
            opts += ["--tree", data.tree_name, "--tree-key", key]
            opts += ["--on-bad-file", ds["jets"]["on_bad_file"]]
            opts += ["--on-duplicate", ds["source"]["on_duplicate"]]
        else:  # identical label files are common (empty masks); the planning compares cases
            opts += ["--on-duplicate", "ignore"]
        return " ".join(shlex.quote(o) for o in opts)

    def verify_targets(self) -> list[str]:
        """The check of each local source's staged copies (touched sources rerun it alone)."""
        return [paths.fill(paths.VERIFIED, dataset=d) for d, src in self.sources.items()
                if src.tracked]  # fmt: skip

    def data_section(self, section: str, name: str) -> Digested:
        """The dataset's jets/volumes section as JSON for the CLI (a jets section with its
        weaver_config read into it, so a change of that file's content counts)."""
        if section == "jets":
            return json_param(self.jets[name].record())
        return json_param(self.dataset(name)[section])

    def read_options(self, name: str) -> Digested:
        """The dataset's `read:` section as JSON for --read."""
        return json_param(self.dataset(name)["read"])

    def shard_parts(self, name: str) -> list[str]:
        """The scatter jobs' part folders of a jets dataset (jets.shard_jobs of them)."""
        n = self.dataset(name)["jets"]["shard_jobs"]
        return [paths.fill(paths.SHARD_PART, dataset=name, part=f"{k:04d}") for k in range(n)]

    def case_ids(self, name: str) -> list[str]:
        """A volumes dataset's training cases, known at the dry run."""
        return self.cases[name].ids

    def case_folder(self, name: str, cases: str) -> str:
        """The folder of a configuration's case files."""
        return paths.fill(paths.CASE_FOLDER, dataset=name, cases=cases)

    def case_outputs(self, name: str, cases: str) -> list[str]:
        """One preprocessed file a case."""
        return [paths.fill(paths.CASE, dataset=name, cases=cases, case=c)
                for c in self.case_ids(name)]  # fmt: skip

    def case_digest(self, name: str, case: str) -> str:
        """What a case's preprocessing is made from: its files' content keys, dataset.json's,
        the dataset's volumes section."""
        files = self.cases[name].files.get(case)
        content = self.sources[name].digest_of(files) if files else self.sources[name].digest()
        return digest([content, json_param(self.dataset(name)["volumes"])])

    def case_current(self, name: str, cases: str, case: str) -> bool:
        """Whether a case file was made from the case's sources and plan as the dry run knows
        them: then what it is made from is taken as `ancient` (a restage or replan for other
        cases leaves it alone; gather_cases refuses it if the new plan differs), else its job
        reruns with anything upstream."""
        path = paths.fill(paths.CASE, dataset=name, cases=cases, case=case)
        try:
            with h5py.File(path, "r") as f:
                made = (f.attrs.get("made_from"), f.attrs.get("plan_digest"))
        except (OSError, KeyError):
            return False
        return made == (self.case_digest(name, case), self.case_plan(name, cases, case))

    def case_plan(self, name: str, cases: str, case: str) -> str:
        """The digest of what a case's preprocessing takes from the planning as it stands
        (the case files record theirs; gather_cases refuses cases of an earlier plan)."""
        folder = paths.fill(paths.VOLUME_PLAN, dataset=name)
        return plan_digest(folder, CONFIGURATION_OF_CASES[cases], case, self._plans)

    # --- runs -----------------------------------------------------------------------------
    def run_location(self, run: str) -> str:
        """Where a run's jobs read its data."""
        r = self.runs[run]
        return data_location(r, self.dataset(r.dataset))

    def best_location(self, name: str) -> str:
        """Where find_best reads a dataset's cases (its first fold run's)."""
        r = self.folds(name)[0]
        return data_location(r, self.dataset(name))

    def data_input(self, name: str, made: str) -> list[str]:
        """The prepared-data input of a job: the workflow's own output `made`, or nothing when
        the dataset is read from source.prepared (a URL Snakemake cannot track)."""
        return [] if self.prepared(name) else [made]

    def seg_data_input(self, name: str, run: str | None = None) -> list[str]:
        """The gathered case files a segmentation job reads (the folder of the run's
        configuration; the first fold's for find_best)."""
        if self.prepared(name):
            return []
        r = self.runs[run] if run else self.folds(name)[0]
        return [paths.fill(paths.CASES, dataset=name, cases=r.cases_folder)]

    def run_file(self, pattern: str, run: Run) -> str:
        """A run's file (a pattern of voxjet.workflow.paths)."""
        return paths.fill(pattern, dataset=run.dataset, run=run.run_id)

    def run_dir(self, run: str, *inside: str) -> str:
        """The run's folder, or one inside it."""
        return os.path.join(self.runs[run].run_dir, *inside)

    def run_config(self, run: str) -> Digested:
        """The run's resolved config as JSON for --run-config (recorded by its digest); with
        `train.data_parallel: auto`, the plan it reads the choice from."""
        r = self.runs[run]
        if not _parallel_auto(r):
            return Digested(r.as_json())
        return Digested(json.dumps({**r.config, "plan": paths.RUN_PLAN}, sort_keys=True))

    def evaluate_settings(self, run: str) -> dict[str, Any]:
        """The run's experiment's `evaluate:` section."""
        return self.config["experiments"][self.runs[run].experiment]["evaluate"]

    def launch(self, run: str) -> Launch:
        """The run's launch; `gpus: auto` as the planner's allocation chose once its plan
        exists (Snakemake evaluates a job's parameters and resources again just before it
        runs, when the plan it waits for is there), one GPU before."""
        launch = self.runs[run].launch
        if not launch.auto:
            return launch
        if not os.path.exists(paths.RUN_PLAN):
            return dataclasses.replace(launch, gpus=1)
        return launch.allocated(allocation_choice(paths.RUN_PLAN),
                                self.config["site"]["gpus_per_node"])  # fmt: skip

    def plan_for_auto(self, run: str) -> list[str]:
        """A run whose GPUs or data parallelism the planner chooses waits for the plan."""
        return [paths.RUN_PLAN] if self.runs[run].launch.auto or _parallel_auto(
            self.runs[run]) else []  # fmt: skip

    def run_resources(self, run: str) -> dict[str, Any]:
        """A run's job's resources (its launch's)."""
        return self.launch(run).resources(self.site)

    def cpu_job(self, mem_mb: int, runtime: int, gpus: int = 0) -> dict[str, Any]:
        """The resources of a job that is no run's (CPU unless `gpus`): partition, account,
        GPUs, its memory (MB) and time limit (minutes) in each executor's names."""
        asks = {**self.site.resources(gpus), **job_needs(mem_mb, runtime)}
        return {k: v for k, v in asks.items() if v is not None}

    def folds(self, name: str | None = None) -> list[Run]:
        """Runs trained as a fold of a cross-validation, of one dataset or all."""
        return fold_runs(self.runs, name)

    def fold_ids(self) -> list[str]:
        """Every fold run's id."""
        return [r.run_id for r in self.folds()]

    def previous(self, run: Run) -> list[Run]:
        """A 3d_cascade_fullres run's 3d_lowres fold runs (one a fold), or none."""
        return previous_runs(run, self.runs, self.config["experiments"])

    def previous_inputs(self, run: str, test: bool) -> list[str]:
        """The lowres folds' validations a cascade run reads (all folds), and for its test
        evaluation the test metrics of the lowres fold of the same number."""
        r = self.runs[run]
        lows = self.previous(r)
        out = [self.run_file(paths.VALIDATION_METRICS, low) for low in lows]
        if test:
            out += [self.run_file(paths.EVAL_METRICS, low) for low in lows if low.fold == r.fold]
        return out

    def previous_args(self, run: str, test: bool) -> str:
        """previous_inputs as the evaluate-seg / train-seg options."""
        r = self.runs[run]
        lows = self.previous(r)
        if not lows:
            return ""
        val = [self.run_file(paths.VALIDATION, low) for low in lows]
        pred = [os.path.join(self.run_file(paths.EVAL, low), "predictions") for low in lows
                if test and low.fold == r.fold]  # fmt: skip
        return " ".join(["--previous-validations", *val]
                        + (["--previous-predictions", *pred] if pred else []))  # fmt: skip

    def evaluations(self) -> list[str]:
        """Every trained run's evaluation (scaling runs are only timed, never evaluated)."""
        return [self.run_file(paths.EVAL_METRICS, r) for r in self.runs.values()
                if r.role == "train"]  # fmt: skip

    def train_logs(self) -> list[str]:
        """Every run's training log."""
        return [self.run_file(paths.TRAIN_LOG, r) for r in self.runs.values()]

    def best_targets(self) -> list[str]:
        """Each volumes dataset with cross-validated experiments: its best-configuration choice."""
        return sorted({paths.fill(paths.BEST_CHOICE, dataset=r.dataset) for r in self.folds()})

    def best_datasets(self) -> list[str]:
        """The datasets find_best runs for."""
        return sorted({r.dataset for r in self.folds()})

    def best_folder(self, name: str) -> str:
        """Where find_best writes a dataset's choice."""
        return paths.fill(paths.BEST, dataset=name)

    def best_inputs(self, name: str) -> list[str]:
        """The validation metrics of every fold run of the dataset."""
        return [self.run_file(paths.VALIDATION_METRICS, r) for r in self.folds(name)]

    def best_configs(self, name: str) -> Digested:
        """find-best's --configs: each candidate's fold validation folders and models."""
        out: dict[str, dict[str, list[str]]] = {}
        for r in self.folds(name):
            c = out.setdefault(r.candidate, {"validations": [], "models": []})
            c["validations"].append(self.run_file(paths.VALIDATION, r))
            c["models"].append(self.run_file(paths.MODEL, r))
        return json_param(out)

    def aggregate_runs(self) -> DigestedList:
        """What the aggregate step needs to know about every run."""
        return DigestedList(dataclasses.asdict(i) for i in run_infos(self.runs.values()))

    def plan_inputs(self) -> list[str]:
        """The prepared data of every dataset a run trains on (the planner profiles batches)."""
        out = set()
        for r in self.runs.values():
            if self.prepared(r.dataset):
                continue
            if r.domain == "jets":
                out.add(paths.fill(paths.SHARD_INDEX, dataset=r.dataset))
            else:
                out.add(paths.fill(paths.CASES, dataset=r.dataset, cases=r.cases_folder))
        return sorted(out)

    def planner_runs(self) -> DigestedList:
        """What the planner needs of every run."""
        return DigestedList(planner_runs(self.runs, self.config["datasets"]))

    def planner_threads(self) -> int:
        """The most threads any run's process trains with."""
        return planner_threads(self.runs)

    def planner_job(self, mem_mb: int, runtime: int) -> dict[str, Any]:
        """The planner job's resources (its GPUs: two when a run trains on several a node)."""
        gpus = planner_gpus(self.runs, self.config["site"]["gpus_per_node"])
        return self.cpu_job(mem_mb, runtime, gpus)

    # --- predictions ----------------------------------------------------------------------
    def prediction_targets(self) -> list[str]:
        """Every chunk folder of every prediction."""
        return [paths.fill(paths.PREDICTION, name=name, chunk=f"{k:04d}")
                for name, chunks in self.chunks.items() for k in range(len(chunks))]  # fmt: skip

    def prediction_models(self, name: str) -> list[str]:
        """The model.pt of the run (or of every run of the experiment: the best is used)."""
        return [self.run_file(paths.MODEL, r) for r in self.predictions[name]]

    def prediction_previous(self, name: str) -> list[str]:
        """A cascade among the predicted runs: its 3d_lowres experiment's fold models."""
        return sorted({self.run_file(paths.MODEL, low)
                       for r in self.predictions[name] for low in self.previous(r)})  # fmt: skip

    def prediction_choice(self, name: str) -> list[str]:
        """`run: best`: the dataset's choice.json, made by find_best."""
        if self.config["predict"][name].get("run") != "best" or "best" in self.runs:
            return []
        return [paths.fill(paths.BEST_CHOICE, dataset=self.predictions[name][0].dataset)]

    def prediction_inputs(self, name: str, chunk: str) -> str:
        """A chunk's input files, shell-quoted."""
        return " ".join(shlex.quote(f) for f in self.chunks[name][int(chunk)])

    def prediction_options(self, name: str) -> str:
        """The predict command's options."""
        p = self.config["predict"][name]
        opts = [f"--overlap {p['overlap']}"] + (["--mirror"] if p["mirror"] else [])
        opts += ["--probabilities"] if p["probabilities"] else []
        if p["observers"]:
            opts.append("--observers " + " ".join(shlex.quote(o) for o in p["observers"]))
        if p.get("tree"):
            opts.append(f"--tree {shlex.quote(p['tree'])}")
        opts += [f"--choice {shlex.quote(c)}" for c in self.prediction_choice(name)]
        previous = self.prediction_previous(name)
        if previous:
            opts.append("--previous-model " + " ".join(shlex.quote(m) for m in previous))
        return " ".join(opts)

    def prediction_launch(self, name: str) -> Launch:
        """The launch of a prediction's jobs: its experiment's, on one node."""
        return dataclasses.replace(self.launch(self.predictions[name][0].run_id), nodes=1)

    def job_counts(self) -> dict[str, int]:
        """The jobs of the rules that have many alike ones (shard parts, preprocessed cases)."""
        shards = sum(len(self.shard_parts(d)) for d in self.datasets_of("jets")
                     if not self.prepared(d))  # fmt: skip
        folders = {(r.dataset, r.cases_folder) for r in self.runs.values()
                   if r.domain == "volumes" and not self.prepared(r.dataset)}  # fmt: skip
        cases = sum(len(self.case_ids(d)) for d, _ in folders)
        return {"shard_jets": shards, "preprocess_case": cases}

    def check_arrays(self, array_rules: str | None, jobs: int | None) -> None:
        """Refuse to start (voxjet's message, exit 1) when a rule submitted as SLURM job arrays
        has more jobs than Snakemake keeps in flight: snakemake-executor-plugin-slurm 2.8
        builds an array from the ready jobs it is handed together and never submits one handed
        alone while others of its rule wait, so the run would stall."""
        if not array_rules or not jobs:
            return
        chosen = {r.strip() for r in array_rules.replace(";", ",").split(",") if r.strip()}
        for rule, n in self.job_counts().items():
            if (rule in chosen or "all" in chosen) and n > jobs:
                exit_with(VoxjetError(
                    f"{rule} has {n} jobs, submitted as SLURM job arrays, but at most {jobs} "
                    "jobs may be in flight (--jobs): the SLURM plugin would hold back the jobs "
                    f"it is handed apart and the run would stall. Raise jobs to {n} or more "
                    "(workflow/profiles/slurm sets 10000), or leave the rule out of "
                    "slurm-array-jobs"
                ))  # fmt: skip

    # --- job states -----------------------------------------------------------------------
    @staticmethod
    def states(made: Iterable[str], wildcards: Mapping[str, str], executes: bool) -> list[str]:
        """The state files (voxjet.io.ledger) of the rule-made inputs `made` (patterns with
        the job's wildcards). A run that executes jobs makes the missing ones, cleared, so
        every job takes the same set from its first run on; a dry run writes nothing."""
        filled = [str(p).format(**wildcards) for p in made]
        return ensure(filled) if executes else existing_states(filled)


def build(config: dict[str, Any], validate: Callable[[dict[str, Any]], None]) -> Graph:
    """The graph of a workflow config: checked (every problem named by key), `validate`d
    (Snakemake's, filling the schema's defaults in place), its sources listed and checked."""
    jets = check_config(config)
    check_sources(config)
    check_extras(config)
    validate(config)
    # dataset.json first: what a volumes folder lacks is said in its terms
    cases = {name: case_list(name, ds) for name, ds in config["datasets"].items()
             if ds["domain"] == "volumes" and not ds["source"].get("prepared")}  # fmt: skip
    sources = {name: DatasetSources.listed(name, ds) for name, ds in config["datasets"].items()}
    for name, data in jets.items():
        if sources[name].files:  # one format, no tree for Parquet: said before any job
            jet_files([{"path": f.relpath} for f in sources[name].files],
                      f"config key 'datasets.{name}.source.path'", data)  # fmt: skip
        first = sources[name].first_jets_file()
        if first and data.on_bad_file == "fail":  # with skip, that one file may be the bad one
            try:
                check_source_file(first, data, name)
            except VoxjetError as e:
                raise VoxjetError(
                    f"config key 'datasets.{name}' (checked on its first file): {e}"
                ) from e
    runs = expand_runs(config)
    predictions = prediction_runs(config, runs)
    chunks = {name: prediction_chunks(config["predict"][name], runs_[0].domain, name)
              for name, runs_ in predictions.items()}  # fmt: skip
    return Graph(config, jets, runs, predictions, sources, cases, chunks, SlurmSite.of(config))


def build_or_exit(config: dict[str, Any], validate: Callable[[dict[str, Any]], None]) -> Graph:
    """build(), or voxjet's message and exit 1 before any job."""
    try:
        return build(config, validate)
    except VoxjetError as e:
        exit_with(e)


def prediction_chunks(p: Mapping[str, Any], domain: str, name: str) -> list[list[str]]:
    """A prediction's input files, cut into chunks of files_per_job."""
    inputs = [p["input"]] if isinstance(p["input"], str) else list(p["input"])
    key = f"predict.{name}.input"
    try:
        if domain == "jets":
            from voxjet.predict import jet_inputs

            items = [path for path, _ in jet_inputs(inputs, key)]
        else:
            from voxjet.volumes.inference.predict import case_inputs

            items = [str(f) for c in case_inputs(inputs) for f in c.files]
    except VoxjetError as e:
        raise VoxjetError(f"config key '{key}': {e}") from e
    n = p["files_per_job"]
    return [items[k : k + n] for k in range(0, len(items), n)]
