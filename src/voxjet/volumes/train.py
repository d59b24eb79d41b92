"""`voxjet train-seg`: patch-based 3D segmentation through the shared training loop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from monai.losses import DiceCELoss
from torch import nn

from voxjet.distributed.runtime import Runtime, init_runtime, shutdown
from voxjet.errors import VoxjetError
from voxjet.io.remote import ReadOptions, read_json_at
from voxjet.training.loop import TrainSettings, train
from voxjet.volumes.inference import predict_case, read_case_arrays, seg_metrics
from voxjet.volumes.models import build_unet
from voxjet.volumes.patches import CaseStore, PatchSampler, case_sizes


class SegTask:
    """Segmentation for the shared loop: DiceCE on patches, mean foreground Dice picks the best."""

    def __init__(
        self,
        cases_dir: str | Path,
        model_cfg: dict[str, Any],
        s: TrainSettings,
        read: ReadOptions | None = None,
    ) -> None:
        self.dir = str(cases_dir)  # a folder or an fsspec URL
        r = read or ReadOptions()
        self.plan = read_json_at(self.dir, "plan.json", r)
        self.fingerprint = read_json_at(self.dir, "fingerprint.json", r)
        self.splits = read_json_at(self.dir, "splits.json", r)
        remote = {"fetch": r.fetch, "storage_options": r.storage_options, "lookahead": r.lookahead,
                  "sizes": case_sizes(self.dir, r)}  # fmt: skip
        self.train_store = CaseStore(self.dir, self.splits["train"], **remote)
        if not self.splits["val"]:
            raise VoxjetError(
                f"{self.dir}/splits.json: the validation split is empty (the best checkpoint "
                "would be picked on training cases); raise the dataset's volumes.val_fraction "
                "or add cases"
            )
        self.val_store = CaseStore(self.dir, self.splits["val"], **remote)
        self.sampler = PatchSampler(
            self.train_store,
            self.plan["patch_size"],
            s.batch_size,
            s.foreground_fraction,
            s.seed,
            augment=s.augment,
        )
        self.iterations = s.iterations_per_epoch
        self.data = {"plan": self.plan}
        channels = self.train_store.file(self.train_store.case_ids[0])["image"].shape[0]
        self.model_cfg = {
            "in_channels": int(channels),
            "out_channels": self.plan["num_classes"],
            **model_cfg,
        }
        self.loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
        self.experiment = ""  # for the trackers (MLflow's experiment)

    def build_model(self) -> nn.Module:
        return build_unet(**self.model_cfg)

    def data_config(self) -> dict[str, Any]:
        return self.data

    def model_config(self) -> dict[str, Any]:
        # the plan and intensity statistics travel with the model: predict prepares new
        # images exactly as the training cases were
        return {
            **self.model_cfg,
            "patch_size": self.plan["patch_size"],
            "domain": "volumes",
            "plan": self.plan,
            "fingerprint": self.fingerprint,
        }

    def batches(self, epoch: int, start: int, rt: Runtime) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(start, self.iterations):
            yield self.sampler.batch(rt.rank, epoch, i)

    def provenance(self, batch) -> list[str]:
        """The case and patch centre of each patch."""
        return list(batch["source"])

    def describe(self, provenance: list[str]) -> str:
        """Which cases and patch centres a batch came from (for error messages)."""
        return "patches " + ", ".join(provenance)

    def loss(self, model: nn.Module, batch, device: torch.device) -> tuple[torch.Tensor, int]:
        inputs, target = self.pipeline_batch(batch, device)
        return self.loss_fn(model(inputs).float(), target), len(inputs)

    def pipeline_stages(self, model: nn.Module, k: int):
        """The U-Net cut into k stages balanced for the plan's patch, and the loss the last
        stage applies to each micro-batch."""
        from voxjet.volumes.unet_stages import split_unet

        stages = split_unet(model, k, self.model_cfg["in_channels"], self.plan["patch_size"])
        return stages, lambda out, target: self.loss_fn(out.float(), target)

    def pipeline_batch(self, batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(input patches, label patches) on the device (labels widened there from the
        sampler's uint8), for the loss and the pipeline schedule."""
        return batch["image"].to(device), batch["label"].to(device).long()

    def validate(self, model: nn.Module, device: torch.device, rt: Runtime) -> dict[str, float]:
        """Each rank predicts its share of the validation cases (case i on rank i mod world);
        the per-case Dice values are gathered and every rank averages them the same way."""
        n = self.plan["num_classes"]
        mine = {}
        for cid in self.val_store.case_ids[rt.rank :: rt.world_size]:
            image, label = read_case_arrays(self.val_store.file(cid))
            pred = predict_case(model, image, self.plan["patch_size"], device)
            mine[cid] = {
                c: m["dice"] for c, m in seg_metrics(pred, label, n).items() if m["present"]
            }
        parts = [mine]
        if rt.distributed:
            parts = [None] * rt.world_size
            dist.all_gather_object(parts, mine)
        cases = {cid: d for part in parts for cid, d in part.items()}
        dices = {
            c: [cases[cid][c] for cid in sorted(cases) if c in cases[cid]] for c in range(1, n)
        }
        per = {
            f"dice_{self.plan['labels'][str(c)]}": float(np.mean(v)) if v else float("nan")
            for c, v in dices.items()
        }
        vals = [v for v in per.values() if np.isfinite(v)]
        return {"score": float(np.mean(vals)) if vals else 0.0, **per}


def run(
    cases_dir: str, run_config: dict[str, Any], out_dir: str, read: dict | None = None
) -> dict[str, Any]:
    """Train one run of a segmentation experiment into `out_dir` (case files from a folder or
    a URL, read with the dataset's `read:` settings)."""
    opts = ReadOptions.from_config(read)
    rt = init_runtime()
    s = TrainSettings(**run_config.get("train", {}))
    if s.batch_size is None:  # the plan's, from the GPU memory budget
        s.batch_size = int(read_json_at(cases_dir, "plan.json", opts)["batch_size"])
    try:
        task = SegTask(cases_dir, dict(run_config.get("model", {})), s, read=opts)
        task.experiment = run_config.get("experiment", "")
        return train(task, s, out_dir, rt, rate_key="patches_per_s")
    finally:
        shutdown(rt)
