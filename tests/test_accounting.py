"""What a run cost: fake NVML, fake sacct and fake RAPL counters feed the meter, the numbers flow
into metrics.jsonl, metrics.csv and summary.md; where nothing measures energy it is missing
with the reason, and a broken source never stops training."""

from __future__ import annotations

import csv
import os
import sys
import types

import pytest
import torch

from voxjet.report.aggregate import aggregate
from voxjet.report.runs import RunInfo
from voxjet.training import accounting
from voxjet.training.accounting import Session, add_session, combine_ranks, summary


def _fake_nvml(monkeypatch, energy_mj: list[int], util: list[int]) -> None:
    """A pynvml whose energy counter and utilisation answer from the lists, in turn."""
    mod = types.ModuleType("pynvml")
    e, u = iter(energy_mj), iter(util)
    mod.nvmlInit = lambda: None
    mod.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"
    mod.nvmlDeviceGetTotalEnergyConsumption = lambda h: next(e)
    mod.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=next(u), memory=0)
    monkeypatch.setitem(sys.modules, "pynvml", mod)


def _fake_sacct(tmp_path, monkeypatch, body: str, job: str = "4242") -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "sacct"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", job)


def _rapl(root, uj: int, wrap: int = 2**32) -> None:
    for zone in ("intel-rapl:0", "intel-rapl:1"):
        (root / zone).mkdir(parents=True, exist_ok=True)
        (root / zone / "energy_uj").write_text(str(uj))
        (root / zone / "max_energy_range_uj").write_text(str(wrap))
    (root / "intel-rapl:0:0").mkdir(exist_ok=True)  # a sub-zone: inside its package's count


def test_nvml_energy_and_utilisation_are_differences_and_means(monkeypatch):
    _fake_nvml(monkeypatch, [5_000_000, 5_900_000], [40, 80])
    meter = accounting.NvmlEnergy(0)
    meter.sample_utilisation()
    meter.sample_utilisation()
    assert meter.joules() == pytest.approx(900.0)  # mJ counter: 900 J since the start
    assert meter.util == [0.4, 0.8]


def test_gpu_ranks_add_energy_and_device_time_and_keep_the_largest_peak():
    def snap(wall, peak, joules):
        return {"wall_s": wall, "gpu": True, "devices": 1, "peak_memory_bytes": peak,
                "utilisation": 0.5, "energy_j": joules, "energy_source": "nvml",
                "energy_missing": ""}  # fmt: skip

    s = combine_ranks([snap(3600, 2e9, 1e5), snap(3590, 3e9, 2e5)])
    assert s["wall_s"] == 3600 and s["device_s"] == 7190 and s["peak_memory_bytes"] == 3e9
    assert s["energy_j"] == 3e5 and s["device_kind"] == "gpu"
    both = add_session(add_session(None, s), s)
    out = summary(both, estimate_bytes=4e9)
    assert out["sessions"] == 2 and out["device_hours"] == pytest.approx(2 * 7190 / 3600)
    assert out["energy_kwh"] == pytest.approx(6e5 / 3.6e6) and out["energy_source"] == "nvml"
    assert out["peak_over_estimate"] == pytest.approx(0.75)


def test_a_session_without_energy_makes_the_runs_energy_missing_not_smaller():
    measured = {"wall_s": 10, "device_s": 10, "device_kind": "gpu", "devices": 1,
                "peak_memory_bytes": 1, "utilisation": 0.5, "energy_j": 500.0,
                "energy_source": "nvml"}  # fmt: skip
    unmeasured = {**measured, "energy_j": None, "energy_source": "",
                  "energy_missing": "NVML gave no energy (NVMLError: Not Supported)"}  # fmt: skip
    out = summary(add_session(add_session(None, measured), unmeasured))
    assert out["energy_kwh"] is None
    assert out["energy_missing"] == "session 2: NVML gave no energy (NVMLError: Not Supported)"


def test_sacct_energy_of_the_job_under_slurm(tmp_path, monkeypatch):
    _fake_sacct(tmp_path, monkeypatch, 'echo "4242|183500"; echo "4242.batch|183000"')
    s = Session.start(torch.device("cpu"), main=True, rapl_root=tmp_path / "none")
    snap = s.snapshot(torch.device("cpu"))
    assert (snap["energy_j"], snap["energy_source"]) == (183500.0, "sacct")
    assert snap["peak_memory_bytes"] > 10 * 2**20 and 0 <= snap["utilisation"] <= 1
    assert snap["devices"] == torch.get_num_threads()


