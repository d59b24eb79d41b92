"""Profile and predict every run (voxjet.planner.plan); the runs come from Snakemake's params,
never a command line."""

import sys

from voxjet.planner.plan import Site, plan_runs

sys.stdout = sys.stderr = open(snakemake.log[0], "w")  # noqa: F821, SIM115
out = plan_runs(snakemake.params.runs, Site(**snakemake.params.site),  # noqa: F821
                snakemake.output.json.rsplit("/", 1)[0])  # noqa: F821
print(f"{len(out['runs'])} runs planned")
