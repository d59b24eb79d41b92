"""`voxjet export`: a trained model in the formats other software runs — a jet tagger to ONNX
and TorchScript (voxjet.jets.export), a segmentation network to TorchScript and a MONAI bundle
(voxjet.volumes.inference.export); the domain comes from the model. Every export is checked against
the eager model before it is kept (voxjet.tracing)."""

from __future__ import annotations

import os
from pathlib import Path

from voxjet.errors import VoxjetError
from voxjet.extras import missing
from voxjet.io.atomic import output_folder
from voxjet.io.overlap import refuse_overlap
from voxjet.jets.export import export_tagger
from voxjet.predict import model_domain
from voxjet.volumes.inference.export import export_volumes


def export_model(model_path: str | os.PathLike, fmt: str, out_dir: str | os.PathLike) -> Path:
    """Export model.pt in `fmt` (onnx, torchscript, bundle) into `out_dir`; returns the file
    or folder written."""
    refuse_overlap(out_dir, [str(model_path)], "export", "--out")
    for module, dist in (("onnx", "onnx"), ("onnxruntime", "onnxruntime")):
        said = fmt == "onnx" and missing(module, dist, "export", "--format onnx", "ONNX export")
        if said:
            raise VoxjetError(said)
    domain = model_domain(model_path)  # an unreadable model stops here, before any folder
    with output_folder(out_dir) as out:
        if domain == "jets":
            return export_tagger(model_path, fmt, out)
        return export_volumes(model_path, fmt, out)
