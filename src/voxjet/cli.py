"""The `voxjet` command: the steps of the workflow, each a subcommand its Snakemake rule calls
(and that can be run by hand), and predict and export for trained models."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from voxjet import __version__
from voxjet.config import from_dict, parse_json_arg
from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path


def _synth_jets(a: argparse.Namespace) -> None:
    from voxjet.jets.synth import ToyJetsConfig

    cfg = ToyJetsConfig(
        classes=a.classes,
        files_per_class=a.files_per_class,
        jets_per_file=a.jets_per_file,
        seed=a.seed,
        detector=a.detector,
    )
    if a.generator not in ("pythia", "toy"):
        raise VoxjetError(f"generator {a.generator!r}: use 'pythia' or 'toy'")
    from voxjet.jets.pythia import generate_dataset as pythia_dataset
    from voxjet.jets.pythia import missing
    from voxjet.jets.synth import generate_dataset

    why = missing() if a.generator == "pythia" else None
    if why:  # the demo still runs where no pythia8mc wheel exists (aarch64, CPython 3.14)
        print(f"synth-jets: {why}. Generating the jets with the toy generator instead.",
              file=sys.stderr)  # fmt: skip
    # the whole folder appears at once: a killed job leaves none that passes for complete
    with atomic_path(a.out, directory=True) as tmp:
        if a.generator == "pythia" and not why:
            pythia_dataset(tmp, cfg, workers=a.workers)
        else:
            generate_dataset(tmp, cfg)


def _synth_volumes(a: argparse.Namespace) -> None:
    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset

    with atomic_path(a.out, directory=True) as tmp:  # all cases or none
        generate_dataset(
            tmp, ToyVolumesConfig(train_cases=a.train_cases, test_cases=a.test_cases, seed=a.seed)
        )


def _stage(a: argparse.Namespace) -> None:
    from voxjet.stage.transfer import load_expected, stage

    if not a.source and not a.file_list:
        raise VoxjetError("stage: give --source or --file-list")
    m = stage(
        a.source,
        a.dest,
        a.manifest,
        patterns=a.pattern,
        expected=load_expected(a.checksums),
        tree=a.tree,
        workers=a.workers,
        retries=a.retries,
        file_list=a.file_list,
        on_bad_file=a.on_bad_file,
        on_duplicate=a.on_duplicate,
        tree_key=a.tree_key,
    )
    print(f"staged {len(m['files'])} files into {a.dest}", file=sys.stderr)


def _verify_sources(a: argparse.Namespace) -> None:
    from voxjet.stage.verify import verify_sources

    verify_sources(a.source, a.dest, a.pattern, a.out)


def _shard_jets(a: argparse.Namespace) -> None:
    from voxjet.jets.data_config import JetDataConfig
    from voxjet.jets.shard import shard_jets, shard_part

    cfg = JetDataConfig.from_record(parse_json_arg(a.config, "--config"), "--config")
    if a.part is None:
        out = shard_jets(a.manifest, a.out, cfg)
    else:
        out = shard_part(a.manifest, a.out, cfg, a.part, cfg.shard_jobs)
    print(json.dumps({k: v["jets"] for k, v in out["splits"].items()}), file=sys.stderr)


def _index_shards(a: argparse.Namespace) -> None:
    from voxjet.jets.data_config import JetDataConfig
    from voxjet.jets.shard import index_shards

    cfg = JetDataConfig.from_record(parse_json_arg(a.config, "--config"), "--config")
    index = index_shards(a.parts, a.out, cfg)
    print(json.dumps({k: v["jets"] for k, v in index["splits"].items()}), file=sys.stderr)


def _preprocess(a: argparse.Namespace) -> None:
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset

    cfg = from_dict(VolumePrepConfig, parse_json_arg(a.config, "--config"), "volumes config")
    plan = preprocess_dataset(a.manifest, a.out, cfg)
    print(json.dumps({"target_spacing": plan.target_spacing, "patch_size": plan.patch_size}),
          file=sys.stderr)  # fmt: skip


def _plan_volumes(a: argparse.Namespace) -> None:
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.plan.planning import plan_volumes

    cfg = from_dict(VolumePrepConfig, parse_json_arg(a.config, "--config"), "volumes config")
    plan = plan_volumes(a.manifest, a.out, cfg, a.on_duplicate)
    print(json.dumps({"target_spacing": plan.target_spacing, "patch_size": plan.patch_size}),
          file=sys.stderr)  # fmt: skip


def _preprocess_case(a: argparse.Namespace) -> None:
    from voxjet.volumes.preprocessing.preprocess import preprocess_one

    summary = preprocess_one(a.manifest, a.plan, a.case, a.out, a.configuration, a.made_from)
    print(json.dumps(summary), file=sys.stderr)


def _gather_cases(a: argparse.Namespace) -> None:
    from voxjet.volumes.preprocessing.preprocess import gather_cases

    cases = gather_cases(a.plan, a.cases, a.configuration)
    print(f"{len(cases)} cases ready in {a.cases}", file=sys.stderr)


READ_HELP = "JSON (or @file): the dataset's read: section, for data at an fsspec URL"


def _read(a: argparse.Namespace) -> dict:
    return parse_json_arg(a.read, "--read")


def _train_jets(a: argparse.Namespace) -> None:
    from voxjet.jets.train import run

    run(a.shards, parse_json_arg(a.run_config, "--run-config"), a.out, _read(a))


def _train_seg(a: argparse.Namespace) -> None:
    from voxjet.volumes.training.train import run

    run(a.cases, parse_json_arg(a.run_config, "--run-config"), a.out, _read(a), _previous(a))


def _previous(a: argparse.Namespace) -> dict[str, list[str]] | None:
    """A cascade's previous stage: its folds' validation folders and test prediction folders."""
    if not a.previous_validations:
        return None
    return {"validations": a.previous_validations, "predictions": a.previous_predictions}


def _evaluate_jets(a: argparse.Namespace) -> None:
    from voxjet.jets.evaluate import evaluate

    evaluate(a.shards, a.model, a.out, _read(a))


def _evaluate_seg(a: argparse.Namespace) -> None:
    from voxjet.volumes.evaluation.evaluate import evaluate

    m = evaluate(a.cases, a.model, a.out, overlap=a.overlap, mirror=a.mirror, read=_read(a),
                 split=a.split, probabilities=a.probabilities,
                 previous=_previous(a))  # fmt: skip
    if m:  # the main process's summary
        print(f"{a.split} mean Dice {m['dice_mean']:.4f}, HD95 {m['hd95_mean']:.3g} mm",
              file=sys.stderr)  # fmt: skip


def _find_best(a: argparse.Namespace) -> None:
    from voxjet.volumes.evaluation.find_best import find_best

    configs = parse_json_arg(a.configs, "--configs")
    choice = find_best(a.cases, {n: c["validations"] for n, c in configs.items()}, a.out,
                       models={n: c["models"] for n, c in configs.items()})  # fmt: skip
    post = choice["postprocessing"]
    print(f"best: {' + '.join(choice['configurations'])}, validation mean Dice "
          f"{choice['dice_mean']:.4f}, {post['dice_mean_after']:.4f} after post-processing",
          file=sys.stderr)  # fmt: skip


def _predict(a: argparse.Namespace) -> None:
    from voxjet.predict import run_predict

    run_predict(a.model, a.input, a.out, a.observers, a.step_size, a.batch_size, a.overlap,
                a.mirror, a.probabilities, tree=a.tree, choice=a.choice,
                previous_models=a.previous_model)  # fmt: skip


def _export(a: argparse.Namespace) -> None:
    from voxjet.export import export_model

    export_model(a.model, a.format, a.out)


def _plan_runs(a: argparse.Namespace) -> None:
    from voxjet.planner.plan import Site, plan_runs

    site = from_dict(Site, parse_json_arg(a.site, "--site"), "site")
    out = plan_runs(parse_json_arg(a.runs, "--runs"), site, a.out)
    print(f"{len(out['runs'])} runs planned into {a.out}/runs.md", file=sys.stderr)


def _aggregate(a: argparse.Namespace) -> None:
    from voxjet.report.aggregate import aggregate
    from voxjet.report.runs import RunInfo, runs_from_config

    if a.runs:
        runs = [from_dict(RunInfo, r, "--runs entry") for r in parse_json_arg(a.runs, "--runs")]
    elif a.from_config:
        runs = runs_from_config(a.from_config, a.schema, a.results)
        if not Path(a.results).is_dir():
            raise VoxjetError(f"no results folder {a.results} (from {a.from_config}'s runs); "
                              "give the folder the workflow wrote: --results DIR")  # fmt: skip
        if a.benchmarks is None and Path(a.results, "benchmarks").is_dir():
            a.benchmarks = str(Path(a.results, "benchmarks"))
    else:
        raise VoxjetError("aggregate: give --runs (what the workflow passes) or --from-config")
    out = aggregate(runs, a.out, a.benchmarks, a.plan, a.best)
    if out["missing"]:
        print(f"runs without metrics (listed as missing): {out['missing']}", file=sys.stderr)


def _launch(a: argparse.Namespace) -> None:
    from voxjet.distributed.launch import run_torchrun

    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        raise VoxjetError("launch: give the voxjet command to run after --")
    code = run_torchrun(a.gpus, args, a.cpu_processes, a.nodes, a.stop_margin, a.threads)
    if code:
        sys.exit(code)


def _job(a: argparse.Namespace) -> None:
    from voxjet.job import run_job

    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        raise VoxjetError("job: give the voxjet command to run after --")
    code = run_job(a.log, a.outputs, lambda: main(args), job=a.log)
    if code:
        sys.exit(code)


# ---- the subcommands' arguments, one function each ------------------------------------------


def _args_synth_jets(s: argparse.ArgumentParser) -> None:
    s.add_argument("--out", required=True, help="folder to write the ROOT files into")
    s.add_argument("--generator", default="toy", help="pythia (Pythia 8 + FastJet) or toy")
    s.add_argument("--workers", type=int, default=1, help="files generated at once (pythia)")
    s.add_argument("--classes", nargs="+", default=["QCD", "Hbb", "Wqq", "Tbqq"],
                   help="JetClass processes to generate, one label branch each")  # fmt: skip
    s.add_argument("--files-per-class", type=int, default=2, help="ROOT files a class")
    s.add_argument("--jets-per-file", type=int, default=2000, help="jets a file")
    s.add_argument("--seed", type=int, default=1, help="random seed of the generator")
    s.add_argument("--detector", default="truth", choices=["truth", "smeared"],
                   help="pythia: exact tracks and the generator's vertices, or a tracker's "
                        "resolution and vertices found from displaced tracks")  # fmt: skip


def _args_synth_volumes(s: argparse.ArgumentParser) -> None:
    s.add_argument("--out", required=True, help="dataset folder to write (MSD layout)")
    s.add_argument("--train-cases", type=int, default=12, help="labelled cases (imagesTr/)")
    s.add_argument("--test-cases", type=int, default=2, help="unlabelled cases (imagesTs/)")
    s.add_argument("--seed", type=int, default=7, help="random seed of the generator")


def _args_relabel(s: argparse.ArgumentParser) -> None:
    s.add_argument("--dataset", required=True, help="the dataset folder (with dataset.json)")
    s.add_argument("--map", nargs="+", required=True, help="old:new label values, e.g. 3:2")
    s.add_argument("--out", required=True, help="the new dataset folder to write")


def _relabel(a: argparse.Namespace) -> None:
    from voxjet.volumes.dataset.relabel import parse_map, relabel

    out = relabel(a.dataset, parse_map(a.map), a.out)
    print(f"relabelled dataset written to {out}", file=sys.stderr)


def _args_stage(s: argparse.ArgumentParser) -> None:
    s.add_argument("--source", default=None, help="directory, glob or fsspec URL")
    s.add_argument("--file-list", default=None, help="text file: one path or URL a line")
    s.add_argument("--dest", required=True, help="folder on fast storage to copy into")
    s.add_argument("--manifest", required=True, help="manifest.json to write (files, checksums)")
    s.add_argument("--pattern", nargs="+", default=["*"], help="file name globs to stage")
    s.add_argument("--checksums", default=None, help="JSON {relative path: checksum} to verify")
    s.add_argument("--tree", default=None, help="ROOT tree whose entries the manifest records")
    s.add_argument("--tree-key", default="jets.tree",
                   help="where the tree was set (a config key, a weaver file)")  # fmt: skip
    s.add_argument("--on-bad-file", choices=["fail", "skip"], default="fail",
                   help="a ROOT file without the tree or unreadable: stop, or stage it marked "
                        "unreadable")  # fmt: skip
    s.add_argument("--on-duplicate", choices=["fail", "skip", "ignore"], default="fail",
                   help="two files with the same checksum: stop naming both, stage the "
                        "first only, or do not compare (volumes: their planning compares "
                        "cases)")  # fmt: skip
    s.add_argument("--workers", type=int, default=4, help="files copied at once")
    s.add_argument("--retries", type=int, default=3, help="tries a file before giving up")


def _args_submissions(s: argparse.ArgumentParser) -> None:
    s.epilog = ("Every other argument is snakemake's, a cluster profile among them: "
                "--workflow-profile workflow/profiles/slurm (or .../htcondor)")  # fmt: skip
    s.set_defaults(passes_on=True)


def _submissions(a: argparse.Namespace) -> None:
    from voxjet.workflow.submissions import preview

    for line in preview(a.unknown):
        print(line)


def _args_verify_sources(s: argparse.ArgumentParser) -> None:
    s.add_argument("--source", required=True, help="the local source folder or glob staged")
    s.add_argument("--dest", required=True, help="the staging folder (its ledger is updated)")
    s.add_argument("--pattern", nargs="+", default=["*"], help="file name globs staged")
    s.add_argument("--out", required=True, help="the summary (JSON) to write")


def _args_prepare(s: argparse.ArgumentParser, what: str) -> None:
    s.add_argument("--manifest", required=True, help="the stage's manifest.json")
    s.add_argument("--out", required=True, help=f"folder to write the {what} into")
    s.add_argument("--config", required=True, help="JSON (or @file): the dataset's section")


def _args_shard_jets(s: argparse.ArgumentParser) -> None:
    _args_prepare(s, "shards")
    s.add_argument("--part", type=int, default=None,
                   help="write only shard job PART of jets.shard_jobs (default: all, then "
                        "index)")  # fmt: skip


def _args_plan_volumes(s: argparse.ArgumentParser) -> None:
    _args_prepare(s, "plan")
    s.add_argument(
        "--on-duplicate",
        choices=["fail", "skip"],
        default="fail",
        help="two cases with identical images: stop naming both, or keep the first",
    )


def _args_index_shards(s: argparse.ArgumentParser) -> None:
    s.add_argument("--parts", nargs="+", required=True, help="the shard part folders")
    s.add_argument("--out", required=True, help="index.json to write")
    s.add_argument("--config", required=True, help="JSON (or @file): the dataset's section")


def _args_preprocess_case(s: argparse.ArgumentParser) -> None:
    s.add_argument("--manifest", required=True, help="the stage's manifest.json")
    s.add_argument("--plan", required=True, help="the plan-volumes folder")
    s.add_argument("--case", required=True, help="the case's id in dataset.json")
    s.add_argument("--configuration", default="3d_fullres",
                   help="the plan's configuration whose spacing the case is resampled to "
                        "(3d_lowres: the low-resolution stage's)")  # fmt: skip
    s.add_argument("--out", required=True, help="the case file (.h5) to write")
    s.add_argument("--made-from", default="",
                   help="what the workflow knows the case's sources as (recorded in the file: "
                        "the dry run takes a case as current by it)")  # fmt: skip


def _args_gather_cases(s: argparse.ArgumentParser) -> None:
    s.add_argument("--plan", required=True, help="the plan-volumes folder")
    s.add_argument("--cases", required=True, help="the folder of the preprocessed case files")
    s.add_argument("--configuration", default="3d_fullres",
                   help="the plan's configuration the case files were made for")  # fmt: skip


def _args_previous(s: argparse.ArgumentParser) -> None:
    s.add_argument("--previous-validations", nargs="*", default=[],
                   help="3d_cascade_fullres: the 3d_lowres folds' validation folders (the "
                        "segmentations of the cross-validation's cases)")  # fmt: skip
    s.add_argument("--previous-predictions", nargs="*", default=[],
                   help="3d_cascade_fullres: folders of the 3d_lowres run's test predictions "
                        "(<case>.nii.gz)")  # fmt: skip


def _args_train(data_arg: str, what: str):
    def add(s: argparse.ArgumentParser) -> None:
        s.add_argument(data_arg, required=True, help=f"the {what} folder (or URL)")
        s.add_argument("--run-config", required=True, help="JSON (or @file) resolved run config")
        s.add_argument("--out", required=True, help="the run's folder (model.pt, checkpoints)")
        s.add_argument("--read", default="{}", help=READ_HELP)
        if data_arg == "--cases":
            _args_previous(s)

    return add


def _args_evaluate(data_arg: str, what: str):
    def add(s: argparse.ArgumentParser) -> None:
        s.add_argument(data_arg, required=True, help=f"the {what} folder (or URL)")
        s.add_argument("--model", required=True, help="the run's model.pt")
        s.add_argument("--out", required=True, help="folder for metrics.json and the figures")
        s.add_argument("--read", default="{}", help=READ_HELP)
        if data_arg != "--cases":
            return
        s.add_argument("--overlap", type=float, default=0.5, help="sliding-window overlap")
        s.add_argument("--mirror", action="store_true", help="average all 8 axis flips")
        s.add_argument("--split", choices=["test", "val"], default="test",
                       help="val: the cases the run validated on (its fold's)")  # fmt: skip
        s.add_argument("--probabilities", action="store_true",
                       help="also write the probabilities (probabilities/<case>.npz)")  # fmt: skip
        _args_previous(s)

    return add


def _args_find_best(s: argparse.ArgumentParser) -> None:
    s.add_argument("--cases", required=True, help="the dataset's prepared cases")
    s.add_argument(
        "--configs",
        required=True,
        help='JSON: {name: {"validations": [dirs], "models": [model.pt]}}',
    )
    s.add_argument("--out", required=True, help="folder for choice.json and summary.md")


def _args_launch(s: argparse.ArgumentParser) -> None:
    s.add_argument("--gpus", type=int, required=True,
                   help="GPUs a node, one process each (checked: torch must see them); 0 runs "
                        "on the CPU")  # fmt: skip
    s.add_argument(
        "--cpu-processes",
        type=int,
        default=1,
        help="processes a node when --gpus is 0 (gloo backend)",
    )
    s.add_argument("--threads", type=int, default=None,
                   help="CPU threads of the job, shared by a node's processes (OMP_NUM_THREADS "
                        "each)")  # fmt: skip
    s.add_argument(
        "--nodes", type=int, default=1, help="nodes of the SLURM job: srun starts one torchrun each"
    )
    s.add_argument("--stop-margin", type=float, default=300.0,
                   help="inside a SLURM job: checkpoint and stop this many seconds before its "
                        "time limit")  # fmt: skip
    s.add_argument("args", nargs=argparse.REMAINDER, help="-- then the voxjet command")


def _args_job(s: argparse.ArgumentParser) -> None:
    s.add_argument("--log", required=True, help="the job's log file (locked while it runs)")
    s.add_argument("--outputs", nargs="+", required=True, help="the rule's output files")
    s.add_argument("args", nargs=argparse.REMAINDER, help="-- then the voxjet command")


def _args_predict(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", nargs="+", required=True,
                   help="a run's model.pt (its domain decides); several: the folds of a "
                        "cross-validation averaged, else the best by validation score")  # fmt: skip
    s.add_argument("--input", nargs="+", required=True,
                   help="files, folders, globs or URLs (jets: ROOT; volumes: NIfTI, imagesTs/, "
                        "a dataset)")  # fmt: skip
    s.add_argument("--out", required=True, help="folder for one output a file / case")
    s.add_argument("--observers", nargs="*", default=[], help="jets: branches copied through")
    s.add_argument("--previous-model", nargs="*", default=[],
                   help="volumes, a 3d_cascade_fullres model: the 3d_lowres experiment's fold "
                        "models, whose segmentation of each image it is fed")  # fmt: skip
    s.add_argument("--tree", default=None,
                   help="jets: the tree to score (default: the training files' tree, else the "
                        "one tree holding every branch the model needs)")  # fmt: skip
    s.add_argument("--step-size", type=int, default=50_000, help="jets: entries read at a time")
    s.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="jets: jets a forward pass (default: the run's training batch size)",
    )
    s.add_argument("--overlap", type=float, default=0.5, help="volumes: sliding-window overlap")
    s.add_argument("--mirror", action="store_true", help="volumes: average all 8 axis flips")
    s.add_argument("--choice", default=None,
                   help="volumes: a best-configuration choice.json (find-best): its models "
                        "averaged and its post-processing applied")  # fmt: skip
    s.add_argument(
        "--probabilities",
        action="store_true",
        help="volumes: also <case>_probabilities.nii.gz (one channel a class)",
    )


def _args_export(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", required=True, help="a run's model.pt")
    s.add_argument(
        "--format",
        required=True,
        choices=["onnx", "torchscript", "bundle"],
        help="taggers: onnx, torchscript; segmentation: torchscript, bundle",
    )
    s.add_argument("--out", required=True, help="folder to write into")


def _args_aggregate(s: argparse.ArgumentParser) -> None:
    s.add_argument("--runs", default=None, help="JSON (or @file) list of runs")
    s.add_argument("--from-config", default=None,
                   help="a workflow config: summarise its runs that have metrics, list the "
                        "rest")  # fmt: skip
    s.add_argument("--results", default="results",
                   help="with --from-config: the results folder the workflow wrote (its runs' "
                        "metrics and, unless --benchmarks, its benchmarks/)")  # fmt: skip
    s.add_argument("--schema", default=None,
                   help="the workflow's config schema (its defaults decide run names), for "
                        "--from-config; default: the one voxjet ships")  # fmt: skip
    s.add_argument("--benchmarks", default=None, help="folder of Snakemake benchmark files")
    s.add_argument("--plan", default=None,
                   help="the planner's runs.json, checked against the throughput the runs "
                        "measured")  # fmt: skip
    s.add_argument("--best", nargs="*", default=[],
                   help="the datasets' best-configuration choices "
                        "(results/<dataset>/best/choice.json), summarised")  # fmt: skip
    s.add_argument("--out", required=True, help="folder for metrics.csv, summary.md, figures/")


def _args_plan_runs(s: argparse.ArgumentParser) -> None:
    s.add_argument("--runs", required=True,
                   help="JSON (or @file) list of runs: run, experiment, domain, data, read, "
                        "config, processes, threads")  # fmt: skip
    s.add_argument("--site", default="{}", help="the config's site: section as JSON")
    s.add_argument("--out", required=True, help="folder for runs.json and runs.md")


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, what it does, its arguments and what runs it; internal ones
    (what the workflow's jobs call) work like any other but stay out of `voxjet --help`."""

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]
    internal: bool = False


