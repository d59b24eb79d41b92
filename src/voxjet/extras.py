"""The optional packages a config needs (pyproject's extras), checked at the dry run: a source
at an s3:// URL, a weaver-core model, nnU-Net's residual-encoder network, MLflow tracking. A
missing one is refused naming the key and the `pip install "voxjet[extra]"` that adds it,
instead of a traceback from a job an hour later."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError

# the package a URL scheme is read through (fsspec's implementations), and its extra
SCHEMES = {"s3": ("s3fs", "s3fs"), "http": ("aiohttp", "aiohttp"),
           "https": ("aiohttp", "aiohttp"), "root": ("fsspec_xrootd", "fsspec-xrootd")}  # fmt: skip
MODEL_PACKAGES = {
    "weaver_part": ("weaver", "weaver-core", "weaver"),
    "weaver_pnet": ("weaver", "weaver-core", "weaver"),
    "resenc": ("dynamic_network_architectures", "dynamic-network-architectures", "resenc"),
}
RESENC_PLANS = ("resenc_m", "resenc_l", "resenc_xl")


def installed(module: str) -> bool:
    """Whether `module` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(module: str, dist: str, extra: str, where: str, what: str) -> str | None:
    """The message for a package that is not installed, or None."""
    if installed(module):
        return None
    return (f"{where}: {what} needs {dist}, which is not installed here; "
            f'pip install "voxjet[{extra}]"')  # fmt: skip


def _urls(config: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(config key, location) of every source, prepared folder and prediction input."""
    for name, ds in (config.get("datasets") or {}).items():
        source = ds.get("source") or {}
        for key in ("path", "prepared"):
            if isinstance(source.get(key), str):
                yield f"datasets.{name}.source.{key}", source[key]
        listing = source.get("file_list")
        if isinstance(listing, str) and Path(listing).is_file():
            for line in Path(listing).read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    yield f"datasets.{name}.source.file_list ({listing})", line.strip()
    for name, p in (config.get("predict") or {}).items():
        given = p.get("input")
        for item in [given] if isinstance(given, str) else (given or []):
            yield f"predict.{name}.input", item


def check_extras(config: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> None:
    """Refuse a config that needs an extra that is not installed, naming the key and the
    pip line (every such key at once)."""
    problems = []
    for where, location in _urls(config):
        scheme = location.split("://", 1)[0] if "://" in location else ""
        if scheme in SCHEMES:
            module, dist = SCHEMES[scheme]
            problems.append(missing(module, dist, "remote", f"config key '{where}'",
                                    f"reading {scheme}:// URLs"))  # fmt: skip
    for name, exp in (config.get("experiments") or {}).items():
        model = (exp.get("model") or {}).get("name")
        if model in MODEL_PACKAGES:
            module, dist, extra = MODEL_PACKAGES[model]
            where = f"config key 'experiments.{name}.model.name'"
            problems.append(missing(module, dist, extra, where, model))
    for name, ds in (config.get("datasets") or {}).items():
        plan = (ds.get("volumes") or {}).get("plan")
        if plan in RESENC_PLANS:
            module, dist, extra = MODEL_PACKAGES["resenc"]
            problems.append(missing(module, dist, extra,
                                    f"config key 'datasets.{name}.volumes.plan'",
                                    f"the {plan} preset's network"))  # fmt: skip
    uri = environ.get("MLFLOW_TRACKING_URI")
    if uri and config.get("experiments"):
        where = f"MLFLOW_TRACKING_URI={uri}"
        problems.append(missing("mlflow", "mlflow-skinny", "track", where, "tracking in MLflow"))
    problems = sorted({p for p in problems if p})
    if problems:
        raise VoxjetError("missing packages:\n  " + "\n  ".join(problems))
