"""The official ParticleTransformer and ParticleNet, through weaver-core's own model code
(`pip install voxjet[weaver]`), fed the input groups a weaver data config defines — points,
features, four-vectors, mask, standardised, clipped and padded as weaver does — so a state dict
saved by weaver (JetClass's published checkpoints) loads here for fine-tuning, and results are
comparable to the paper's. The network lives under `mod`, as in particle_transformer's
wrappers, so their checkpoints' keys match."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from voxjet.errors import VoxjetError

# the paper's configurations (jet-universe/particle_transformer, networks/example_*.py)
PART_DEFAULTS: dict[str, Any] = {
    "pair_input_dim": 4, "use_pre_activation_pair": False, "embed_dims": [128, 512, 128],
    "pair_embed_dims": [64, 64, 64], "num_heads": 8, "num_layers": 8, "num_cls_layers": 2,
    "block_params": None, "fc_params": [], "activation": "gelu", "trim": True,
    "cls_block_params": {"dropout": 0, "attn_dropout": 0, "activation_dropout": 0},
}  # fmt: skip
PNET_DEFAULTS: dict[str, Any] = {
    "conv_params": [[16, [64, 64, 64]], [16, [128, 128, 128]], [16, [256, 256, 256]]],
    "fc_params": [[256, 0.1]], "use_fusion": False, "use_fts_bn": True, "use_counts": True,
}  # fmt: skip
ROLES = ("points", "features", "vectors", "mask")  # the wrappers' arguments, in order


class WeaverInputs(nn.Module):
    """weaver's preprocessing of one input group, on the device: (x − centre)·scale clipped to
    [min, max] for variables with a centre, then padding to the group's length with the pad
    value (constant) or by repeating the jet's particles (wrap), then NaN → 0."""

    def __init__(self, group: dict[str, Any], feature_names: list[str], name: str) -> None:
        super().__init__()
        names = [v["name"] for v in group["vars"]]
        missing = [n for n in names if n not in feature_names]
        if missing:
            raise VoxjetError(f"weaver input group {name!r} needs {missing}, which the shards "
                              "do not hold; shard with the same weaver_config")  # fmt: skip
        vs = group["vars"]
        auto = [v["name"] for v in vs if v["center"] == "auto"]
        if auto:
            raise VoxjetError(f"weaver input group {name!r}: the automatic standardisation of "
                              f"{auto} was not computed (shards made by an older voxjet?); "
                              "rerun shard_jets")  # fmt: skip
        self.length, self.wrap = int(group["length"]), group["pad_mode"] == "wrap"
        self.register_buffer("index", torch.tensor([feature_names.index(n) for n in names]))
        self.register_buffer("standardise", torch.tensor([v["center"] is not None for v in vs]))
        for key, default in (("center", 0.0), ("scale", 1.0), ("min", float("-inf")),
                             ("max", float("inf")), ("pad_value", 0.0)):  # fmt: skip
            vals = [default if v[key] is None else float(v[key]) for v in vs]
            self.register_buffer(key, torch.tensor(vals, dtype=torch.float32))

    def forward(self, particles: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, P, F] particles (zero-padded) and [B, P] mask → [B, C, length]."""
        x = particles.index_select(-1, self.index)
        std = torch.clamp((x - self.center) * self.scale, self.min, self.max)
        x = torch.where(self.standardise, std, x)
        b, p, c = x.shape
        if p < self.length:
            x = torch.cat([x, x.new_zeros(b, self.length - p, c)], 1)
            mask = torch.cat([mask, mask.new_zeros(b, self.length - p)], 1)
        x, mask = x[:, : self.length], mask[:, : self.length].bool()
        if self.wrap:  # position j of a jet of n particles takes particle j mod n
            n = mask.sum(1, keepdim=True).clamp(min=1)
            pos = torch.arange(self.length, device=x.device).unsqueeze(0) % n
            x = torch.gather(x, 1, pos.unsqueeze(-1).expand(-1, -1, c))
            x = torch.where(mask.any(1, keepdim=True).unsqueeze(-1), x, self.pad_value)
        else:
            x = torch.where(mask.unsqueeze(-1), x, self.pad_value)
        return torch.nan_to_num(x, nan=0.0).transpose(1, 2)


# what weaver's pf + sv taggers read of each collection, in their forward's order
TAGGER_ROLES = {"pnet": ("points", "features", "mask"), "part": ("features", "vectors", "mask")}


class WeaverTagger(nn.Module):
    """weaver-core's ParticleTransformer (`kind` "part") or ParticleNet ("pnet") behind voxjet's
    (particles, mask) interface; with a second collection's groups (CMS's sv_*), weaver's
    ParticleTransformerTagger or ParticleNetTagger, fed (particles, mask, sv, sv_mask)."""

    def __init__(self, kind: str, n_classes: int, feature_names: list[str],
                 weaver_inputs: dict[str, Any] | None, pretrained: str | None = None,
                 collections: list[dict] | None = None, **kwargs: Any) -> None:  # fmt: skip
        super().__init__()
        self.kind = kind
        if collections:
            self._tagger(n_classes, feature_names, weaver_inputs or {}, collections, kwargs)
            if pretrained:
                load_pretrained(self.mod, pretrained)
            return
        if not weaver_inputs or len(weaver_inputs) != len(ROLES):
            raise VoxjetError(
                f"model weaver_{kind} reads the four input groups of a weaver data config "
                f"({', '.join(ROLES)}, in that order); give the dataset jets.weaver_config"
            )
        self.groups = nn.ModuleDict({name: WeaverInputs(g, feature_names, name)
                                     for name, g in weaver_inputs.items()})  # fmt: skip
        self.sources = [-1] * len(self.groups)  # every group reads the particles
        try:
            if kind == "part":
                from weaver.nn.model.ParticleTransformer import ParticleTransformer as Net
            else:
                from weaver.nn.model.ParticleNet import ParticleNet as Net
        except ImportError as e:
            raise VoxjetError(f"model weaver_{kind} runs weaver-core's model code: install it "
                              f"with pip install 'voxjet[weaver]' ({e})") from e  # fmt: skip
        n_feat = len(list(weaver_inputs.values())[1]["vars"])  # the features group
        if kind == "part":
            cfg = {**PART_DEFAULTS, **kwargs}
            self.mod = Net(input_dim=n_feat, num_classes=n_classes, **cfg)
        else:
            cfg = {**PNET_DEFAULTS, **kwargs}
            cfg["conv_params"] = [(k, tuple(ch)) for k, ch in cfg["conv_params"]]
            cfg["fc_params"] = [tuple(f) for f in cfg["fc_params"]]
            self.mod = Net(input_dims=n_feat, num_classes=n_classes, **cfg)
        if pretrained:
            load_pretrained(self.mod, pretrained)

    def _tagger(self, n_classes: int, feature_names: list[str], inputs: dict[str, Any],
                colls: list[dict], kwargs: dict) -> None:  # fmt: skip
        """weaver's pf + sv tagger: the particles' groups, then one collection's, by role."""
        if len(colls) != 1:
            names = [c["name"] for c in colls]
            raise VoxjetError(
                f"model weaver_{self.kind}: weaver's taggers read the particles "
                f"and one more collection, not {names}"
            )
        names = {None: feature_names, colls[0]["name"]: colls[0]["features"]}
        order = []
        for coll in (None, colls[0]["name"]):
            mine = {g.split("_", 1)[-1]: g for g, spec in inputs.items()
                    if spec.get("collection") == coll}  # fmt: skip
            for role in TAGGER_ROLES[self.kind]:
                if role not in mine:
                    raise VoxjetError(
                        f"model weaver_{self.kind} reads each collection's {role} group, and "
                        f"the data config's {coll or 'particle'} groups {sorted(mine.values())} "
                        f"have none (a group named <collection>_{role})"
                    )  # fmt: skip
                order.append(mine[role])
        self.groups = nn.ModuleDict(
            {g: WeaverInputs(inputs[g], names[inputs[g].get("collection")], g) for g in order}
        )
        self.sources = [-1 if inputs[g].get("collection") is None else 0 for g in order]
        try:
            if self.kind == "part":
                from weaver.nn.model.ParticleTransformer import ParticleTransformerTagger as Net
            else:
                from weaver.nn.model.ParticleNet import ParticleNetTagger as Net
        except ImportError as e:
            raise VoxjetError(f"model weaver_{self.kind} runs weaver-core's model code: install "
                              f"it with pip install 'voxjet[weaver]' ({e})") from e  # fmt: skip
        dims = [len(inputs[order[i]]["vars"]) for i in ((0, 3) if self.kind == "part" else (1, 4))]
        if self.kind == "part":
            self.mod = Net(*dims, num_classes=n_classes, **{**PART_DEFAULTS, **kwargs})
        else:
            cfg = {**PNET_DEFAULTS, **kwargs}
            cfg["conv_params"] = [(k, tuple(ch)) for k, ch in cfg["conv_params"]]
            cfg["fc_params"] = [tuple(f) for f in cfg["fc_params"]]
            self.mod = Net(*dims, num_classes=n_classes, **cfg)

    def weaver_inputs(self, particles: torch.Tensor, mask: torch.Tensor,
                      *extra: torch.Tensor) -> list[torch.Tensor]:  # fmt: skip
        """The groups as weaver's loader hands them to the model (a collection's from its
        objects and mask, `extra`)."""
        out = []
        for src, g in zip(self.sources, self.groups.values(), strict=True):
            x, m = (particles, mask) if src < 0 else (extra[2 * src], extra[2 * src + 1])
            out.append(g(x, m))
        return out

    def forward(self, particles: torch.Tensor, mask: torch.Tensor,
                *extra: torch.Tensor) -> torch.Tensor:  # fmt: skip
        groups = self.weaver_inputs(particles, mask, *extra)
        if len(groups) == 6:  # weaver's pf + sv tagger, its arguments in this order
            return self.mod(*groups)
        points, features, vectors, m = groups
        if self.kind == "part":
            return self.mod(features, v=vectors, mask=m)
        return self.mod(points, features, m)


