"""Stand-ins for `sbatch`, `squeue`, `sacct`, `srun`, `scontrol`, `scancel`, `sacctmgr` and
`sinfo`: each records its arguments in $FAKE_SLURM_DIR/calls.jsonl and does what SLURM would,
on this machine. `sbatch` starts the batch script in the background (a job id, a state file,
an exit code); `srun` starts its tasks here, one a "node", with SLURM's task variables.

`install(bin_dir, state_dir)` writes the commands; tests put `bin_dir` first on PATH.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ("sbatch", "squeue", "sacct", "srun", "scontrol", "scancel", "sacctmgr", "sinfo")
ACCOUNT = "my_account"
NODE_NAMES = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")  # loopback: all this host


def install(bin_dir: Path, state_dir: Path) -> dict[str, str]:
    """Write the fake commands into `bin_dir`; returns the environment entries they need."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    for name in COMMANDS:
        script = bin_dir / name
        script.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(here)!r})\n"
            f"from fake_slurm import main\nmain({name!r}, sys.argv[1:])\n"
        )
        script.chmod(0o755)
    return {"FAKE_SLURM_DIR": str(state_dir)}


def calls(state_dir: Path, command: str | None = None) -> list[list[str]]:
    """Recorded argument lists, in order (of one command when given)."""
    path = state_dir / "calls.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["argv"] for r in rows if command is None or r["cmd"] == command]


def options(argv: list[str]) -> dict[str, str]:
    """`--key=value`, `--key value` and `-k value` options of a recorded call, as a dict."""
    short = {"-A": "--account", "-p": "--partition", "-t": "--time", "-D": "--chdir",
             "-C": "--constraint", "-N": "--nodes", "-n": "--ntasks", "-c": "--cpus-per-task",
             "-J": "--job-name", "-o": "--output"}  # fmt: skip
    flags = {"--parsable", "--parsable2", "--requeue", "--no-requeue", "--kill-on-bad-exit", "-h",
             "--noheader", "-X", "--allocations"}  # fmt: skip
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            break
        if "=" in a and a.startswith("--"):
            key, value = a.split("=", 1)
            out[key] = value
        elif a in flags or a.startswith("--kill-on-bad-exit"):
            out[a] = ""
        elif a in short and len(argv) > i + 1:
            out[short[a]] = argv[i + 1]
            i += 1
        elif len(argv) > i + 1 and not argv[i + 1].startswith("-"):
            out[a] = argv[i + 1]
            i += 1
        else:
            out[a] = ""
        i += 1
    return out


# ---- the commands ------------------------------------------------------------------------


def _state() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


def _record(cmd: str, argv: list[str]) -> None:
    with open(_state() / "calls.jsonl", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps({"cmd": cmd, "argv": argv, "job": os.environ.get("SLURM_JOB_ID")}))
        f.write("\n")


def _jobs_dir() -> Path:
    d = _state() / "jobs"
    d.mkdir(exist_ok=True)
    return d


def _job(job: str) -> dict:
    return json.loads((_jobs_dir() / f"{job}.json").read_text())


def _save(job: dict) -> None:
    path = _jobs_dir() / f"{job['id']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(job))
    tmp.replace(path)


