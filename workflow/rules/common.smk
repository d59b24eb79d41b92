# Input and params functions for the rules, over what the voxjet package says of the config
# (voxjet.config: the runs, their launch and folders). Logic stays in the package.
import dataclasses
import hashlib
import json
import os
import re
import shlex
import sys

from snakemake.exceptions import IncompleteCheckpointException
from snakemake.settings.types import DeploymentMethod

from voxjet.volumes.settings import CASE_FOLDERS
from voxjet.config import (
    RESOURCE_KEYS,
    SlurmSite,
    check_config,
    check_sources,
    data_location as run_data_location,
    expand_runs,
    fold_runs as config_fold_runs,
    planner_gpus,
    planner_runs,
    planner_threads,
    prediction_runs,
    previous_runs as config_previous_runs,
)
from voxjet.planner.allocate import allocation_choice
from voxjet.errors import VoxjetError
from voxjet.extras import check_extras
from voxjet.jets.branch_reads import check_source_file
from voxjet.job_params import Digested, DigestedList, json_param
from voxjet.stage.manifest import staged_digest
from voxjet.io.ledger import ensure as ensure_states, existing_states
from voxjet.report.runs import run_infos
from voxjet.stage.transfer import list_sources
from voxjet.workflow_env import conda_env_file


def conda_env():
    """The rules' conda env: envs/voxjet.yaml, with voxjet installed from this workflow's
    folder when Snakemake deploys it (`--sdm conda` copies the file elsewhere first)."""
    if DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method:
        return "../../envs/voxjet.yaml"
    template = workflow.source_path("../../envs/voxjet.yaml")
    return str(conda_env_file(template, workflow.basedir, ".snakemake/voxjet-envs").resolve())


ENV = conda_env()

def runs_jobs():
    """Whether this invocation executes jobs (not a dry run, --touch, --dag or --summary)."""
    return workflow.executor_plugin is not None and not (workflow.dryrun or workflow.touch)


def ledgers(*made):
    """An input function: the state files of the rule-made inputs `made` (patterns with the
    rule's wildcards, or input functions; voxjet.io.ledger). A job that failed or died leaves
    its outputs' states newer than what was built from them, so the next run redoes that
    instead of calling stale results finished. A run that executes jobs makes the missing
    states (cleared) so that every job takes the same set from its first run on; a dry run
    writes nothing and takes those that exist."""

    def entries(wildcards):
        paths = []
        for m in made:
            found = m(wildcards) if callable(m) else m
            paths += [found] if isinstance(found, str) else list(found)
        # patterns are filled in as Snakemake fills in what input functions return
        values = dict(wildcards.items())
        filled = [str(p).format(**values) for p in paths]
        return ensure_states(filled) if runs_jobs() else existing_states(filled)

    return entries


wildcard_constraints:
    dataset="[A-Za-z0-9_-]+",
    run="[A-Za-z0-9_.+-]+",


def fail_before_any_job(error):
    """voxjet's message, naming the key or file and the fix, as the last thing on the console
    (no traceback through the workflow's files), and a non-zero exit before any job."""
    print(f"voxjet: {error}", file=sys.stderr)
    raise SystemExit(1)


def check_config_or_fail(config):
    """Fail before any job with every config problem named by key path; returns each jets
    dataset's checked data config."""
    try:
        jets = check_config(config)
        check_sources(config)
        check_extras(config)
    except VoxjetError as e:
        fail_before_any_job(str(e))
    return jets


def expand_runs_or_fail(config):
    try:
        return expand_runs(config)
    except VoxjetError as e:
        fail_before_any_job(str(e))


def prediction_runs_or_fail(config, runs):
    try:
        return prediction_runs(config, runs)
    except VoxjetError as e:
        fail_before_any_job(str(e))


_chunks = {}


def predict_chunks(name):
    """The inputs of a prediction, listed once and cut into chunks of files_per_job."""
    if name not in _chunks:
        p = config["predict"][name]
        inputs = [p["input"]] if isinstance(p["input"], str) else list(p["input"])
        try:
            if PREDICTIONS[name][0].domain == "jets":
                from voxjet.predict import jet_inputs

                items = [path for path, _ in jet_inputs(inputs, f"predict.{name}.input")]
            else:
                from voxjet.volumes.predict import case_inputs

                items = [str(f) for c in case_inputs(inputs) for f in c.files]
        except VoxjetError as e:
            fail_before_any_job(f"config key 'predict.{name}.input': {e}")
        n = p["files_per_job"]
        _chunks[name] = [items[k : k + n] for k in range(0, len(items), n)]
    return _chunks[name]