def load_pretrained(net: nn.Module, path: str) -> None:
    """Weights saved by weaver (a state dict, or a checkpoint with one under `model`/
    `state_dict`; keys with or without the wrappers' `mod.`) into `net`. Every tensor must
    fit, except a final classifier of another class count (fine-tuning to new classes)."""
    p = Path(path)
    if not p.is_file():
        raise VoxjetError(f"{p}: no such pretrained weights file; check model.pretrained")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        raise VoxjetError(f"{p}: not a PyTorch state dict ({type(e).__name__}: {e})") from e
    for key in ("model", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise VoxjetError(f"{p}: holds no state dict")
    state = {k.removeprefix("module.").removeprefix("mod."): v for k, v in state.items()}
    own = net.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise VoxjetError(
            f"{p}: does not fit this network (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}); give the model the settings the weights were trained with"
        )
    head = {k for k, v in state.items() if v.shape != own[k].shape}
    last = max((k for k in own if k.startswith("fc.")), default=None)
    if head and not all(k.startswith("fc.") for k in head):
        raise VoxjetError(f"{p}: shapes differ for {sorted(head)[:5]}; give the model the "
                          "settings the weights were trained with")  # fmt: skip
    keep = {k: v for k, v in state.items() if k not in head}
    net.load_state_dict({**own, **keep})
    if head:
        print(f"{p}: loaded; the classifier {sorted(head)} starts afresh for the new classes "
              f"(last layer {last})")  # fmt: skip


def _factory(kind: str):
    def build(n_classes: int, feature_names: list[str], weaver_inputs: dict | None = None,
              pretrained: str | None = None, network: dict | None = None,
              n_features: int | None = None, particle_mean: Any = None,
              particle_std: Any = None, input_clip: Any = None, particle_missing: Any = None,
              collections: list[dict] | None = None) -> WeaverTagger:  # fmt: skip
        # weaver's inputs are standardised by the data config's own centres and scales, not by
        # the shards' statistics (n_features, particle_mean/std, input_clip, particle_missing
        # are voxjet's models' inputs)
        return WeaverTagger(kind, n_classes, feature_names, weaver_inputs, pretrained,
                            collections, **(network or {}))  # fmt: skip

    build.__doc__ = f"weaver-core's {'ParticleTransformer' if kind == 'part' else 'ParticleNet'}"
    return build


weaver_part = _factory("part")
weaver_pnet = _factory("pnet")
