# voxjet: stage → shard/preprocess → train → evaluate → aggregate, for jets (ROOT) and
# volumes (NIfTI). Logic lives in the `voxjet` package; rules call its CLI.
import sys

from snakemake.utils import min_version, validate

from voxjet.failures import failure_summary
from voxjet.schema import schema_file
from voxjet.workflow.graph import build_or_exit

min_version("9.27")


# The demo's config, unless you give yours: `--configfile my.yaml` stands alone (merged into the
# demo's, it would add the demo's datasets and runs to yours and its settings to experiments of
# the same name); `--config key=value` alone edits the demo.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# the config checked (every problem named by key), validated against the schema voxjet ships
# (config/schema.yaml links to it; its defaults filled in), and turned into the run graph
G = build_or_exit(config, lambda c: validate(c, str(schema_file())))
for notice in G.notices():  # said at the dry run, not found later in a job's log
    print(notice, file=sys.stderr)


include: "workflow/rules/common.smk"
include: "workflow/rules/synth.smk"
include: "workflow/rules/stage.smk"
include: "workflow/rules/shard.smk"
include: "workflow/rules/preprocess.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/predict.smk"


onstart:
    # job arrays stall when a rule has more jobs than may be in flight (voxjet.workflow.graph)
    G.check_arrays(
        getattr(workflow.executor_settings, "array_jobs", None), workflow.resource_settings.nodes
    )


onerror:
    # each failed job's voxjet message, last on the console; voxjet's logger (the profiles'
    # `logger: [voxjet]`) says them itself, after Snakemake's last lines
    if "voxjet" not in workflow.output_settings.log_handler_settings:
        for line in failure_summary(log):
            print(line, file=sys.stderr)


rule all:
    input:
        rules.aggregate.output,
        G.prediction_targets(),
        G.best_targets(),
        G.verify_targets(),
    default_target: True
