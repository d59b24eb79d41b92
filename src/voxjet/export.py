"""`voxjet export`: a trained model in the formats other software runs — a jet tagger to ONNX
and TorchScript (voxjet.jets.export), a segmentation network to TorchScript and a MONAI bundle
(voxjet.volumes.export); the domain comes from the model. Every export is checked against the
eager model before it is kept (voxjet.tracing)."""

from __future__ import annotations

import os
from pathlib import Path

from voxjet.io.overlap import refuse_overlap
from voxjet.jets.export import export_tagger
from voxjet.predict import model_domain
from voxjet.volumes.export import export_volumes


def export_model(model_path: str | os.PathLike, fmt: str, out_dir: str | os.PathLike) -> Path:
    """Export model.pt in `fmt` (onnx, torchscript, bundle) into `out_dir`; returns the file
    or folder written."""
    refuse_overlap(out_dir, [str(model_path)], "export", "--out")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model_domain(model_path) == "jets":
        return export_tagger(model_path, fmt, out)
    return export_volumes(model_path, fmt, out)
