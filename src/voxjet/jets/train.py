"""`voxjet train-jets`: a jet tagger on the shards, through the shared training loop."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from voxjet.distributed.runtime import Runtime, init_runtime, shutdown
from voxjet.io.handover import ReturningLoader
from voxjet.io.node_local import localised
from voxjet.io.remote import ReadOptions
from voxjet.jets.collections import model_inputs
from voxjet.jets.data_config import JetDataConfig, index_config
from voxjet.jets.dataset import collection_keys, load_index, load_split
from voxjet.jets.jagged import pad_particles
from voxjet.jets.metrics import jet_metrics
from voxjet.jets.models import build_model
from voxjet.jets.stream import JetStream
from voxjet.jets.tagger import JET_BATCH_SIZE
from voxjet.jets.targets import (
    Target,
    decode_numpy,
    output_columns,
    parse_targets,
    target_loss,
    target_metrics,
)
from voxjet.training.loop import train
from voxjet.training.task import TrainSettings, settings_of


@torch.no_grad()
def predict(model: nn.Module, data, device: torch.device, n_classes: int,
            collections: list[dict] = (), batch_size: int = 2048,
            ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Class probabilities [N, C] and the head's raw target outputs [N, W] (past the classes;
    voxjet.jets.targets.decode reads them) of every jet of `data`."""
    model.eval()
    probs, regressed = [], []
    for lo in range(0, len(data), batch_size):
        b = data.take(np.arange(lo, min(lo + batch_size, len(data))))
        extra = model_inputs(b, collections, device)
        out = model(b["particles"].to(device), b["mask"].to(device), *extra).float()
        probs.append(torch.softmax(out[:, :n_classes], dim=1).cpu().numpy())
        regressed.append(out[:, n_classes:].cpu().numpy())
    return np.concatenate(probs), np.concatenate(regressed)


