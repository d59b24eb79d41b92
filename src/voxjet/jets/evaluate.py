"""`voxjet evaluate-jets`: predictions on the test split, metrics and ROC curves."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch

from voxjet.distributed import checkpoint
from voxjet.distributed.gpus import job_device
from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, write_json
from voxjet.io.remote import ReadOptions
from voxjet.jets.baseline import fit_mass_histograms, mass_probabilities
from voxjet.jets.dataset import load_columns, load_index, load_split
from voxjet.jets.metrics import jet_metrics
from voxjet.jets.models import build_model
from voxjet.jets.train import predict
from voxjet.report.figures import pyplot, roc_overlay, save_figure


def load_trained(model_path: str | Path) -> tuple[torch.nn.Module, dict]:
    """Rebuild a trained jet model from model.pt."""
    saved = checkpoint.load_file(model_path)
    cfg = {k: v for k, v in saved["model_config"].items() if k != "classes"}
    model = build_model(**cfg)
    checkpoint.load_weights(model, saved["model"], model_path, "the model its config describes")
    return model, saved


def _plot_confusion(path: Path, probs: np.ndarray, labels: np.ndarray, classes: list[str]) -> None:
    plt = pyplot()
    n = len(classes)
    cm = np.zeros((n, n))
    np.add.at(cm, (labels, probs.argmax(1)), 1)
    cm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(1.1 * n + 2, 1.0 * n + 1.5))
    im = ax.imshow(cm, cmap="Blues", vmin=0, vmax=1)
    for i in range(n):
        for j in range(n):
            ax.text(
                j,
                i,
                f"{cm[i, j]:.2f}",
                ha="center",
                va="center",
                color="white" if cm[i, j] > 0.5 else "black",
                fontsize=8,
            )
    ax.set_xticks(range(n), classes)
    ax.set_yticks(range(n), classes)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    fig.colorbar(im, ax=ax, label="fraction of the true class")
    save_figure(fig, path)


def _check_compatible(saved: dict, index: dict, model_path: str, shard_dir: str) -> None:
    cfg = saved["model_config"]
    if list(cfg["classes"]) != list(index["classes"]) or cfg["n_features"] != len(
        index["particle_features"]
    ):
        raise VoxjetError(
            f"{model_path}: trained for classes {cfg['classes']} with {cfg['n_features']} particle "
            f"features, but {shard_dir} has {index['classes']} with "
            f"{len(index['particle_features'])}; retrain on these shards"
        )


def mass_baseline(
    shard_dir: str, index: dict, test, read: ReadOptions | None = None
) -> np.ndarray | None:
    """Class probabilities of the jet-mass-only reference on `test` (None without jet_sdmass)."""
    if "jet_sdmass" not in index["jet_features"]:
        return None
    col = index["jet_features"].index("jet_sdmass")
    # the jet-level columns only: the training particles are not needed for a mass histogram
    train = load_columns(shard_dir, "train", ("jets", "labels"), read)
    edges, table = fit_mass_histograms(
        train["jets"][:, col], train["labels"], len(index["classes"])
    )
    return mass_probabilities(test.jets[:, col].numpy(), edges, table)


def evaluate(shard_dir: str, model_path: str, out_dir: str, read: dict | None = None) -> dict:
    """Score the test split (and the jet-mass reference); write metrics.json, predictions.h5,
    roc.png and confusion.png."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    opts = ReadOptions.from_config(read)
    index = load_index(shard_dir, opts)
    classes = index["classes"]
    data = load_split(shard_dir, "test", opts)
    model, saved = load_trained(model_path)
    _check_compatible(saved, index, model_path, shard_dir)
    probs = predict(model, data, torch.device(job_device()))
    labels = data.labels.numpy()
    metrics = jet_metrics(probs, labels, classes)
    metrics.update(
        {"domain": "jets", "split": "test", "best_step": saved["best_step"], "classes": classes}
    )
    with atomic_path(out / "predictions.h5") as tmp, h5py.File(tmp, "w") as f:
        f["probs"] = probs.astype(np.float32)
        f["labels"] = labels
        f.attrs["classes"] = classes
    base = mass_baseline(shard_dir, index, data, opts)
    if base is not None:
        bm = jet_metrics(base, labels, classes)
        metrics["baseline_jet_mass"] = {k: bm[k] for k in ("accuracy", "auc_macro", "rej50_mean")}
    roc_overlay(
        out / "roc.png", "ROC curves on the test split", {"this model": (probs, labels, classes)}
    )
    _plot_confusion(out / "confusion.png", probs, labels, classes)
    write_json(out / "metrics.json", metrics)
    return metrics
