"""Demo jets from a real event generator: Pythia 8 (the `pythia8mc` wheel) and FastJet.

pp collisions at 13.6 TeV; QCD dijets, tt̄ (all-hadronic), W/Z + jet with W/Z → qq̄, and
H + jet with H → bb̄, each with a hard-process pT above 450 GeV. Final-state visible particles
are clustered anti-kT R = 0.8; jets with 500 < pT < 1000 GeV and |η| < 2 are kept. A jet of a
signal class is kept only if it contains every quark of the decay (ΔR < 0.8 to the jet axis),
as in JetClass; QCD jets are all jets of the dijet events. Jet observables: soft-drop mass
(C/A declustering, z_cut = 0.1, β = 0) and N-subjettiness τ1..τ4 with exclusive-kT axes.

Multiple parton interactions (the underlying event) are off: three times faster, and jets as
in a sample without pile-up. No detector: particles are Pythia's, and the impact parameters
are the straight-line transverse and longitudinal distances of each charged particle's
production vertex from the beam line (Pythia records the displacement of b/c-hadron and K0/Λ
decays), with a constant nominal uncertainty (0.02 mm, 0.05 mm) rather than a tracker's.
Neutral particles get zero.

Secondary vertices (`sv_*`, counter `nsv`): the decay vertex of every b or c hadron (Pythia
records it) that at least two charged constituents of the jet come from — the hadron's own
decay products, or those of resonances decaying at the same point — with their summed
momentum, mass and track count, and the vertex's distance from the beam line (`sv_dxy`) and
from the interaction point (`sv_d3d`, over a nominal 0.05 mm for `sv_d3dsig`): a vertex finder
with perfect efficiency and no fakes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from voxjet.errors import VoxjetError
from voxjet.jets.detector import measured_tracks, reconstructed_vertices
from voxjet.jets.synth import (
    R0,
    SV_FEATURES,
    ToyJetsConfig,
    file_seed,
    particle_columns,
    write_jets,
)
from voxjet.progress import progress as progress_of

PROCESSES: dict[str, list[str]] = {
    "QCD": ["HardQCD:all = on"],
    "Tbqq": [
        "Top:gg2ttbar = on",
        "Top:qqbar2ttbar = on",
        "24:onMode = off",
        "24:onIfAny = 1 2 3 4 5",
    ],
    "Wqq": [
        "WeakBosonAndParton:qqbar2Wg = on",
        "WeakBosonAndParton:qg2Wq = on",
        "24:onMode = off",
        "24:onIfAny = 1 2 3 4 5",
    ],
    "Zqq": [
        "WeakBosonAndParton:qqbar2gmZg = on",
        "WeakBosonAndParton:qg2gmZq = on",
        "WeakZ0:gmZmode = 2",
        "23:onMode = off",
        "23:onIfAny = 1 2 3 4 5",
    ],
    "Hbb": [
        "HiggsSM:gg2Hg(l:t) = on",
        "HiggsSM:qg2Hq(l:t) = on",
        "HiggsSM:qqbar2Hg(l:t) = on",
        "25:onMode = off",
        "25:onIfAny = 5",
    ],
}
# the decaying particle whose quarks a signal jet must contain
RESONANCE = {"Tbqq": 6, "Wqq": 24, "Zqq": 23, "Hbb": 25}
D0_ERR, DZ_ERR = 0.02, 0.05  # mm, nominal


MISSING = (
    "the pythia generator needs the optional packages pythia8mc and fastjet: pip install "
    "'voxjet[pythia]' (pythia8mc has binary wheels for Linux x86_64 and CPython 3.10-3.13 only)"
)


def missing() -> str | None:
    """Why the generator cannot run here (None when it can)."""
    try:
        import fastjet  # noqa: F401
        import pythia8mc  # noqa: F401
    except ImportError as e:
        return f"{MISSING} ({e})"
    return None


def not_installed() -> str | None:
    """Why the generator cannot run here, from what is installed, without importing it (the
    Snakefile asks at every start), or None."""
    import importlib.util

    def gone(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is None
        except ImportError:
            return True

    absent = [m for m in ("pythia8mc", "fastjet") if gone(m)]
    return f"{MISSING} (not installed: {', '.join(absent)})" if absent else None


def _require():
    why = missing()
    if why:
        raise VoxjetError(f"{why}; or use generator: toy")
    import fastjet
    import pythia8mc

    return pythia8mc, fastjet


def _pythia(cls: str, seed: int):
    pythia8mc, _ = _require()
    if cls not in PROCESSES:
        raise VoxjetError(
            f"pythia generator: no process for class {cls!r}; use {sorted(PROCESSES)}"
        )
    p = pythia8mc.Pythia("", False)
    for line in [
        "Beams:eCM = 13600",
        "PhaseSpace:pTHatMin = 450",
        "PhaseSpace:pTHatMax = 1200",
        "Random:setSeed = on",
        f"Random:seed = {seed % 900_000_000 + 1}",
        "Next:numberCount = 0",
        "Next:numberShowEvent = 0",
        "Next:numberShowProcess = 0",
        "Next:numberShowInfo = 0",
        "Init:showProcesses = off",
        "Init:showChangedSettings = off",
        "Init:showChangedParticleData = off",
        "PartonLevel:MPI = off",
        *PROCESSES[cls],
    ]:
        if not p.readString(line):
            raise VoxjetError(f"Pythia refused the setting {line!r}")
    if not p.init():
        raise VoxjetError(f"Pythia failed to initialise for class {cls}")
    return p


def _decay_quarks(event, pid: int) -> list[tuple[float, float]]:
    """(eta, phi) of the quarks from each decay of a particle |id| = pid in the event."""
    found = []
    for i in range(event.size()):
        q = event[i]
        if q.idAbs() != pid or event[q.daughter1()].idAbs() == pid:
            continue  # only the last copy decays
        quarks, todo = [], [i]
        while todo:
            j = todo.pop()
            for d in event[j].daughterList():
                dd = event[d]
                if dd.idAbs() in (23, 24) and pid != dd.idAbs():  # t → bW: follow the W
                    last = d
                    while event[event[last].daughter1()].idAbs() == dd.idAbs():
                        last = event[last].daughter1()
                    todo.append(last)
                elif 1 <= dd.idAbs() <= 5:
                    quarks.append((dd.eta(), dd.phi()))
        found.append(quarks)
    return found


def _dr(eta1, phi1, eta2, phi2):
    dphi = (phi1 - phi2 + np.pi) % (2 * np.pi) - np.pi
    return np.hypot(eta1 - eta2, dphi)


def _softdrop_mass(fastjet, consts, zcut: float = 0.1) -> float:
    ca = fastjet.ClusterSequence(
        list(consts), fastjet.JetDefinition(fastjet.cambridge_algorithm, 10.0)
    )
    jet = ca.inclusive_jets()[0] if len(ca.inclusive_jets()) == 1 else None
    if jet is None:
        jet = max(ca.inclusive_jets(), key=lambda j: j.pt())
    j1, j2 = fastjet.PseudoJet(), fastjet.PseudoJet()
    while jet.has_parents(j1, j2):
        a, b = (j1, j2) if j1.pt() >= j2.pt() else (j2, j1)
        if b.pt() / (a.pt() + b.pt()) > zcut:
            break
        jet = a
        j1, j2 = fastjet.PseudoJet(), fastjet.PseudoJet()
    return float(max(jet.m(), 0.0))


def _taus(fastjet, consts, pt, eta, phi, nmax: int = 4) -> np.ndarray:
    kt = fastjet.ClusterSequence(list(consts), fastjet.JetDefinition(fastjet.kt_algorithm, 10.0))
    taus = np.zeros(nmax, np.float32)
    norm = pt.sum() * R0
    for n in range(1, nmax + 1):
        if len(consts) < n:
            break
        axes = kt.exclusive_jets(n)
        d = np.min([_dr(eta, phi, a.eta(), a.phi_std()) for a in axes], axis=0)
        taus[n - 1] = (pt * d).sum() / norm
    return taus


def _jet_record(fastjet, event, jet, rng: np.random.Generator | None = None) -> dict:
    """One jet's columns; with `rng` as a detector measures it (voxjet.jets.detector): smeared
    impact parameters, reconstructed vertices; without, the generator's truth."""
    consts = jet.constituents()
    idx = [c.user_index() for c in consts]
    ps = [event[i] for i in idx]
    px = np.array([q.px() for q in ps])
    py = np.array([q.py() for q in ps])
    pz = np.array([q.pz() for q in ps])
    e = np.array([q.e() for q in ps])
    pt = np.hypot(px, py)
    eta = np.array([q.eta() for q in ps])
    phi = np.arctan2(py, px)
    charge = np.array([q.charge() for q in ps])
    aid = np.array([q.idAbs() for q in ps])
    hadron = np.array([q.isHadron() for q in ps])
    x = np.array([q.xProd() for q in ps])
    y = np.array([q.yProd() for q in ps])
    z = np.array([q.zProd() for q in ps])
    charged = charge != 0
    jeta, jphi = jet.eta(), jet.phi_std()
    if rng is None:
        d0 = np.where(charged, (x * py - y * px) / np.maximum(pt, 1e-9), 0.0)
        dz = np.where(charged, z - (x * px + y * py) * pz / np.maximum(pt**2, 1e-9), 0.0)
        d0err, dzerr = np.full(len(ps), D0_ERR), np.full(len(ps), DZ_ERR)
        sv = _secondary_vertices(event, (x, y, z), charged, (px, py, pz, e), (jeta, jphi))
    else:
        tracks = measured_tracks(rng, (x, y, z), (px, py, pz, e), charged)
        d0, dz, d0err, dzerr = tracks["d0"], tracks["dz"], tracks["d0err"], tracks["dzerr"]
        sv = reconstructed_vertices(tracks, (px, py, pz, e), charged, (jeta, jphi))
    kind = np.select(
        [hadron & charged, hadron & ~charged, aid == 22, aid == 11, aid == 13], [0, 1, 2, 3, 4], -1
    )
    return {
        "part": particle_columns(
            (px, py, pz, e),
            eta - jeta,
            (phi - jphi + np.pi) % (2 * np.pi) - np.pi,
            charge,
            kind,
            (d0, d0err),
            (dz, dzerr),
        ),
        "jet_pt": jet.pt(),
        "jet_eta": jeta,
        "jet_phi": jphi,
        "jet_energy": jet.e(),
        "jet_nparticles": float(len(ps)),
        "jet_sdmass": _softdrop_mass(fastjet, consts),
        "taus": _taus(fastjet, consts, pt, eta, phi),
        "sv": sv,
    }


