"""The Pythia generator's detector (voxjet.jets.detector): track resolution, and a vertexer that
finds displaced vertices from measured tracks, misses a decay with one displaced track, and can
be fooled — what makes `detector: smeared` reconstructed-like rather than truth."""

from __future__ import annotations

import numpy as np
import pytest

from voxjet.jets.detector import measured_tracks, reconstructed_vertices, resolution


def test_resolution_is_a_floor_and_multiple_scattering():
    d0, dz = resolution(np.array([1.0, 2.0, 1000.0]))
    assert d0 == pytest.approx([np.hypot(0.02, 0.04), np.hypot(0.02, 0.02), 0.02], rel=1e-3)
    assert dz[-1] == pytest.approx(0.04, rel=1e-3) and (np.diff(d0) < 0).all()


def _jet(rng):
    """Prompt tracks, a 3-track vertex 6 mm along the jet (a b hadron's flight at ~100 GeV), a
    2-track one at 3 mm, and a decay 4 mm away that left only one charged track; decay
    products fan out ~0.1 rad from the flight direction (m/p of a B at tens of GeV)."""
    direction = np.array([1.0, 0.2, 0.1]) / np.linalg.norm([1.0, 0.2, 0.1])
    points = [np.zeros(3)] * 8 + [6.0 * direction] * 3 + [3.0 * direction] * 2 + [4.0 * direction]
    xyz = tuple(np.array(points).T)
    n = len(points)
    spread = rng.normal(0, 0.1, (n, 3))
    spread[:8] *= 0.5
    mom = (direction + spread) * rng.uniform(8, 30, (n, 1))
    e = np.linalg.norm(mom, axis=1) + 0.14
    return xyz, (mom[:, 0], mom[:, 1], mom[:, 2], e), np.ones(n, bool)


def test_the_vertexer_finds_displaced_vertices_and_misses_a_one_track_decay():
    found = []
    for k in range(20):
        rng = np.random.default_rng(k)
        xyz, p4, charged = _jet(rng)
        tracks = measured_tracks(rng, xyz, p4, charged)
        # impact parameters as measured: prompt ones at the resolution, displaced ones far off
        sig = np.abs(tracks["d0"]) / tracks["d0err"]
        assert np.median(sig[:8]) < 2
        sv = reconstructed_vertices(tracks, p4, charged, (0.1, 0.2))
        found.append(sv)
    d3d = [sv["d3d"] for sv in found]
    # the 3-track vertex in most jets, where it is; a decay whose tracks point back at the
    # beam (small d0 however displaced) is missed, as a vertexer misses it
    assert np.mean([(np.abs(d - 6.0) < 0.2).any() for d in d3d]) > 0.7
    every = np.concatenate(d3d)
    assert ((np.abs(every - 6.0) < 0.2) | (np.abs(every - 3.0) < 0.2)).mean() > 0.8
    # never a vertex of one track: the one-track decay at 4 mm is not found alone
    assert all((sv["ntracks"] >= 2).all() for sv in found)
    assert not (np.abs(every - 4.0) < 0.1).any()
    assert max(np.concatenate([sv["d3dsig"] for sv in found])) > 20


def test_a_jet_of_prompt_tracks_rarely_has_a_vertex():
    """Prompt tracks displaced only by their errors: a fake now and then (2 tracks past 3σ
    within each other's errors), not a vertex a jet."""
    fakes = 0
    for k in range(40):
        rng = np.random.default_rng(100 + k)
        n = 20
        mom = np.array([1.0, 0.1, 0.0]) + rng.normal(0, 0.05, (n, 3))
        mom *= rng.uniform(1.5, 10, (n, 1))
        p4 = (mom[:, 0], mom[:, 1], mom[:, 2], np.linalg.norm(mom, axis=1))
        tracks = measured_tracks(rng, (np.zeros(n), np.zeros(n), np.zeros(n)), p4,
                                 np.ones(n, bool))  # fmt: skip
        fakes += len(reconstructed_vertices(tracks, p4, np.ones(n, bool), (0.0, 0.1))["pt"])
    assert fakes < 8
