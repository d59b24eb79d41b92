"""`voxjet evaluate-jets`: predictions on the test split, metrics and ROC curves."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch

from voxjet.io.atomic import atomic_path, write_json
from voxjet.jets.dataset import load_index, load_split
from voxjet.jets.metrics import jet_metrics, roc_curve
from voxjet.jets.models import build_model
from voxjet.jets.train import predict


def load_trained(model_path: str | Path) -> tuple[torch.nn.Module, dict]:
    """Rebuild a trained jet model from model.pt."""
    saved = torch.load(model_path, map_location="cpu", weights_only=False)
    cfg = {k: v for k, v in saved["model_config"].items() if k != "classes"}
    model = build_model(**cfg)
    model.load_state_dict(saved["model"])
    return model, saved


def _plot_roc(path: Path, probs: np.ndarray, labels: np.ndarray, classes: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    b = classes.index("QCD") if "QCD" in classes else None
    for i, c in enumerate(classes):
        if i == b:
            continue
        if b is None:
            sel, score = np.ones(len(labels), bool), probs[:, i]
        else:
            sel = (labels == i) | (labels == b)
            score = probs[sel, i] / np.maximum(probs[sel, i] + probs[sel, b], 1e-12)
        s_eff, b_eff = roc_curve(score, labels[sel] == i)
        ok = b_eff > 0
        ax.plot(s_eff[ok], 1 / b_eff[ok], label=f"{c} vs {'QCD' if b is not None else 'rest'}")
    ax.set_yscale("log")
    ax.set_xlabel("signal efficiency ε_S")
    ax.set_ylabel("background rejection 1/ε_B")
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def evaluate(shard_dir: str, model_path: str, out_dir: str) -> dict:
    """Score the test split with a trained model; write metrics.json, predictions.h5, roc.png."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = load_index(shard_dir)
    classes = index["classes"]
    data = load_split(shard_dir, "test")
    model, saved = load_trained(model_path)
    probs = predict(model, data, torch.device("cpu"))
    labels = data.labels.numpy()
    metrics = jet_metrics(probs, labels, classes)
    metrics.update(
        {"domain": "jets", "split": "test", "best_step": saved["best_step"], "classes": classes}
    )
    with atomic_path(out / "predictions.h5") as tmp, h5py.File(tmp, "w") as f:
        f["probs"] = probs.astype(np.float32)
        f["labels"] = labels
        f.attrs["classes"] = classes
    _plot_roc(out / "roc.png", probs, labels, classes)
    write_json(out / "metrics.json", metrics)
    return metrics