SV_ERR = 0.05  # mm, nominal uncertainty of a vertex position


def _heavy(idabs: int) -> bool:
    """A hadron holding a b or c quark (its code's quark digits)."""
    d = idabs % 10000
    return (d // 100) % 10 in (4, 5) or (d // 1000) % 10 in (4, 5)


def _secondary_vertices(event, xyz, charged, p4, axis) -> dict[str, np.ndarray]:
    """The jet's b/c-hadron decay vertices with ≥ 2 charged constituents from them (sv_*)."""
    x, y, z = xyz
    px, py, pz, e = p4
    rows = []
    for i in range(event.size()):
        h = event[i]
        if not (h.isHadron() and _heavy(h.idAbs())):
            continue
        vx, vy, vz = h.xDec(), h.yDec(), h.zDec()
        if np.hypot(np.hypot(vx - h.xProd(), vy - h.yProd()), vz - h.zProd()) < 1e-6:
            continue  # decayed where it was made (no lifetime): no separate vertex
        g = charged & (np.abs(x - vx) < 1e-9) & (np.abs(y - vy) < 1e-9) & (np.abs(z - vz) < 1e-9)
        if g.sum() < 2:
            continue
        sx, sy, sz, se = px[g].sum(), py[g].sum(), pz[g].sum(), e[g].sum()
        spt = np.hypot(sx, sy)
        d3d = float(np.hypot(np.hypot(vx, vy), vz))
        rows.append({
            "pt": spt, "deta": np.arcsinh(sz / spt) - axis[0],
            "dphi": (np.arctan2(sy, sx) - axis[1] + np.pi) % (2 * np.pi) - np.pi,
            "mass": np.sqrt(max(se**2 - sx**2 - sy**2 - sz**2, 0.0)), "ntracks": float(g.sum()),
            "dxy": float(np.hypot(vx, vy)), "d3d": d3d, "d3dsig": d3d / SV_ERR,
        })  # fmt: skip
    rows.sort(key=lambda r: -r["pt"])
    return {k: np.array([r[k] for r in rows], np.float64) for k in SV_FEATURES}


def generate_jets(cls: str, n_jets: int, seed: int, cfg: ToyJetsConfig) -> list[dict]:
    """`n_jets` jets of class `cls` from Pythia events (deterministic by seed)."""
    _, fastjet = _require()
    if cfg.detector not in ("truth", "smeared"):
        raise VoxjetError(f"synth-jets: detector {cfg.detector!r}: use truth or smeared")
    p = _pythia(cls, seed)
    # the detector's measurement errors, from a stream of their own (the events stay the same)
    rng = np.random.default_rng([seed, 7]) if cfg.detector == "smeared" else None
    jdef = fastjet.JetDefinition(fastjet.antikt_algorithm, R0)
    jets: list[dict] = []
    tries = 0
    while len(jets) < n_jets:
        tries += 1
        if tries > 50 * n_jets + 1000:
            raise VoxjetError(f"Pythia {cls}: too few jets pass the selection; check the settings")
        if not p.next():
            continue
        ev = p.event
        parts = []
        for i in range(ev.size()):
            q = ev[i]
            if q.isFinal() and q.isVisible():
                pj = fastjet.PseudoJet(q.px(), q.py(), q.pz(), q.e())
                pj.set_user_index(i)
                parts.append(pj)
        cs = fastjet.ClusterSequence(parts, jdef)
        lo, hi = cfg.pt_range
        found = [j for j in cs.inclusive_jets(lo) if j.pt() < hi and abs(j.eta()) < cfg.eta_max]
        if cls in RESONANCE:
            decays = _decay_quarks(ev, RESONANCE[cls])
            found = [
                j
                for j in found
                if any(
                    qs and all(_dr(j.eta(), j.phi_std(), eta, phi) < R0 for eta, phi in qs)
                    for qs in decays
                )
            ]
        for j in found:
            if len(jets) < n_jets:
                jets.append(_jet_record(fastjet, ev, j, rng))
    return jets


def generate_dataset(
    out_dir: str | os.PathLike, cfg: ToyJetsConfig, progress: bool = True, workers: int = 1
) -> list[Path]:
    """`files_per_class` files a class, named like JetClass's, one Pythia run a file (in
    `workers` processes)."""
    from concurrent.futures import ProcessPoolExecutor

    _require()
    bad = [c for c in cfg.classes if c not in PROCESSES]
    if bad:
        raise VoxjetError(
            f"pythia generator: no process for classes {bad}; use {sorted(PROCESSES)}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (out / f"{c}_{i:03d}.root", c, file_seed(cfg.seed, c, i))
        for c in cfg.classes
        for i in range(cfg.files_per_class)
    ]
    with ProcessPoolExecutor(max(1, workers)) as pool:
        futures = [pool.submit(_one_file, path, c, seed, cfg) for path, c, seed in jobs]
        for f in progress_of(futures, "synth-jets (pythia)", "file", disable=not progress):
            f.result()
    return [path for path, _, _ in jobs]


def _one_file(path: Path, cls: str, seed: int, cfg: ToyJetsConfig) -> None:
    write_jets(path, generate_jets(cls, cfg.jets_per_file, seed, cfg), cls)
