"""`voxjet predict`: apply a trained model to new data — ROOT files for a tagger, NIfTI cases
for a segmentation model (the domain comes from the model). The inputs are shared out over the
job's processes (`voxjet launch`: one a GPU, or CPU processes): file by file for jets, case by
case for volumes; each output is written whole or not at all, so a rerun after a kill redoes
only what is missing."""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePosixPath

from voxjet.errors import VoxjetError
from voxjet.io.atomic import output_folder
from voxjet.io.overlap import refuse_overlap
from voxjet.stage.transfer import list_sources


def model_domain(model_path: str | os.PathLike) -> str:
    """ "jets" or "volumes", from what model.pt records."""
    from voxjet.distributed import checkpoint

    saved = checkpoint.load_file(model_path)
    cfg = saved.get("model_config", {})
    if "domain" in cfg:
        return cfg["domain"]
    return "volumes" if "in_channels" in cfg else "jets"


def jet_inputs(inputs: list[str], key: str = "--input") -> list[tuple[str, str]]:
    """(path or URL, output name) of every ROOT file the inputs name: files, folders, globs
    or URLs; output names must be unique (they land side by side). `key`: where the user gave
    them (a CLI option or a config key), for messages."""
    found: list[tuple[str, str]] = []
    for item in inputs:
        if item.lower().endswith(".parquet"):
            raise VoxjetError(
                f"{key} {item}: predict reads ROOT files (it writes each file's scores as a "
                "ROOT file of the same tree and entries); Parquet inputs are read by the shard "
                "stage only. Convert them back with uproot, or evaluate them as a dataset's "
                "test split (jets.split_files)"
            )
        if item.endswith(".root") and "://" not in item and Path(item).is_file():
            found.append((item, Path(item).name))
            continue
        _, files = list_sources(item, ["*.root"], key)
        found += [(f.url.removeprefix("file://"), PurePosixPath(f.relpath).name) for f in files]
    names = [n for _, n in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise VoxjetError(
            f"predict: several input files are named {dupes[:5]}; outputs are named after their "
            "inputs and land in one folder: predict them into separate --out folders"
        )
    return found


def choose_models(paths: list[str]) -> list[str]:
    """Of several runs' model.pt: all of them when they are the folds of one cross-validation
    (their predictions are averaged, as nnU-Net ensembles its folds), else the one with the
    highest validation score (a sweep's best)."""
    from voxjet.distributed import checkpoint

    if len(paths) == 1:
        return list(paths)
    saved = {p: checkpoint.load_file(p) for p in paths}
    folds = [s.get("settings", {}).get("fold") for s in saved.values()]
    if all(f is not None for f in folds):
        print(f"predict: averaging the {len(paths)} folds' models", file=sys.stderr)
        return list(paths)
    scores = {p: float(s.get("best_score", float("-inf"))) for p, s in saved.items()}
    best = max(scores, key=scores.get)
    print(f"predict: the best of {len(paths)} runs by validation score: {best} "
          f"({scores[best]:.4g})", file=sys.stderr)  # fmt: skip
    return [best]


def chosen_models(choice_path: str, given: list[str]) -> tuple[list[str], dict]:
    """The models and post-processing a best-configuration choice names (each must be among
    the models given to the job)."""
    import json

    try:
        choice = json.loads(Path(choice_path).read_text())
        models = [m for c in choice["configurations"] for m in choice["models"][c]]
        post = choice["postprocessing"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise VoxjetError(f"{choice_path}: not a best-configuration choice ({e}); rerun "
                          "find_best (snakemake -R find_best)") from e  # fmt: skip
    missing = [m for m in models if m not in given]
    if missing:
        raise VoxjetError(f"{choice_path}: names models this job was not given: {missing}; "
                          "rerun find_best for the current experiments")  # fmt: skip
    return models, post


def run_predict(
    model_path: str | list[str],
    inputs: list[str],
    out_dir: str,
    observers: list[str] = (),
    step_size: int = 50_000,
    batch_size: int | None = None,
    overlap: float = 0.5,
    mirror: bool = False,
    probabilities: bool = False,
    tree: str | None = None,
    choice: str | None = None,
    previous_models: list[str] = (),
) -> list[Path]:
    """Predict every input with this process's share; returns the outputs written here.
    `choice`: a dataset's best configuration (find-best's choice.json): its configurations'
    fold models averaged and its post-processing applied; `previous_models`: a cascade's
    3d_lowres fold models, whose segmentation it is fed."""
    from voxjet.distributed.runtime import init_runtime, shutdown

    refuse_overlap(out_dir, inputs, "predict", "--out")
    given = [model_path] if isinstance(model_path, str) else list(model_path)
    post = None
    if choice is not None:
        given, post = chosen_models(choice, given)
    models = given if choice is not None else choose_models(given)
    domain = model_domain(models[0])
    rt = init_runtime()
    try:
        with output_folder(out_dir) as out:
            if domain != "jets":
                from voxjet.volumes.inference.predict import run_volume_predict

                return run_volume_predict(models, inputs, out, rt, overlap, mirror, probabilities,
                                          postprocessing=post,
                                          previous_models=list(previous_models))  # fmt: skip
            from voxjet.jets.predict import predict_file
            from voxjet.jets.tagger import load_tagger

            if len(models) > 1:
                raise VoxjetError("predict: a tagger is applied one model at a time")
            files = jet_inputs(inputs, "--input")
            tagger = load_tagger(models[0], rt.device)
            written = []
            for path, name in files[rt.rank :: rt.world_size]:
                target = out / name
                predict_file(tagger, path, target, list(observers), step_size, batch_size, tree)
                written.append(target)
            print(f"predict: {len(written)} of {len(files)} files on rank {rt.rank}",
                  file=sys.stderr)  # fmt: skip
            return written
    finally:
        shutdown(rt)
