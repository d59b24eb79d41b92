"""What installing voxjet brings and refuses: no test tools in a user install, Python < 3.11
refused by pip from the metadata, and the conda env that `--sdm conda` deploys."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_snakemake, snakemake_env
from packaging.requirements import Requirement

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
BASE = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
TEST_TOOLS = {"pytest", "ruff", "moto", "flask", "docker", "cfn-lint", "scikit-hep-testdata",
              "nilearn", "pythia8mc", "fastjet", "s3fs", "setuptools-scm"}  # fmt: skip


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: list[str]) -> set[str]:
    """Every distribution these requirements pull in, from the installed packages' metadata."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if _key(name) in seen:
            continue
        seen.add(_key(name))
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for r in map(Requirement, requires):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return seen


def test_a_user_install_pulls_no_test_tools_and_no_pythia():
    pulled = _closure([r.name for r in BASE])
    assert {"torch", "snakemake", "uproot", "monai"} <= pulled
    # README's `snakemake --report results/report.html` after `make demo`'s install: the
    # report needs pygments, which snakemake leaves to the user
    assert "pygments" in pulled
    assert not pulled & TEST_TOOLS, pulled & TEST_TOOLS
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {_key(Requirement(r).name) for r in extras["remote"]} >= {"s3fs", "fsspec-xrootd"}
    # pythia8mc has wheels for Linux x86_64 / CPython < 3.14 only: elsewhere the extra is empty
    for r in map(Requirement, extras["pythia"]):
        assert not r.marker.evaluate({"platform_machine": "aarch64", "extra": ""})
        assert not r.marker.evaluate({"python_version": "3.14", "extra": ""})


def _built_wheel(folder: Path) -> Path:
    """The package built as a wheel into `folder` (what `pip install .` installs)."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(folder), str(REPO)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = folder.glob("voxjet-*.whl")
    return wheel


def test_python_3_10_gets_pips_refusal_from_the_metadata(tmp_path):
    """pip refuses the package for Python 3.10 on the metadata alone (Requires-Python), before
    resolving any dependency."""
    assert PYPROJECT["project"]["requires-python"] == ">=3.11"
    pip = [sys.executable, "-m", "pip"]
    wheel = _built_wheel(tmp_path)
    r = subprocess.run(
        [*pip, "install", "--dry-run", "--no-deps", "--no-index", "--python-version", "3.10",
         "--only-binary=:all:", "--target", str(tmp_path / "t"), str(wheel)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert r.returncode != 0
    assert "requires a different Python" in r.stderr and ">=3.11" in r.stderr, r.stderr


CONDA_NAMES = {
    "torch": "pytorch",
    "matplotlib": "matplotlib-base",
    "snakemake": "snakemake-minimal",
    "blosc2": "python-blosc2",
}
FAKE_CONDA = """#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
if a[:2] == ["info", "--json"]:
    print(json.dumps({"conda_version": "24.7.1", "conda_prefix": "/opt/conda",
                      "envs_dirs": ["/opt/conda/envs"], "pkgs_dirs": ["/opt/conda/pkgs"],
                      "platform": "linux-64"}))
elif a[:1] == ["--version"]:
    print("conda 24.7.1")
elif a[:2] == ["config", "--get"]:
    print(json.dumps({"get": {"channel_priority": "strict"}}))
else:
    sys.exit("fake conda: " + " ".join(a) + " is not faked")
"""


def test_sdm_conda_env_installs_voxjet_from_the_workflow_folder(workflow_dir, tmp_path):
    """The env file Snakemake deploys under `--sdm conda` (listed by Snakemake itself with a
    stand-in `conda` that answers its checks: conda cannot run here) installs voxjet from the
    workflow's folder, and conda provides every dependency, so pip adds none."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "conda").write_text(FAKE_CONDA)
    (fake / "conda").chmod(0o755)
    env = snakemake_env()
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    r = run_snakemake(workflow_dir, "--list-conda-envs", "--sdm", "conda", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = [line.split("\t") for line in r.stdout.splitlines() if "voxjet-" in line]
    rendered = yaml.safe_load((workflow_dir / row[0]).read_text())
    pip = next(d["pip"] for d in rendered["dependencies"] if isinstance(d, dict))
    (local,) = [p for p in pip if p.startswith("-e ")]
    assert Path(local[3:]) == workflow_dir.resolve()
    assert (
        tomllib.loads((workflow_dir / "pyproject.toml").read_text())["project"]["name"] == "voxjet"
    )
    conda = {re.split(r"[<>=! ]", d)[0] for d in rendered["dependencies"] if isinstance(d, str)}
    missing = {r.name for r in BASE if CONDA_NAMES.get(r.name, r.name) not in conda}
    assert not missing, f"envs/voxjet.yaml lacks {missing}"
    # the template itself stays usable as it is (conda env create -f envs/voxjet.yaml)
    assert "- -e .." in (REPO / "envs" / "voxjet.yaml").read_text()


def test_an_installed_wheel_works_from_any_folder(tmp_path):
    """`pip install .` (a built wheel, not the repository) and the commands README shows outside
    the workflow, from an empty folder: the schema comes with the package."""
    pip = [sys.executable, "-m", "pip"]
    wheel = _built_wheel(tmp_path)
    site = tmp_path / "site"
    r = subprocess.run([*pip, "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "mine.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    (empty / "results").mkdir()  # where the workflow would have written its runs
    env = {**snakemake_env(), "PYTHONPATH": str(site)}  # the installed copy, not the checkout
    run = [sys.executable, "-m", "voxjet.cli"]

    def voxjet(*args):
        return subprocess.run([*run, *args], cwd=empty, env=env, capture_output=True, text=True)

    where = subprocess.run([sys.executable, "-c", "import voxjet; print(voxjet.__file__)"],
                           cwd=empty, env=env, capture_output=True, text=True)  # fmt: skip
    assert where.stdout.startswith(str(site)), where.stdout
    version = voxjet("--version")
    assert version.returncode == 0 and PYPROJECT["project"]["version"] in version.stdout
    r = voxjet("aggregate", "--from-config", "mine.yaml", "--out", "summary")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "runs without metrics" in r.stderr and (empty / "summary" / "summary.md").is_file()


def _snakemake_bound() -> Requirement:
    (req,) = [r for r in BASE if r.name == "snakemake"]
    return req


def test_the_tests_run_the_snakemake_release_readme_and_pyproject_state():
    """The installed Snakemake is the bound's lower end (the newest release tested), which
    README names: a newer release on PyPI fails this until it is tested and the bound moved."""
    from importlib.metadata import version

    req = _snakemake_bound()
    lower = next(s.version for s in req.specifier if s.operator == ">=")
    assert version("snakemake") == lower, (version("snakemake"), str(req))
    assert f"Snakemake {lower}" in (REPO / "README.md").read_text()


@pytest.mark.slow
def test_a_fresh_user_install_resolves_the_snakemake_the_tests_run(tmp_path):
    """pip's resolution of `make venv`'s install from scratch (the same torch pinned) takes the
    Snakemake installed here: users run what CI passed."""
    from importlib.metadata import version

    import torch

    constraints = tmp_path / "constraints.txt"
    constraints.write_text(f"torch=={torch.__version__}\n")
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                        "--quiet", "--report", str(report), "-c", str(constraints),
                        f"{REPO}[pythia]"], capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0 and "Could not find a version" in r.stderr + r.stdout:
        pytest.skip(f"no package index reachable: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stderr[-2000:]
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}  # fmt: skip
    assert resolved["snakemake"] == version("snakemake")
