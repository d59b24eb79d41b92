"""A fast parametric jet generator that writes ROOT files in the JetClass schema.

Not an event generator: boosted-decay kinematics in the collinear approximation give one-,
two- and three-prong jets near 0, 80/91, 125 and 173 GeV; each prong fragments into particles
with leading-particle dominance and pT-dependent angular spread; soft radiation fills the cone.
QCD jets get their mass from hard wide-angle emissions, so a mass cut alone overlaps W/Z/H while
the constituents (prong structure, multiplicity, displaced b tracks) separate them better.
Impact parameters have no detector behind them: prompt tracks get a narrow Gaussian, tracks from
b prongs an exponential decay length on top; neutral particles get zero, as in JetClass.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import awkward as ak
import numpy as np
import uproot

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path
from voxjet.jets.schema import CLASSES
from voxjet.progress import progress as progress_of

R0 = 0.8
M_W, M_Z, M_H, M_T = 80.4, 91.2, 125.1, 172.8
# Label branches in JetClass mix types; so do ours, so that readers must treat them as numbers.
_LABEL_DTYPES = {0: np.float32, 1: np.bool_, 2: np.int32}
BASKET_JETS = 1000
TOY_CLASSES = ("QCD", "Hbb", "Zqq", "Wqq", "Tbqq")
# label sets of JetClass-II's size (188 classes): a resonance X of mass M (GeV) decaying to two
# or three prongs of the flavours named (b, q: light, g), e.g. X120_bqg
RESONANCE = re.compile(r"X(\d{2,3})_([bqg]{2,3})")
DECAYS = [*itertools.combinations_with_replacement("bqg", 2),
          *itertools.combinations_with_replacement("bqg", 3)]  # fmt: skip


def resonance_classes(n: int) -> list[str]:
    """QCD and n - 1 resonance classes, masses from 40 GeV in steps of 20 (each with every
    two- and three-prong decay): `resonance_classes(188)` is a JetClass-II-sized label set."""
    masses = range(40, 40 + 20 * -(-(n - 1) // len(DECAYS)), 20)
    return ["QCD", *[f"X{m}_{''.join(d)}" for m in masses for d in DECAYS][: n - 1]]


@dataclass
class ToyJetsConfig:
    """What `voxjet synth-jets --generator toy` writes."""

    classes: list[str] = field(default_factory=lambda: ["QCD", "Hbb", "Wqq", "Tbqq"])
    files_per_class: int = 2
    jets_per_file: int = 2000
    seed: int = 1
    pt_range: tuple[float, float] = (500.0, 1000.0)
    eta_max: float = 2.0
    # pythia: "truth" (exact impact parameters, the generator's own b/c-hadron decay vertices:
    # a perfect tracker and vertexer) or "smeared" (voxjet.jets.detector: impact parameters
    # measured with a tracker's resolution, vertices found from the displaced tracks)
    detector: str = "truth"


@dataclass
class _Prong:
    z: float  # fraction of the jet pT
    deta: float
    dphi: float
    flavour: str  # "q", "g" or "b": sets multiplicity and displaced tracks


def _split(
    rng: np.random.Generator,
    parent: _Prong,
    pt: float,
    mass: float,
    m1: float,
    m2: float,
    f1: str,
    f2: str,
) -> list[_Prong]:
    """Two-body decay of a boosted parent in the collinear approximation."""
    ptot = pt * parent.z
    for _ in range(100):
        z = rng.uniform(0.0, 1.0)
        rhs = mass**2 - m1**2 / max(z, 1e-6) - m2**2 / max(1 - z, 1e-6)
        if rhs <= 0:
            continue
        dr = np.sqrt(rhs / (z * (1 - z))) / ptot
        if dr < 0.75 * R0:
            break
    else:  # extremely asymmetric: keep the last draw clipped to the cone
        z, dr = 0.5, 0.6 * R0
    psi = rng.uniform(0, 2 * np.pi)
    ux, uy = np.cos(psi), np.sin(psi)
    a = _Prong(parent.z * z, parent.deta + (1 - z) * dr * ux, parent.dphi + (1 - z) * dr * uy, f1)
    b = _Prong(parent.z * (1 - z), parent.deta - z * dr * ux, parent.dphi - z * dr * uy, f2)
    return [a, b]


def _prongs(rng: np.random.Generator, cls: str, pt: float) -> list[_Prong]:
    root = _Prong(1.0, 0.0, 0.0, "q")
    if cls == "QCD":
        prongs = [_Prong(1.0, 0.0, 0.0, "g" if rng.random() < 0.5 else "q")]
        # Hard wide-angle emissions with a soft/collinear spectrum give QCD its broad mass tail.
        for _ in range(rng.poisson(1.2)):
            zf = np.exp(rng.uniform(np.log(0.03), np.log(0.4)))
            theta = np.exp(rng.uniform(np.log(0.05), np.log(0.7)))
            psi = rng.uniform(0, 2 * np.pi)
            lead = prongs[0]
            emitted = zf * lead.z
            lead.z -= emitted
            flav = "b" if rng.random() < 0.05 else "g"  # g -> bb splitting
            prongs.append(
                _Prong(
                    emitted, lead.deta + theta * np.cos(psi), lead.dphi + theta * np.sin(psi), flav
                )
            )
        return prongs
    if cls in ("Wqq", "Zqq"):
        mass = rng.normal(M_W if cls == "Wqq" else M_Z, 2.5)
        return _split(rng, root, pt, mass, 0, 0, "q", "q")
    if cls in ("Hbb", "Hcc", "Hgg"):
        flav = {"Hbb": "b", "Hcc": "q", "Hgg": "g"}[cls]
        return _split(rng, root, pt, rng.normal(M_H, 3.0), 0, 0, flav, flav)
    if cls == "Tbqq":
        mw = rng.normal(M_W, 2.5)
        b, w = _split(rng, root, pt, rng.normal(M_T, 4.0), 4.8, mw, "b", "q")
        return [b, *_split(rng, w, pt, mw, 0, 0, "q", "q")]
    hit = RESONANCE.fullmatch(cls)
    if hit:
        mass, flavours = float(hit[1]), list(hit[2])
        mass = rng.normal(mass, 0.03 * mass)
        if len(flavours) == 2:
            return _split(rng, root, pt, mass, 0, 0, *flavours)
        m23 = rng.uniform(0.3, 0.6) * mass  # the last two prongs from an intermediate state
        a, bc = _split(rng, root, pt, mass, 0, m23, flavours[0], "q")
        return [a, *_split(rng, bc, pt, m23, 0, 0, flavours[1], flavours[2])]
    raise VoxjetError(f"the toy generator has no model for class {cls!r}; use one of "
                      f"{TOY_CLASSES} or a resonance X<mass>_<2-3 of b, q, g>")  # fmt: skip


def _fragment(rng: np.random.Generator, prong: _Prong, pt: float) -> dict[str, np.ndarray]:
    p = prong.z * pt
    base = {"q": 6.0, "b": 7.0, "g": 10.0}[prong.flavour]
    n = max(1, rng.poisson(base + 3.0 * np.log1p(p / 50.0)))
    frac = rng.dirichlet(np.full(n, 0.55))
    ppt = np.maximum(frac * p, 0.3)
    sigma = np.clip(0.35 * np.sqrt(1.0 / ppt), 0.004, 0.3)
    deta = prong.deta + rng.normal(0, sigma)
    dphi = prong.dphi + rng.normal(0, sigma)
    kind = rng.choice(5, size=n, p=[0.62, 0.1, 0.25, 0.02, 0.01])
    if prong.flavour == "b":  # semileptonic b decays: more leptons
        kind = np.where(rng.random(n) < 0.04, rng.choice([3, 4], size=n), kind)
    # Only the b-hadron's decay products are displaced, not the whole b prong.
    displaced = (rng.random(n) < 0.35) if prong.flavour == "b" else np.zeros(n, bool)
    return {"pt": ppt, "deta": deta, "dphi": dphi, "kind": kind, "displaced": displaced}


def _soft(rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = rng.poisson(6)
    r = R0 * np.sqrt(rng.random(n))
    psi = rng.uniform(0, 2 * np.pi, n)
    return {
        "pt": rng.exponential(1.0, n) + 0.3,
        "deta": r * np.cos(psi),
        "dphi": r * np.sin(psi),
        "kind": rng.choice(5, size=n, p=[0.55, 0.15, 0.3, 0.0, 0.0]),
        "displaced": np.zeros(n, bool),
    }


def _nsubjettiness(pt: np.ndarray, eta: np.ndarray, phi: np.ndarray, nmax: int = 4) -> np.ndarray:
    """tau_1..tau_nmax; axes from pT-weighted k-means seeded by the hardest particles."""
    taus = np.zeros(nmax, np.float32)
    order = np.argsort(-pt)
    norm = pt.sum() * R0
    for n in range(1, nmax + 1):
        k = min(n, len(pt))
        ax_eta, ax_phi = eta[order[:k]].copy(), phi[order[:k]].copy()
        for _ in range(3):
            d2 = (eta[:, None] - ax_eta) ** 2 + (phi[:, None] - ax_phi) ** 2
            assign = d2.argmin(1)
            for j in range(k):
                w = pt[assign == j]
                if w.sum() > 0:
                    ax_eta[j] = (w * eta[assign == j]).sum() / w.sum()
                    ax_phi[j] = (w * phi[assign == j]).sum() / w.sum()
        d = np.sqrt(((eta[:, None] - ax_eta) ** 2 + (phi[:, None] - ax_phi) ** 2).min(1))
        taus[n - 1] = (pt * d).sum() / norm
    return taus


KINDS = ("ChargedHadron", "NeutralHadron", "Photon", "Electron", "Muon")


def particle_columns(p4, deta, dphi, charge, kind, d0, dz) -> dict[str, np.ndarray]:
    """A jet's JetClass `part_*` columns (names without the prefix): four-momenta `p4`, angles
    to the jet axis, charge, `kind` indexing KINDS (-1: none), and (value, error) of the
    transverse and longitudinal impact parameters, zeroed for neutral particles."""
    px, py, pz, e = p4
    neutral = charge == 0
    cols = {"px": px, "py": py, "pz": pz, "energy": e, "deta": deta, "dphi": dphi}
    for name, (val, err) in (("d0", d0), ("dz", dz)):
        cols[f"{name}val"] = np.where(neutral, 0.0, val)
        cols[f"{name}err"] = np.where(neutral, 0.0, err)
    cols["charge"] = charge
    cols.update({f"is{k}": (kind == i).astype(float) for i, k in enumerate(KINDS)})
    return cols


def generate_jet(rng: np.random.Generator, cls: str, cfg: ToyJetsConfig) -> dict:
    """One jet: particles in the lab frame and jet-level observables."""
    pt = rng.uniform(*cfg.pt_range)
    eta0, phi0 = rng.uniform(-cfg.eta_max, cfg.eta_max), rng.uniform(-np.pi, np.pi)
    parts = [_fragment(rng, p, pt) for p in _prongs(rng, cls, pt)] + [_soft(rng)]
    for k, part in enumerate(parts):  # which prong made each particle (the soft ones: -1)
        part["prong"] = np.full(len(part["pt"]), k if k < len(parts) - 1 else -1)
    cat = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    gen_mass = _mass(cat["pt"], eta0 + cat["deta"], phi0 + cat["dphi"])
    keep = np.hypot(cat["deta"], cat["dphi"]) < R0
    cat = {k: v[keep] for k, v in cat.items()}
    ppt = cat["pt"]
    eta, phi = eta0 + cat["deta"], phi0 + cat["dphi"]
    px, py, pz, e = ppt * np.cos(phi), ppt * np.sin(phi), ppt * np.sinh(eta), ppt * np.cosh(eta)
    jpx, jpy, jpz, je = px.sum(), py.sum(), pz.sum(), e.sum()
    jpt = np.hypot(jpx, jpy)
    jeta, jphi = np.arcsinh(jpz / jpt), np.arctan2(jpy, jpx)
    deta = eta - jeta
    dphi = (phi - jphi + np.pi) % (2 * np.pi) - np.pi
    # A crude groomer: drop particles below 1% of the jet pT before the mass ("sdmass").
    g = ppt > 0.01 * jpt
    gm2 = e[g].sum() ** 2 - px[g].sum() ** 2 - py[g].sum() ** 2 - pz[g].sum() ** 2
    n = len(ppt)
    kind = cat["kind"]
    charged = np.isin(kind, (0, 3, 4))
    charge = np.where(charged, rng.choice([-1.0, 1.0], n), 0.0)
    # Light tracks get a small tail (mismeasurement, V0s), so displacement alone is not a label.
    tail = (rng.random(n) < 0.02) * rng.exponential(0.1, n) * rng.choice([-1, 1], n)
    d0 = (
        rng.normal(0, 0.01, n)
        + tail
        + cat["displaced"] * rng.exponential(0.25, n) * rng.choice([-1, 1], n)
    )
    dz = rng.normal(0, 0.02, n) + cat["displaced"] * rng.exponential(0.3, n) * rng.choice(
        [-1, 1], n
    )
    d0err = rng.uniform(0.005, 0.03, n)
    dzerr = rng.uniform(0.01, 0.05, n)
    tracks = {"p4": (px, py, pz, e), "d0": d0, "dz": dz, "d0err": d0err, "charged": charged}
    return {
        "part": particle_columns(
            (px, py, pz, e), deta, dphi, charge, kind, (d0, d0err), (dz, dzerr)
        ),
        "jet_pt": jpt,
        "jet_eta": jeta,
        "jet_phi": jphi,
        "jet_energy": je,
        "jet_nparticles": float(n),
        "jet_sdmass": float(np.sqrt(max(gm2, 0.0))),
        "taus": _nsubjettiness(ppt, deta, dphi),
        # generator-level truth, a regression target: every particle generated, before the
        # jet's cone and grooming (a JetClass-style aux_* branch: never a model input)
        "aux_genjet_mass": gen_mass,
        "sv": secondary_vertices(tracks, cat["prong"], cat["displaced"], (jeta, jphi)),
    }


SV_FEATURES = ("pt", "deta", "dphi", "mass", "ntracks", "dxy", "d3d", "d3dsig")
FAKE_D0 = 0.05  # |d0| beyond which prompt tracks (the mismeasured tail) can fake a vertex


def secondary_vertices(tracks: dict, prong: np.ndarray, displaced: np.ndarray,
                       axis: tuple[float, float]) -> dict[str, np.ndarray]:  # fmt: skip
    """A jet's secondary vertices (`sv_*` columns, by pT): one a b prong whose displaced
    charged tracks number at least two (its b-hadron decay), and one fake from prompt charged
    tracks of the mismeasured tail when two or more are there — as a vertex finder would
    also find. Position from the tracks' impact parameters: no new random draws."""
    px, py, pz, e = tracks["p4"]
    charged = tracks["charged"]
    groups = [charged & displaced & (prong == k) for k in np.unique(prong[displaced & charged])]
    fake = charged & ~displaced & (np.abs(tracks["d0"]) > FAKE_D0)
    groups += [fake] if fake.sum() >= 2 else []
    rows = []
    for g in groups:
        if g.sum() < 2:
            continue
        vx, vy, vz, ve = px[g].sum(), py[g].sum(), pz[g].sum(), e[g].sum()
        vpt = np.hypot(vx, vy)
        dxy = float(np.abs(tracks["d0"][g]).mean())
        d3d = float(np.hypot(tracks["d0"][g], tracks["dz"][g]).mean())
        rows.append({
            "pt": vpt, "deta": np.arcsinh(vz / vpt) - axis[0],
            "dphi": (np.arctan2(vy, vx) - axis[1] + np.pi) % (2 * np.pi) - np.pi,
            "mass": np.sqrt(max(ve**2 - vx**2 - vy**2 - vz**2, 0.0)), "ntracks": float(g.sum()),
            "dxy": dxy, "d3d": d3d, "d3dsig": d3d / float(tracks["d0err"][g].mean()),
        })  # fmt: skip
    rows.sort(key=lambda r: -r["pt"])
    return {k: np.array([r[k] for r in rows], np.float64) for k in SV_FEATURES}


