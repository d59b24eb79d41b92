"""Every benchmark still runs (on tiny data): they call voxjet's internals, which change under
them, and a benchmark that no longer starts measures nothing. Only that they run and print
their ratios is checked here; what they measure is for benchmarks/README.md, not for a test."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

CASES = {
    "dag_parse": ["--files", "40", "--cases", "4", "--runs", "4"],
    "data_parallel": ["--tiny", "--steps", "2"],
    "job_prediction": ["--repeats", "1", "--steps", "40"],
    "scale_rehearsal": ["--jets", "4000", "--files", "8", "--pool", "60", "--work", "rehearsal"],
    "jets_training": ["--steps", "21", "--batch", "32", "--particles", "16"],
    # batches small enough that both loader workers get one from a few hundred jets a file
    "jets_io": ["--jets-per-file", "400", "--batch", "128"],
    "io_latency": ["--jets-per-file", "300", "--cases", "4", "--batches", "2"],  # 4: a val case
    "predict": ["--jets", "400"],
    "big_volumes": [
        "--shape",
        "48",
        "48",
        "40",
        "--classes",
        "3",
        "--preprocess",
        "--repeats",
        "1",
        "--mirror",
        "--probabilities",
    ],  # fmt: skip
    "store_quality": ["--seeds", "2", "--steps", "2", "--cases", "5"],
    "sv_gain": ["--jets", "60", "--steps", "3", "--seeds", "1", "--models", "pfn", "--batch", "16"],
    # four cases: the plan's split needs a validation case besides training ones
    "augment": [
        "--cases",
        "4",
        "--shape",
        "40",
        "40",
        "20",
        "--patch",
        "32",
        "32",
        "16",
        "--batches",
        "3",
    ],  # fmt: skip
}


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_runs_on_tiny_data(name, tmp_path):
    if name == "jets_io" and importlib.util.find_spec("weaver") is None:
        pytest.skip("jets_io.py compares against weaver-core: pip install -e '.[bench]'")
    if name == "sv_gain" and importlib.util.find_spec("pythia8mc") is None:
        pytest.skip("sv_gain.py generates Pythia jets: pip install -e '.[pythia]'")
    args = [*CASES[name], *(["--plot", str(tmp_path / "p.png")] if name == "io_latency" else [])]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "target" in r.stdout or "goal" in r.stdout, r.stdout[-2000:]


@pytest.mark.long
@pytest.mark.slow
def test_gpu_benchmark_runs_every_row_on_the_cpu(tmp_path):
    # the script a GPU machine runs once: on the CPU with tiny shapes, every section must
    # still produce its rows (one tagger compiled, to keep the compile time down)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, str(BENCH / "gpu.py"), "--tiny", "--compile-models",
                        "pfn", "--out", str(out)], cwd=tmp_path, env=env, capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    rows = json.loads(out.read_text())
    assert not [x for x in rows if x["section"] == "error"], rows
    names = {x["name"] for x in rows}
    for model in ("pfn", "particlenet", "part"):
        assert f"{model} eager jets/s" in names
    assert "pfn compiled jets/s" in names
    seg = [x for x in rows if x["section"] == "seg"]
    assert len(seg) == 4 and all(x["value"] > 0 for x in seg)
    assert any(x["name"].startswith("DDP step on gloo") for x in rows)
    assert next(x for x in rows if x["section"] == "fail")["value"] == "yes"
