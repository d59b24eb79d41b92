# voxjet: stage → shard/preprocess → train → evaluate → aggregate, for jets (ROOT) and
# volumes (NIfTI). Logic lives in the `voxjet` package; rules call its CLI.
import sys

from snakemake.utils import min_version, validate

from voxjet.failures import failure_summary
from voxjet.schema import schema_file

min_version("9.0")


# The demo's config, unless you give yours: `--configfile my.yaml` stands alone (merged into the
# demo's, it would add the demo's datasets and runs to yours and its settings to experiments of
# the same name); `--config key=value` alone edits the demo.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# the schema voxjet ships (config/schema.yaml links to it): the workflow and the package agree
JETS = check_config_or_fail(config)
validate(config, str(schema_file()))
check_first_source_files(JETS)
RUNS = expand_runs_or_fail(config)
PREDICTIONS = prediction_runs_or_fail(config, RUNS)


include: "workflow/rules/synth.smk"
include: "workflow/rules/stage.smk"
include: "workflow/rules/shard.smk"
include: "workflow/rules/preprocess.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/predict.smk"


onerror:
    # each failed job's voxjet message, last on the console (below logs and tracebacks)
    for line in failure_summary(log):
        print(line, file=sys.stderr)


rule all:
    input:
        rules.aggregate.output,
        predict_targets(),
        best_targets(),
    default_target: True