def _next_id() -> str:
    with open(_state() / "counter", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = int(f.read().strip() or "1000") + 1
        f.seek(0)
        f.truncate()
        f.write(str(n))
    return str(n)


def _minutes(text: str) -> float:
    parts = [int(p) for p in text.replace("-", ":").split(":")]
    if len(parts) == 1:
        return float(parts[0])
    if len(parts) == 2:  # MM:SS
        return parts[0] + parts[1] / 60
    return parts[-3] * 60 + parts[-2] + parts[-1] / 60  # HH:MM:SS


def sbatch(argv: list[str]) -> int:
    opts = options(argv)
    wrap = next((a.split("=", 1)[1] for a in argv if a.startswith("--wrap=")), None)
    if wrap is None:
        script = sys.stdin.read()
    else:
        script = f"#!/bin/sh\n{wrap}\n"
    job = _next_id()
    nodes = int(opts.get("--nodes", "1"))
    workdir = opts.get("--chdir", os.getcwd())
    # a job array (--array=1-200): one job a task, `<job>_<task>`, the task's number in its
    # environment (what snakemake-executor-plugin-slurm-jobstep picks the task's command by)
    first, _, last = opts.get("--array", "").partition("-")
    tasks = list(range(int(first), int(last or first) + 1)) if first else [None]
    ids = [job if t is None else f"{job}_{t}" for t in tasks]
    for task, task_id in zip(tasks, ids, strict=True):
        out = opts.get("--output", f"slurm-{job}.out").replace("%A", job).replace("%j", job)
        out = out.replace("%a", str(task)) if task is not None else out
        _save({
            "id": task_id,
            "name": opts.get("--job-name", ""),
            "state": "PENDING",
            "nodes": list(NODE_NAMES[:nodes]),
            "time_limit_min": _minutes(opts["--time"]) if "--time" in opts else None,
            "start": time.time(),
            "script": script,
            "output": str(Path(workdir) / out),
            "workdir": workdir,
            "gpus": opts.get("--gpus", ""),
            "comment": opts.get("--comment", ""),
            "array": None if task is None else {"job": job, "task": task, "min": tasks[0],
                                                "max": tasks[-1], "count": len(tasks)},
        })  # fmt: skip
    # a detached runner plays slurmd: it runs the script (each task of an array, a few at a
    # time, as a cluster's free nodes would) and records how each ended
    subprocess.Popen(
        [sys.executable, __file__, "_run", *ids],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
        cwd=workdir,
    )
    print(job)
    return 0


def _node_tmp(job_id: str, node: str) -> Path:
    """The job's scratch folder on a node (created)."""
    path = _state() / "scratch" / node / job_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run_all(job_ids: list[str]) -> int:
    """Run one job, or an array's tasks at most FAKE_SLURM_ARRAY_PARALLEL (4) at a time."""
    from concurrent.futures import ThreadPoolExecutor

    parallel = int(os.environ.get("FAKE_SLURM_ARRAY_PARALLEL", "4"))
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(job_ids)))) as pool:
        list(pool.map(_run, job_ids))
    return 0


def _run(job_id: str) -> int:
    job = _job(job_id)
    env = dict(os.environ)
    if job.get("array"):
        a = job["array"]
        env.update(SLURM_ARRAY_JOB_ID=a["job"], SLURM_ARRAY_TASK_ID=str(a["task"]),
                   SLURM_ARRAY_TASK_MIN=str(a["min"]), SLURM_ARRAY_TASK_MAX=str(a["max"]),
                   SLURM_ARRAY_TASK_COUNT=str(a["count"]), SLURM_ARRAY_TASK_STEP="1")  # fmt: skip
    env.update(
        {
            "SLURM_JOB_ID": job_id,
            "SLURM_JOBID": job_id,
            "SLURM_JOB_NUM_NODES": str(len(job["nodes"])),
            "SLURM_NNODES": str(len(job["nodes"])),
            "SLURM_JOB_NODELIST": ",".join(job["nodes"]),
            "SLURMD_NODENAME": job["nodes"][0],
            # as sites that give each job a node-local scratch folder
            "SLURM_TMPDIR": str(_node_tmp(job_id, job["nodes"][0])),
        }
    )
    if job["gpus"]:
        env["SLURM_GPUS"] = job["gpus"].split(":")[-1]
    script = Path(job["output"]).with_suffix(".sh")
    Path(job["output"]).parent.mkdir(parents=True, exist_ok=True)
    script.write_text(job["script"])
    with open(job["output"], "ab") as log:
        proc = subprocess.Popen(
            ["/bin/sh", str(script)],
            cwd=job["workdir"],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        job.update(state="RUNNING", pid=proc.pid, start=time.time())
        _save(job)
        code = proc.wait()
    job = _job(job_id)
    job["exit_code"] = code
    job["end"] = time.time()
    if job["state"] == "RUNNING":
        job["state"] = "COMPLETED" if code == 0 else "FAILED"
    _save(job)
    return 0


def _all_jobs() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(_jobs_dir().glob("*.json"))]


def _time_left(job: dict) -> str:
    if job["time_limit_min"] is None:
        return "UNLIMITED"
    left = max(0, int(job["time_limit_min"] * 60 - (time.time() - job["start"])))
    return f"{left // 3600}:{left % 3600 // 60:02d}:{left % 60:02d}"


def squeue(argv: list[str]) -> int:
    opts = options(argv)
    # squeue's -o is --format (not sbatch's --output)
    fmt = opts.get("--format", opts.get("--output", "%i|%T"))
    jobs = _all_jobs()
    if "-j" in opts or "--jobs" in opts:
        jobs = [j for j in jobs if j["id"] == opts.get("-j", opts.get("--jobs"))]
    if "--name" in opts:
        jobs = [j for j in jobs if j["name"] == opts["--name"]]
    for j in jobs:
        line = (
            fmt.replace("%i", j["id"])
            .replace("%T", j["state"])
            .replace("%N", ",".join(j["nodes"]))
            .replace("%L", _time_left(j))
        )
        print(line)
    return 0


