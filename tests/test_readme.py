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
