"""A jet tagger in the formats other software runs: ONNX (CMSSW/Athena run taggers through ONNX
Runtime) and TorchScript, inputs `particles` [B, P, F] (the features as in the shards:
standardisation is inside the model) and `mask` [B, P] (then each extra collection and its
mask), any batch and particle count, output `softmax` [B, classes] (and `targets` for a model
with regression or auxiliary targets). Every export is checked against the eager model on
inputs of other shapes before it is kept; `export.json` beside it says what goes in and comes
out."""

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
from voxjet.io.atomic import temporary_name, write_json
from voxjet.jets.tagger import load_trained
from voxjet.jets.targets import decode, output_columns, parse_targets
from voxjet.tracing import deviation, refuse_deviation, trace_saved


class Softmax(nn.Module):
    """The tagger with its class probabilities as output (what an analysis consumes), and,
    for a model with targets, a second output: regressions in their units, each
    classification's probabilities."""

    def __init__(self, model: nn.Module, n_classes: int | None = None,
                 targets: dict | None = None) -> None:  # fmt: skip
        super().__init__()
        self.model, self.n_classes = model, n_classes
        self.targets = parse_targets((targets or {}).get("specs"))
        self.mean = [float(x) for x in (targets or {}).get("mean") or []]
        self.std = [float(x) for x in (targets or {}).get("std") or []]

    def forward(self, particles: torch.Tensor, mask: torch.Tensor, *extra: torch.Tensor):
        out = self.model(particles, mask, *extra).float()
        probs = torch.softmax(out[:, : self.n_classes], dim=1)  # None: every output a class
        if not self.targets:
            return probs
        return probs, decode(out[:, self.n_classes :], self.targets, self.mean, self.std)


def _joined(out) -> np.ndarray:
    """A model's output(s) as one array [jets, classes + targets] (for the comparison)."""
    outs = out if isinstance(out, (tuple, list)) else [out]
    return np.concatenate([np.asarray(o) for o in outs], axis=1)


def _jet_inputs(b: int, p: int, f: int, seed: int, colls: list[dict] = ()) -> tuple:
    """Random inputs of `b` jets: particles [b, p, f] and mask, then each extra collection's
    objects [b, length, features] and mask (as a model with those collections reads them)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, length, least in ((f, p, 1), *((len(c["features"]), c["length"], 0) for c in colls)):
        counts = torch.randint(least, length + 1, (b,), generator=g)
        mask = torch.arange(length)[None] < counts[:, None]
        out += [torch.randn(b, length, n, generator=g) * mask[..., None], mask]
    return tuple(out)


def _dynamic(dims: list[dict]) -> tuple:
    """torch.export's dynamic shapes of (particles, mask, *extra): the extras are one tuple."""
    extra = tuple(d for d in dims[1:] for _ in range(2))
    return (dims[0], dims[0], extra) if extra else (dims[0], dims[0])


def input_names(colls: list[dict] = ()) -> list[str]:
    """The exported model's inputs: particles, mask, then <collection>, <collection>_mask."""
    return ["particles", "mask", *(k for c in colls for k in (c["name"], f"{c['name']}_mask"))]


CHECK_SHAPES = ((3, 17), (7, 41))  # (jets, particles) the exports are checked on


def _check(name: str, run, eager: nn.Module, n_features: int, colls: list[dict] = ()) -> float:
    worst = 0.0
    for i, (b, p) in enumerate(CHECK_SHAPES):
        inputs = _jet_inputs(b, p, n_features, i, colls)
        with torch.no_grad():
            want = _joined(eager(*inputs))
        got = _joined(run(*inputs))
        if got.shape != want.shape:
            raise VoxjetError(f"export {name}: output of shape {got.shape} for {b} jets of {p} "
                              f"particles, the model gives {want.shape}")  # fmt: skip
        worst = max(worst, deviation(got, want))
    refuse_deviation(name, worst)
    return worst


# ONNX's protobuf limit: larger models keep their weights in an external-data file
ONNX_INLINE_LIMIT = 2 * 2**30 - 64 * 2**20