def _mass(pt: np.ndarray, eta: np.ndarray, phi: np.ndarray) -> float:
    """The invariant mass of massless particles."""
    px, py, pz, e = pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta), pt * np.cosh(eta)
    return float(np.sqrt(max(e.sum() ** 2 - px.sum() ** 2 - py.sum() ** 2 - pz.sum() ** 2, 0.0)))


def write_jets(path: str | os.PathLike, jets: list[dict], cls: str, tree: str = "tree",
               classes: list[str] = ()) -> None:  # fmt: skip
    """Write jets (as `generate_jet` returns them) of class `cls` as a JetClass-schema file,
    with a `label_<c>` branch for each of JetClass's classes and of `classes` beyond them."""
    # jagged columns from one flat array and the counts (ak.Array of a list of arrays would
    # convert element by element)
    first = next(iter(jets[0]["part"]))
    counts = np.array([len(j["part"][first]) for j in jets], np.int64)
    part = ak.zip(
        {
            k: ak.unflatten(np.concatenate([j["part"][k] for j in jets]).astype(np.float32), counts)
            for k in jets[0]["part"]
        }
    )
    branches: dict = {"part": part}
    if "sv" in jets[0]:  # secondary vertices: their own collection, counter `nsv`
        sv_counts = np.array([len(j["sv"]["pt"]) for j in jets], np.int64)
        branches["sv"] = ak.zip({k: ak.unflatten(np.concatenate([j["sv"][k] for j in jets])
                                                 .astype(np.float32), sv_counts)
                                 for k in jets[0]["sv"]})  # fmt: skip
    for k in ("jet_pt", "jet_eta", "jet_phi", "jet_energy", "jet_nparticles", "jet_sdmass",
              "aux_genjet_mass"):  # fmt: skip
        if k in jets[0]:
            branches[k] = np.array([j[k] for j in jets], np.float32)
    taus = np.stack([j["taus"] for j in jets])
    for i in range(4):
        branches[f"jet_tau{i + 1}"] = taus[:, i]
    names = [*CLASSES, *(c for c in classes if c not in CLASSES)]
    for i, c in enumerate(names):
        branches[f"label_{c}"] = np.full(len(jets), c == cls, dtype=_LABEL_DTYPES[i % 3])
    with atomic_path(path) as tmp:
        with uproot.recreate(tmp, compression=uproot.LZ4(4)) as f:
            # mktree, not f[tree] = ...: recent uproot writes an RNTuple for the latter, and
            # JetClass is a TTree (`part_*` jagged branches with an `npart` counter).
            types = {k: v.type if isinstance(v, ak.Array) else v.dtype for k, v in branches.items()}
            out = f.mktree(tree, types)
            # a basket of BASKET_JETS entries a branch, as ROOT's auto-flush clusters are: a
            # reader of an entry range (a scatter shard job) decompresses only its baskets
            for lo in range(0, max(len(jets), 1), BASKET_JETS):  # 0 jets: one empty basket
                out.extend({k: v[lo : lo + BASKET_JETS] for k, v in branches.items()})


