"""A trained jet tagger as evaluation and prediction both use it: rebuilt from model.pt, with
the jets config it was trained with, and scoring jets given as flat particles with counts."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from voxjet.distributed import checkpoint
from voxjet.errors import VoxjetError
from voxjet.jets.collections import model_inputs
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.jagged import pad_particles
from voxjet.jets.models import build_model
from voxjet.jets.targets import Target, decode_numpy, output_columns, parse_targets

JET_BATCH_SIZE = 256  # train.batch_size null (config/schema.yaml)


def load_trained(model_path: str | Path) -> tuple[torch.nn.Module, dict]:
    """Rebuild a trained jet model from model.pt."""
    saved = checkpoint.load_model_file(model_path, "jets", "jet tagging", "train-jets")
    cfg = {k: v for k, v in saved["model_config"].items()
           if k not in ("classes", "data", "domain", "targets")}  # fmt: skip
    model = build_model(**cfg)
    checkpoint.load_weights(model, saved["model"], model_path, "the model its config describes")
    return model, saved


@dataclass
class Tagger:
    """A trained tagger and what it needs to turn ROOT branches into its inputs."""

    model: torch.nn.Module
    classes: list[str]
    data: JetDataConfig  # the jets config it was trained with
    device: torch.device
    path: str
    batch: int = 256  # jets a forward pass (inference_batch)
    # regression targets: {names, specs, mean, std} (voxjet.jets.train.target_settings)
    targets: dict | None = None
    # extra constituent collections the model reads ({name, features, length, ...} each)
    collections: list[dict] | None = None

    @property
    def target_list(self) -> list[Target]:
        """The targets the model predicts past its classes (none: [])."""
        return parse_targets((self.targets or {}).get("specs"))

    @property
    def target_names(self) -> list[str]:
        """Its target outputs' names: a regression's, a classification's one a class."""
        return output_columns(self.target_list)

    @property
    def tree(self) -> str:
        """The tree the model's features were defined on."""
        return self.data.tree_name


def load_tagger(model_path: str | os.PathLike, device: torch.device) -> Tagger:
    """A jet model from model.pt, refusing other domains and models without their features."""
    model, saved = load_trained(model_path)
    record = saved["model_config"].get("data")
    if record is None:
        raise VoxjetError(
            f"{model_path}: this model does not record the jets config it was trained with "
            "(trained by an older voxjet); retrain it to predict on new files"
        )
    data = JetDataConfig.from_record(record, f"{model_path} (its jets config)")
    return Tagger(model.to(device).eval(), list(saved["model_config"]["classes"]), data, device,
                  str(model_path), inference_batch(saved), saved["model_config"].get("targets"),
                  saved["model_config"].get("collections"))  # fmt: skip


def inference_batch(saved: dict) -> int:
    """Jets a forward pass: the run's training batch, which fitted with gradients, so it fits
    without (activations, not the split, set inference memory: ParT's pair features grow with
    batch × particles²)."""
    batch = (saved.get("settings") or {}).get("batch_size")
    if batch is None:  # a model.pt without its settings: the training default
        batch = JET_BATCH_SIZE
    return int(batch)


def score(tagger: Tagger, feats: dict[str, np.ndarray], batch: int | None = None) -> np.ndarray:
    """Class probabilities [N, C] of jets given as flat particles with counts."""
    return infer(tagger, feats, batch)[0]


@torch.no_grad()
def infer(tagger: Tagger, feats: dict[str, np.ndarray],
          batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(class probabilities [N, C], target outputs [N, W]: regressions in their units, each
    classification's probabilities) of jets given as
    flat particles with counts (and each extra collection's padded rows and counts)."""
    batch = batch or tagger.batch
    counts = np.asarray(feats["counts"], np.int64)
    off = np.concatenate([[0], np.cumsum(counts)])
    length = tagger.data.max_particles
    c, t = len(tagger.classes), len(tagger.target_names)
    probs = np.empty((len(counts), c), np.float32)
    regressed = np.empty((len(counts), t), np.float32)
    flat = torch.from_numpy(feats["particles"])
    for lo in range(0, len(counts), batch):
        hi = min(lo + batch, len(counts))
        part = flat[off[lo] : off[hi]].to(tagger.device)
        p, mask = pad_particles(part, torch.from_numpy(counts[lo:hi]).to(tagger.device), length)
        rows = {k: torch.from_numpy(v[lo:hi]) for k, v in feats.items() if k.startswith("coll_")}
        extra = model_inputs(rows, tagger.collections or [], tagger.device)
        out = tagger.model(p, mask, *extra).float()
        probs[lo:hi] = torch.softmax(out[:, :c], dim=1).cpu().numpy()
        regressed[lo:hi] = out[:, c:].cpu().numpy()
    if t:
        regressed = decode_numpy(regressed, tagger.target_list, tagger.targets["mean"],
                                 tagger.targets["std"])  # fmt: skip
    return probs, regressed