class JetTask:
    """Jet tagging for the shared loop: cross-entropy on shards, macro AUC picks the best."""

    def __init__(
        self,
        shard_dir: str | Path,
        model_cfg: dict[str, Any],
        s: TrainSettings,
        read: ReadOptions | None = None,
    ):
        self.dir = str(shard_dir)  # a folder or an fsspec URL
        self.read = read or ReadOptions()
        self.index = load_index(shard_dir, self.read)
        self.data = index_config(self.index, f"{self.dir}/index.json")
        self._val: tuple[tuple[int, int], Any] | None = None  # (rank, world), this rank's share
        self.n_classes = len(self.index["classes"])
        # targets: a block of outputs each past the classes (voxjet.jets.targets)
        self.targets: list[Target] = parse_targets(self.data.targets)
        self.model_cfg = {
            "n_features": len(self.index["particle_features"]),
            "n_classes": self.n_classes + len(output_columns(self.targets)),
            "particle_mean": self.index["particle_mean"],
            "particle_std": self.index["particle_std"],
            # the robust standardisation's clip and the declared missing values (index.json)
            "input_clip": self.index.get("input_clip"),
            "particle_missing": self.index.get("particle_missing"),
            "feature_names": self.index["particle_features"],
            **model_cfg,
        }
        groups = self.data.weaver_inputs or {}
        points = [g for name, g in groups.items()
                  if name.endswith("_points") and g.get("collection") is None]  # fmt: skip
        if model_cfg.get("name") == "particlenet" and points and "points" not in model_cfg:
            # voxjet's ParticleNet finds neighbours in the weaver config's points (CMS's
            # pfcand_etarel, pfcand_phirel)
            self.model_cfg["points"] = [v["name"] for v in points[0]["vars"]]
        if str(model_cfg.get("name", "")).startswith("weaver_"):
            # weaver's networks read the input groups of the data config the shards came from
            # (with the "auto" centres and scales the index job computed, if any)
            self.model_cfg["weaver_inputs"] = (
                self.index.get("weaver_inputs") or self.data.weaver_inputs
            )
        # extra constituent collections, each joined to the particles by the model
        self.collections = [
            {**c, "mean": self.index[f"coll_{c['name']}_mean"],
             "std": self.index[f"coll_{c['name']}_std"]}
            for c in self.index.get("collections") or []
        ]  # fmt: skip
        if self.collections:
            self.model_cfg["collections"] = self.collections
            self.device_keys = (*JetTask.device_keys, *collection_keys(self.index))
        self.s = s
        self.experiment = ""  # for the trackers (MLflow's experiment)
        # the loss of a tagger that guesses (uniform scores; standardised targets predicted 0):
        # a loss far above it for long is a diverged run (voxjet.training.divergence)
        self.chance_loss = math.log(max(self.n_classes, 2)) + sum(
            t.weight * (math.log(len(t.classes)) if t.classes else 1.0) for t in self.targets
        )
        # one stream for the run: read in this process, its buffer serves every epoch (new
        # memory each epoch costs a page fault every 4 KiB, at the epoch boundary)
        self._stream: JetStream | None = None

    def data_config(self) -> dict[str, Any]:
        return {"shards": self.index["config_hash"]}

    def memory_estimate(self, model: nn.Module, gpu: bool) -> float | None:
        return None  # jet taggers are small: nothing is planned for their memory

    def build_model(self) -> nn.Module:
        return build_model(**self.model_cfg)

    def model_config(self) -> dict[str, Any]:
        # the jets config travels with the model: predict computes its inputs from raw files
        return {
            **self.model_cfg,
            "classes": self.index["classes"],
            "domain": "jets",
            "data": self.data.record(),
            **({"targets": target_settings(self.index, self.data)} if self.targets else {}),
        }

    def stream(self, rt: Runtime) -> JetStream:
        """This rank's share of the training shards, streamed: padded by the loader for a CPU
        model, unpadded (a third of the bytes) for a GPU, which pads them itself."""
        pad = None if rt.device.type == "cuda" else int(self.index["max_particles"])
        return JetStream(
            self.dir,
            "train",
            self.s.batch_size,
            self.s.seed,
            rt.rank,
            rt.world_size,
            fetch=self.read.fetch,
            lookahead=self.read.lookahead,
            storage_options=self.read.storage_options,
            pad_to=pad,
        )

    def batches(self, epoch: int, start: int, rt: Runtime) -> Iterator[dict[str, torch.Tensor]]:
        if self._stream is None:
            self._stream = self.stream(rt)
        self._stream.at(epoch, start)
        # workers reuse their batches' shared memory once the loop lets go of them: enough
        # slots for every batch the loop's read-ahead can hold, and the ones in transit
        loader = (
            self._stream
            if self.s.loader_workers == 0
            else ReturningLoader(self._stream, self.s.loader_workers, slots=self.s.prefetch + 4)
        )
        yield from loader

    # what the loop's DeviceFeed moves to the device one step ahead (where the jets came from
    # stays on the host, for messages)
    device_keys = ("particles", "mask", "labels", "offsets", "targets")

    def on_device(self, batch: dict, device: torch.device) -> dict:
        """An unpadded batch (a GPU's) padded where it now is."""
        if "offsets" not in batch:
            return batch
        b = dict(batch)
        counts = b.pop("offsets").diff().to(device)
        b["particles"], b["mask"] = pad_particles(b["particles"].to(device), counts,
                                                  int(self.index["max_particles"]))  # fmt: skip
        return b

    def provenance(self, batch) -> torch.Tensor:
        """(shard number, row) of each jet of the batch."""
        return batch["source"].clone()

    def describe(self, provenance: torch.Tensor) -> str:
        """Which shards and rows a batch came from (for error messages)."""
        return self._stream.describe({"source": provenance})

    def loss(self, model: nn.Module, batch, device: torch.device) -> tuple[torch.Tensor, int]:
        extra = model_inputs(batch, self.collections, device)
        out = model(batch["particles"].to(device), batch["mask"].to(device), *extra).float()
        c = self.n_classes
        loss = F.cross_entropy(out[:, :c], batch["labels"].to(device))
        if self.targets:  # standardised by the training split's mean and std
            loss = loss + target_loss(
                out[:, c:],
                batch["targets"].to(device),
                self.targets,
                self.index["target_mean"],
                self.index["target_std"],
            )
        return loss, len(batch["labels"])

    def validation_share(self, rt: Runtime):
        """This rank's contiguous share of the validation jets, read once (only where used)."""
        part = (rt.rank, rt.world_size)
        if self._val is None or self._val[0] != part:
            self._val = (part, load_split(self.dir, "val", self.read, part=part))
        return self._val[1]

    def validate(self, model: nn.Module, device: torch.device, rt: Runtime) -> dict[str, float]:
        """Each rank scores its share of the validation jets; the scores and labels are gathered
        (in rank order: the split's order) and every rank computes the same metrics."""
        data = self.validation_share(rt)
        probs, regressed = predict(model, data, device, self.n_classes, self.collections)
        true = data.targets.numpy() if data.targets is not None else np.zeros((len(data), 0))
        mine = (probs, data.labels.numpy(), regressed, true)
        parts = [mine]
        if rt.distributed:
            parts = [None] * rt.world_size
            dist.all_gather_object(parts, mine)
        probs, labels, regressed, true = (np.concatenate(p) for p in zip(*parts, strict=True))
        m = jet_metrics(probs, labels, self.index["classes"], self.index.get("background"))
        out = {"score": m["auc_macro"], "auc_macro": m["auc_macro"], "accuracy": m["accuracy"]}
        if self.targets:  # logged beside the AUC; the AUC picks the best
            pred = decode_numpy(regressed, self.targets, self.index["target_mean"],
                                self.index["target_std"])  # fmt: skip
            m = target_metrics(pred, true, self.targets, self.index["target_mean"], None)
            for name, r in m.get("regression", {}).items():
                out[f"resolution_{name}"] = r["resolution"]
            for name, r in m.get("classification", {}).items():
                out[f"accuracy_{name}"] = r["accuracy"]
        return out


def target_settings(index: dict, data: JetDataConfig) -> dict[str, Any]:
    """What a trained model needs of its targets: names, specs and the training split's mean
    and std (to turn its regression outputs back into the targets' units)."""
    return {"names": list(index["targets"]), "specs": data.targets,
            "mean": index["target_mean"], "std": index["target_std"]}  # fmt: skip


def run(
    shard_dir: str, run_config: dict[str, Any], out_dir: str, read: dict | None = None
) -> dict[str, Any]:
    """Train one run of a jet experiment into `out_dir` (shards from a folder or a URL, read
    with the dataset's `read:` settings)."""
    rt = init_runtime()
    try:
        # read.node_local: the node's processes read one copy in node-local storage
        with localised(shard_dir, read) as where:
            task, s = make_task(where, run_config, read)
            return train(task, s, out_dir, rt, rate_key="jets_per_s")
    finally:
        shutdown(rt)


def make_task(shard_dir: str, run_config: dict[str, Any],
              read: dict | None = None) -> tuple[JetTask, TrainSettings]:  # fmt: skip
    """The task and settings a run config describes (for training, and for the planner's
    profile of one step)."""
    s = settings_of(run_config)
    s.batch_size = s.batch_size or JET_BATCH_SIZE
    task = JetTask(shard_dir, dict(run_config.get("model", {})), s, ReadOptions.from_config(read))
    task.experiment = run_config.get("experiment", "")
    return task, s
