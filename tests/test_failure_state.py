"""After a failure the workflow never looks finished: each fault of an operator's bad day, run
as a user would (the same `snakemake` twice), fails again with its message on the second run
instead of "Nothing to be done" over results built from data that is no longer there; undone,
a third run completes with a clean run's results. Duplicate sources are refused naming both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import awkward as ak
import numpy as np
import pytest
import uproot
from conftest import JETS, copy_workflow, run_snakemake, write_config
from conftest import JETS_ARGS as ARGS

pytestmark = pytest.mark.slow

EVAL = Path("results/j/runs/pfn/eval/metrics.json")


@pytest.fixture
def wf(finished_jets, tmp_path) -> Path:
    """A copy of the finished workflow (times kept, Snakemake's records with it)."""
    return Path(shutil.copytree(finished_jets, tmp_path / "wf", symlinks=True))


def _rewrite(path: Path, change) -> None:
    """The file's tree read, `change`d (a dict of branches to a dict) and written back."""
    with uproot.open(path) as f:
        arrays = f["tree"].arrays(library="ak")
    fields = change({k: arrays[k] for k in arrays.fields})
    with uproot.recreate(path) as f:
        f.mktree("tree", {k: v.type for k, v in fields.items()}).extend(fields)


def _poison(branch: str, value: float):
    def change(fields):
        flat = ak.to_numpy(ak.flatten(fields[branch])).copy()
        flat[11] = value
        fields[branch] = ak.unflatten(flat, ak.num(fields[branch]))
        return fields

    return change


def _nan_in_part_deta(wf: Path) -> None:
    _rewrite(wf / "src" / "Wqq_001.root", _poison("part_deta", np.nan))


def _inf_in_part_px(wf: Path) -> None:
    _rewrite(wf / "src" / "QCD_000.root", _poison("part_px", np.inf))


def _label_branch_dropped(wf: Path) -> None:
    _rewrite(wf / "src" / "Wqq_000.root",
             lambda fields: {k: v for k, v in fields.items() if k != "label_Wqq"})  # fmt: skip


def _empty_file_added(wf: Path) -> None:
    shutil.copy(wf / "src" / "QCD_000.root", wf / "src" / "QCD_002.root")
    _rewrite(wf / "src" / "QCD_002.root", lambda fields: {k: v[:0] for k, v in fields.items()})


def _truncated_copy(wf: Path) -> None:
    p = wf / "src" / "Wqq_001.root"
    p.write_bytes(p.read_bytes()[:20000])


def _twice(wf: Path, *extra: str):
    """The run that meets the fault, then the same `snakemake` again."""
    first = run_snakemake(wf, *ARGS, *extra)
    second = run_snakemake(wf, *ARGS)
    return first, second


def _message(result, rule: str) -> str:
    """The failed job's voxjet error, as the console's last line says it (`voxjet: RULE failed
    (LOG): MESSAGE`, from the job's log)."""
    assert result.returncode != 0, result.stderr[-3000:]
    assert f"Error in rule {rule}:" in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"voxjet: {rule} failed ("), result.stderr[-3000:]
    return last.split("): ", 1)[1]


@pytest.mark.parametrize(
    "fault,rule,words",
    [
        (_truncated_copy, "stage", "Wqq_001.root: truncated ROOT file"),
        (_nan_in_part_deta, "shard_jets", "'part_deta' holds NaN/inf"),
        (_inf_in_part_px, "shard_jets", "'part_px' holds NaN/inf"),
        (_label_branch_dropped, "shard_jets", "label_Wqq"),
        (_empty_file_added, "shard_jets", "QCD_002.root"),
    ],
)
@pytest.mark.long
def test_a_bad_source_fails_the_second_run_too(wf, fault, rule, words):
    original = {p.name: p.read_bytes() for p in (wf / "src").iterdir()}
    fault(wf)
    first, second = _twice(wf)
    message = _message(first, rule)
    assert words in message, message
    assert _message(second, rule) == message  # not "Nothing to be done" over the old summary
    if fault in (_truncated_copy, _nan_in_part_deta):  # undone: a clean run's results
        expected = json.loads((wf / EVAL).read_text())
        for name, data in original.items():
            (wf / "src" / name).write_bytes(data)
        third = run_snakemake(wf, *ARGS)
        assert third.returncode == 0, third.stderr[-3000:]
        assert json.loads((wf / EVAL).read_text()) == expected
        assert "Nothing to be done" in run_snakemake(wf, *ARGS, "-n").stdout


