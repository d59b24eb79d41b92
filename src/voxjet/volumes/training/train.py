"""`voxjet train-seg`: patch-based segmentation (3D, or the 2d configuration's slices)
through the shared training loop: DiceCE on class labels (softmax) or on region masks (sigmoid,
region-based datasets, as nnU-Net trains them), deep supervision on the decoder outputs where
asked, the plan's network, k-fold cross-validation runs, and patches made by DataLoader workers
with nnU-Net's augmentation (applied there, or to whole batches on the training device:
`train.augment_on`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from voxjet.distributed.gpus import job_device
from voxjet.distributed.runtime import Runtime, init_runtime, shutdown
from voxjet.distributed.sharded import shard_units
from voxjet.errors import VoxjetError
from voxjet.io.handover import ReturningLoader
from voxjet.io.node_local import localised
from voxjet.io.remote import ReadOptions, read_json_at
from voxjet.training.loop import train
from voxjet.training.task import TrainSettings, settings_of
from voxjet.volumes.dataset.splits import fold_splits
from voxjet.volumes.evaluation.metrics import class_means, dice, mean_of, nanmean
from voxjet.volumes.inference.cascade import PreviousStage
from voxjet.volumes.inference.segment import Windows, segment_image
from voxjet.volumes.networks.models import build_seg_model
from voxjet.volumes.networks.unet_stages import network_ops, split_network
from voxjet.volumes.plan.memory import estimate_bytes
from voxjet.volumes.plan.plan_file import Plan, read_configured
from voxjet.volumes.plan.sizing import check_model_against_plan
from voxjet.volumes.preprocessing.store import CaseStore, case_sizes, read_case_arrays
from voxjet.volumes.training.augment import augment_batch, params_of
from voxjet.volumes.training.loss import segmentation_loss
from voxjet.volumes.training.patches import PatchBatches, PatchSampler


def region_targets(label: torch.Tensor, plan: Plan) -> torch.Tensor:
    """[B, R, ...] float masks of the regions from [B, 1, ...] labels (on their device)."""
    masks = [torch.isin(label[:, 0], torch.tensor(v, device=label.device)) for v in
             plan.regions.values()]  # fmt: skip
    return torch.stack(masks, 1).float()


class SegTask:
    """Segmentation for the shared loop: DiceCE on patches, mean foreground Dice picks the best."""

    def __init__(
        self,
        cases_dir: str | Path,
        model_cfg: dict[str, Any],
        s: TrainSettings,
        read: ReadOptions | None = None,
        configuration: str = "3d_fullres",
        previous: dict[str, list[str]] | None = None,
    ) -> None:
        self.dir = str(cases_dir)  # a folder or an fsspec URL
        r = read or ReadOptions()
        self.plan = read_configured(self.dir, configuration, r)
        self.fingerprint = read_json_at(self.dir, "fingerprint.json", r)
        self.splits = read_json_at(self.dir, "splits.json", r)
        train_ids, val_ids = fold_splits(self.splits, s.fold, s.folds, self.plan.seed,
                                         f"{self.dir}/splits.json")  # fmt: skip
        if not val_ids:
            raise VoxjetError(
                f"{self.dir}/splits.json: the validation split is empty (the best checkpoint "
                "would be picked on training cases); raise the dataset's volumes.val_fraction "
                "or add cases"
            )
        remote = {"fetch": r.fetch, "storage_options": r.storage_options, "lookahead": r.lookahead,
                  "sizes": case_sizes(self.dir, r)}  # fmt: skip
        self.previous = self._previous_stage(previous)
        self.train_store = CaseStore(self.dir, train_ids, **remote, previous=self.previous)
        self.val_store = CaseStore(self.dir, val_ids, **remote, previous=self.previous)
        self.sampler = PatchSampler(
            self.train_store,
            self.plan.patch_size,
            s.batch_size,
            s.foreground_fraction,
            s.seed,
            augment=s.augment,
            spacing=self.plan.target_spacing,
            augment_on=s.augment_on,
            slice_axis=self.plan.slice_axis,
        )
        self.s = s
        self.iterations = s.iterations_per_epoch
        self.data = {"plan": self.plan.to_dict(), "train": sorted(train_ids),
                     "val": sorted(val_ids)}  # fmt: skip
        channels = self.train_store.volumes(self.train_store.case_ids[0])[0].shape[0]
        self.regions = bool(self.plan.regions)
        self.model_cfg = {
            "name": "unet",
            **model_cfg,
            "in_channels": int(channels),
            "out_channels": self.plan.outputs,
        }
        if self.plan.slice_axis is not None:  # a 2d configuration: the 2D network by slices
            self.model_cfg["slice_axis"] = int(self.plan.slice_axis)
            if s.pipeline_stages > 1:
                raise VoxjetError(
                    f"configuration {configuration} and train.pipeline_stages > 1: a 2D "
                    "network is not cut into pipeline stages; set train.pipeline_stages: 1"
                )
        if self.model_cfg["name"] == "resenc":
            self.model_cfg["network"] = self.plan.network
            if s.pipeline_stages > 1:
                raise VoxjetError(
                    "model resenc and train.pipeline_stages > 1: the residual-encoder U-Net is "
                    "not cut into pipeline stages; use model dynunet or unet for a pipeline, or "
                    "a ResEnc plan whose batch fits one GPU (train.pipeline_stages: 1)"
                )
        if self.model_cfg["name"] == "dynunet":
            self.model_cfg["network"] = self.plan.network
            filters = self.model_cfg.get("filters")
            if filters is not None and len(filters) != len(self.plan.network["strides"]):
                raise VoxjetError(
                    f"model.filters has {len(filters)} widths, but the plan's network has "
                    f"{len(self.plan.network['strides'])} levels; give that many, or null "
                    "for the plan's"
                )
        check_model_against_plan(self.model_cfg, self.plan, f"{self.dir}/plan.json")
        self.deep_supervision = bool(self.model_cfg.get("deep_supervision"))
        if self.deep_supervision and s.pipeline_stages > 1:
            raise VoxjetError("model.deep_supervision and train.pipeline_stages > 1: a pipeline "
                              "cut has one output; switch one off")  # fmt: skip
        self.loss_fn = segmentation_loss(bool(self.regions), self.plan.ignore_label)
        self.experiment = ""  # for the trackers (MLflow's experiment)

    def _previous_stage(self, previous: dict[str, list[str]] | None):
        """The cascade's low-resolution segmentations (None for other configurations)."""
        if self.plan.configuration != "3d_cascade_fullres":
            return None
        if not previous or not previous.get("validations"):
            raise VoxjetError(
                "configuration 3d_cascade_fullres: no 3d_lowres validations given; train it "
                "through the workflow (experiment `previous:` names the 3d_lowres experiment), "
                "or give train-seg --previous-validations (its folds' validation folders)"
            )
        return PreviousStage(previous["validations"], previous.get("predictions", []), self.plan)

    def build_model(self) -> nn.Module:
        return build_seg_model(self.model_cfg)

    def data_config(self) -> dict[str, Any]:
        return self.data

    def memory_estimate(self, model: nn.Module, gpu: bool) -> float | None:
        # the planner's estimate for the network trained (not the one it sized the patch for)
        return estimate_bytes(model, self.model_cfg["in_channels"], self.plan.patch_size,
                              self.s.batch_size, gpu=gpu)  # fmt: skip

    def model_config(self) -> dict[str, Any]:
        # the plan and intensity statistics travel with the model: predict prepares new
        # images exactly as the training cases were
        return {
            **self.model_cfg,
            "patch_size": self.plan.patch_size,
            "domain": "volumes",
            # which cases trained and picked it (a fold's, for a cross-validation)
            "cases": {"train": self.data["train"], "val": self.data["val"]},
            "plan": self.plan.to_dict(),
            "fingerprint": self.fingerprint,
        }

    def batches(self, epoch: int, start: int, rt: Runtime) -> Iterator[dict[str, torch.Tensor]]:
        if self.s.loader_workers == 0:
            for i in range(start, self.iterations):
                yield self.sampler.batch(rt.rank, epoch, i)
            return
        # workers make the patches (reading, augmenting) side by side, in the same order
        batches = PatchBatches(self.sampler, rt.rank, epoch, start, self.iterations)
        yield from ReturningLoader(batches, self.s.loader_workers, slots=self.s.prefetch + 4)

    # what the loop's DeviceFeed moves to the device one step ahead (the drawn augmentation
    # parameters stay on the host: indexing by them there costs no device synchronisation)
    device_keys = ("image", "label", "big_image", "big_label")

    def on_device(self, batch: dict, device: torch.device) -> dict:
        """The batch augmented on the device (`train.augment_on: device`), in place."""
        if "aug_spatial" not in batch:
            return batch
        b = {k: (v.to(device) if k in self.device_keys else v) for k, v in batch.items()}
        augment_batch(b["image"], b["label"], params_of(b), (b["big_image"], b["big_label"]))
        return b

    def provenance(self, batch) -> list[str]:
        """The case and patch centre of each patch."""
        return list(batch["source"])

    def describe(self, provenance: list[str]) -> str:
        """Which cases and patch centres a batch came from (for error messages)."""
        return "patches " + ", ".join(provenance)

    def _loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.regions:
            target = region_targets(target, self.plan)
        if out.dim() == target.dim() + 1:  # deep supervision: [B, heads, C, ...]
            heads = out.shape[1]
            w = torch.tensor([0.5**i for i in range(heads)], device=out.device)
            w = w / w.sum()  # nnU-Net's weights: 1, 1/2, 1/4, … normalised
            return sum(w[i] * self.loss_fn(out[:, i].float(), target) for i in range(heads))
        return self.loss_fn(out.float(), target)

    def loss(self, model: nn.Module, batch, device: torch.device) -> tuple[torch.Tensor, int]:
        inputs, target = self.pipeline_batch(batch, device)
        return self._loss(model(inputs), target), len(inputs)

    def pipeline_stages(self, model: nn.Module, k: int):
        """The network cut into k stages balanced for the plan's patch, and the loss the last
        stage applies to each micro-batch."""
        stages = split_network(model, k, self.model_cfg["in_channels"], self.plan.patch_size)
        return stages, self._loss

    def fsdp_units(self, model: nn.Module) -> list[nn.Module]:
        """The blocks FSDP shards one by one: the U-Net's levels (down blocks, bottom, up
        blocks), as the pipeline cuts it; a network of another shape, its ModuleLists'."""
        try:
            return [op.module for op in network_ops(model)]
        except VoxjetError:
            return shard_units(model)

    def pipeline_batch(self, batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(input patches, label patches) on the device (labels widened there from the
        sampler's uint8), for the loss and the pipeline schedule."""
        return batch["image"].to(device), batch["label"].to(device).long()

    def validate(self, model: nn.Module, device: torch.device, rt: Runtime) -> dict[str, float]:
        """Each rank predicts its share of the validation cases (case i on rank i mod world);
        the per-case Dice values are gathered and every rank averages them the same way (a
        class's nanmean over the cases, then the mean over classes: nnU-Net's)."""
        mine = {}
        for cid in self.val_store.case_ids[rt.rank :: rt.world_size]:
            f = self.val_store.file(cid)
            image, label = read_case_arrays(f)
            if self.previous is not None:
                image = self.previous.with_image(image, cid, f.attrs)
            windows = Windows(list(self.plan.patch_size))
            pred = segment_image(model, image, windows, device, classes=self.plan.label_set)[0]
            # nnU-Net's Dice: a false positive on a case without the class counts 0
            mine[cid] = dice(pred, label, self.plan.label_set)
        parts = [mine]
        if rt.distributed:
            parts = [None] * rt.world_size
            dist.all_gather_object(parts, mine)
        cases = {cid: d for part in parts for cid, d in part.items()}
        per = {f"dice_{c}": v for c, v in class_means(dict(sorted(cases.items()))).items()}
        # a class no validation case has, in reference or prediction, has no Dice: the
        # score (what picks the best checkpoint) is then the mean of the others
        score = mean_of(per) if all(np.isfinite(v) for v in per.values()) else nanmean(
            per.values())  # fmt: skip
        return {"score": score if np.isfinite(score) else 0.0, **per}


def run(
    cases_dir: str,
    run_config: dict[str, Any],
    out_dir: str,
    read: dict | None = None,
    previous: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Train one run of a segmentation experiment into `out_dir` (case files from a folder or
    a URL, read with the dataset's `read:` settings; a cascade's `previous` stage: its
    validation folders and test prediction folders)."""
    rt = init_runtime()
    try:
        # read.node_local: the node's processes read one copy in node-local storage
        with localised(cases_dir, read) as where:
            task, s = make_task(where, run_config, read, previous)
            return train(task, s, out_dir, rt, rate_key="patches_per_s")
    finally:
        shutdown(rt)


def make_task(
    cases_dir: str,
    run_config: dict[str, Any],
    read: dict | None = None,
    previous: dict[str, list[str]] | None = None,
) -> tuple[SegTask, TrainSettings]:
    """The task and settings a run config describes (for training, and for the planner's
    profile of one step)."""
    opts = ReadOptions.from_config(read)
    s = settings_of(run_config)
    configuration = run_config.get("configuration", "3d_fullres")
    if s.augment_on is None:  # a GPU augments its batches; a CPU's loader does
        s.augment_on = "device" if job_device() == "cuda" else "loader"
        if configuration == "3d_cascade_fullres":  # its previous stage moves with the label
            s.augment_on = "loader"
    if s.batch_size is None:  # the plan's, from the GPU memory budget
        s.batch_size = read_configured(cases_dir, configuration, opts).batch_size
    task = SegTask(cases_dir, dict(run_config.get("model", {})), s, read=opts,
                   configuration=configuration, previous=previous)  # fmt: skip
    task.experiment = run_config.get("experiment", "")
    return task, s
