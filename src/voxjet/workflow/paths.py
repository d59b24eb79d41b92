"""Every file the workflow's rules make, as patterns over the rules' wildcards: the rules
declare their outputs with these, and the run graph (voxjet.workflow.graph) names its inputs
with them, so the two cannot disagree."""

from __future__ import annotations

SYNTHETIC = "resources/synthetic/{dataset}"
MANIFEST = "resources/{dataset}/manifest.json"
STAGED = "resources/{dataset}/data"
VERIFIED = "resources/{dataset}/verified.json"
SHARD_PART = "results/{dataset}/shards/part_{part}"
SHARD_INDEX = "results/{dataset}/shards/index.json"
VOLUME_PLAN = "results/{dataset}/plan"
CASE_FOLDER = "results/{dataset}/{cases}"
CASE = f"{CASE_FOLDER}/{{case}}.h5"
CASES = f"{CASE_FOLDER}/cases.json"
RUN = "results/{dataset}/runs/{run}"
MODEL = f"{RUN}/model.pt"
TRAIN_LOG = f"{RUN}/metrics.jsonl"
EVAL = f"{RUN}/eval"
EVAL_METRICS = f"{EVAL}/metrics.json"
VALIDATION = f"{RUN}/validation"
VALIDATION_METRICS = f"{VALIDATION}/metrics.json"
BEST = "results/{dataset}/best"
BEST_CHOICE = f"{BEST}/choice.json"
RUN_PLAN = "results/plan/runs.json"
RUN_PLAN_MD = "results/plan/runs.md"
SUMMARY = "results/summary"
RUN_LIST = f"{SUMMARY}/runs.json"
PREDICTION = "results/predict/{name}/part_{chunk}"
BENCHMARKS = "results/benchmarks"


def fill(pattern: str, **wildcards: object) -> str:
    """A pattern with its wildcards filled in."""
    return pattern.format(**wildcards)
