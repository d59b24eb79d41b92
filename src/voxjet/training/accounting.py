"""What a training run cost: wall time, device-hours (GPUs × time, or CPU cores × time), peak
memory of a device, its utilisation and energy, summed over the sessions the run took (resumes,
requeues). Energy comes only from something that measures it: NVML's energy counter on GPUs,
SLURM's `sacct` ConsumedEnergy for the job, or RAPL counters on a single node. Where none
does, it is missing and the record says why: never estimated."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RAPL_ROOT = Path("/sys/class/powercap")


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# ---- energy sources ---------------------------------------------------------------------------


class NvmlEnergy:
    """Energy of one GPU from NVML's total-energy counter (millijoules since the driver
    loaded), and its utilisation sampled when asked."""

    def __init__(self, index: int) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.start = pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        self.util: list[float] = []

    def joules(self) -> float:
        """Energy the GPU used since this meter started."""
        return (self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) - self.start) / 1e3

    def sample_utilisation(self) -> None:
        """One reading of the fraction of time a kernel ran (NVML's GPU utilisation)."""
        self.util.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0)


def rapl_counters(root: Path = RAPL_ROOT) -> dict[Path, tuple[int, int]]:
    """(energy µJ, wrap range µJ) of each readable CPU package counter (intel-rapl:N)."""
    out = {}
    for zone in sorted(root.glob("intel-rapl:[0-9]*")):
        if zone.name.count(":") != 1:
            continue  # sub-zones (core, dram) are inside the package's count
        try:
            out[zone] = (int((zone / "energy_uj").read_text()),
                         int((zone / "max_energy_range_uj").read_text()))  # fmt: skip
        except (OSError, ValueError):
            return {}
    return out


def rapl_joules(before: dict[Path, tuple[int, int]], after: dict[Path, tuple[int, int]]) -> float:
    """Energy between two readings of the package counters, each allowed to wrap once."""
    total = 0
    for zone, (e0, wrap) in before.items():
        e1 = after[zone][0]
        total += e1 - e0 if e1 >= e0 else e1 + wrap - e0
    return total / 1e6