def predict_targets():
    """Every chunk folder of every prediction."""
    return [
        f"results/predict/{name}/part_{k:04d}"
        for name in PREDICTIONS
        for k in range(len(predict_chunks(name)))
    ]


def predict_models(wildcards):
    """The model.pt of the run (or of every run of the experiment: the best is used)."""
    return [run_output(rules.train_jets.output.model if r.domain == "jets" else
                       rules.train_seg.output.model, r) for r in PREDICTIONS[wildcards.name]]


def predict_previous(wildcards):
    """A cascade among the predicted runs: its 3d_lowres experiment's fold models (nnU-Net
    predicts the low-resolution stage first and feeds its segmentation on)."""
    out = []
    for run in PREDICTIONS[wildcards.name]:
        out += [run_output(rules.train_seg.output.model, r) for r in previous_runs(run)]
    return sorted(set(out))


def predict_choice(wildcards):
    """`run: best`: the dataset's choice.json, made by find_best."""
    p = config["predict"][wildcards.name]
    if p.get("run") != "best" or "best" in RUNS:
        return []
    return [f"results/{PREDICTIONS[wildcards.name][0].dataset}/best/choice.json"]


def predict_inputs(wildcards):
    return " ".join(shlex.quote(f) for f in predict_chunks(wildcards.name)[int(wildcards.chunk)])


def predict_options(wildcards):
    p = config["predict"][wildcards.name]
    opts = [f"--overlap {p['overlap']}"] + (["--mirror"] if p["mirror"] else [])
    opts += ["--probabilities"] if p["probabilities"] else []
    if p["observers"]:
        opts.append("--observers " + " ".join(shlex.quote(o) for o in p["observers"]))
    if p.get("tree"):
        opts.append(f"--tree {shlex.quote(p['tree'])}")
    opts += [f"--choice {shlex.quote(c)}" for c in predict_choice(wildcards)]
    previous = predict_previous(wildcards)
    if previous:
        opts.append("--previous-model " + " ".join(shlex.quote(m) for m in previous))
    return " ".join(opts)


def predict_launch(wildcards):
    """The launch of a prediction's jobs: its experiment's (one node)."""
    return dataclasses.replace(PREDICTIONS[wildcards.name][0].launch, nodes=1)


def dataset_cfg(name):
    return config["datasets"][name]


def datasets_of(domain):
    return [d for d, c in config["datasets"].items() if c["domain"] == domain]


