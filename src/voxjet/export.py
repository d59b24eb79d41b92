"""`voxjet export`: a trained model in the formats other software runs. Taggers to ONNX
(CMSSW/Athena run taggers through ONNX Runtime) and TorchScript, inputs `particles` [B, P, F]
(the features as in the shards: standardisation is inside the model) and `mask` [B, P], any
batch and particle count, output `softmax` [B, classes]; the U-Net to TorchScript and to a
MONAI bundle (configs/metadata.json, configs/inference.json, models/model.ts) that MONAI's own
runner applies to NIfTI images. Every export is checked against the eager model on inputs of
other shapes before it is kept; `export.json` beside it says what goes in and comes out."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, temporary_name, write_json
from voxjet.io.overlap import refuse_overlap

TOLERANCE = 1e-4  # max |exported − eager| accepted


class Softmax(nn.Module):
    """The tagger with its class probabilities as output (what an analysis consumes), and,
    for a model with regression targets, a second output: the targets in their units."""

    def __init__(self, model: nn.Module, n_classes: int | None = None,
                 targets: dict | None = None) -> None:  # fmt: skip
        super().__init__()
        self.model, self.n_classes = model, n_classes
        targets = targets or {"mean": [], "std": []}
        self.register_buffer("mean", torch.tensor(targets["mean"], dtype=torch.float32))
        self.register_buffer("std", torch.tensor(targets["std"], dtype=torch.float32))

    def forward(self, particles: torch.Tensor, mask: torch.Tensor):
        out = self.model(particles, mask).float()
        probs = torch.softmax(out[:, : self.n_classes], dim=1)  # None: every output a class
        if not self.mean.numel():
            return probs
        return probs, out[:, self.n_classes :] * self.std + self.mean


def _joined(out) -> np.ndarray:
    """A model's output(s) as one array [jets, classes + targets] (for the comparison)."""
    outs = out if isinstance(out, (tuple, list)) else [out]
    return np.concatenate([np.asarray(o) for o in outs], axis=1)


def _jet_inputs(b: int, p: int, f: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, p + 1, (b,), generator=g)
    mask = torch.arange(p)[None] < counts[:, None]
    return torch.randn(b, p, f, generator=g) * mask[..., None], mask


CHECK_SHAPES = ((3, 17), (7, 41))  # (jets, particles) the exports are checked on


def _check(name: str, run, eager: nn.Module, n_features: int) -> float:
    worst = 0.0
    for i, (b, p) in enumerate(CHECK_SHAPES):
        x, mask = _jet_inputs(b, p, n_features, seed=i)
        with torch.no_grad():
            want = _joined(eager(x, mask))
        got = _joined(run(x, mask))
        if got.shape != want.shape:
            raise VoxjetError(f"export {name}: output of shape {got.shape} for {b} jets of {p} "
                              f"particles, the model gives {want.shape}")  # fmt: skip
        # relative where a regression target is large (a mass in GeV), absolute below 1
        worst = max(worst, float((np.abs(got - want) / np.maximum(np.abs(want), 1)).max()))
    if worst > TOLERANCE:
        raise VoxjetError(f"export {name}: differs from the eager model by {worst:.2e} (more "
                          f"than {TOLERANCE}, relative above 1); not kept")  # fmt: skip
    return worst


# ONNX's protobuf limit: larger models keep their weights in an external-data file
ONNX_INLINE_LIMIT = 2 * 2**30 - 64 * 2**20


