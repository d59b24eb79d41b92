# voxjet: stage → shard/preprocess → train → evaluate → aggregate, for jets (ROOT) and
# volumes (NIfTI). Logic lives in the `voxjet` package; rules call its CLI.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


JETS = check_config_or_fail(config, workflow.source_path("config/schema.yaml"))
validate(config, "config/schema.yaml")
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


rule all:
    input:
        rules.aggregate.output,
        predict_targets(),
        best_targets(),
    default_target: True
