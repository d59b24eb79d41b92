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
    "jets_training": ["--steps", "21", "--batch", "32", "--particles", "16"],
    "jets_io": ["--jets-per-file", "400"],
    "io_latency": ["--jets-per-file", "300", "--cases", "4", "--batches", "2"],  # 4: a val case
    "predict": ["--jets", "400"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_runs_on_tiny_data(name, tmp_path):
    if name == "jets_io" and importlib.util.find_spec("weaver") is None:
        pytest.skip("jets_io.py compares against weaver-core: pip install -e '.[bench]'")
    args = [*CASES[name], *(["--plot", str(tmp_path / "p.png")] if name == "io_latency" else [])]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "target" in r.stdout or "goal" in r.stdout, r.stdout[-2000:]