def one_of(names):
    """A wildcard regex matching exactly these names (or nothing)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def runs_of(domain):
    return [r for r in RUNS.values() if r.domain == domain]


def is_synthetic(name):
    return "synthetic" in dataset_cfg(name)["source"]


def stage_patterns(name):
    ds = dataset_cfg(name)
    return ds["source"].get("patterns", ["*.root"] if ds["domain"] == "jets" else ["*"])


def local_source_files(name):
    """The files of a local source.path (none for a URL, a file list or generated data)."""
    path = dataset_cfg(name)["source"].get("path")
    if not path or "://" in path:
        return []
    try:
        return list_sources(path, stage_patterns(name), f"datasets.{name}.source.path")[1]
    except VoxjetError as e:
        fail_before_any_job(f"config key 'datasets.{name}.source.path': {e}")


def check_first_source_files(jets):
    """The first local ROOT file of each jets dataset holds the tree and every branch its
    config reads: a misnamed branch or tree stops the dry run, not a shard job hours later."""
    for name, data in jets.items():
        files = [f for f in local_source_files(name) if f.relpath.endswith(".root")]
        if files and data.on_bad_file == "fail":  # with skip, that one file may be the bad one
            try:
                check_source_file(files[0].url.removeprefix("file://"), data, name)
            except VoxjetError as e:
                fail_before_any_job(f"config key 'datasets.{name}' (checked on its first file): {e}")


def stage_input(wildcards):
    """Generated datasets come from their synth rule; a file list is an input (editing it
    restages); a local source.path's files are inputs, so a changed file restages (the stage
    copies only what changed)."""
    source = dataset_cfg(wildcards.dataset)["source"]
    if is_synthetic(wildcards.dataset):
        return f"resources/synthetic/{wildcards.dataset}"
    if "file_list" in source:
        return source["file_list"]
    files = [f.url.removeprefix("file://") for f in local_source_files(wildcards.dataset)]
    # a relative source.path stays relative: the workflow folder can move without restaging
    return files if os.path.isabs(source["path"]) else [os.path.relpath(f) for f in files]


def synthetic_source(wildcards):
    """The generated folder a synthetic dataset stages from (its synth rule's output)."""
    return [f"resources/synthetic/{wildcards.dataset}"] if is_synthetic(wildcards.dataset) else []


def source_state(wildcards):
    """Size and modification time of each local source file: a file replaced by one with an
    older time (where Snakemake's mtime check looks away) still restages."""
    files = local_source_files(wildcards.dataset)
    blob = json.dumps([(f.relpath, f.size, f.stamp) for f in files])
    return hashlib.sha256(blob.encode()).hexdigest()[:16] if files else ""


def staged_manifest(wildcards):
    """The dataset's manifest as an input whose time does not matter (its content does:
    manifest_digest); after the stage, a checkpoint, has run, Snakemake asks again."""
    path = rules.stage.output[0].format(dataset=wildcards.dataset)
    try:
        path = checkpoints.stage.get(dataset=wildcards.dataset).output[0]
    except IncompleteCheckpointException:
        pass  # not staged yet: the jobs wait for the stage and are judged again after it
    return ancient(path)


def manifest_digest(wildcards):
    """A params function: the digest of the staged files' checksums and entries (what the
    manifest says of their content), so that a changed source reruns what reads it."""
    return staged_digest(rules.stage.output[0].format(dataset=wildcards.dataset))


def stage_source(wildcards):
    """The stage command's source arguments, shell-quoted."""
    source = dataset_cfg(wildcards.dataset)["source"]
    if is_synthetic(wildcards.dataset):
        return f"--source resources/synthetic/{wildcards.dataset}"
    if "file_list" in source:
        return f"--file-list {shlex.quote(source['file_list'])}"
    return f"--source {shlex.quote(source['path'])}"


def stage_options(wildcards):
    """Patterns, checksum manifest and (for ROOT) the tree whose entries the manifest records."""
    ds = dataset_cfg(wildcards.dataset)
    opts = ["--pattern", *stage_patterns(wildcards.dataset)]
    if ds["source"].get("checksums"):
        opts += ["--checksums", ds["source"]["checksums"]]
    if ds["domain"] == "jets":
        # the tree a weaver config names (its treename), else the section's
        data = JETS[wildcards.dataset]
        key = (f"the treename of weaver_config {data.weaver_config}" if data.weaver_config
               else f"datasets.{wildcards.dataset}.jets.tree")  # fmt: skip
        opts += ["--tree", data.tree, "--tree-key", key, "--on-bad-file", ds["jets"]["on_bad_file"]]
        opts += ["--on-duplicate", ds["source"]["on_duplicate"]]
    else:  # identical label files are common (empty masks); the planning compares cases
        opts += ["--on-duplicate", "ignore"]
    return " ".join(f"'{o}'" for o in opts)


def synth_args(wildcards):
    s = dataset_cfg(wildcards.dataset)["source"]["synthetic"]
    return " ".join(f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                    for k, v in s.items())


def data_config(section):
    """The dataset's jets/volumes section as JSON for the CLI (a change reruns the stage); a
    jets section's weaver_config is read into it, so a change of that file's content does too."""

    def resolved(wildcards):
        if section == "jets":
            return json_param(JETS[wildcards.dataset].record())
        return json_param(dataset_cfg(wildcards.dataset)[section])

    return resolved


def prepared(name):
    """The folder or URL of a dataset given as already-prepared shards/cases (else None)."""
    return dataset_cfg(name)["source"].get("prepared")


# the configuration whose spacing each folder of case files under results/<dataset>/ holds
CONFIGURATION_OF_CASES = {folder: c for c, folder in CASE_FOLDERS.items()}


def data_location(wildcards):
    """Where a run's jobs (or find_best, over the dataset's first fold run) read its data."""
    run = RUNS[wildcards.run] if hasattr(wildcards, "run") else fold_runs(wildcards.dataset)[0]
    return run_data_location(run, dataset_cfg(wildcards.dataset))


def data_input(rule_output):
    """The prepared-data input of train/evaluate: the workflow's own output, or nothing when
    the dataset is read from source.prepared (a URL is not a file Snakemake can track)."""
    return lambda wildcards: [] if prepared(wildcards.dataset) else [rule_output]


def seg_data_input(wildcards):
    """The gathered case files a segmentation job reads (data_input for volumes: the folder
    follows the run's configuration)."""
    if prepared(wildcards.dataset):
        return []
    return [f"{data_location(wildcards)}/cases.json"]


def read_options(wildcards):
    """The dataset's `read:` section as JSON for --read."""
    return json_param(dataset_cfg(wildcards.dataset)["read"])


def shard_parts(wildcards):
    """The scatter jobs' part folders of a jets dataset (jets.shard_jobs of them)."""
    n = dataset_cfg(wildcards.dataset)["jets"]["shard_jobs"]
    return [f"results/{wildcards.dataset}/shards/part_{k:04d}" for k in range(n)]


def run_config(wildcards):
    """The run's resolved config as JSON for --run-config (recorded by its digest)."""
    return Digested(RUNS[wildcards.run].as_json())


def run_launch(wildcards):
    """The run's launch (voxjet.config.Launch); `gpus: auto` as the planner's allocation chose
    (read once plan_runs, a checkpoint, has run)."""
    launch = RUNS[wildcards.run].launch
    if not launch.auto:
        return launch
    try:
        plan = checkpoints.plan_runs.get().output.json
    except IncompleteCheckpointException:
        # while the DAG is built: the plan as it stands, or one GPU shown in a dry run before
        # there is one; either way the jobs wait for the plan (plan_for_auto) and Snakemake
        # re-evaluates them with its choice once plan_runs has run
        plan = rules.plan_runs.output.json
        if not os.path.exists(plan):
            return dataclasses.replace(launch, gpus=1)
    try:
        return launch.allocated(allocation_choice(plan), config["site"]["gpus_per_node"])
    except VoxjetError as e:
        fail_before_any_job(str(e))


def plan_for_auto(wildcards):
    """A run whose GPUs the planner chooses waits for the plan (the DAG is re-evaluated then)."""
    if not RUNS[wildcards.run].launch.auto:
        return []
    return [checkpoints.plan_runs.get().output.json]


def run_evaluate(wildcards):
    return config["experiments"][RUNS[wildcards.run].experiment]["evaluate"]


def run_dir(*inside):
    """A params function: the run's folder (voxjet.config.Run.run_dir), or one inside it."""
    return lambda wildcards: os.path.join(RUNS[wildcards.run].run_dir, *inside)


def launch_args(wildcards):
    """`voxjet launch` options of the run's job: GPUs (or CPU processes), nodes, stop margin."""
    return run_launch(wildcards).args()


SITE = SlurmSite.of(config)


def launch_resources(launch_of):
    """The resources of a job on a launch (`launch_of(wildcards)`), one function a resource
    (None: not asked for): the one resources block of every training, evaluation, validation
    and prediction rule."""
    return {k: (lambda wildcards, k=k: launch_of(wildcards).resources(SITE)[k])
            for k in RESOURCE_KEYS}  # fmt: skip


def site_resources(gpus=0):
    """Partition, account and GPUs of a job that is no run's (CPU unless `gpus`)."""
    return {k: v for k, v in SITE.resources(gpus).items() if v is not None}


CPU_RESOURCES = site_resources()
RUN_RESOURCES = launch_resources(run_launch)
PREDICT_RESOURCES = launch_resources(predict_launch)


def run_output(rule_output, run):
    """A rule's output pattern filled in for a run."""
    return rule_output.format(dataset=run.dataset, run=run.run_id)


def eval_targets(domain=None):
    """Every trained run's evaluation (scaling runs are only timed, never evaluated)."""
    return [run_output(rules.evaluate_jets.output.metrics if r.domain == "jets" else
                       rules.evaluate_seg.output.metrics, r) for r in RUNS.values()
            if r.role == "train" and (domain is None or r.domain == domain)]


_case_ids = {}


def case_ids(name):
    """The training cases of a volumes dataset, known at the dry run: the generator's, or
    dataset.json's at the source."""
    if name not in _case_ids:
        source = dataset_cfg(name)["source"]
        try:
            if "synthetic" in source:
                from voxjet.volumes.synth import ToyVolumesConfig
                from voxjet.volumes.synth import case_ids as toy_ids

                s = source["synthetic"]
                _case_ids[name] = toy_ids(ToyVolumesConfig(s["train_cases"], s["test_cases"]))
            elif "path" in source:
                from voxjet.volumes.preprocess import dataset_case_ids

                _case_ids[name] = dataset_case_ids(source["path"])
            else:
                raise VoxjetError(
                    "a volumes dataset is staged from source.path (a folder or URL with its "
                    "dataset.json) or given as source.prepared; a file list flattens the "
                    "imagesTr/labelsTr layout"
                )
        except VoxjetError as e:
            fail_before_any_job(f"config key 'datasets.{name}.source': {e}")
    return _case_ids[name]


def case_files(wildcards):
    """One preprocessed file a case (a bad case skipped by on_bad_case: skip gets a file that
    says so)."""
    return [f"results/{wildcards.dataset}/{wildcards.cases}/{c}.h5"
            for c in case_ids(wildcards.dataset)]  # fmt: skip


def fold_runs(dataset=None):
    """Runs trained as a fold of a cross-validation (`folds:`), of one dataset or all."""
    return config_fold_runs(RUNS, dataset)


def previous_runs(run):
    """A 3d_cascade_fullres run's 3d_lowres fold runs (one a fold), or none."""
    return config_previous_runs(run, RUNS, config["experiments"])


def previous_inputs(test):
    """Input function: the lowres folds' validations a cascade run reads (all folds), and for
    its test evaluation the test predictions of the lowres fold of the same number."""

    def inputs(wildcards):
        run = RUNS[wildcards.run]
        lows = previous_runs(run)
        out = [run_output(rules.validate_seg.output.metrics, r) for r in lows]
        if test:
            out += [run_output(rules.evaluate_seg.output.metrics, r) for r in lows
                    if r.fold == run.fold]  # fmt: skip
        return out

    return inputs


def previous_args(test):
    """Params function: previous_inputs as the evaluate-seg / train-seg options (the lowres
    folds' validation folders, and the folder of the test predictions)."""

    def args(wildcards):
        run = RUNS[wildcards.run]
        lows = previous_runs(run)
        if not lows:
            return ""
        val = [os.path.dirname(run_output(rules.validate_seg.output.metrics, r)) for r in lows]
        pred = [os.path.join(os.path.dirname(run_output(rules.evaluate_seg.output.metrics, r)),
                             "predictions") for r in lows if test and r.fold == run.fold]  # fmt: skip
        return " ".join(["--previous-validations", *val]
                        + (["--previous-predictions", *pred] if pred else []))  # fmt: skip

    return args


def best_targets():
    """Each volumes dataset with cross-validated experiments: its best-configuration choice."""
    return sorted({f"results/{r.dataset}/best/choice.json" for r in fold_runs()})


def best_inputs(wildcards):
    """The validation metrics of every fold run of the dataset (the probabilities beside)."""
    return [run_output(rules.validate_seg.output.metrics, r) for r in fold_runs(wildcards.dataset)]


def best_configs(wildcards):
    """find-best's --configs: each candidate's fold validation folders and models."""
    out = {}
    for r in fold_runs(wildcards.dataset):
        c = out.setdefault(r.candidate, {"validations": [], "models": []})
        c["validations"].append(os.path.dirname(run_output(rules.validate_seg.output.metrics, r)))
        c["models"].append(run_output(rules.train_seg.output.model, r))
    return json_param(out)


def train_logs():
    return [run_output(rules.train_jets.output.metrics if r.domain == "jets" else
                       rules.train_seg.output.metrics, r) for r in RUNS.values()]  # fmt: skip


def aggregate_runs():
    """What the aggregate step needs to know about every run (list_runs writes it to a file)."""
    return DigestedList(dataclasses.asdict(i) for i in run_infos(RUNS.values()))


def plan_inputs():
    """The prepared data of every dataset a run trains on (the planner profiles real batches)."""
    out = set()
    for r in RUNS.values():
        if not prepared(r.dataset):
            if r.domain == "jets":
                out.add(rules.index_jets.output[0].format(dataset=r.dataset))
            else:
                out.add(rules.gather_cases.output[0].format(dataset=r.dataset,
                                                             cases=r.cases_folder))  # fmt: skip
    return sorted(out)


def plan_run_list():
    """What the planner needs of every run (voxjet.config.planner_runs)."""
    return DigestedList(planner_runs(RUNS, config["datasets"]))


def plan_threads():
    """The most threads any run's process trains with (voxjet.config.planner_threads)."""
    return planner_threads(RUNS)


def plan_gpus():
    """GPUs the planner's job holds (voxjet.config.planner_gpus)."""
    return planner_gpus(RUNS, config["site"]["gpus_per_node"])