def export_onnx(tagger: nn.Module, n_features: int, length: int, path: Path,
                outputs: tuple[str, ...] = ("softmax",)) -> tuple[float, list]:  # fmt: skip
    """The tagger as ONNX with dynamic batch and particle count; the largest deviation and the
    files written (the model alone, or with `<name>.data` when its weights pass 2 GB). The
    check loads a copy of those files from another folder: what is deployed is what passed."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise VoxjetError("export --format onnx needs onnx, onnxscript and onnxruntime: "
                          "pip install 'voxjet[export]'") from e  # fmt: skip

    x, mask = _jet_inputs(2, length, n_features, seed=9)
    names = {"input_names": ["particles", "mask"], "output_names": list(outputs)}
    weights = sum(t.numel() * t.element_size() for t in tagger.state_dict().values())
    external = weights > ONNX_INLINE_LIMIT
    # written under its final name inside a private folder, so that an external-data file is
    # named after the final name (the model refers to it by that name)
    work = temporary_name(path)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        staged = work / path.name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:  # torch.export first; where it cannot trace a model, TorchScript tracing
                dims = {0: torch.export.Dim("jets"), 1: torch.export.Dim("particles")}
                torch.onnx.export(tagger, (x, mask), str(staged), dynamo=True,
                                  dynamic_shapes=(dims, dims), external_data=external,
                                  **names)  # fmt: skip
                how = "torch.export"
            except Exception as e:  # noqa: BLE001 - the tracer's own failure, then the other way
                print(f"export: torch.export could not export it ({type(e).__name__}); tracing",
                      file=sys.stderr)  # fmt: skip
                axes = {"particles": {0: "jets", 1: "particles"},
                        "mask": {0: "jets", 1: "particles"},
                        **{name: {0: "jets"} for name in outputs}}  # fmt: skip
                torch.onnx.export(tagger, (x, mask), str(staged), dynamo=False,
                                  dynamic_axes=axes, opset_version=17, **names)  # fmt: skip
                how = "TorchScript tracing"
        files = sorted(p.name for p in work.iterdir())
        if not external and files != [path.name]:
            raise VoxjetError(f"export onnx: the exporter wrote {files}, not one self-contained "
                              f"{path.name}; not kept")  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="voxjet-onnx-check-") as elsewhere:
            for f in files:
                shutil.copy2(work / f, Path(elsewhere) / f)
            session = ort.InferenceSession(str(Path(elsewhere) / path.name),
                                           providers=["CPUExecutionProvider"])  # fmt: skip

            def run(p, m):
                return session.run(None, {"particles": p.numpy(), "mask": m.numpy()})

            worst = _check("onnx", run, tagger, n_features)
        for f in sorted(files, key=lambda f: f == path.name):  # the model last: it counts
            os.replace(work / f, path.parent / f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"export: ONNX via {how}, max deviation {worst:.2e}, files {files}", file=sys.stderr)
    return worst, files


def export_torchscript_tagger(tagger: nn.Module, n_features: int, length: int, path: Path) -> float:
    """The tagger traced to TorchScript (any batch and particle count); the largest deviation."""
    x, mask = _jet_inputs(2, length, n_features, seed=9)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(tagger, (x, mask), check_trace=False)
    with atomic_path(path) as tmp:
        torch.jit.save(traced, str(tmp))
    loaded = torch.jit.load(str(path))
    with torch.no_grad():
        return _check("torchscript", loaded, tagger, n_features)


def export_model(model_path: str | os.PathLike, fmt: str, out_dir: str | os.PathLike) -> Path:
    """Export model.pt in `fmt` (onnx, torchscript, bundle) into `out_dir`; returns the file
    or folder written."""
    from voxjet.predict import model_domain

    refuse_overlap(out_dir, [str(model_path)], "export", "--out")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    domain = model_domain(model_path)
    if domain == "jets":
        return _export_jets(model_path, fmt, out)
    from voxjet.volumes.bundle import export_volumes

    return export_volumes(model_path, fmt, out)


def _export_jets(model_path, fmt: str, out: Path) -> Path:
    from voxjet.jets.tagger import load_trained

    model, saved = load_trained(model_path)
    cfg = saved["model_config"]
    if str(cfg.get("name", "")).startswith("weaver_"):
        raise VoxjetError(
            f"{model_path}: a {cfg['name']} model is exported by weaver itself (`weaver "
            "--export-onnx`, which builds its inference variant of the network); voxjet "
            "exports pfn, particlenet, part and the U-Nets"
        )
    targets = cfg.get("targets")
    tagger = Softmax(model.eval(), len(cfg["classes"]), targets).eval()
    outputs = ("softmax", "targets") if targets else ("softmax",)
    n_features, length = (
        int(cfg["n_features"]),
        int((cfg.get("data") or {}).get("max_particles", 64)),
    )
    if fmt == "onnx":
        target = out / "model.onnx"
        worst, files = export_onnx(tagger, n_features, length, target, outputs)
    elif fmt == "torchscript":
        target = out / "model.ts"
        worst = export_torchscript_tagger(tagger, n_features, length, target)
        files = [target.name]
    else:
        raise VoxjetError(f"export --format {fmt}: a jet tagger exports as onnx or torchscript")
    write_json(
        out / "export.json",
        {
            "format": fmt,
            "file": target.name,
            "files": files,
            "inputs": {
                "particles": f"float32 [jets, particles, {n_features}]: "
                + ", ".join(cfg.get("feature_names") or []),
                "mask": "bool [jets, particles]: true for real particles",
            },
            "output": {
                "softmax": f"float32 [jets, {len(cfg['classes'])}]: {cfg['classes']}",
                **(
                    {
                        "targets": f"float32 [jets, {len(targets['names'])}]: "
                        f"{targets['names']} in their units"
                    }
                    if targets
                    else {}
                ),
            },  # fmt: skip
            "classes": cfg["classes"],
            "targets": list((targets or {}).get("names") or []),
            "jets_config": cfg.get("data"),
            "max_abs_deviation_from_eager": worst,
            "source": str(model_path),
        },
    )
    print(f"export: {target} ({json.dumps(cfg['classes'])})", file=sys.stderr)
    return target
