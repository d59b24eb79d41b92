"""What SLURM gets for each job of a dry run: the jobs a `snakemake -n -p` listing shows, and the
sbatch options snakemake-executor-plugin-slurm's own command construction makes of them."""

from __future__ import annotations

import re
import shlex
from types import SimpleNamespace

from fake_slurm import options
from snakemake_executor_plugin_slurm.submit_string import get_submit_command
from snakemake_executor_plugin_slurm.utils import set_gres_string


class _Resources(dict):
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(key) from e


def _value(text: str):
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def dry_jobs(stdout: str) -> list[dict]:
    """Each job of a `snakemake -n -p` listing: rule, wildcards, threads, resources, command."""
    jobs, job = [], None
    for line in stdout.splitlines():
        s = line.strip()
        m = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):$", s)
        if m:
            job = {"rule": m[1], "threads": 1, "resources": {}, "wildcards": "", "shell": ""}
            jobs.append(job)
        elif job is None:
            continue
        elif s.startswith("threads:"):
            job["threads"] = int(s.split(":", 1)[1])
        elif s.startswith("wildcards:"):
            job["wildcards"] = s.split(":", 1)[1].strip()
        elif s.startswith("resources:"):
            for item in s.split(":", 1)[1].split(","):
                k, _, v = item.strip().partition("=")
                if v and "<TBD>" not in v:
                    job["resources"][k] = _value(v)
        elif s.startswith("Shell command:"):
            job["shell"] = s.split(":", 1)[1].strip()
    return [j for j in jobs if j["rule"] != "all"]


def sbatch_of(job: dict) -> dict[str, str]:
    """The sbatch options the plugin's command construction gives this job."""
    res = _Resources(job["resources"])
    fake = SimpleNamespace(resources=res, threads=job["threads"], name=job["rule"])
    params = {"run_uuid": "u", "slurm_logfile": "l/%j.log", "comment_str": f"rule_{job['rule']}",
              "account": f" -A {res['slurm_account']}" if res.get("slurm_account") else "",
              "partition": f" -p {res['slurm_partition']}" if res.get("slurm_partition") else "",
              "workdir": "."}  # fmt: skip
    call = get_submit_command(fake, params) + set_gres_string(fake)
    return options(shlex.split(call)[1:])  # read as the fake sbatch reads what it is given


def command_threads(job: dict) -> int | None:
    m = re.search(r"--threads (\d+)", job["shell"])
    return int(m[1]) if m else None
