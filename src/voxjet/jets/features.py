"""Per-particle and per-jet input features computed columnar from JetClass-schema arrays,
and padding of jagged particles to a fixed length without ak.pad_none (numpy on offsets)."""

from __future__ import annotations

from collections.abc import Callable

import awkward as ak
import numpy as np

from voxjet.errors import VoxjetError

Arrays = ak.Array


def _pt(a: Arrays) -> ak.Array:
    return np.hypot(a["part_px"], a["part_py"])


def _safe_log(x):
    return np.log(np.maximum(x, 1e-8))


# ParT's inputs (Qu, Li, Qian 2022): kinematics, particle ID, track impact parameters.
PARTICLE_FEATURES: dict[str, Callable[[Arrays], ak.Array]] = {
    "part_deta": lambda a: a["part_deta"],
    "part_dphi": lambda a: a["part_dphi"],
    "part_pt_log": lambda a: _safe_log(_pt(a)),
    "part_e_log": lambda a: _safe_log(a["part_energy"]),
    "part_logptrel": lambda a: _safe_log(_pt(a) / a["jet_pt"]),
    "part_logerel": lambda a: _safe_log(a["part_energy"] / a["jet_energy"]),
    "part_deltaR": lambda a: np.hypot(a["part_deta"], a["part_dphi"]),
    "part_charge": lambda a: a["part_charge"],
    "part_isChargedHadron": lambda a: a["part_isChargedHadron"],
    "part_isNeutralHadron": lambda a: a["part_isNeutralHadron"],
    "part_isPhoton": lambda a: a["part_isPhoton"],
    "part_isElectron": lambda a: a["part_isElectron"],
    "part_isMuon": lambda a: a["part_isMuon"],
    "part_d0": lambda a: np.tanh(a["part_d0val"]),
    "part_d0err": lambda a: a["part_d0err"],
    "part_dz": lambda a: np.tanh(a["part_dzval"]),
    "part_dzerr": lambda a: a["part_dzerr"],
}

JET_FEATURES: dict[str, Callable[[Arrays], np.ndarray]] = {
    "jet_pt": lambda a: a["jet_pt"],
    "jet_eta": lambda a: a["jet_eta"],
    "jet_sdmass": lambda a: a["jet_sdmass"],
    "jet_nparticles": lambda a: a["jet_nparticles"],
    "jet_tau21": lambda a: a["jet_tau2"] / np.maximum(a["jet_tau1"], 1e-8),
    "jet_tau32": lambda a: a["jet_tau3"] / np.maximum(a["jet_tau2"], 1e-8),
}

# Which ROOT branches each feature reads, so that a shard job reads only those baskets.
_PART_NEEDS = {
    "part_pt_log": ["part_px", "part_py"],
    "part_logptrel": ["part_px", "part_py", "jet_pt"],
    "part_logerel": ["part_energy", "jet_energy"],
    "part_e_log": ["part_energy"],
    "part_deltaR": ["part_deta", "part_dphi"],
    "part_d0": ["part_d0val"],
    "part_dz": ["part_dzval"],
}
_JET_NEEDS = {"jet_tau21": ["jet_tau1", "jet_tau2"], "jet_tau32": ["jet_tau2", "jet_tau3"]}


def branches_needed(particle_features: list[str], jet_features: list[str]) -> list[str]:
    """The ROOT branches to read for the chosen features (always including the pT for sorting)."""
    check_feature_names(particle_features, jet_features)
    need = {"part_px", "part_py"}
    for f in particle_features:
        need.update(_PART_NEEDS.get(f, [f]))
    for f in jet_features:
        need.update(_JET_NEEDS.get(f, [f]))
    return sorted(need)


def check_feature_names(particle_features: list[str], jet_features: list[str]) -> None:
    """Fail with the list of known names when the config asks for an unknown feature."""
    bad = [f for f in particle_features if f not in PARTICLE_FEATURES]
    if bad:
        raise VoxjetError(f"unknown particle features {bad}; known: {sorted(PARTICLE_FEATURES)}")
    bad = [f for f in jet_features if f not in JET_FEATURES]
    if bad:
        raise VoxjetError(f"unknown jet features {bad}; known: {sorted(JET_FEATURES)}")


def pad_jagged(content: np.ndarray, counts: np.ndarray, length: int) -> np.ndarray:
    """Pad/clip flat per-particle rows [sum(counts), F] into [N, length, F] with zeros."""
    counts = np.asarray(counts, np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    pos = np.arange(length)[None, :]
    valid = pos < counts[:, None]
    out = np.zeros((len(counts), length) + content.shape[1:], content.dtype)
    out[valid] = content[(offsets[:-1, None] + pos)[valid]]
    return out


def compute_features(
    arrays: Arrays, particle_features: list[str], jet_features: list[str], max_particles: int
) -> dict[str, np.ndarray]:
    """Particles [N, P, F] sorted by pT and padded, mask [N, P], jets [N, J]."""
    order = ak.argsort(_pt(arrays), axis=1, ascending=False)
    counts = ak.to_numpy(ak.num(arrays["part_px"], axis=1))
    cols = []
    for name in particle_features:
        col = ak.Array(PARTICLE_FEATURES[name](arrays))[order]
        cols.append(ak.to_numpy(ak.flatten(col)).astype(np.float32))
    flat = np.stack(cols, axis=1) if cols else np.zeros((int(counts.sum()), 0), np.float32)
    particles = pad_jagged(flat, counts, max_particles)
    mask = np.arange(max_particles)[None, :] < counts[:, None]
    jets = (
        np.stack(
            [np.asarray(ak.to_numpy(JET_FEATURES[n](arrays)), np.float32) for n in jet_features],
            axis=1,
        )
        if jet_features
        else np.zeros((len(counts), 0), np.float32)
    )
    if not np.isfinite(particles).all() or not np.isfinite(jets).all():
        raise VoxjetError(
            "non-finite input features (NaN/inf) in the ROOT file; check the branches"
        )
    return {"particles": particles, "mask": mask, "jets": jets}


def labels_from_onehot(arrays: Arrays, label_branches: list[str]) -> np.ndarray:
    """Class index from one-hot label branches of mixed types; -1 where none is set."""
    onehot = np.stack([ak.to_numpy(arrays[b]).astype(np.float32) for b in label_branches], axis=1)
    labels = onehot.argmax(1).astype(np.int64)
    labels[onehot.max(1) <= 0] = -1
    return labels
