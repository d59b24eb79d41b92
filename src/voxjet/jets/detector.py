"""A detector's view of a generated jet's tracks, for the Pythia generator (`detector: smeared`):
each charged track's impact parameters and production point measured with a tracker's
resolution, σ(d0) = 20 µm ⊕ 40 µm·GeV/pT and σ(z) = 40 µm ⊕ 60 µm·GeV/pT (the scale of an
LHC silicon tracker's at high pT), and secondary vertices found from the displaced tracks by a
simple vertexer rather than read from the generator's record: some heavy-hadron decays are
missed (too few displaced tracks), some vertices are fakes (mismeasured prompt tracks, strange
hadrons' decays the V0 veto lets through, tracks of two decays merged), and positions carry
the tracks' errors."""

from __future__ import annotations

import numpy as np

from voxjet.jets.synth import SV_FEATURES

D0_FLOOR, D0_MS = 0.020, 0.040  # mm, mm·GeV: σ(d0) = floor ⊕ multiple scattering / pT
DZ_FLOOR, DZ_MS = 0.040, 0.060
DISPLACED = 3.0  # a track is displaced above this transverse significance |d0| / σ(d0)
TRACK_PT_MIN = 1.0  # GeV: softer tracks are not used by the vertexer
COMPATIBLE = 3.0  # a track joins a vertex within this many σ of its position
# what a b-tagging vertexer drops (CMS's inclusive vertex finder, its sv selection): vertices
# beyond the pixel layers (material interactions, long-lived strange hadrons) and two-track
# vertices of a K_S or Λ's mass
MAX_DXY = 25.0  # mm
V0_MASSES, V0_WINDOW = (0.4976, 1.1157), 0.03  # GeV


def resolution(pt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(σ(d0), σ(z)) in mm of tracks of transverse momenta `pt` (GeV)."""
    pt = np.maximum(np.asarray(pt, np.float64), 1e-3)
    return np.hypot(D0_FLOOR, D0_MS / pt), np.hypot(DZ_FLOOR, DZ_MS / pt)


def measured_tracks(rng: np.random.Generator, xyz: tuple[np.ndarray, ...], p4: tuple,
                    charged: np.ndarray) -> dict[str, np.ndarray]:  # fmt: skip
    """Each charged track's measured production point (x, y, z), impact parameters d0, dz and
    their errors: the truth moved by the resolution (neutral particles: zeros)."""
    x, y, z = (np.asarray(a, np.float64) for a in xyz)
    px, py, pz, _ = p4
    pt = np.hypot(px, py)
    s_t, s_z = resolution(pt)
    n = len(x)
    mx = x + rng.normal(0.0, 1.0, n) * s_t
    my = y + rng.normal(0.0, 1.0, n) * s_t
    mz = z + rng.normal(0.0, 1.0, n) * s_z
    safe = np.maximum(pt, 1e-9)
    d0 = np.where(charged, (mx * py - my * px) / safe, 0.0)
    dz = np.where(charged, mz - (mx * px + my * py) * pz / safe**2, 0.0)
    return {"x": mx, "y": my, "z": mz, "d0": d0, "dz": dz,
            "d0err": np.where(charged, s_t, 0.0), "dzerr": np.where(charged, s_z, 0.0),
            "sigma_t": s_t, "sigma_z": s_z}  # fmt: skip


def _clusters(points: np.ndarray, sigma: np.ndarray, order: np.ndarray) -> list[list[int]]:
    """Greedy vertexing: tracks (highest pT first) join the first vertex whose error-weighted
    position lies within COMPATIBLE σ (the two errors combined) of their own point, else
    start one."""
    vertices: list[list[int]] = []
    centres: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for i in order:
        for k, (c, w) in enumerate(zip(centres, weights, strict=True)):
            err = np.sqrt(sigma[i] ** 2 + 1.0 / w)
            if np.all(np.abs(points[i] - c) < COMPATIBLE * err):
                vertices[k].append(int(i))
                wi = 1.0 / sigma[i] ** 2
                centres[k] = (c * w + points[i] * wi) / (w + wi)
                weights[k] = w + wi
                break
        else:
            vertices.append([int(i)])
            centres.append(points[i].copy())
            weights.append(1.0 / sigma[i] ** 2)
    return vertices


def reconstructed_vertices(tracks: dict[str, np.ndarray], p4: tuple, charged: np.ndarray,
                           axis: tuple[float, float]) -> dict[str, np.ndarray]:  # fmt: skip
    """The jet's secondary vertices as the vertexer finds them from its displaced tracks (at
    least two a vertex), highest pT first, in the sv_* schema of the generator."""
    px, py, pz, e = (np.asarray(a, np.float64) for a in p4)
    pt = np.hypot(px, py)
    sig = np.abs(tracks["d0"]) / np.maximum(tracks["sigma_t"], 1e-12)
    use = np.flatnonzero(charged & (pt > TRACK_PT_MIN) & (sig > DISPLACED))
    points = np.stack([tracks["x"], tracks["y"], tracks["z"]], 1)
    sigma = np.stack([tracks["sigma_t"], tracks["sigma_t"], tracks["sigma_z"]], 1)
    rows = []
    for members in _clusters(points, sigma, use[np.argsort(-pt[use], kind="stable")]):
        if len(members) < 2:
            continue
        g = np.asarray(members)
        w = 1.0 / sigma[g] ** 2
        vx, vy, vz = (points[g] * w).sum(0) / w.sum(0)
        err = np.sqrt(1.0 / w.sum(0))  # the vertex's position error along x, y, z
        sx, sy, sz, se = px[g].sum(), py[g].sum(), pz[g].sum(), e[g].sum()
        spt = np.hypot(sx, sy)
        mass = float(np.sqrt(max(se**2 - sx**2 - sy**2 - sz**2, 0.0)))
        v0 = len(g) == 2 and any(abs(mass - m) < V0_WINDOW for m in V0_MASSES)
        if np.hypot(vx, vy) > MAX_DXY or v0:
            continue
        d3d = float(np.sqrt(vx**2 + vy**2 + vz**2))
        d3d_err = float(np.sqrt(((np.array([vx, vy, vz]) / max(d3d, 1e-12)) ** 2 * err**2).sum()))
        rows.append({
            "pt": spt, "deta": np.arcsinh(sz / spt) - axis[0],
            "dphi": (np.arctan2(sy, sx) - axis[1] + np.pi) % (2 * np.pi) - np.pi,
            "mass": mass, "ntracks": float(len(g)),
            "dxy": float(np.hypot(vx, vy)), "d3d": d3d, "d3dsig": d3d / max(d3d_err, 1e-12),
        })  # fmt: skip
    rows.sort(key=lambda r: -r["pt"])
    return {k: np.array([r[k] for r in rows], np.float64) for k in SV_FEATURES}
