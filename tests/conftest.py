"""Shared fixtures: a copy of the workflow in a temporary folder, and snakemake runs in it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mni_dataset import mni_file  # noqa: F401  (the tests import it from here)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def hep_file(name: str) -> Path:
    """A real ROOT file that scikit-hep-testdata ships (the `test` extra): uproot's HZZ sample,
    a NanoAOD Drell-Yan skim, ... Read from the installed package, nothing downloaded."""
    import skhep_testdata

    path = Path(skhep_testdata.data_path(name))
    assert path.is_file(), f"{name}: not in the installed scikit-hep-testdata"
    return path


def snakemake_env() -> dict[str, str]:
    """The environment the rules need: this venv's voxjet, torchrun and snakemake first, and
    the tests' latency:// filesystem registered in every process (tests/site)."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    tests = Path(__file__).resolve().parent
    paths = [str(tests / "site"), str(tests), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def same_tensor(a, b) -> bool:
    """Equal to the bit, NaN equal to NaN (a standardiser's `missing` holds NaN for "none")."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    return a.is_floating_point() and bool(((a == b) | (a.isnan() & b.isnan())).all())


def copy_workflow(dest: Path) -> Path:
    """The workflow's files (no data, no results) copied into the new folder `dest`."""
    dest.mkdir(parents=True)
    for name in ("Snakefile", "pyproject.toml"):
        shutil.copy(REPO / name, dest / name)
    for sub in ("workflow", "config", "envs", "profiles"):
        shutil.copytree(REPO / sub, dest / sub)
    return dest


@pytest.fixture
def workflow_dir(tmp_path: Path) -> Path:
    """The workflow's files (no data, no results) copied into a fresh folder."""
    return copy_workflow(tmp_path / "wf")


def run_snakemake(
    cwd: Path, *args: str, timeout: int = 1200, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`snakemake ARGS` in `cwd`, output captured (`env` is the environment, when given)."""
    return subprocess.run(
        [str(BIN / "snakemake"), *args],
        cwd=cwd,
        env=env or snakemake_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a snakemake run or dry run: {rule: jobs}."""
    assert "Job stats:" in output, output[-3000:]
    table = output.split("Job stats:")[1]
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)
        if m.group(1) != "total"
    }


def merge_config(base: dict, over: dict) -> dict:
    """`over` merged into `base` key by key (mappings recursively), as Snakemake merges
    --configfile into the workflow's config."""
    out = dict(base)
    for k, v in over.items():
        out[k] = (
            merge_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


def write_config(path: Path, config: dict) -> Path:
    """Dump a config dict as YAML."""
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_pfn_workflow(workflow_dir: Path, source: dict, jets: dict,
                     train: dict) -> subprocess.CompletedProcess:  # fmt: skip
    """Real snakemake (`-c 2`) over one jets dataset `jets` (its source and jets section) and
    one tiny PFN (one process, one thread) trained with `train`."""
    cfg = {
        "datasets": {"jets": {"domain": "jets", "source": source, "jets": jets}},
        "experiments": {"pfn": {"dataset": "jets", "launch": {"gpus": 0, "threads": 1},
                                "model": {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]},
                                "train": train}},
    }  # fmt: skip
    write_config(workflow_dir / "config" / "config.yaml", cfg)
    return run_snakemake(workflow_dir, "-c", "2")


@pytest.fixture
def demo_config() -> dict:
    """The demo config as a dict."""
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


@pytest.fixture
def fake_slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Fake SLURM commands first on PATH: (environment for subprocesses, their state folder)."""
    from fake_slurm import install

    bin_dir, state = tmp_path / "fake-slurm-bin", tmp_path / "fake-slurm-state"
    env = snakemake_env()
    env.update(install(bin_dir, state))
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env, state


def toy_cases(root: Path, synth, prep) -> Path:
    """Toy CT cases generated (`synth`: a ToyVolumesConfig, into root/msd) and preprocessed
    (`prep`: a VolumePrepConfig) into root/cases, as the workflow's jobs make them."""
    import json

    from voxjet.volumes.dataset.synth import generate_dataset
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset

    msd = generate_dataset(root / "msd", synth, progress=False)
    (root / "manifest.json").write_text(json.dumps({"root": str(msd), "files": []}))
    preprocess_dataset(root / "manifest.json", root / "cases", prep)
    return root / "cases"


def assert_predict_equals_evaluation(eval_dir: Path, pred_dir: Path, columns: dict,
                                     atol: float = 1e-6) -> None:  # fmt: skip
    """Each `predict` output column {branch: (dataset, column)} equals evaluation's stored
    value (eval_dir/predictions.h5) for the same jets, found by (file, entry)."""
    import h5py
    import hdf5plugin  # noqa: F401
    import numpy as np
    import uproot

    with h5py.File(eval_dir / "predictions.h5") as p:
        stored = {k: p[k][...] for k in {d for d, _ in columns.values()}}
        files, entries = p["file"][...], p["entry"][...]
        sources = [str(s) for s in p.attrs["source_files"]]
    for k, src in enumerate(sources):
        (out,) = pred_dir.rglob(src.split("/")[-1])
        with uproot.open(out) as f:
            tree = f[f.keys(cycle=False)[0]]
            got = tree.arrays(list(columns), library="np")
        for branch, (dataset, col) in columns.items():
            np.testing.assert_allclose(got[branch][entries[files == k]],
                                       stored[dataset][files == k, col], atol=atol,
                                       err_msg=f"{src} {branch}")  # fmt: skip


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Jet shards of a small toy dataset (4 classes × 200 jets), staged and sharded."""
    from voxjet.jets.data_config import JetDataConfig
    from voxjet.jets.shard import shard_jets
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset
    from voxjet.stage.transfer import stage

    d = tmp_path_factory.mktemp("jets")
    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=200), progress=False)
    stage(str(d / "raw"), d / "staged", d / "manifest.json", patterns=["*.root"])
    shard_jets(
        d / "manifest.json", d / "shards", JetDataConfig(max_particles=24, jets_per_shard=300)
    )
    return d / "shards"


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need a CUDA device; without one they are skipped, saying so."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A tiny jets workflow (two classes, two files each, a few PFN steps): the runs that test what a
# second `snakemake` does after a fault, a touch or a change start from one finished copy of it.
JETS = {
    "datasets": {
        "j": {
            "domain": "jets",
            "source": {"path": "src"},
            "jets": {"labels": ["label_QCD", "label_Wqq"], "max_particles": 16},
        }
    },
    "experiments": {
        "pfn": {
            "dataset": "j",
            "model": {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]},
            "train": {"steps": 6, "eval_every": 3, "batch_size": 32},
            "launch": {"gpus": 0, "threads": 1},
        }
    },
}
JETS_ARGS = ["--cores", "2", "--configfile", "c.yaml", "--replace-workflow-config"]


@pytest.fixture(scope="session")
def finished_jets(tmp_path_factory) -> Path:
    """The tiny jets workflow run to the end once; copy it (times kept) before changing it."""
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset

    wf = copy_workflow(tmp_path_factory.mktemp("clean") / "wf")
    generate_dataset(wf / "src", ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=2,
                     jets_per_file=150, seed=3), progress=False)  # fmt: skip
    write_config(wf / "c.yaml", JETS)
    r = run_snakemake(wf, *JETS_ARGS)
    assert r.returncode == 0, r.stderr[-3000:]
    return wf