@pytest.mark.parametrize(
    "body,why",
    [
        ("echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1",
         "sacct -j 4242 failed: sacct: error: Slurm accounting storage is disabled"),
        ("echo '4242|'", "records no ConsumedEnergy"),
        ("echo 'garbage'", "unreadable line 'garbage'"),
        ("echo '4242|12.5K'", "ConsumedEnergyRaw '12.5K' is no number"),
    ],
)  # fmt: skip
def test_unreadable_sacct_leaves_energy_missing_with_the_reason(tmp_path, monkeypatch, body, why):
    _fake_sacct(tmp_path, monkeypatch, body)
    s = Session.start(torch.device("cpu"), main=True, rapl_root=tmp_path / "none")
    snap = s.snapshot(torch.device("cpu"))
    assert snap["energy_j"] is None and why in snap["energy_missing"]
    assert "no GPU, so no NVML" in snap["energy_missing"]


def test_rapl_counters_wrap_once_and_count_only_on_one_node(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    _rapl(tmp_path, 2**32 - 1_000_000, wrap=2**32)
    s = Session.start(torch.device("cpu"), main=True, rapl_root=tmp_path)
    _rapl(tmp_path, 2_000_000, wrap=2**32)
    snap = s.snapshot(torch.device("cpu"))
    assert snap["energy_source"] == "rapl" and snap["energy_j"] == pytest.approx(2 * 3.0)
    two_nodes = Session.start(torch.device("cpu"), main=True, nodes=2, rapl_root=tmp_path)
    assert "RAPL reads one node of 2" in two_nodes.snapshot(torch.device("cpu"))["energy_missing"]


def _run_info(tmp_path, name, cost):
    d = tmp_path / name
    (d / "eval").mkdir(parents=True)
    (d / "eval" / "metrics.json").write_text('{"accuracy": 0.8, "auc_macro": 0.9}')
    lines = ['{"step": 10, "loss": 0.5, "jets_per_s": 100, "data_wait_fraction": 0.1}']
    if cost is not None:
        import json

        lines.append(json.dumps({"step": 10, "cost": cost}))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return RunInfo("ds", "jets", "pfn", name, str(d / "eval" / "metrics.json"),
                   str(d / "metrics.jsonl"))  # fmt: skip


def test_costs_flow_to_metrics_csv_and_beside_the_auc_in_summary(tmp_path):
    gpu = summary(add_session(None, {
        "wall_s": 1800, "device_s": 4 * 1800, "device_kind": "gpu", "devices": 4,
        "peak_memory_bytes": 2 * 2**30, "utilisation": 0.9, "energy_j": 3.6e6,
        "energy_source": "nvml"}))  # fmt: skip
    cpu = summary(add_session(None, {
        "wall_s": 3600, "device_s": 2 * 3600, "device_kind": "cpu_core", "devices": 2,
        "peak_memory_bytes": 2**30, "utilisation": 0.7, "energy_j": None, "energy_source": "",
        "energy_missing": "no GPU, so no NVML; not a SLURM job, so no sacct"}))  # fmt: skip
    runs = [_run_info(tmp_path, "a", gpu), _run_info(tmp_path, "b", cpu),
            _run_info(tmp_path, "old", None)]  # fmt: skip
    aggregate(runs, tmp_path / "summary")
    rows = list(csv.DictReader(open(tmp_path / "summary" / "metrics.csv")))
    val = {(r["run"], r["metric"]): (float(r["value"]), r["note"]) for r in rows
           if r["split"] == "cost"}  # fmt: skip
    assert val[("a", "device_hours")] == (2.0, "GPU-hours")
    assert val[("a", "energy_kwh")] == (1.0, "from nvml")
    assert val[("b", "device_hours")] == (2.0, "CPU core-hours")
    e, note = val[("b", "energy_kwh")]
    assert e != e and note == "not measured: no GPU, so no NVML; not a SLURM job, so no sacct"
    assert val[("b", "peak_memory_gib")] == (1.0, "")
    assert not [k for k in val if k[0] == "old"]
    md = (tmp_path / "summary" / "summary.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| rank"))
    assert head.endswith("| device_hours | energy_kwh | peak_memory_gib |")
    row_a = next(line for line in md.splitlines() if line.startswith("| 1 | a "))
    assert row_a.endswith("| 2 | 1 | 2 |")
    assert "Energy not measured: no GPU, so no NVML; not a SLURM job, so no sacct" in md
