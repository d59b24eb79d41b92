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


def model_domain(model_path: str | os.PathLike) -> str:
    """ "jets" or "volumes", from what model.pt records."""
    from voxjet.distributed import checkpoint

    saved = checkpoint.load_file(model_path)
    cfg = saved.get("model_config", {})
    if "domain" in cfg:
        return cfg["domain"]
    return "volumes" if "in_channels" in cfg else "jets"


def jet_inputs(inputs: list[str]) -> list[tuple[str, str]]:
    """(path or URL, output name) of every ROOT file the inputs name: files, folders, globs
    or URLs; output names must be unique (they land side by side)."""
    from voxjet.stage.transfer import list_sources

    found: list[tuple[str, str]] = []
    for item in inputs:
        if item.endswith(".root") and "://" not in item and Path(item).is_file():
            found.append((item, Path(item).name))
            continue
        _, files = list_sources(item, ["*.root"])
        found += [(f.url.removeprefix("file://"), PurePosixPath(f.relpath).name) for f in files]
    names = [n for _, n in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise VoxjetError(
            f"predict: several input files are named {dupes[:5]}; outputs are named after their "
            "inputs and land in one folder: predict them into separate --out folders"
        )
    return found


def best_model(paths: list[str]) -> str:
    """Of several runs' model.pt (a sweep), the one with the highest validation score."""
    from voxjet.distributed import checkpoint

    if len(paths) == 1:
        return paths[0]
    scores = {p: float(checkpoint.load_file(p).get("best_score", float("-inf"))) for p in paths}
    best = max(scores, key=scores.get)
    print(f"predict: the best of {len(paths)} runs by validation score: {best} "
          f"({scores[best]:.4g})", file=sys.stderr)  # fmt: skip
    return best


def run_predict(
    model_path: str | list[str],
    inputs: list[str],
    out_dir: str,
    observers: list[str] = (),
    step_size: int = 50_000,
    batch_size: int = 4096,
    overlap: float = 0.5,
    mirror: bool = False,
) -> list[Path]:
    """Predict every input with this process's share; returns the outputs written here."""
    from voxjet.distributed.runtime import init_runtime, shutdown

    model_path = best_model([model_path] if isinstance(model_path, str) else list(model_path))
    domain = model_domain(model_path)
    rt = init_runtime()
    try:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if domain != "jets":
            from voxjet.volumes.predict import run_volume_predict

            return run_volume_predict(model_path, inputs, out, rt, overlap, mirror)
        from voxjet.jets.predict import load_tagger, predict_file

        files = jet_inputs(inputs)
        tagger = load_tagger(model_path, rt.device)
        written = []
        for path, name in files[rt.rank :: rt.world_size]:
            target = out / name
            predict_file(tagger, path, target, list(observers), step_size, batch_size)
            written.append(target)
        print(f"predict: {len(written)} of {len(files)} files on rank {rt.rank}", file=sys.stderr)
        return written
    finally:
        shutdown(rt)
