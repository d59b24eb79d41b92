"""What a cluster gets for each job of a planned run, made with the executor plugins' own code
before any queue slot is spent: the `sbatch` command snakemake-executor-plugin-slurm builds
(`get_submit_command`, `set_gres_string`), or the submit description
snakemake-executor-plugin-htcondor hands the schedd (its `run_job`, with a schedd that keeps
the description instead of submitting it). The jobs come from a dry run's listing (`snakemake
-n -p`): each job's rule, wildcards, threads, resources and command as Snakemake prints them.
`voxjet submissions` prints them."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError


@dataclass
class DryJob:
    """One job of a dry run's listing."""

    rule: str
    wildcards: str = ""
    threads: int = 1
    resources: dict[str, Any] = field(default_factory=dict)
    shell: str = ""

    @property
    def name(self) -> str:
        """The rule's name (what the plugins call a job's name)."""
        return self.rule


def _value(text: str) -> int | str:
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def dry_jobs(listing: str) -> list[DryJob]:
    """Each job (the `all` target left out) of a `snakemake -n -p` listing."""
    jobs: list[DryJob] = []
    job = None
    for line in listing.splitlines():
        s = line.strip()
        m = re.fullmatch(r"(?:local)?(?:rule|checkpoint) (\w+):", s)
        if m:
            job = DryJob(m[1])
            jobs.append(job)
        elif job is None:
            continue
        elif s.startswith("threads:"):
            job.threads = int(s.split(":", 1)[1])
        elif s.startswith("wildcards:"):
            job.wildcards = s.split(":", 1)[1].strip()
        elif s.startswith("resources:"):
            for item in s.split(":", 1)[1].split(","):
                k, _, v = item.strip().partition("=")
                if v and "<TBD>" not in v:
                    job.resources[k] = _value(v)
        elif s.startswith("Shell command:"):
            job.shell = s.split(":", 1)[1].strip()
    return [j for j in jobs if j.rule != "all"]


