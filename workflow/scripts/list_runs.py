"""Write the runs the aggregate step summarises to a file (Snakemake's `script:` hands the list
over in a file, never on a command line: thousands of runs pass Linux's argument limit)."""

import sys

from voxjet.report.aggregate import RunInfo, write_runs

sys.stderr = open(snakemake.log[0], "w")  # noqa: F821, SIM115 - snakemake is given to scripts
runs = [RunInfo(**r) for r in snakemake.params.runs]  # noqa: F821
write_runs(snakemake.output[0], runs)  # noqa: F821
print(f"{len(runs)} runs listed in {snakemake.output[0]}", file=sys.stderr)  # noqa: F821
