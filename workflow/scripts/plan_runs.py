"""Profile and predict every run (voxjet.planner.plan); the runs come from Snakemake's params,
never a command line. Run as every rule's job is (voxjet.job): a log of its own, the outputs'
states marked until it succeeds."""

from voxjet.job import script_job
from voxjet.planner.plan import Site, plan_runs

sm = snakemake  # noqa: F821 - given to scripts by Snakemake
with script_job(sm.log[0], list(sm.output), "plan-runs"):
    # the job's time (minutes), shared by the profiles: one that cannot finish is named
    out = plan_runs(sm.params.runs, Site(**sm.params.site), sm.output.json.rsplit("/", 1)[0],
                    time_limit_s=60.0 * sm.resources.runtime)
    print(f"{len(out['runs'])} runs planned")
