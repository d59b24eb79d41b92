"""README's command lines are the ones the tests run (tests/readme.py), and each is run."""

from __future__ import annotations

import re
import subprocess

from conftest import REPO
from readme import COMMANDS, MAKE, SHELL, readme_commands


def test_every_readme_command_is_one_the_tests_run():
    shown = readme_commands()
    unknown = shown - set(COMMANDS.values()) - MAKE - SHELL
    assert not unknown, f"README shows commands no test runs: {sorted(unknown)}"
    stale = set(COMMANDS.values()) - shown
    assert not stale, f"tests/readme.py lists commands README no longer shows: {sorted(stale)}"
    # each is run by a test, by its key
    tests = "\n".join(p.read_text() for p in (REPO / "tests").glob("test_*.py"))
    used = set(re.findall(r'README\["([\w-]+)"\]', tests))
    assert used == set(COMMANDS), set(COMMANDS) - used


def test_readme_make_targets_exist():
    for line in MAKE & readme_commands():
        target = line.split()[1]
        r = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_readmes_demo_tables_are_what_the_script_makes_from_the_recorded_runs():
    """README's tables are never typed: benchmarks/demo_table.py makes them from the demo runs'
    metrics.csv kept in benchmarks/ (demo_metrics.csv: `make demo`; demo_full_metrics.csv:
    `make demo-full`), and the numbers a user reads are the ones those runs measured."""
    import csv
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "demo_table", REPO / "benchmarks" / "demo_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (REPO / "README.md").read_text()
    for block, recorded in (("demo-table", "demo_metrics.csv"),
                            ("demo-full-table", "demo_full_metrics.csv")):  # fmt: skip
        with open(REPO / "benchmarks" / recorded, newline="") as f:
            rows = list(csv.DictReader(f))
        table = module.demo_table(rows)
        assert module.replace_block(readme, table, block) == readme, block
        aucs = {r["run"]: float(r["value"]) for r in rows
                if r["split"] == "test" and r["metric"] == "auc_macro"}  # fmt: skip
        assert f"| {max(aucs.values()):.3f} |" in table
