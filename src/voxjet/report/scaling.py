"""Scaling studies: an experiment trained for a short fixed number of steps at several sizes
(processes), summarised as Frey et al. (HPEC 2022) do: T(n) = a·n^(−b) fitted to the time a
fixed number of samples takes (over three sizes or more; two give a ratio, shown as one),
speed-up and parallel efficiency against the smallest size — efficiency measured against what
each size adds (GPUs; for CPU processes, which share the job's threads, the cores they use) —
and energy per sample where it was measured."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from voxjet.plotting import pyplot, save_figure

PER = 1000  # T(n) is the time for this many samples


@dataclass
class Point:
    """One size of a study: its measured throughput and what a sample cost."""

    run: str
    processes: int
    rate: float  # samples/s over the steady windows
    unit: str  # what a sample is (jets, patches)
    energy_per_sample_j: float | None
    energy_missing: str = ""
    cores: int = 0  # CPU processes: the cores the size used (0: one device a process)

    @property
    def devices(self) -> int:
        """What the size computes on: its GPUs (processes), or its CPU cores."""
        return self.cores or self.processes

    @property
    def time(self) -> float:
        """Seconds for PER samples."""
        return PER / self.rate


def steady_rate(lines: list[dict[str, Any]]) -> tuple[float, str] | None:
    """Throughput over a training log's windows after the first (start-up: compilation, the
    first batches): items ÷ seconds, validations and checkpoints between windows included, as
    a run pays them; (rate, unit) or None with too few windows. Logs without window lengths
    (older runs) give the mean of those windows' rates."""
    steps = [r for r in lines if "loss" in r]
    key = next((k for k in (steps[-1] if steps else {}) if k.endswith("_per_s")), None)
    if key is None or len(steps) < 3:
        return None
    inner = steps[1:]
    if all("window_s" in r for r in inner):
        seconds = sum(r["window_s"] for r in inner)
        return sum(r[key] * r["window_s"] for r in inner) / seconds, key.removesuffix("_per_s")
    return sum(r[key] for r in inner) / len(inner), key.removesuffix("_per_s")


def fit_power_law(n: list[float], t: list[float]) -> tuple[float, float]:
    """(a, b) of T(n) = a·n^(−b), least squares in log-log."""
    x, y = np.log(np.asarray(n, float)), np.log(np.asarray(t, float))
    slope, intercept = np.polyfit(x, y, 1)
    return float(math.exp(intercept)), float(-slope)


MIN_FIT_SIZES = 3  # a power law of two points is a line through them, no fit


def study_table(points: list[Point]) -> dict[str, Any]:
    """Per size, speed-up against the smallest and parallel efficiency (speed-up ÷ the devices
    it added), and the power-law fit over three sizes or more (None with fewer)."""
    pts = sorted(points, key=lambda p: p.processes)
    fitted = len({p.processes for p in pts}) >= MIN_FIT_SIZES
    a, b = fit_power_law([p.processes for p in pts], [p.time for p in pts]) if fitted else (
        None, None)  # fmt: skip
    n0, t0 = pts[0].devices, pts[0].time
    rows = [
        {
            "run": p.run,
            "processes": p.processes,
            "devices": p.devices,
            "rate": p.rate,
            "time": p.time,
            "speedup": t0 / p.time,
            "ideal": p.devices / n0,
            "efficiency": (t0 / p.time) * n0 / p.devices,
            "fit_time": a * p.processes ** (-b) if fitted else None,
            "energy_per_sample_j": p.energy_per_sample_j,
            "energy_missing": p.energy_missing,
        }
        for p in pts
    ]
    cpu = any(p.cores for p in pts)
    return {"a": a, "b": b, "unit": pts[0].unit, "rows": rows, "cpu_cores": cpu}


def _exponent(b: float) -> str:
    """n's exponent −b with its one sign (`n^(−0.800)`, `n^(+1.230)`)."""
    e = -b
    return ("−" if e < 0 else "+") + f"{abs(e):.3f}"


def study_markdown(title: str, table: dict[str, Any]) -> list[str]:
    """A summary.md section for one study."""
    unit, rows = table["unit"], table["rows"]
    if table["a"] is not None:
        head = (f"### Scaling of {title}: T(n) = {table['a']:.4g}·n^({_exponent(table['b'])}) "
                f"(seconds per {PER} {unit})")  # fmt: skip
    else:
        head = (f"### Scaling of {title}: {len(rows)} sizes, so a speed-up, not a fit (a "
                f"power law needs {MIN_FIT_SIZES} or more; T(n) in seconds per {PER} "
                f"{unit})")  # fmt: skip
    devices = "cores" if table.get("cpu_cores") else "GPUs"
    out = [head, ""]
    if table.get("cpu_cores"):
        out += [f"CPU processes share the job's threads: each size's speed-up is measured "
                f"against the cores it used ({', '.join(str(r['devices']) for r in rows)}); "
                "the ideal is their ratio, and efficiency is speed-up ÷ ideal.", ""]  # fmt: skip
    out += [
        f"| run | processes | {unit}/s | T(n) s | fit s | speed-up | efficiency | J per {unit} | "
        f"{devices} | ideal speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        e, fit = r["energy_per_sample_j"], r["fit_time"]
        out.append(
            f"| {r['run']} | {r['processes']} | {r['rate']:.4g} | {r['time']:.4g} | "
            f"{'–' if fit is None else f'{fit:.4g}'} | {r['speedup']:.3g} | "
            f"{r['efficiency']:.3g} | "
            + (f"{e:.3g}" if e is not None else "–")
            + f" | {r['devices']} | {r['ideal']:.3g} |"
        )
    missing = sorted({r["energy_missing"] for r in rows if r["energy_missing"]})
    out += (
        [""] + [f"Energy per {unit} not measured: {m}" for m in missing] + ([""] if missing else [])
    )
    return out


def scaling_figure(path, title: str, table: dict[str, Any]) -> None:
    """T(n) measured and fitted against the ideal 1/n (log-log), and parallel efficiency."""
    plt = pyplot()
    rows = table["rows"]
    n = np.array([r["processes"] for r in rows], float)
    t = np.array([r["time"] for r in rows])
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 4))
    grid = np.geomspace(n.min(), n.max(), 50)
    ax_t.plot(n, t, "o", label="measured")
    if table["a"] is not None:
        ax_t.plot(grid, table["a"] * grid ** (-table["b"]), "-",
                  label=f"fit {table['a']:.3g}·n^({_exponent(table['b'])})")  # fmt: skip
    ideal = t[0] / np.array([r["ideal"] for r in rows])
    ax_t.plot(n, ideal, ":", color="grey", marker=".", label="ideal (the devices added)")
    ax_t.set_xscale("log")
    ax_t.set_yscale("log")
    ax_t.set_xlabel("processes (GPUs, or CPU processes)")
    ax_t.set_ylabel(f"seconds per {PER} {table['unit']}")
    ax_t.legend(fontsize=8)
    ax_e.plot(n, [r["efficiency"] for r in rows], "o-")
    ax_e.axhline(1.0, color="grey", ls=":")
    ax_e.set_xscale("log")
    ax_e.set_ylim(0, 1.2 * max(1.0, max(r["efficiency"] for r in rows)))
    ax_e.set_xlabel("processes")
    ax_e.set_ylabel("parallel efficiency")
    for ax in (ax_t, ax_e):
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    save_figure(fig, path)
