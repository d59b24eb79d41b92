"""Jet taggers that read padded, masked particle clouds ([B, P, F] particles, [B, P] mask) and
return class logits; one module a model, found by its config name in MODELS."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from voxjet.jets.models.layers import Standardize, feature_indices
from voxjet.jets.models.part import ParT, pairwise_features
from voxjet.jets.models.particlenet import ParticleNet
from voxjet.jets.models.pfn import PFN
from voxjet.jets.models.sets import CollectionEmbedding
from voxjet.jets.models.weaver import weaver_part, weaver_pnet

MODELS: dict[str, Callable[..., nn.Module]] = {
    "pfn": PFN, "particlenet": ParticleNet, "part": ParT,
    # the official networks through weaver-core (the `weaver` extra), fed weaver's input groups
    "weaver_part": weaver_part, "weaver_pnet": weaver_pnet,
}  # fmt: skip

__all__ = ["MODELS", "PFN", "ParT", "ParticleNet", "Standardize", "build_model",
           "feature_indices", "pairwise_features"]  # fmt: skip


def build_model(name: str, collections: list[dict] | None = None, **kwargs) -> nn.Module:
    """A jet model by its config name (a key of MODELS), built with the model's keywords; with
    extra constituent `collections` ({name, features, mean, std} each), they join the
    particles through a CollectionEmbedding."""
    if name not in MODELS:
        raise ValueError(f"unknown jet model {name!r}; known: {sorted(MODELS)}")
    if name.startswith("weaver_"):  # weaver's taggers read a collection's groups themselves
        return MODELS[name](collections=collections, **kwargs)
    model = MODELS[name](**kwargs)
    if collections:
        model = CollectionEmbedding(model, kwargs["feature_names"], kwargs["particle_mean"],
                                    kwargs["particle_std"], collections,
                                    clip=kwargs.get("input_clip"))  # fmt: skip
    return model
