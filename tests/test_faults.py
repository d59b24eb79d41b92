"""An operator's bad day: flipped bytes in intermediate files, a second writer, a SIGKILL of
Snakemake's whole process group, torn log lines, a forced re-stage, a source file replaced, a
killed generator, stale temporaries, a full disk. Each is caught with a message naming the file,
or recovered from, never a silent wrong result."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import BIN, job_counts, run_snakemake, snakemake_env, write_config

from voxjet.errors import VoxjetError

MODEL = {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]}


def flip(path: Path, n: int, where: float = 0.5) -> None:
    """Invert `n` bytes of a file from the fraction `where` of its length on."""
    data = bytearray(path.read_bytes())
    at = int(len(data) * where)
    for i in range(at, min(at + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_a_shard_fail_naming_file_and_jets(shards, tmp_path):
    from voxjet.jets.dataset import load_split
    from voxjet.jets.stream import JetStream

    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    index = json.loads((copy / "index.json").read_text())
    train = copy / index["splits"]["train"]["shards"][0]["file"]
    flip(train, 16)
    with pytest.raises(VoxjetError) as e:
        for _ in JetStream(copy, "train", 16, seed=1).at(0, 0):
            pass
    msg = str(e.value)
    assert train.name in msg and "failed its checksum" in msg and "rerun shard_jets" in msg
    test = copy / index["splits"]["test"]["shards"][0]["file"]
    flip(test, 16, 0.6)
    with pytest.raises(VoxjetError, match=rf"{test.name}: test jets .* failed its checksum"):
        load_split(copy, "test")


@pytest.mark.parametrize("storage", ["mapped", "compressed", "blosc2"])
def test_flipped_bytes_in_a_case_file_fail_naming_the_case(tmp_path, storage):
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset
    from voxjet.volumes.preprocessing.store import CaseStore
    from voxjet.volumes.training.patches import PatchSampler

    generate_dataset(tmp_path / "msd", ToyVolumesConfig(train_cases=4, test_cases=0,
                     min_shape=(40, 40, 16), max_shape=(44, 44, 18)), progress=False)  # fmt: skip
    (tmp_path / "m.json").write_text(json.dumps({"root": str(tmp_path / "msd")}))
    plan = preprocess_dataset(tmp_path / "m.json", tmp_path / "cases", VolumePrepConfig(
        patch_size=[16, 16, 8], val_fraction=0.25, test_fraction=0.0, storage=storage))  # fmt: skip
    ids = sorted(p.stem for p in (tmp_path / "cases").glob("*.h5"))
    for n in (16, 4096):
        victim = tmp_path / "cases" / f"{ids[0]}.h5"
        original = victim.read_bytes()
        flip(victim, n, 0.4)
        store = CaseStore(tmp_path / "cases", ids[:1])
        sampler = PatchSampler(store, plan.patch_size, 2, 0.5, 0, augment=False)
        with pytest.raises(VoxjetError) as e:
            for i in range(20):  # patches over the case touch every chunk soon
                store.cache = type(store.cache)(0)  # no cache: every read decodes
                sampler.batch(0, 0, i)
            store.volumes(ids[0])[0].read((0, 0, 0, 0), store.volumes(ids[0])[0].shape)
        assert f"{ids[0]}.h5" in str(e.value) and "rerun preprocess_case" in str(e.value)
        if storage == "blosc2":  # the region: the array and the voxels of the damaged chunk
            region = r"(image channel 0|label) voxels \[\d+-\d+, \d+-\d+, \d+-\d+\]"
            assert re.search(region, str(e.value))
        store.close()
        # evaluation and validation read whole cases: verified as well
        from voxjet.volumes.preprocessing.store import read_case_arrays

        with pytest.raises(VoxjetError, match=rf"{ids[0]}\.h5: .*rerun preprocess_case"):
            with h5py.File(victim) as f:
                read_case_arrays(f)
        victim.write_bytes(original)


def test_a_damaged_checkpoint_is_refused_naming_it(shards, tmp_path):
    from voxjet.distributed import checkpoint
    from voxjet.jets.train import run

    run(str(shards), {"model": MODEL, "train": {"steps": 4, "batch_size": 32}}, str(tmp_path))
    model = tmp_path / "model.pt"
    checkpoint.load_file(model)  # intact: loads
    flip(model, 16, 0.7)
    with pytest.raises(VoxjetError, match=r"model\.pt: its content does not match the checksum"):
        checkpoint.load_file(model)


def _train_cmd(shards, out, steps: int, *launch: str) -> list[str]:
    cfg = {"model": MODEL, "train": {"steps": steps, "batch_size": 32, "checkpoint_every": 20}}
    train = ["train-jets", "--shards", str(shards), "--run-config", json.dumps(cfg),
             "--out", str(out)]  # fmt: skip
    return [str(BIN / "voxjet"), *(["launch", *launch, "--"] if launch else []), *train]


def test_a_second_trainer_on_the_same_run_folder_refuses(shards, tmp_path):
    from voxjet.io.lock import RunLock

    lock = RunLock(tmp_path).acquire()  # a training job of this host is writing the run
    try:
        r = subprocess.run(_train_cmd(shards, tmp_path, 10), env=snakemake_env(),
                           capture_output=True, text=True)  # fmt: skip
    finally:
        lock.release()
    assert r.returncode == 2
    assert "another training job is writing this run" in r.stderr
    assert f"PID {os.getpid()}" in r.stderr
    assert not (tmp_path / "checkpoints").exists()


def _voxjet_processes(marker: str) -> list:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in a for a in p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_sigkill_of_the_snakemake_group_leaves_no_training_process(workflow_dir, shards, tmp_path):
    """Snakemake's whole process group killed mid-training (what a killed terminal or batch job
    does): torchrun and its training processes die with the launcher within seconds."""
    cfg = {
        "datasets": {"prep": {"domain": "jets", "source": {"prepared": str(shards)}}},
        "experiments": {
            "orphan-test": {
                "dataset": "prep",
                "model": MODEL,
                "train": {"steps": 10**6, "batch_size": 32, "checkpoint_every": 50},
                "launch": {"gpus": 0, "cpu_processes": 2, "threads": 2},
            }
        },
    }
    path = write_config(tmp_path / "c.yaml", cfg)
    proc = subprocess.Popen(
        [str(BIN / "snakemake"), "--configfile", str(path), "--replace-workflow-config",
         "results/prep/runs/orphan-test/model.pt"],
        cwd=workflow_dir, env=snakemake_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    marker = "runs/orphan-test"
    last = workflow_dir / "results" / "prep" / "runs" / "orphan-test" / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while not last.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert last.exists(), "training never started"
    assert len(_voxjet_processes(marker)) >= 3  # launch, torchrun, 2 training processes
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while _voxjet_processes(marker) and time.time() < deadline:
        time.sleep(0.2)
    left = _voxjet_processes(marker)
    for p in left:
        p.kill()
    assert not left, [p.info["cmdline"][:4] for p in left]


def test_torn_metrics_line_resumes_and_a_garbage_line_names_file_and_line(shards, tmp_path):
    from voxjet.distributed.runtime import init_runtime
    from voxjet.jets.train import JetTask
    from voxjet.report.aggregate import aggregate
    from voxjet.report.runs import RunInfo
    from voxjet.training.loop import train
    from voxjet.training.task import TrainSettings

    def go(steps: int) -> None:
        s = TrainSettings(steps=steps, batch_size=32, log_every=5, checkpoint_every=10,
                          schedule_steps=40)  # fmt: skip
        train(JetTask(shards, MODEL, s), s, tmp_path, init_runtime("cpu"))

    go(10)
    log = tmp_path / "checkpoints" / "metrics.jsonl"
    with open(log, "a") as f:
        f.write('{"step": 12, "loss": 0.4')  # a write cut by a kill: no newline
    go(20)  # the run continues (steps raised), dropping the torn line
    steps = [json.loads(x)["step"] for x in log.read_text().splitlines()]
    assert steps == sorted(steps) and 12 not in steps
    lines = log.read_text().splitlines()
    lines.insert(2, "garbage, not JSON")
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(VoxjetError, match=rf"{log}, line 3: not a metrics record"):
        go(30)
    final = tmp_path / "metrics.jsonl"
    final.write_text(final.read_text() + "{oops\n")
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "metrics.json").write_text(json.dumps({"auc_macro": 0.9}))
    run = RunInfo("d", "jets", "e", "r", str(tmp_path / "eval" / "metrics.json"), str(final))
    with pytest.raises(VoxjetError, match=rf"{final}, line \d+: not a metrics record"):
        aggregate([run], tmp_path / "summary")


def test_forced_restage_copies_nothing_already_verified(tmp_path, monkeypatch, capsys):
    import voxjet.stage.transfer as transfer

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.root").write_bytes(os.urandom(2000))
    transfer.stage(str(src), tmp_path / "data", tmp_path / "manifest.json")
    (tmp_path / "manifest.json").unlink()  # what Snakemake does before `--forcerun stage`

    def no_copy(*a, **k):
        raise AssertionError("a verified file was copied again")

    monkeypatch.setattr(transfer, "_copy_verified", no_copy)
    capsys.readouterr()
    m = transfer.stage(str(src), tmp_path / "data", tmp_path / "manifest.json")
    assert len(m["files"]) == 3 and "0 of 3 files copied" in capsys.readouterr().err
    monkeypatch.undo()
    (src / "f1.root").write_bytes(os.urandom(2000))  # the user fixes one file
    transfer.stage(str(src), tmp_path / "data", tmp_path / "manifest.json")
    assert "1 of 3 files copied" in capsys.readouterr().err
    assert (tmp_path / "data" / "f1.root").read_bytes() == (src / "f1.root").read_bytes()


def test_a_replaced_source_file_restages_only_its_dataset(workflow_dir, tmp_path):
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset

    for name, seed in (("a", 1), ("b", 2)):
        generate_dataset(tmp_path / name, ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=1,
                         jets_per_file=50, seed=seed), progress=False)  # fmt: skip
    cfg = {
        "datasets": {n: {"domain": "jets", "source": {"path": str(tmp_path / n)}} for n in "ab"},
        "experiments": {},
    }
    path = write_config(tmp_path / "c.yaml", cfg)
    targets = ["resources/a/manifest.json", "resources/b/manifest.json"]
    base = ["--configfile", str(path), "--replace-workflow-config"]
    first = run_snakemake(workflow_dir, *base, *targets)
    assert first.returncode == 0, first.stderr[-3000:]
    # replaced by a file with an older modification time: Snakemake's mtime check looks away
    old = (tmp_path / "a" / "Wqq_000.root").stat().st_mtime - 3600
    generate_dataset(tmp_path / "new", ToyJetsConfig(classes=["Wqq"], files_per_class=1,
                     jets_per_file=60, seed=9), progress=False)  # fmt: skip
    shutil.copy(tmp_path / "new" / "Wqq_000.root", tmp_path / "a" / "Wqq_000.root")
    os.utime(tmp_path / "a" / "Wqq_000.root", (old, old))
    dry = run_snakemake(workflow_dir, *base, "-n", "-p", *targets)
    assert job_counts(dry.stdout) == {"stage": 1}, dry.stdout[-2000:]
    assert "--dest resources/a/data" in dry.stdout
    again = run_snakemake(workflow_dir, *base, *targets)
    assert again.returncode == 0, again.stderr[-3000:]
    log = (workflow_dir / "logs" / "stage" / "a.log").read_text()
    assert "1 of 2 files copied" in log
    manifest = json.loads((workflow_dir / "resources" / "a" / "manifest.json").read_text())
    assert {f["path"]: f["entries"] for f in manifest["files"]}["Wqq_000.root"] == 60


def test_a_killed_generator_leaves_no_folder_that_passes_for_complete(tmp_path, monkeypatch):
    import voxjet.jets.synth as synth
    from voxjet.cli import main

    real, made = synth.generate_file, []

    def dies_second(path, *a, **k):
        if made:
            raise KeyboardInterrupt  # as a kill mid-way would stop it
        made.append(path)
        return real(path, *a, **k)

    monkeypatch.setattr(synth, "generate_file", dies_second)
    with pytest.raises(KeyboardInterrupt):
        main(["synth-jets", "--out", str(tmp_path / "raw"), "--generator", "toy"])
    assert made and not (tmp_path / "raw").exists()
    assert not list(tmp_path.iterdir())  # the temporary folder went with it


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    from voxjet.io.atomic import HOST, atomic_path

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        stale = tmp_path / f".part_0001.tmp-{HOST}-{dead}"
        stale.mkdir()
        (stale / "shard.h5").write_bytes(b"x" * 1000)
        live = tmp_path / f".toy.h5.tmp-{HOST}-{sleeper.pid}"
        other_host = tmp_path / f".figures.tmp-elsewhere.example-{dead}"
        live.write_bytes(b"x")
        other_host.mkdir()
        with atomic_path(tmp_path / "index.json") as tmp:
            tmp.write_text("{}")
        assert not stale.exists()  # a dead writer's leftovers
        assert live.exists() and other_host.exists()  # a live writer's; another host's
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs where the machine allows mounting one (root), else a folder whose writes
    fail with ENOSPC (the same errors the libraries see on a full disk)."""
    mount = tmp_path / "small"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                       capture_output=True)  # fmt: skip
    yield mount, r.returncode == 0
    if r.returncode == 0:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)  # lazy: never busy


def test_a_full_disk_is_named_with_the_path(small_disk, monkeypatch):
    from voxjet.distributed import checkpoint
    from voxjet.io.atomic import atomic_path

    folder, real = small_disk
    if not real:  # no tmpfs here: the writes below fail as on a full disk

        def full(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(torch, "save", full)
        monkeypatch.setattr(np, "save", full)
    state = {"model": {"w": torch.zeros(1_000_000)}}  # 4 MB: more than the disk
    with pytest.raises(VoxjetError) as e:
        checkpoint.save(folder / "run" / "last.pt", state)
    assert f"{folder / 'run' / 'last.pt'}: no space left on device" in str(e.value)
    with pytest.raises(VoxjetError) as e, atomic_path(folder / "big.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, np.zeros(1_000_000))
    assert f"{folder / 'big.npy'}: no space left on device" in str(e.value)
    assert not [p for p in folder.rglob("*") if p.is_file()]  # nothing half-written kept
