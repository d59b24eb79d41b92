"""Segmentation networks from MONAI, built from the plan and the experiment's model section:
`dynunet` (MONAI's DynUNet with the plan's per-axis kernels and strides, nnU-Net's network) and
`unet` (MONAI's UNet, isotropic levels of the experiment's widths). Both use InstanceNorm, so
micro-batches do not change the result."""

from __future__ import annotations

from typing import Any

from monai.networks.nets import DynUNet, UNet
from torch import nn

from voxjet.errors import VoxjetError


def build_unet(
    in_channels: int,
    out_channels: int,
    channels: list[int],
    num_res_units: int = 1,
    dropout: float = 0.0,
) -> nn.Module:
    """A MONAI 3D U-Net; one stride-2 level between each pair of channel counts."""
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


def build_dynunet(
    in_channels: int,
    out_channels: int,
    kernels: list[list[int]],
    strides: list[list[int]],
    filters: list[int],
    deep_supervision: bool = False,
    res_block: bool = False,
    dropout: float = 0.0,
) -> nn.Module:
    """MONAI's DynUNet with a topology from the plan (kernels and strides a level)."""
    if len(filters) != len(strides):
        raise VoxjetError(
            f"dynunet: {len(filters)} filters for {len(strides)} levels; give one width a level"
        )
    return DynUNet(
        spatial_dims=3,
        in_channels=in_channels,
        out_channels=out_channels,
        kernel_size=kernels,
        strides=strides,
        upsample_kernel_size=strides[1:],
        filters=filters,
        norm_name="instance",
        deep_supervision=deep_supervision,
        deep_supr_num=max(1, len(strides) - 2),
        res_block=res_block,
        dropout=dropout or None,
    )


MODEL_KEYS = {
    "unet": ("channels", "num_res_units", "dropout"),
    "dynunet": ("filters", "deep_supervision", "res_block", "dropout"),
}


def build_seg_model(cfg: dict[str, Any]) -> nn.Module:
    """The network a model config describes (in_channels, out_channels, name and its keys;
    `network` the plan's topology for dynunet)."""
    name = cfg.get("name", "unet")
    if name not in MODEL_KEYS:
        raise VoxjetError(f"model {name!r} is no segmentation model; use unet or dynunet")
    keys = {k: cfg[k] for k in MODEL_KEYS[name] if k in cfg and cfg[k] is not None}
    if name == "unet":
        return build_unet(cfg["in_channels"], cfg["out_channels"], **keys)
    net = cfg["network"]
    keys.setdefault("filters", net["filters"])
    return build_dynunet(cfg["in_channels"], cfg["out_channels"], net["kernels"],
                         net["strides"], **keys)  # fmt: skip
