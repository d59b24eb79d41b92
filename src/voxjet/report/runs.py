"""The runs a summary covers, as the aggregate job reads them: where each run's outputs are and
what distinguishes it within its experiment (from the workflow's config, or a file of them)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from voxjet.config import expand_runs, with_defaults
from voxjet.config_file import read_config_file
from voxjet.io.atomic import write_json


@dataclass
class RunInfo:
    """Where a run's outputs are and what distinguishes it within its experiment."""

    dataset: str
    domain: str
    experiment: str
    run: str
    eval_metrics: str
    train_metrics: str
    params: dict[str, Any] = field(default_factory=dict)
    group: str = ""  # the run's name without its repeat (`_rep-<k>`): repeats share it
    role: str = "train"  # "scaling": a scaling study's run, timed and never evaluated

    def __post_init__(self) -> None:
        self.group = self.group or self.run


def run_infos(runs) -> list[RunInfo]:
    """RunInfo for each voxjet.config.Run, at the paths the workflow writes them to."""
    out = []
    for r in runs:
        repeat = r.params.get("repeat", 0)
        out.append(
            RunInfo(
                dataset=r.dataset,
                domain=r.domain,
                experiment=r.experiment,
                run=r.run_id,
                params={k: v for k, v in r.params.items() if k != "repeat"},
                eval_metrics=f"{r.run_dir}/eval/metrics.json",
                train_metrics=f"{r.run_dir}/metrics.jsonl",
                group=r.run_id.removesuffix(f"_rep-{repeat}") if repeat else r.run_id,
                role=r.role,
            )
        )
    return out


def write_runs(path: str | os.PathLike, runs: list[RunInfo]) -> None:
    """The runs to aggregate as a JSON file (what `voxjet aggregate --runs @file` reads: a
    command line holding thousands of runs would pass Linux's argument limit)."""
    write_json(Path(path), [asdict(r) for r in runs])


def runs_from_config(
    config_path: str | os.PathLike,
    schema_path: str | os.PathLike | None = None,
    results: str | os.PathLike = "results",
) -> list[RunInfo]:
    """Every run a workflow config defines (for summarising by hand after some runs failed:
    those are then listed as missing), named as the workflow names them, its outputs looked for
    under `results` (the workflow's results/ folder, wherever it now is)."""
    config = with_defaults(read_config_file(config_path), schema_path)
    runs = run_infos(expand_runs(config).values())
    if Path(results) != Path("results"):
        for r in runs:
            r.eval_metrics = str(Path(results, Path(r.eval_metrics).relative_to("results")))
            r.train_metrics = str(Path(results, Path(r.train_metrics).relative_to("results")))
    return runs