class _Resources(dict):
    """A job's resources as the plugins read them (attributes and get)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(key) from e


def sbatch_command(job: DryJob) -> str:
    """The sbatch command snakemake-executor-plugin-slurm builds for the job (without the
    `--wrap` of the job's own command)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import get_job_wildcards, set_gres_string

    res = _Resources(job.resources)
    values = [w.split("=", 1)[1] for w in job.wildcards.split(", ") if "=" in w]
    fake = types.SimpleNamespace(resources=res, threads=job.threads, name=job.rule,
                                 wildcards=values, is_group=lambda: False)  # fmt: skip
    wildcards = get_job_wildcards(fake)
    params = {
        "run_uuid": "<run>",
        "slurm_logfile": f".snakemake/slurm_logs/rule_{job.rule}/{wildcards}/%j.log",
        "comment_str": f"rule_{job.rule}" + (f"_wildcards_{wildcards}" if wildcards else ""),
        "account": f" -A {res['slurm_account']}" if res.get("slurm_account") else "",
        "partition": f" -p {res['slurm_partition']}" if res.get("slurm_partition") else "",
        "workdir": ".",
    }
    return get_submit_command(fake, params) + set_gres_string(fake)


def sbatch_options(job: DryJob) -> dict[str, str]:
    """sbatch_command's options as a mapping (`--key=value`, `--key value`, `-k value`)."""
    argv = shlex.split(sbatch_command(job))[1:]
    short = {"-A": "--account", "-p": "--partition", "-t": "--time", "-D": "--chdir",
             "-C": "--constraint", "-N": "--nodes", "-n": "--ntasks", "-c": "--cpus-per-task",
             "-J": "--job-name", "-o": "--output"}  # fmt: skip
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if "=" in a and a.startswith("--"):
            key, value = a.split("=", 1)
            out[key] = value
        elif a in short and i + 1 < len(argv):
            out[short[a]] = argv[i + 1]
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out[a] = argv[i + 1]
            i += 1
        else:
            out[a] = ""
        i += 1
    return out


def htcondor_submit(job: DryJob, jobdir: str = ".snakemake/htcondor") -> dict[str, Any]:
    """The submit description snakemake-executor-plugin-htcondor makes for the job (a shared
    filesystem, as the voxjet profile declares), through the plugin's own `run_job`."""
    import warnings

    with warnings.catch_warnings():  # the bindings' note on a machine without HTCondor
        warnings.simplefilter("ignore", UserWarning)
        import snakemake_executor_plugin_htcondor as plugin

    executor = plugin.Executor.__new__(plugin.Executor)
    quiet = types.SimpleNamespace(debug=_quiet, info=_quiet, warning=_quiet, error=_quiet)
    executor.logger = quiet
    executor.jobDir = jobdir
    executor._unified_log_file = f"{jobdir}/snakemake-rules.log"
    executor.workflow = types.SimpleNamespace(
        storage_settings=types.SimpleNamespace(shared_fs_usage=True),
        executor_settings=types.SimpleNamespace(jobdir=jobdir, shared_fs_prefixes=None),
    )
    executor.shared_fs_prefixes = []
    executor.envvars = dict
    executor.format_job_exec = lambda j: f"{sys.executable} -m snakemake --target-jobs {j.rule}"
    executor.get_python_executable = lambda: sys.executable
    executor.report_job_submission = _quiet
    fake = types.SimpleNamespace(resources=_Resources(job.resources), threads=job.threads,
                                 name=job.rule, jobid=0, rule=job.rule)  # fmt: skip
    kept: dict[str, Any] = {}

    class Submit(dict):
        def issue_credentials(self) -> None:
            return None

    class Schedd:
        def submit(self, description: dict, count: int = 1) -> Any:
            kept.update(description)
            return types.SimpleNamespace(cluster=lambda: 0)

    real, plugin.htcondor = plugin.htcondor, types.SimpleNamespace(Submit=Submit, Schedd=Schedd)
    try:
        executor.run_job(fake)
    finally:
        plugin.htcondor = real
    return {k: v for k, v in kept.items()
            if k not in ("executable", "arguments", "log", "output", "error")}  # fmt: skip


def _quiet(*args: Any, **kwargs: Any) -> None:
    return None


def _profile_settings(args: list[str]) -> dict[str, Any]:
    """The workflow profile's settings a snakemake command line names (none: none)."""
    import yaml

    for i, a in enumerate(args):
        if a.startswith("--workflow-profile"):
            folder = a.split("=", 1)[1] if "=" in a else args[i + 1]
            path = Path(folder) / "config.yaml"
            if not path.is_file():
                raise VoxjetError(f"{path}: no such profile; name a folder of workflow/profiles")
            return yaml.safe_load(path.read_text()) or {}
    return {}


def preview(args: list[str]) -> list[str]:
    """For every job `snakemake ARGS` would run now (its dry run with those arguments), what
    the cluster of the profile gets: the sbatch command, or HTCondor's submit description."""
    settings = _profile_settings(args)
    executor = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--executor", "-e")),
                    settings.get("executor"))  # fmt: skip
    if executor not in ("slurm", "htcondor"):
        raise VoxjetError(
            "name a cluster profile: --workflow-profile workflow/profiles/slurm (or "
            f"workflow/profiles/htcondor); {executor or 'none'} submits nothing to a queue"
        )
    snakemake = Path(sys.executable).with_name("snakemake")
    r = subprocess.run([str(snakemake), "-n", "-p", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise VoxjetError(f"the dry run failed:\n{r.stderr.strip()[-3000:]}")
    jobs = dry_jobs(r.stdout)
    arrays = {x.strip() for x in str(settings.get("slurm-array-jobs", "")).split(",") if x}
    lines = []
    for job in jobs:
        lines.append(f"rule {job.rule}" + (f" ({job.wildcards})" if job.wildcards else "") + ":")
        if executor == "slurm":
            sbatch = sbatch_command(job)
            if job.rule in arrays or "all" in arrays:
                n = sum(j.rule == job.rule for j in jobs)
                sbatch += f"  # one task of a job array of the rule's {n} jobs"
            lines.append(f"  {sbatch}")
        else:
            lines += [f"  {k} = {v}" for k, v in htcondor_submit(job).items()]
    return lines