def sacct_joules(job_id: str) -> tuple[float | None, str]:
    """ConsumedEnergyRaw (joules) SLURM has recorded for the job so far, or None and why."""
    try:
        out = subprocess.run(
            ["sacct", "-j", job_id, "--noheader", "--parsable2",
             "--format=JobID,ConsumedEnergyRaw"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"sacct could not run ({e})"
    if out.returncode != 0:
        return None, f"sacct -j {job_id} failed: {out.stderr.strip()[:200]}"
    values = []
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2:
            return None, f"sacct -j {job_id}: unreadable line {line[:80]!r}"
        if parts[0] == job_id and parts[1].strip():
            try:
                values.append(float(parts[1]))
            except ValueError:
                return None, f"sacct -j {job_id}: ConsumedEnergyRaw {parts[1][:40]!r} is no number"
    if not values or max(values) <= 0:
        return None, (f"sacct -j {job_id} records no ConsumedEnergy (the cluster gathers none: "
                      "AcctGatherEnergyType)")  # fmt: skip
    return max(values), ""


# ---- one session ------------------------------------------------------------------------------


@dataclass
class Session:
    """One process's share of one session: what it measured since it started."""

    gpu: bool
    cores: int  # CPU threads the process computes with (its device count on CPU)
    main: bool  # rank 0: reads the job-wide energy sources
    nodes: int = 1
    t0: float = field(default_factory=time.monotonic)
    cpu0: float = field(default_factory=_cpu_seconds)
    nvml: NvmlEnergy | None = None
    rapl0: dict = field(default_factory=dict)
    rapl_root: Path = RAPL_ROOT
    why_not: list[str] = field(default_factory=list)
    items: int = 0  # items (jets, patches) trained on by all ranks together in this session

    @classmethod
    def start(cls, device: Any, main: bool, nodes: int = 1, rapl_root: Path = RAPL_ROOT) -> Session:
        """Start measuring on this process (device: its torch.device)."""
        import torch

        gpu = getattr(device, "type", "cpu") == "cuda"
        s = cls(gpu=gpu, cores=torch.get_num_threads(), main=main, nodes=nodes,
                rapl_root=rapl_root)  # fmt: skip
        if gpu:
            torch.cuda.reset_peak_memory_stats(device)
            try:
                s.nvml = NvmlEnergy(device.index or 0)
            except Exception as e:  # no nvidia-ml-py, or a driver without the counter
                s.why_not.append(f"NVML gave no energy ({type(e).__name__}: {e})")
        else:
            s.why_not.append("no GPU, so no NVML")
        if main and s.nvml is None:
            s.rapl0 = rapl_counters(rapl_root)
            if not s.rapl0:
                s.why_not.append(f"RAPL counters not readable under {rapl_root}")
            elif nodes > 1:
                s.rapl0 = {}
                s.why_not.append(f"RAPL reads one node of {nodes}")
        return s

    def count(self, items: int) -> None:
        """Items the whole job trained on in one step (for energy per item)."""
        self.items += items

    def sample(self) -> None:
        """A utilisation reading (GPUs; called at log steps, never in the step itself)."""
        if self.nvml is not None:
            try:
                self.nvml.sample_utilisation()
            except Exception:  # a reading lost is a reading lost, not a failed run
                pass

    def snapshot(self, device: Any, energy: bool = True) -> dict[str, Any]:
        """This process's measurements so far (plain values: gathered over ranks); without
        `energy` the energy is left unread (a periodic checkpoint: a session killed after it
        has no reading, and says so)."""
        import torch

        wall = time.monotonic() - self.t0
        rec: dict[str, Any] = {"wall_s": wall, "gpu": self.gpu, "items": self.items,
                               "devices": 1 if self.gpu else self.cores}  # fmt: skip
        if self.gpu:
            rec["peak_memory_bytes"] = float(torch.cuda.max_memory_allocated(device))
            util = self.nvml.util if self.nvml is not None else []
            rec["utilisation"] = sum(util) / len(util) if util else None
        else:
            # ru_maxrss is in KiB on Linux: the process's resident peak
            rec["peak_memory_bytes"] = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                             * 1024)  # fmt: skip
            rec["utilisation"] = min(1.0, (_cpu_seconds() - self.cpu0) / max(wall * self.cores,
                                                                               1e-9))  # fmt: skip
        if energy:
            rec["energy_j"], rec["energy_source"], rec["energy_missing"] = self._energy()
        else:
            rec.update(energy_j=None, energy_source="",
                       energy_missing="the session ended without a reading (killed after a "
                       "periodic checkpoint)")  # fmt: skip
        return rec

    def _energy(self) -> tuple[float | None, str, str]:
        if self.nvml is not None:
            try:
                return self.nvml.joules(), "nvml", ""
            except Exception as e:
                return None, "", f"NVML energy read failed ({e})"
        if not self.main:
            return None, "", ""  # rank 0 reads the job-wide sources for everyone
        why = list(self.why_not)
        job = os.environ.get("SLURM_JOB_ID")
        if job:
            joules, reason = sacct_joules(job)
            if joules is not None:
                return joules, "sacct", ""
            why.append(reason)
        else:
            why.append("not a SLURM job, so no sacct")
        if self.rapl0:
            after = rapl_counters(self.rapl_root)
            if after.keys() == self.rapl0.keys():
                return rapl_joules(self.rapl0, after), "rapl", ""
            why.append("RAPL counters vanished")
        return None, "", "; ".join(why)


# ---- combining ranks and sessions -------------------------------------------------------------


def combine_ranks(snaps: list[dict[str, Any]]) -> dict[str, Any]:
    """One session's totals from every rank's snapshot: the wall time of the slowest, device
    time summed, the largest peak, the mean utilisation, energy summed (NVML) or rank 0's."""
    wall = max(s["wall_s"] for s in snaps)
    utils = [s["utilisation"] for s in snaps if s.get("utilisation") is not None]
    out: dict[str, Any] = {
        "wall_s": wall,
        "device_s": sum(s["devices"] * s["wall_s"] for s in snaps),
        "device_kind": "gpu" if snaps[0]["gpu"] else "cpu_core",
        "devices": sum(s["devices"] for s in snaps),
        "peak_memory_bytes": max(s["peak_memory_bytes"] for s in snaps),
        "utilisation": sum(utils) / len(utils) if utils else None,
        "items": snaps[0].get("items", 0),  # every rank counts the whole job's items
    }
    if all(s["energy_source"] == "nvml" for s in snaps):
        out.update(energy_j=sum(s["energy_j"] for s in snaps), energy_source="nvml")
    elif snaps[0]["energy_j"] is not None and snaps[0]["energy_source"] != "nvml":
        out.update(energy_j=snaps[0]["energy_j"], energy_source=snaps[0]["energy_source"])
    else:
        why = next((s["energy_missing"] for s in snaps if s["energy_missing"]), "")
        out.update(energy_j=None, energy_source="", energy_missing=why or "not measured")
    return out


def add_session(total: dict[str, Any] | None, session: dict[str, Any]) -> dict[str, Any]:
    """A run's cost so far plus one more session: times add, the peak is the larger; energy
    adds while every session measured it and is missing (with the first reason) otherwise."""
    if not total:
        return {**session, "sessions": 1}
    out = dict(total)
    out["sessions"] = total.get("sessions", 1) + 1
    out["wall_s"] = total["wall_s"] + session["wall_s"]
    out["device_s"] = total["device_s"] + session["device_s"]
    out["devices"] = session["devices"]
    out["peak_memory_bytes"] = max(total["peak_memory_bytes"], session["peak_memory_bytes"])
    out["items"] = total.get("items", 0) + session.get("items", 0)
    u0, u1 = total.get("utilisation"), session.get("utilisation")
    if u0 is not None and u1 is not None:
        out["utilisation"] = (u0 * total["device_s"] + u1 * session["device_s"]) / max(
            out["device_s"], 1e-9
        )
    else:
        out["utilisation"] = u1 if u0 is None else u0
    if total.get("energy_j") is not None and session.get("energy_j") is not None:
        out["energy_j"] = total["energy_j"] + session["energy_j"]
        if session["energy_source"] != total.get("energy_source"):
            out["energy_source"] = f"{total.get('energy_source')}+{session['energy_source']}"
    else:
        out["energy_j"] = None
        out["energy_source"] = ""
        out["energy_missing"] = (
            total.get("energy_missing")
            or f"session {out['sessions']}: {session.get('energy_missing', 'not measured')}"
        )
    return out


def summary(cost: dict[str, Any], estimate_bytes: float | None = None) -> dict[str, Any]:
    """The numbers the report shows: hours, GiB, kWh, and the peak memory over the estimate."""
    out: dict[str, Any] = {
        "wall_h": cost["wall_s"] / 3600,
        "device_hours": cost["device_s"] / 3600,
        "device_kind": cost["device_kind"],
        "devices": cost["devices"],
        "peak_memory_gib": cost["peak_memory_bytes"] / 1024**3,
        "utilisation": cost.get("utilisation"),
        "energy_kwh": None if cost.get("energy_j") is None else cost["energy_j"] / 3.6e6,
        "items": cost.get("items", 0),
        "energy_per_item_j": (
            None
            if cost.get("energy_j") is None or not cost.get("items")
            else cost["energy_j"] / cost["items"]
        ),  # fmt: skip
        "energy_source": cost.get("energy_source", ""),
        "sessions": cost.get("sessions", 1),
    }
    if cost.get("energy_j") is None:
        out["energy_missing"] = cost.get("energy_missing", "not measured")
    if estimate_bytes:
        out["memory_estimate_gib"] = estimate_bytes / 1024**3
        out["peak_over_estimate"] = cost["peak_memory_bytes"] / estimate_bytes
    return out
