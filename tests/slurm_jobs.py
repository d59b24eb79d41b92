"""What SLURM gets for each job of a dry run, as the tests read it: the jobs a `snakemake -n -p`
listing shows and the sbatch options snakemake-executor-plugin-slurm's own command
construction makes of them (voxjet.workflow.submissions, what `voxjet submissions` prints)."""

from __future__ import annotations

import dataclasses
import re

from voxjet.workflow.submissions import DryJob, sbatch_options
from voxjet.workflow.submissions import dry_jobs as _dry_jobs


def dry_jobs(stdout: str) -> list[dict]:
    """Each job of a `snakemake -n -p` listing: rule, wildcards, threads, resources, command."""
    return [dataclasses.asdict(j) for j in _dry_jobs(stdout)]


def sbatch_of(job: dict) -> dict[str, str]:
    """The sbatch options the plugin's command construction gives this job."""
    return sbatch_options(DryJob(**job))


def command_threads(job: dict) -> int | None:
    m = re.search(r"--threads (\d+)", job["shell"])
    return int(m[1]) if m else None
