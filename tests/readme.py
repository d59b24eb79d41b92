"""The command lines README.md and the docs/ pages it links to show, for the tests that run
them as written. Every command in their code blocks (and every inline `snakemake ...`/`voxjet
...` command) must be one of COMMANDS, and every entry of COMMANDS is run by a test
(tests/test_readme.py checks both)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

README_PATH = Path(__file__).resolve().parents[1] / "README.md"
# the pages README links to: their commands count as README's
DOCS = sorted((README_PATH.parent / "docs").glob("*.md"))

COMMANDS = {
    "dry-run": "snakemake -n --configfile my_config.yaml",
    "run": "snakemake --configfile my_config.yaml",
    "report-mine": "snakemake --report results/report.html --configfile my_config.yaml",
    "report": "snakemake --report results/report.html",
    "slurm-dry-run": "snakemake -n --workflow-profile workflow/profiles/slurm",
    "slurm-run": "snakemake --workflow-profile workflow/profiles/slurm",
    "squeue": "squeue --me",
    "submissions": "voxjet submissions --workflow-profile workflow/profiles/slurm",
    "htcondor-dry-run": "snakemake -n --workflow-profile workflow/profiles/htcondor",
    "htcondor-run": "snakemake --workflow-profile workflow/profiles/htcondor",
    "keep-going": "snakemake --keep-going",
    "gpu-resources": "snakemake --resources gpu=4",
    "rerun-shards": "snakemake -R shard_jets --until index_jets",
    "rerun-train": "snakemake -R train_jets",
    "rerun-one-run": "snakemake results/toy_jets/runs/pfn_lr-0.003/model.pt -R train_jets",
    "rerun-preprocess": "snakemake -R preprocess_case --until gather_cases",
    "restage": "snakemake --forcerun stage --until stage",
    "aggregate": "voxjet aggregate --from-config config/config.yaml --out results/summary",
    "predict": "snakemake --until predict",
    "plan": "snakemake --until plan_runs",
    "relabel": "voxjet relabel --dataset data/Task01_lesions --map 3:2 --out "
    "data/Task01_lesions_relabelled",
}
# run by make itself (CI runs `make test`; the others are Makefile targets checked by test_readme)
MAKE = {
    "make demo",
    "make demo-full",
    "make test",
    "make dev-venv",
    "make lint",
    "make test-fast",
    "make test-all",
}
SHELL = {"source .venv/bin/activate"}

README = {k: shlex.split(v) for k, v in COMMANDS.items()}


def readme_commands(text: str | None = None) -> set[str]:
    """Every command line README shows: lines of its bash blocks (comments dropped) and inline
    code spans that start with `snakemake ` or `voxjet ` (without a <placeholder>)."""
    if text is None:
        text = "\n".join(p.read_text() for p in [README_PATH, *DOCS])
    found: set[str] = set()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line:
                found.add(" ".join(shlex.split(line)))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if span.startswith(("snakemake ", "voxjet ")) and "<" not in span:
            found.add(" ".join(shlex.split(span)))
    return found
