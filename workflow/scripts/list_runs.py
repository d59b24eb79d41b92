"""Write the runs the aggregate step summarises to a file (Snakemake's `script:` hands the list
over in a file, never on a command line: thousands of runs pass Linux's argument limit)."""

import sys

from voxjet.job import script_job
from voxjet.report.runs import RunInfo, write_runs

sm = snakemake  # noqa: F821 - given to scripts by Snakemake
with script_job(sm.log[0], list(sm.output), "list-runs"):
    runs = [RunInfo(**r) for r in sm.params.runs]
    write_runs(sm.output[0], runs)
    print(f"{len(runs)} runs listed in {sm.output[0]}", file=sys.stderr)