@pytest.mark.long
def test_flipped_bytes_in_a_train_shard_fail_the_second_run_too(wf):
    from test_faults import flip

    shard = sorted((wf / "results/j/shards/part_0000").glob("train*.h5"))[0]
    original = shard.read_bytes()
    flip(shard, 16, 0.6)
    first, second = _twice(wf, "--forcerun", "train_jets")
    message = _message(first, "train_jets")
    assert shard.name in message, message
    dry = run_snakemake(wf, *ARGS, "-n")
    assert (
        dry.returncode == 0
        and "train_jets" in dry.stdout
        and "Nothing to be done" not in (dry.stdout)
    )
    assert _message(second, "train_jets") == message
    expected = json.loads((wf / EVAL).read_text())
    shard.write_bytes(original)
    third = run_snakemake(wf, *ARGS)
    assert third.returncode == 0, third.stderr[-3000:]
    assert json.loads((wf / EVAL).read_text()) == expected


def test_a_failure_survives_clearing_snakemakes_and_voxjets_folders(wf):
    """After a failed shard job, `rm -rf .snakemake .voxjet` (what users do to clear a stale
    lock) and a plain `snakemake`: the failure is still there (the states live beside the
    outputs), so the run fails again instead of "Nothing to be done" over the old results."""
    _nan_in_part_deta(wf)
    first = run_snakemake(wf, *ARGS)
    message = _message(first, "shard_jets")
    for hidden in (".snakemake", ".voxjet"):
        shutil.rmtree(wf / hidden, ignore_errors=True)
    second = run_snakemake(wf, *ARGS)
    assert second.returncode != 0
    assert _message(second, "shard_jets") == message


def test_a_source_file_present_twice_is_refused_naming_both(wf):
    shutil.copy(wf / "src" / "QCD_000.root", wf / "src" / "QCD_007.root")
    r = run_snakemake(wf, *ARGS)
    message = _message(r, "stage")
    assert "QCD_000.root and QCD_007.root have the same content" in message, message
    assert "source.on_duplicate: skip" in message
    cfg = json.loads(json.dumps(JETS))
    cfg["datasets"]["j"]["source"]["on_duplicate"] = "skip"
    write_config(wf / "c.yaml", cfg)
    r = run_snakemake(wf, *ARGS)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((wf / "resources/j/manifest.json").read_text())
    assert manifest["duplicates"] == [{"path": "QCD_007.root", "same_as": "QCD_000.root"}]
    assert "QCD_007.root" not in {f["path"] for f in manifest["files"]}
    log = (wf / "logs/stage/j.log").read_text()
    assert "1 files left out as duplicates of others: QCD_007.root (= QCD_000.root)" in log


@pytest.mark.long
def test_flipped_bytes_in_a_case_file_fail_the_second_run_too(tmp_path):
    from test_faults import flip

    wf = copy_workflow(tmp_path / "wf")
    cfg = {
        "datasets": {
            "ct": {
                "domain": "volumes",
                "source": {"synthetic": {"train_cases": 4, "test_cases": 0}},
                "volumes": {"patch_size": [16, 16, 8], "network_depth": 2,
                            "val_fraction": 0.25, "test_fraction": 0.25},
            }
        },
        "experiments": {
            "unet": {
                "dataset": "ct",
                "model": {"name": "unet", "channels": [4, 8], "num_res_units": 0},
                "train": {"steps": 4, "eval_every": 2, "batch_size": 2},
                "launch": {"gpus": 0, "threads": 1},
            }
        },
    }  # fmt: skip
    write_config(wf / "c.yaml", cfg)
    # trained (its evaluation and the summary add nothing here)
    assert run_snakemake(wf, *ARGS, "results/ct/runs/unet/model.pt").returncode == 0
    splits = json.loads((wf / "results/ct/cases/splits.json").read_text())
    victim = wf / "results/ct/cases" / f"{splits['train'][0]}.h5"
    flip(victim, 4096, 0.4)
    first, second = _twice(wf, "--forcerun", "train_seg")
    message = _message(first, "train_seg")
    assert victim.name in message and "rerun preprocess_case" in message, message
    assert _message(second, "train_seg") == message
