"""Node-local copies (`read.node_local`): a training job reads only its copy, verified and made
once a node however many processes read it, removed after the job unless kept; a folder that
is too small or a variable the node does not set is refused, naming it."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from voxjet.errors import VoxjetError
from voxjet.io import node_local as nl


def _files(root: Path) -> dict[str, bytes]:
    """The data files under `root` (not the copy's own bookkeeping, dot-named)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            out[str(rel)] = p.read_bytes()
    return out


def test_a_training_job_reads_only_its_node_local_copy(shards, tmp_path, monkeypatch):
    from voxjet.jets.train import run

    src = tmp_path / "shared" / "shards"
    shutil.copytree(shards, src)
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path / "node"))
    real_fill, hidden = nl._fill, tmp_path / "hidden"

    def fill_then_hide_the_source(*args):
        real_fill(*args)
        src.rename(hidden)  # from here on, only the copy can be read

    monkeypatch.setattr(nl, "_fill", fill_then_hide_the_source)
    cfg = {
        "model": {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]},
        "train": {"steps": 6, "batch_size": 32, "eval_every": 3, "checkpoint_every": 3},
    }
    run(str(src), cfg, str(tmp_path / "run"), read={"node_local": "$SLURM_TMPDIR"})
    assert (tmp_path / "run" / "model.pt").is_file()
    assert not list((tmp_path / "node" / "voxjet").glob("*/index.json"))  # removed after


def test_one_copy_a_node_made_once_and_kept_when_asked(shards, tmp_path, monkeypatch):
    fills = []
    real_fill = nl._fill
    monkeypatch.setattr(nl, "_fill", lambda *a: (fills.append(1), real_fill(*a)))
    seen, barrier = [], threading.Barrier(2)

    def reader():
        with nl.node_local(str(shards), str(tmp_path / "node"), keep=True) as where:
            barrier.wait()  # both inside at once: one copy serves both
            seen.append(_files(Path(where)))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fills) == 1 and len(seen) == 2
    assert seen[0] == seen[1] == _files(shards)
    # kept: the next job on the node copies nothing; without keep, the last one out removes it
    with nl.node_local(str(shards), str(tmp_path / "node")) as where:
        assert Path(where).is_dir()
    assert len(fills) == 1 and not Path(where).exists()


def test_a_node_local_folder_too_small_or_unset_is_refused(shards, tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_TMPDIR", raising=False)
    with pytest.raises(VoxjetError, match=r"'\$NO_SUCH_TMPDIR/x' names a variable this node "
                       r"does not set"):  # fmt: skip
        with nl.node_local(str(shards), "$NO_SUCH_TMPDIR/x"):
            pass
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(nl.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(VoxjetError, match=r"read\.node_local: copying .* needs 0\.\d+ GiB, but "
                       r".*node has 0\.00 GiB free"):  # fmt: skip
        with nl.node_local(str(shards), str(tmp_path / "node")):
            pass
    assert not list((tmp_path / "node" / "voxjet").glob("*/*"))  # nothing half-copied


def test_a_copy_that_does_not_match_its_source_is_refused(shards, tmp_path, monkeypatch):
    real_open = open

    def corrupting_open(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        if "w" in mode and str(path).endswith(".part"):
            real_write = f.write
            f.write = lambda b: real_write(bytes(b[:-1]) + b"\x00" if len(b) else b)
        return f

    monkeypatch.setattr("builtins.open", corrupting_open)
    with pytest.raises(VoxjetError, match=r"node-local copy .* does not match it"):
        with nl.node_local(str(shards), str(tmp_path / "node")):
            pass
