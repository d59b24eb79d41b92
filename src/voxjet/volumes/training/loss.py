"""The segmentation loss: MONAI's DiceCE, and for a dataset with nnU-Net's ignore label the
same Dice + cross entropy on the annotated voxels alone (nnU-Net's loss mask): unannotated
voxels pull the prediction nowhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from monai.losses import DiceCELoss, DiceLoss
from torch import nn


class IgnoringDiceCE(nn.Module):
    """Soft Dice (MONAI's, as DiceCELoss computes it) plus cross entropy over [B, C, ...]
    logits and [B, 1, ...] labels, leaving out every voxel labelled `ignore`."""

    def __init__(self, ignore: int) -> None:
        super().__init__()
        self.ignore = ignore
        self.dice = DiceLoss()  # DiceCELoss's own Dice: smooth 1e-5, mean over batch and class

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        labels = target[:, 0].long()
        seen = labels != self.ignore
        n = seen.sum()
        ce = F.cross_entropy(logits, labels, ignore_index=self.ignore, reduction="sum")
        ce = ce / n.clamp(min=1)  # the mean over annotated voxels (0 where a patch has none)
        weight = seen.unsqueeze(1).to(logits.dtype)
        probs = torch.softmax(logits, 1) * weight
        onehot = F.one_hot(labels.masked_fill(~seen, 0), logits.shape[1]).movedim(-1, 1)
        return self.dice(probs, onehot.to(logits.dtype) * weight) + ce


def segmentation_loss(regions: bool, ignore: int | None) -> nn.Module:
    """The loss a plan's network trains with: sigmoid DiceCE on region masks, softmax DiceCE
    on classes, without the ignore label's voxels where the dataset has one."""
    if regions:
        return DiceCELoss(sigmoid=True)
    if ignore is not None:
        return IgnoringDiceCE(ignore)
    return DiceCELoss(to_onehot_y=True, softmax=True)