COMMANDS = (
    Command(
        "synth-jets",
        "write demo jets (Pythia 8 or toy) as ROOT files in the JetClass schema",
        _args_synth_jets,
        _synth_jets,
    ),  # fmt: skip
    Command(
        "synth-volumes",
        "write a toy CT dataset in the MSD layout",
        _args_synth_volumes,
        _synth_volumes,
    ),  # fmt: skip
    Command(
        "relabel",
        "renumber a volumes dataset's label values into a new folder (to 0, 1, …, n−1)",
        _args_relabel,
        _relabel,
    ),  # fmt: skip
    Command("stage", "copy a dataset to fast storage, verified by checksum", _args_stage, _stage),
    Command(
        "verify-sources",
        "check staged copies against sources with new times (touched, copied, moved)",
        _args_verify_sources,
        _verify_sources,
        internal=True,
    ),  # fmt: skip
    Command(
        "shard-jets",
        "ROOT files to shuffled HDF5 shards (and their index)",
        _args_shard_jets,
        _shard_jets,
    ),  # fmt: skip
    Command(
        "index-shards",
        "gather shard parts into index.json",
        _args_index_shards,
        _index_shards,
        internal=True,
    ),  # fmt: skip
    Command(
        "preprocess-volumes",
        "fingerprint, plan and preprocess every case of a dataset",
        lambda s: _args_prepare(s, "case files"),
        _preprocess,
    ),  # fmt: skip
    Command(
        "plan-volumes",
        "check every case, fingerprint, plan and split a dataset",
        _args_plan_volumes,
        _plan_volumes,
    ),  # fmt: skip
    Command(
        "preprocess-case",
        "preprocess one case with the dataset's plan",
        _args_preprocess_case,
        _preprocess_case,
        internal=True,
    ),  # fmt: skip
    Command(
        "gather-cases",
        "put the plan beside the case files, list them",
        _args_gather_cases,
        _gather_cases,
        internal=True,
    ),  # fmt: skip
    Command(
        "train-jets",
        "train one run of a jet-tagging experiment on the shards "
        "(launch through torchrun for several processes)",
        _args_train("--shards", "shards"),
        _train_jets,
    ),  # fmt: skip
    Command(
        "train-seg",
        "train one run of a segmentation experiment on the case files, "
        "patch by patch (launch through torchrun for several processes)",
        _args_train("--cases", "case files"),
        _train_seg,
    ),  # fmt: skip
    Command(
        "evaluate-jets",
        "score a tagger on the shards' test split: accuracy, AUC, rejection, ROC curves",
        _args_evaluate("--shards", "shards"),
        _evaluate_jets,
    ),  # fmt: skip
    Command(
        "evaluate-seg",
        "segment the test cases (or a fold's validation cases) and score "
        "them on their original grids: Dice, HD95, overlays",
        _args_evaluate("--cases", "case files"),
        _evaluate_seg,
    ),  # fmt: skip
    Command(
        "find-best",
        "choose a dataset's best configuration or ensemble and "
        "post-processing from the folds' validation predictions",
        _args_find_best,
        _find_best,
    ),  # fmt: skip
    Command(
        "launch",
        "run a voxjet command under torchrun (one process a GPU)",
        _args_launch,
        _launch,
        internal=True,
    ),  # fmt: skip
    Command(
        "job",
        "run a voxjet command as a workflow job: a log of its own, its outputs' "
        "ledger entries marked until it succeeds (what every rule runs)",
        _args_job,
        _job,
        internal=True,
    ),  # fmt: skip
    Command(
        "predict",
        "apply a trained model to new ROOT files or NIfTI images",
        _args_predict,
        _predict,
    ),  # fmt: skip
    Command(
        "export", "a trained model as ONNX, TorchScript or a MONAI bundle", _args_export, _export
    ),  # fmt: skip
    Command(
        "aggregate",
        "tidy metrics.csv, summary.md and figures over all runs",
        _args_aggregate,
        _aggregate,
    ),  # fmt: skip
    Command(
        "submissions",
        "what the cluster gets for each job of a planned run (the sbatch command, or the "
        "HTCondor submit description), made with the executor plugins' own code",
        _args_submissions,
        _submissions,
    ),  # fmt: skip
    Command(
        "plan-runs",
        "profile each run on one device, predict its step time at each "
        "size, allocate a sweep to a GPU budget",
        _args_plan_runs,
        _plan_runs,
    ),  # fmt: skip
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subcommand a pipeline step (COMMANDS)."""
    p = argparse.ArgumentParser(prog="voxjet", description=__doc__)
    p.add_argument("--version", action="version", version=f"voxjet {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="<command>")
    for c in COMMANDS:
        # an internal command given no `help` is left out of the list (still callable)
        listed = {} if c.internal else {"help": c.help}
        s = sub.add_parser(c.name, description=c.help, **listed)
        c.arguments(s)
        s.set_defaults(func=c.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run a subcommand; user errors print one clear line and exit 2."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "passes_on", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.unknown = unknown
    from voxjet.distributed.lifeline import die_with_parent, under_launcher

    if under_launcher():  # a torchrun worker: never outlive the agent (a SIGKILLed job)
        die_with_parent()
    from voxjet.distributed import worker_errors

    try:
        args.func(args)
    except VoxjetError as e:
        message = f"voxjet {args.command}: error: {e}"
        print(message, file=sys.stderr)
        worker_errors.record(message)  # for the launcher's summary, when launched
        return 2
    except Exception as e:
        worker_errors.record(f"voxjet {args.command}: {type(e).__name__}: {e} (traceback above)")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