def file_seed(seed: int, cls: str, index: int) -> int:
    """The seed of one generated file: a hash of the dataset's seed, the class and the file's
    number (32 bits), so no two files of any number of classes and files share their events
    (`seed * 1000 + class * 100 + i` made QCD_100 the same events as Hbb_000)."""
    digest = hashlib.blake2b(f"{seed}/{cls}/{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def generate_file(
    path: str | os.PathLike,
    cls: str,
    n_jets: int,
    seed: int,
    cfg: ToyJetsConfig,
    tree: str = "tree",
) -> None:
    """Write one ROOT file of `n_jets` jets of class `cls` (as JetClass does: a process a file)."""
    rng = np.random.default_rng(seed)
    write_jets(path, [generate_jet(rng, cls, cfg) for _ in range(n_jets)], cls, tree, cfg.classes)


def generate_dataset(
    out_dir: str | os.PathLike, cfg: ToyJetsConfig, progress: bool = True
) -> list[Path]:
    """Write `files_per_class` files a class into `out_dir`, named like JetClass's."""
    unknown = [c for c in cfg.classes if c not in TOY_CLASSES and not RESONANCE.fullmatch(c)]
    if unknown:
        raise VoxjetError(f"toy generator: unknown classes {unknown}; choose from {TOY_CLASSES} "
                          "or resonances X<mass>_<2-3 of b, q, g> (e.g. X120_bqg)")  # fmt: skip
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(c, i) for c in cfg.classes for i in range(cfg.files_per_class)]
    paths = []
    for c, i in progress_of(jobs, "synth-jets", "file", disable=not progress):
        path = out / f"{c}_{i:03d}.root"
        generate_file(path, c, cfg.jets_per_file, file_seed(cfg.seed, c, i), cfg)
        paths.append(path)
    return paths
