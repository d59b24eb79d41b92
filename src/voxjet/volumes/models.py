"""Segmentation networks from MONAI, built from the plan and the experiment's model section."""

from __future__ import annotations

from monai.networks.nets import UNet
from torch import nn


def build_unet(
    in_channels: int,
    out_channels: int,
    channels: list[int],
    num_res_units: int = 1,
    dropout: float = 0.0,
    **_: object,
) -> nn.Module:
    """A MONAI 3D U-Net with InstanceNorm (micro-batches then do not change the result);
    one stride-2 level between each pair of channel counts."""
    return UNet(
        spatial_dims=3,
        in_channels=in_channels,
        out_channels=out_channels,
        channels=tuple(channels),
        strides=tuple([2] * (len(channels) - 1)),
        num_res_units=num_res_units,
        norm="instance",
        dropout=dropout,
    )
