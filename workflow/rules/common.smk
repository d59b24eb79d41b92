# Input, params and resources functions of the rules: each passes its job's wildcards to the
# run graph (voxjet.workflow.graph), where what they decide lives and is tested.
from snakemake.settings.types import DeploymentMethod

from voxjet.config import Launch
from voxjet.workflow import paths
from voxjet.workflow.conda_env import rule_env
from voxjet.workflow.graph import CONFIGURATION_OF_CASES, one_of, resource_functions

ENV = rule_env(
    workflow.source_path("../../envs/voxjet.yaml"),
    workflow.basedir,
    DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method,
)


wildcard_constraints:
    dataset="[A-Za-z0-9_-]+",
    run="[A-Za-z0-9_.+-]+",


def runs_jobs():
    """Whether this invocation executes jobs (not a dry run, --touch, --dag or --summary)."""
    return workflow.executor_plugin is not None and not (workflow.dryrun or workflow.touch)


def ledgers(*made):
    """The state files (voxjet.io.ledger) of the rule-made inputs `made`: patterns with the
    rule's wildcards, or input functions."""

    def states(wildcards):
        found = [m(wildcards) if callable(m) else m for m in made]
        flat = [p for f in found for p in ([f] if isinstance(f, str) else f)]
        return G.states(flat, dict(wildcards.items()), runs_jobs())

    return states


def stage_sources(wildcards):
    """The stage's source files; a local source's times do not matter (its content does)."""
    files = G.stage_input(wildcards.dataset)
    return [ancient(f) for f in files] if G.untimed_sources(wildcards.dataset) else files


def case_input(pattern):
    """An input of a case's preprocessing: `ancient` while the case file is current."""

    def path(wildcards):
        filled = paths.fill(pattern, dataset=wildcards.dataset)
        current = G.case_current(wildcards.dataset, wildcards.cases, wildcards.case)
        return ancient(filled) if current else filled

    return path


def data_section(section):
    return lambda wildcards: G.data_section(section, wildcards.dataset)


def seg_data_input(wildcards):
    return G.seg_data_input(wildcards.dataset, wildcards.get("run"))


def run_evaluate(key):
    return lambda wildcards: G.evaluate_settings(wildcards.run)[key]


def mirror_option(wildcards):
    return "--mirror" if G.evaluate_settings(wildcards.run)["mirror"] else ""


def prediction_launch(wildcards):
    return G.prediction_launch(wildcards.name)


RUN_RESOURCES = resource_functions(lambda wildcards: G.run_resources(wildcards.run))
PREDICT_RESOURCES = resource_functions(
    lambda wildcards: G.prediction_launch(wildcards.name).resources(G.site)
)


def of_dataset(method, *args):
    """A function of the wildcards: the graph's `method` for the job's dataset."""
    return lambda wildcards: method(wildcards.dataset, *args)


def of_run(method, *args):
    """A function of the wildcards: the graph's `method` for the job's run."""
    return lambda wildcards: method(wildcards.run, *args)