def _elapsed(job: dict) -> str:
    s = int(job.get("end", time.time()) - job["start"])
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


SACCT_FIELDS = {
    "jobid": lambda j: j["id"],
    "jobidraw": lambda j: j["id"],
    "jobname": lambda j: j["name"],
    "state": lambda j: j["state"],
    "comment": lambda j: j.get("comment", ""),
    "elapsed": _elapsed,
    "totalcpu": _elapsed,
    "nnodes": lambda j: str(len(j["nodes"])),
    "ncpus": lambda j: "1",
    "maxrss": lambda j: "100M",
    "reqmem": lambda j: "1000M",
    # what a site with energy accounting reports (joules); empty where it has none
    "consumedenergy": lambda j: os.environ.get("FAKE_SLURM_ENERGY_J", ""),
    "consumedenergyraw": lambda j: os.environ.get("FAKE_SLURM_ENERGY_J", ""),
    "exitcode": lambda j: f"{j.get('exit_code', 0)}:0",
}


def sacct(argv: list[str]) -> int:
    opts = options(argv)
    fields = opts.get("--format", opts.get("-o", "JobIdRaw,State")).lower().split(",")
    jobs = _all_jobs()
    if "--name" in opts:
        jobs = [j for j in jobs if j["name"] == opts["--name"]]
    if "-j" in opts or "--jobs" in opts:
        jobs = [j for j in jobs if j["id"] == opts.get("-j", opts.get("--jobs"))]
    for j in jobs:
        print("|".join(SACCT_FIELDS[f.strip()](j) for f in fields))
    return 0


def scontrol(argv: list[str]) -> int:
    if argv[:2] == ["show", "hostnames"]:
        for host in argv[2].split(","):
            print(host)
        return 0
    if argv[:2] == ["show", "config"]:
        print("MinJobAge               = 300 sec")
        return 0
    print(f"fake scontrol: {' '.join(argv)} is not faked", file=sys.stderr)
    return 1


def scancel(argv: list[str]) -> int:
    for a in argv:
        # a job, an array task (<job>_<task>), or every task of an array (<job>)
        for job in [j for j in _all_jobs() if j["id"] == a or j["id"].startswith(f"{a}_")]:
            job["state"] = "CANCELLED"
            _save(job)
            if job.get("pid"):
                _signal_tree(job["pid"], signal.SIGTERM)
    return 0


def _signal_tree(pid: int, sig: int) -> None:
    """Every process of the job gets the signal, as slurmstepd signals a step's cgroup."""
    import psutil

    try:
        parent = psutil.Process(pid)
        tree = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def srun(argv: list[str]) -> int:
    opts = options(argv)
    n_opts = 0
    while n_opts < len(argv) and argv[n_opts].startswith("-"):
        takes_value = "=" not in argv[n_opts] and argv[n_opts] in {
            "-n",
            "-N",
            "-c",
            "-J",
            "--jobid",
            "--ntasks",
            "--nodes",
        }
        n_opts += 2 if takes_value else 1
    command = argv[n_opts:]
    nodes = int(opts.get("--nodes", "1"))
    ntasks = int(opts.get("--ntasks", nodes * int(opts.get("--ntasks-per-node", "1"))))
    job = os.environ.get("SLURM_JOB_ID")
    if job is None:
        print("srun: error: no allocation (SLURM_JOB_ID unset)", file=sys.stderr)
        return 1
    hosts = _job(job)["nodes"]
    if nodes > len(hosts):
        print(f"srun: error: {nodes} nodes asked, job {job} has {len(hosts)}", file=sys.stderr)
        return 1
    per_node = max(1, ntasks // nodes)
    procs = []
    for rank in range(ntasks):
        env = dict(os.environ)
        node = rank // per_node
        env.update(
            SLURM_PROCID=str(rank),
            SLURM_NODEID=str(node),
            SLURM_LOCALID=str(rank % per_node),
            SLURM_NTASKS=str(ntasks),
            SLURMD_NODENAME=hosts[node],
            SLURM_TMPDIR=str(_node_tmp(job, hosts[node])),
        )
        procs.append(subprocess.Popen(command, env=env))

    def forward(signum, frame) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c != 0), 0)


def sacctmgr(argv: list[str]) -> int:
    print(ACCOUNT)
    return 0


def sinfo(argv: list[str]) -> int:
    print("PARTITION\ncpu\ngpu")
    return 0


def main(cmd: str, argv: list[str]) -> None:
    """Entry point of every fake command."""
    if cmd == "_run":
        sys.exit(_run_all(argv))
    _record(cmd, argv)
    handler = globals()[cmd]
    sys.exit(handler(argv))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
