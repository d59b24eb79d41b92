"""What a second `snakemake` redoes: nothing for sources whose content did not change (touched,
copied without times, a config file saved again) but their verification, what depends on a
source whose content did (for volumes: the changed case alone while the plan stays, all of
them once it moves); and a dry run on a fresh clone changes nothing in it but Snakemake's own
`.snakemake/`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import uproot
from conftest import JETS_ARGS, copy_workflow, job_counts, run_snakemake

pytestmark = pytest.mark.slow

# What a run leaves that a user keeps: the model, its evaluation and the summary.
KEPT = ("results/j/runs/pfn/model.pt", "results/j/runs/pfn/eval", "results/summary")


@pytest.fixture
def wf(finished_jets, tmp_path) -> Path:
    """A copy of the finished tiny jets workflow (times kept, Snakemake's records with it)."""
    return Path(shutil.copytree(finished_jets, tmp_path / "wf", symlinks=True))


def _digests(wf: Path) -> dict[str, str]:
    """blake2b of every file under KEPT, by path."""
    out = {}
    for top in KEPT:
        paths = [wf / top] if (wf / top).is_file() else sorted((wf / top).rglob("*"))
        for p in paths:
            if p.is_file():
                out[str(p.relative_to(wf))] = hashlib.blake2b(p.read_bytes()).hexdigest()
    assert any(k.endswith("model.pt") for k in out) and len(out) > 5, out
    return out


def _dry_jobs(wf: Path) -> dict[str, int]:
    r = run_snakemake(wf, *JETS_ARGS, "-n")
    assert r.returncode == 0, r.stderr[-3000:]
    return {} if "Nothing to be done" in r.stdout else job_counts(r.stdout)


def _touch(paths: list[Path]) -> None:
    """Every path's times set to now, as `touch`, `cp` without -p or a restore do."""
    for p in paths:
        os.utime(p)


def test_touched_sources_and_config_rerun_nothing_beyond_the_stage(wf):
    before = _digests(wf)
    sources = sorted((wf / "src").glob("*.root"))
    _touch([*sources, wf / "c.yaml"])
    assert set(_dry_jobs(wf)) <= {"verify_sources", "all"}
    r = run_snakemake(wf, *JETS_ARGS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _digests(wf) == before
    assert _dry_jobs(wf) == {}  # and it settles


def test_copied_without_times_the_sources_rerun_nothing_beyond_the_stage(wf, tmp_path):
    before = _digests(wf)
    copy = tmp_path / "copy"
    shutil.copytree(wf / "src", copy, copy_function=shutil.copyfile)  # `cp -r`, no times
    shutil.rmtree(wf / "src")
    shutil.move(copy, wf / "src")  # the move to another filesystem keeps the new times
    _touch(sorted((wf / "src").glob("*.root")))
    assert set(_dry_jobs(wf)) <= {"verify_sources", "all"}
    assert run_snakemake(wf, *JETS_ARGS).returncode == 0
    assert _digests(wf) == before


def test_a_changed_source_reruns_what_depends_on_it(wf):
    path = wf / "src" / "Wqq_001.root"
    with uproot.open(path) as f:
        arrays = f["tree"].arrays(library="ak")
    fields = {k: arrays[k][:-10] for k in arrays.fields}  # ten jets fewer
    with uproot.recreate(path) as f:
        f.mktree("tree", {k: v.type for k, v in fields.items()}).extend(fields)
    # the dry run shows everything that will run: the file's size and sampled bytes changed
    dry = run_snakemake(wf, *JETS_ARGS, "-n")
    assert {"stage", "shard_jets", "train_jets", "aggregate"} <= set(job_counts(dry.stdout))
    before = _digests(wf)
    r = run_snakemake(wf, *JETS_ARGS)
    assert r.returncode == 0, r.stderr[-3000:]
    for rule in ("shard_jets", "index_jets", "train_jets", "evaluate_jets", "aggregate"):
        assert f"rule {rule}:" in r.stderr, rule
    after = _digests(wf)
    assert after["results/j/runs/pfn/model.pt"] != before["results/j/runs/pfn/model.pt"]
    index = json.loads((wf / "results/j/shards/index.json").read_text())
    assert sum(split["jets"] for split in index["splits"].values()) == 590
    # each reason says what changed in a line, not the run's whole config
    reasons = [ln for ln in r.stderr.splitlines() if "reason:" in ln]
    assert reasons and max(map(len, reasons)) < 300, max(reasons, key=len)
    assert _dry_jobs(wf) == {}  # settled in one run


def test_a_dry_run_on_a_fresh_clone_changes_nothing_but_snakemakes_folder(tmp_path):
    wf = copy_workflow(tmp_path / "clone")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(wf)]
    subprocess.run([*git, "init", "-q"], check=True)
    (wf / ".gitignore").write_text("")  # nothing hidden from the listing below
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], check=True)

    def listing() -> set[str]:
        out = subprocess.run([*git, "status", "--porcelain", "--ignored", "-uall"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return set(out.splitlines())

    before = listing()
    r = run_snakemake(wf, "-n")
    assert r.returncode == 0, r.stderr[-3000:]
    new = listing() - before
    # Snakemake keeps its own records there whatever the workflow; everything else is untouched
    assert all(line.startswith("?? .snakemake/") for line in new), new


# A tiny volumes workflow on a local MSD folder (a U-Net of a few steps).
VOLUMES = {
    "datasets": {"v": {"domain": "volumes", "source": {"path": "msd"},
                       "volumes": {"patch_size": [16, 16, 8], "network_depth": 2,
                                   "val_fraction": 0.2, "test_fraction": 0.2}}},
    "experiments": {"unet": {"dataset": "v", "model": {"name": "unet", "channels": [4, 8],
                                                       "num_res_units": 0},
                             "train": {"steps": 2, "batch_size": 2, "eval_every": 2,
                                       "iterations_per_epoch": 2},
                             "evaluate": {"overlap": 0.25},
                             "launch": {"gpus": 0, "threads": 1}}},
}  # fmt: skip


def _volumes_workflow(root: Path, modality: str) -> Path:
    import yaml

    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset

    wf = copy_workflow(root / "wf")
    toy = ToyVolumesConfig(train_cases=6, test_cases=1, seed=3, min_shape=(24, 24, 12),
                           max_shape=(28, 28, 12))  # fmt: skip
    msd = generate_dataset(wf / "msd", toy, progress=False)
    meta = json.loads((msd / "dataset.json").read_text())
    meta["modality"] = {"0": modality}
    (msd / "dataset.json").write_text(json.dumps(meta))
    (wf / "c.yaml").write_text(yaml.safe_dump(VOLUMES))
    return wf


def _change_a_label_voxel(wf: Path, case: str) -> None:
    import nibabel as nib
    import numpy as np

    path = wf / "msd" / "labelsTr" / f"{case}.nii.gz"
    img = nib.load(path)
    label = np.asarray(img.dataobj).copy()
    label[tuple(np.argwhere(label == 1)[0])] = 0
    nib.save(nib.Nifti1Image(label, img.affine, img.header), path)


def _case_bytes(wf: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((wf / "results/v/cases").glob("*.h5"))}


def _training_case(wf: Path) -> str:
    return json.loads((wf / "results/v/plan/splits.json").read_text())["train"][0]


def test_one_changed_label_voxel_redoes_that_case_and_what_trains_on_it(tmp_path):
    """An MR dataset (each case normalised by itself): the plan stays, the other case files
    are not touched."""
    wf = _volumes_workflow(tmp_path, "MRI")
    args = ("--cores", "2", "--configfile", "c.yaml", "--replace-workflow-config")
    assert run_snakemake(wf, *args).returncode == 0
    before, case = _case_bytes(wf), _training_case(wf)
    _change_a_label_voxel(wf, case)
    dry = job_counts(run_snakemake(wf, *args, "-n").stdout)
    assert dry["preprocess_case"] == 1 and dry["train_seg"] == 1, dry
    r = run_snakemake(wf, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    after = _case_bytes(wf)
    assert [c for c in before if before[c] != after[c]] == [f"{case}.h5"]
    assert "Nothing to be done" in run_snakemake(wf, *args, "-n").stdout


def test_a_case_that_moves_the_plan_stops_gather_then_every_case_is_rebuilt(tmp_path):
    """A CT dataset: the changed foreground moves the dataset's intensity statistics, which
    every case is normalised with; gather_cases refuses the older case files, the next run
    rebuilds them."""
    wf = _volumes_workflow(tmp_path, "CT")
    args = ("--cores", "2", "--configfile", "c.yaml", "--replace-workflow-config", "--until",
            "gather_cases")  # fmt: skip
    assert run_snakemake(wf, *args).returncode == 0
    before = _case_bytes(wf)
    _change_a_label_voxel(wf, _training_case(wf))
    assert job_counts(run_snakemake(wf, *args, "-n").stdout)["preprocess_case"] == 1
    refused = run_snakemake(wf, *args)
    assert refused.returncode != 0
    said = [ln for ln in refused.stderr.splitlines() if ln.startswith("voxjet: gather_cases")]
    assert said and "were made with an earlier plan" in said[-1], refused.stderr[-3000:]
    assert "Run snakemake again" in said[-1]
    r = run_snakemake(wf, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert job_counts(r.stderr)["preprocess_case"] == len(before) - 1
    after = _case_bytes(wf)
    assert all(before[c] != after[c] for c in before)
