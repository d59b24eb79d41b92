"""Segmentation networks built from the plan and the experiment's model section: `dynunet`
(MONAI's DynUNet with the plan's per-axis kernels and strides, nnU-Net's plain network), `unet`
(MONAI's UNet, isotropic levels of the experiment's widths) and `resenc` (nnU-Net's residual-
encoder U-Net from MIC-DKFZ's dynamic-network-architectures, the `ResidualEncoderUNet` its
ResEnc presets train). All use InstanceNorm, so micro-batches do not change the result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from monai.networks.nets import DynUNet, UNet
from torch import nn

from voxjet.distributed import checkpoint
from voxjet.errors import VoxjetError

# residual blocks a stage of nnU-Net's ResEnc presets' encoder
BLOCKS_ENCODER = (1, 3, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6)


def build_unet(
    in_channels: int,
    out_channels: int,
    channels: list[int],
    num_res_units: int = 1,
    dropout: float = 0.0,
    spatial_dims: int = 3,
) -> nn.Module:
    """A MONAI U-Net (3D, or 2D for a 2d configuration); one stride-2 level between each pair
    of channel counts."""
    return UNet(
        spatial_dims=spatial_dims,
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
    """MONAI's DynUNet with a topology from the plan (kernels and strides a level; 2D when they
    have two axes)."""
    if len(filters) != len(strides):
        raise VoxjetError(
            f"dynunet: {len(filters)} filters for {len(strides)} levels; give one width a level"
        )
    return DynUNet(
        spatial_dims=len(strides[0]),
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


def build_resenc_core(in_channels: int, out_channels: int, network: dict,
                      deep_supervision: bool = False) -> nn.Module:  # fmt: skip
    """dynamic-network-architectures' ResidualEncoderUNet with nnU-Net's settings (InstanceNorm
    with affine, LeakyReLU, conv bias) for a planned topology; the residual blocks a stage and
    decoder convolutions are the plan's, else the ResEnc presets' (1, 3, 4, 6, 6, … and 1)."""
    try:
        from dynamic_network_architectures.architectures.unet import ResidualEncoderUNet
    except ImportError as e:
        raise VoxjetError(
            "model resenc needs MIC-DKFZ's dynamic-network-architectures: pip install "
            "'voxjet[resenc]' (or pip install dynamic-network-architectures)"
        ) from e
    strides = network["strides"]
    n = len(strides)
    dims = len(strides[0])
    conv, norm = (nn.Conv3d, nn.InstanceNorm3d) if dims == 3 else (nn.Conv2d, nn.InstanceNorm2d)
    return ResidualEncoderUNet(
        input_channels=in_channels,
        n_stages=n,
        features_per_stage=list(network["filters"]),
        conv_op=conv,
        kernel_sizes=[list(k) for k in network["kernels"]],
        strides=[list(s) for s in strides],
        n_blocks_per_stage=list(network.get("blocks_per_stage") or BLOCKS_ENCODER[:n]),
        num_classes=out_channels,
        n_conv_per_stage_decoder=list(network.get("decoder_convs") or [1] * (n - 1)),
        conv_bias=True,
        norm_op=norm,
        norm_op_kwargs={"eps": 1e-5, "affine": True},
        dropout_op=None,
        nonlin=nn.LeakyReLU,
        nonlin_kwargs={"inplace": True},
        deep_supervision=deep_supervision,
    )


class ResEncUNet(nn.Module):
    """The residual-encoder U-Net with deep supervision as voxjet's trainer takes it from
    DynUNet: in training, the decoder's outputs upsampled to the patch and stacked
    [B, heads, C, ...] (the full resolution first); in evaluation the full-resolution output."""

    def __init__(self, in_channels: int, out_channels: int, network: dict,
                 deep_supervision: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.deep_supervision = deep_supervision
        self.net = build_resenc_core(in_channels, out_channels, network, deep_supervision)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = self.training and self.deep_supervision
        self.net.decoder.deep_supervision = heads
        out = self.net(x)
        if not heads:
            return out
        size = out[0].shape[2:]
        mode = "trilinear" if len(size) == 3 else "bilinear"
        up = [out[0]] + [F.interpolate(o, size=size, mode=mode) for o in out[1:]]
        return torch.stack(up, dim=1)


def build_resenc(in_channels: int, out_channels: int, network: dict,
                 deep_supervision: bool = False) -> nn.Module:  # fmt: skip
    """nnU-Net's residual-encoder U-Net for the plan's network."""
    return ResEncUNet(in_channels, out_channels, network, deep_supervision)


class SliceWise(nn.Module):
    """A 2D network applied to every slice of a volume along `axis` (0-2 of [B, C, X, Y, Z]):
    nnU-Net's 2d configuration in voxjet's 3D pipeline. Patches one voxel thick along the axis
    train it, the sliding window predicts slice by slice, and everything between (sampler,
    losses, evaluation, export) sees 3D tensors. Deep-supervision outputs [B, heads, C, …] keep
    their heads axis."""

    def __init__(self, net: nn.Module, axis: int) -> None:
        super().__init__()
        self.net = net
        self.axis = axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = 2 + self.axis
        b, n = x.shape[0], x.shape[a]
        slices = x.movedim(a, 1)  # [B, N, C, u, v]
        out = self.net(slices.reshape(b * n, *slices.shape[2:]))
        out = out.reshape(b, n, *out.shape[1:])  # [B, N, (heads,) C', u, v]
        # the slice axis back among the spatial ones (after heads and channels)
        return out.movedim(1, out.dim() - 2 + self.axis - 1)


MODEL_KEYS = {
    "unet": ("channels", "num_res_units", "dropout"),
    "dynunet": ("filters", "deep_supervision", "res_block", "dropout"),
    "resenc": ("deep_supervision",),
}


def build_seg_model(cfg: dict[str, Any]) -> nn.Module:
    """The network a model config describes (in_channels, out_channels, name and its keys;
    `network` the plan's topology for dynunet)."""
    name = cfg.get("name", "unet")
    if name not in MODEL_KEYS:
        raise VoxjetError(f"model {name!r} is no segmentation model; use unet, dynunet or resenc")
    keys = {k: cfg[k] for k in MODEL_KEYS[name] if k in cfg and cfg[k] is not None}
    axis = cfg.get("slice_axis")  # a 2d configuration's: a 2D network applied slice-wise
    if name == "unet":
        net = build_unet(cfg["in_channels"], cfg["out_channels"], **keys,
                         spatial_dims=3 if axis is None else 2)  # fmt: skip
    elif name == "resenc":
        net = build_resenc(cfg["in_channels"], cfg["out_channels"], cfg["network"], **keys)
    else:
        topo = cfg["network"]
        keys.setdefault("filters", topo["filters"])
        net = build_dynunet(cfg["in_channels"], cfg["out_channels"], topo["kernels"],
                            topo["strides"], **keys)  # fmt: skip
    return net if axis is None else SliceWise(net, int(axis))


def load_trained(model_path: str | Path) -> tuple[nn.Module, dict]:
    """Rebuild a trained segmentation model from model.pt (and return what model.pt holds)."""
    saved = checkpoint.load_model_file(model_path, "volumes", "segmentation", "train-seg")
    model = build_seg_model(saved["model_config"])
    checkpoint.load_weights(model, saved["model"], model_path, "the model its config describes")
    return model, saved