def export_onnx(tagger: nn.Module, n_features: int, length: int, path: Path,
                outputs: tuple[str, ...] = ("softmax",),
                colls: list[dict] = ()) -> tuple[float, list]:  # fmt: skip
    """The tagger as ONNX with dynamic batch and particle count; the largest deviation and the
    files written (the model alone, or with `<name>.data` when its weights pass 2 GB). The
    check loads a copy of those files from another folder: what is deployed is what passed."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise VoxjetError("export --format onnx needs onnx, onnxscript and onnxruntime: "
                          "pip install 'voxjet[export]'") from e  # fmt: skip

    inputs = _jet_inputs(2, length, n_features, 9, colls)
    in_names = input_names(colls)
    names = {"input_names": in_names, "output_names": list(outputs)}
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
                jets = torch.export.Dim("jets")
                dims = [{0: jets, 1: torch.export.Dim("particles")}]
                dims += [{0: jets, 1: torch.export.Dim(f"{c['name']}_objects")} for c in colls]
                torch.onnx.export(tagger, inputs, str(staged), dynamo=True,
                                  dynamic_shapes=_dynamic(dims),
                                  external_data=external, **names)  # fmt: skip
                how = "torch.export"
            except Exception as e:  # noqa: BLE001 - the tracer's own failure, then the other way
                print(f"export: torch.export could not export it ({type(e).__name__}); tracing",
                      file=sys.stderr)  # fmt: skip
                axes = {n: {0: "jets", 1: "particles" if i < 2 else f"{in_names[i - i % 2]}_n"}
                        for i, n in enumerate(in_names)}  # fmt: skip
                axes.update({name: {0: "jets"} for name in outputs})
                torch.onnx.export(tagger, inputs, str(staged), dynamo=False,
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

            def run(*xs):
                return session.run(None, {n: x.numpy() for n, x in zip(in_names, xs, strict=True)})

            worst = _check("onnx", run, tagger, n_features, colls)
        for f in sorted(files, key=lambda f: f == path.name):  # the model last: it counts
            os.replace(work / f, path.parent / f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"export: ONNX via {how}, max deviation {worst:.2e}, files {files}", file=sys.stderr)
    return worst, files


def export_torchscript_tagger(tagger: nn.Module, n_features: int, length: int, path: Path,
                              colls: list[dict] = ()) -> float:  # fmt: skip
    """The tagger traced to TorchScript (any batch and particle count); the largest deviation."""
    loaded = trace_saved(tagger, _jet_inputs(2, length, n_features, 9, colls), path)
    with torch.no_grad():
        return _check("torchscript", loaded, tagger, n_features, colls)


def export_tagger(model_path: str | os.PathLike, fmt: str, out: Path) -> Path:
    """Export a tagger's model.pt as onnx (model.onnx) or torchscript (model.ts) into `out`,
    with export.json."""
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
    cols = output_columns(tagger.targets)
    colls = cfg.get("collections") or []
    n_features, length = (
        int(cfg["n_features"]),
        int((cfg.get("data") or {}).get("max_particles", 64)),
    )
    if fmt == "onnx":
        target = out / "model.onnx"
        worst, files = export_onnx(tagger, n_features, length, target, outputs, colls)
    elif fmt == "torchscript":
        target = out / "model.ts"
        worst = export_torchscript_tagger(tagger, n_features, length, target, colls)
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
                **{
                    k: v
                    for c in colls
                    for k, v in (
                        (
                            c["name"],
                            f"float32 [jets, objects ≤ {c['length']}, {len(c['features'])}]: "
                            + ", ".join(c["features"]),
                        ),
                        (f"{c['name']}_mask", f"bool [jets, objects]: true for real {c['name']}"),
                    )
                },
            },
            "output": {
                "softmax": f"float32 [jets, {len(cfg['classes'])}]: {cfg['classes']}",
                **(
                    {
                        "targets": f"float32 [jets, {len(cols)}]: {cols} (regressions in their "
                        "units, classifications' probabilities)"
                    }
                    if targets
                    else {}
                ),
            },
            "classes": cfg["classes"],
            "targets": cols,
            "jets_config": cfg.get("data"),
            "max_abs_deviation_from_eager": worst,
            "source": str(model_path),
        },
    )
    print(f"export: {target} ({json.dumps(cfg['classes'])})", file=sys.stderr)
    return target
