"""The particle features a jet model computes geometry from, beyond learning from them:
ParticleNet finds neighbours in (Δη, Δφ), ParT builds its pair features from Δη, Δφ and pT.
Torch-free, so that the config check refuses a dataset without them at the dry run."""

from __future__ import annotations

PARTICLENET_POINTS = ("part_deta", "part_dphi")
PART_PAIR_FEATURES = ("part_deta", "part_dphi", "part_pt_log")
NEEDED_FEATURES = {"particlenet": PARTICLENET_POINTS, "part": PART_PAIR_FEATURES}
