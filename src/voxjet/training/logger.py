"""metrics.jsonl: one JSON object a logged step, appended and flushed so a killed job keeps
what it logged; on resume, lines after the checkpoint's step are dropped, and so is a line
torn by a kill in mid-write. The same records go to TensorBoard (and MLflow when
MLFLOW_TRACKING_URI is set), for people who watch runs there."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, disk_full_error, finite_json, is_disk_full


def _parse(path: Path, torn_ok: bool) -> list[dict[str, Any]]:
    text = path.read_text()
    lines = text.split("\n")
    torn = lines[-1] != ""  # a last line without its newline: a write cut short
    records = []
    for i, line in enumerate(lines[:-1] if not torn else lines, 1):
        if not line.strip():
            continue
        last = i == len(lines)
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if last and torn and torn_ok:
                print(f"{path}: dropped a torn last line ({line[:60]!r})", file=sys.stderr)
                continue
            raise VoxjetError(
                f"{path}, line {i}: not a metrics record ({e}: {line[:80]!r}); remove the line "
                "(or the file, to start the run afresh)"
            ) from e
        if last and torn and torn_ok:
            print(f"{path}: dropped a torn last line", file=sys.stderr)
            continue
        records.append(rec)
    return records


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file; a line that is not one is an error naming the file
    and the line."""
    return _parse(Path(path), torn_ok=False)


class MetricsLog:
    """Append-only JSON-lines log owned by rank 0."""

    def __init__(self, path: str | os.PathLike, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> None:
        """Drop records logged after `step` (work the checkpoint does not contain) and a last
        line torn by a kill; any other bad line is an error naming file and line."""
        if not self.enabled or not self.path.exists():
            return
        keep = [r for r in _parse(self.path, torn_ok=True) if r.get("step", 0) <= step]
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in keep))

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (with a wall-clock time stamp)."""
        if not self.enabled:
            return
        clean = finite_json(record)
        clean.setdefault("time", time.time())
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(clean, allow_nan=False) + "\n")
                f.flush()
        except OSError as e:
            if is_disk_full(e, self.path.parent):
                raise disk_full_error(self.path, e) from e
            raise


class Trackers:
    """TensorBoard event files in `<run>/tensorboard/` (always, on rank 0) and an MLflow run
    (when MLFLOW_TRACKING_URI is set): the numbers of every metrics.jsonl record, under
    `train/…` and `val/…`. A resumed run drops what TensorBoard holds past its checkpoint."""

    def __init__(
        self, run_dir: Path, enabled: bool, resume_step: int, experiment: str, run: str
    ) -> None:
        self.tb = self.mlflow = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step or None)
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if uri:
            try:
                import mlflow
            except ImportError as e:
                raise VoxjetError(
                    f"MLFLOW_TRACKING_URI={uri} asks for MLflow tracking, but mlflow is not "
                    "installed: pip install 'voxjet[track]' (or unset MLFLOW_TRACKING_URI)"
                ) from e
            mlflow.set_tracking_uri(uri)
            mlflow.set_experiment(experiment or "voxjet")
            found = mlflow.search_runs(filter_string=f"tags.mlflow.runName = '{run}'")
            run_id = found["run_id"].iloc[0] if len(found) else None
            self.mlflow = mlflow
            mlflow.start_run(run_id=run_id, run_name=run)

    def log(self, record: dict[str, Any]) -> None:
        """The record's finite numbers as scalars at its step."""
        step = int(record["step"])
        prefix = "val" if record.get("split") == "val" else "train"
        values = {
            f"{prefix}/{k}": float(v)
            for k, v in record.items()
            if k not in ("step", "time", "epoch", "split")
            and isinstance(v, int | float)
            and not isinstance(v, bool)
            and math.isfinite(float(v))
        }
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
        if self.mlflow is not None:
            self.mlflow.log_metrics({k.replace("/", "_"): v for k, v in values.items()}, step=step)

    def params(self, params: dict[str, Any]) -> None:
        """The run's settings (MLflow parameters)."""
        if self.mlflow is not None:
            flat = {k: str(v)[:500] for k, v in params.items()}
            self.mlflow.log_params(flat)

    def close(self) -> None:
        """Flush and close the event file and the MLflow run."""
        if self.tb is not None:
            self.tb.close()
        if self.mlflow is not None:
            self.mlflow.end_run()


class StepTimer:
    """Splits wall time into waiting for data and the rest, for the data-stall fraction."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start a new logging window."""
        self.data = 0.0
        self.items = 0
        self.start = self._t = time.perf_counter()

    def data_ready(self) -> None:
        """Call when a batch has arrived: the time since the last step ended was data wait."""
        now = time.perf_counter()
        self.data += now - self._t
        self._t = now

    def step_done(self, items: int) -> None:
        """Call when the step's compute finished."""
        self._t = time.perf_counter()
        self.items += items

    def other_done(self) -> None:
        """Call after work that is neither a step nor waiting (validation, a checkpoint): its
        time counts in the window's wall time, not as data wait."""
        self._t = time.perf_counter()

    def summary(self) -> dict[str, float]:
        """Throughput and data-wait fraction over the window."""
        total = max(time.perf_counter() - self.start, 1e-9)
        return {
            "items_per_s": self.items / total,
            "data_wait_fraction": min(1.0, self.data / total),
            "window_s": total,
        }
