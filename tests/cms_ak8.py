"""Files in the schema of CMS's AK8 jet-tagging ntuples (the branches weaver-core's
data/ak8_points_pf_sv_full.yaml reads: `pfcand_*` with counter `npfcand`, `sv_*` with `nsv`,
`fj_*`, 20 one-hot `label_*` branches and the selection's bookkeeping), filled from the toy
generator's jets — so that config can run here — and that config's layout as a dict."""

from __future__ import annotations

from pathlib import Path

import awkward as ak
import numpy as np
import uproot

# the 20 classes of ak8_points_pf_sv_full.yaml, each filled with toy jets of a similar decay
LABELS = {
    **{f"label_Top_{k}": "Tbqq" for k in ("bcq", "bqq", "bc", "bq", "bele", "bmu", "btau")},
    "label_W_cq": "Wqq", "label_W_qq": "Wqq",
    "label_Z_bb": "Zqq", "label_Z_cc": "Zqq", "label_Z_qq": "Zqq",
    "label_H_bb": "Hbb", "label_H_cc": "Hbb", "label_H_qqqq": "Hbb",
    **{f"label_QCD_{k}": "QCD" for k in ("bb", "cc", "b", "c", "others")},
}  # fmt: skip

PF = [["pfcand_pt_log_nopuppi", 1, 0.5], ["pfcand_e_log_nopuppi", 1.3, 0.5], "pfcand_etarel",
      "pfcand_phirel", ["pfcand_abseta", 0.6, 1.6], "pfcand_charge", ["pfcand_VTX_ass", 4, 0.3],
      "pfcand_lostInnerHits", ["pfcand_normchi2", 5, 0.2], ["pfcand_quality", 0, 0.2],
      ["pfcand_dz", 0, 180], ["pfcand_dzsig", 0, 0.9], ["pfcand_dxy", 0.0, 300],
      ["pfcand_dxysig", 0, 1.0], ["pfcand_btagEtaRel", 1.5, 0.5], ["pfcand_btagPtRatio", 0, 1],
      ["pfcand_btagPParRatio", 0, 1], ["pfcand_btagSip3dVal", 0, 100],
      ["pfcand_btagSip3dSig", 0, 0.5], ["pfcand_btagJetDistVal", 0, 40]]  # fmt: skip
SV = [["sv_pt_log", 4, 0.6], ["sv_mass", 1.2, 0.3], "sv_etarel", "sv_phirel",
      ["sv_abseta", 0.5, 1.6], ["sv_ntracks", 3, 1], ["sv_normchi2", 0.8, 0.6],
      ["sv_dxy", 0.4, 0.25], ["sv_dxysig", 7, 0.02], ["sv_d3d", 0.5, 0.2],
      ["sv_d3dsig", 7, 0.02]]  # fmt: skip


def ak8_config(ones_like: str = "ak.ones_like") -> dict:
    """The layout of weaver-core's ak8_points_pf_sv_full.yaml: its selection, 100 pf
    candidates and 10 secondary vertices in points/features/mask groups with its
    standardisation, 20 classes, observers and pT-flat reweighting of grouped classes.
    `ones_like`: weaver-core 0.5 (awkward 2) reads `ak.ones_like`; the published file spells
    awkward-0's `awkward.JaggedArray.ones_like`."""
    pf = {"length": 100}
    sv = {"length": 10}
    return {
        "selection": "(jet_tightId==1) & (jet_no<2) & (((sample_isQCD==0) & (fj_isQCD==0)) | "
                     "((sample_isQCD==1) & (fj_isQCD==1))) & (event_no%7!=0)",
        "new_variables": {"pfcand_mask": f"{ones_like}(pfcand_etarel)",
                          "sv_mask": f"{ones_like}(sv_etarel)"},
        "preprocess": {"method": "manual", "data_fraction": None},
        "inputs": {
            "pf_points": {**pf, "vars": ["pfcand_etarel", "pfcand_phirel"]},
            "pf_features": {**pf, "vars": PF},
            "pf_mask": {**pf, "vars": ["pfcand_mask"]},
            "sv_points": {**sv, "vars": ["sv_etarel", "sv_phirel"]},
            "sv_features": {**sv, "vars": SV},
            "sv_mask": {**sv, "vars": ["sv_mask"]},
        },
        "labels": {"type": "simple", "value": list(LABELS)},
        "observers": ["event_no", "fj_pt", "fj_eta", "fj_phi", "fj_sdmass", "npfcands"],
        "weights": {
            "use_precomputed_weights": False, "reweight_method": "flat",
            "reweight_vars": {"fj_pt": [200, 251, 316, 398, 501, 630, 793, 997, 1255, 1579],
                              "fj_sdmass": [-10000, 10000]},
            "reweight_classes": ["fj_isTop", "fj_isW", "label_Z_bb", "label_Z_cc", "label_Z_qq",
                                 "label_H_bb", "label_H_cc", "label_H_qqqq", "fj_isQCD"],
            "reweight_hists": None,
        },
    }  # fmt: skip


def write_file(path: Path, label: str, n_jets: int, seed: int) -> None:
    """`n_jets` toy jets of `label`'s decay in the CMS AK8 schema (tree `Events`)."""
    from voxjet.jets.synth import ToyJetsConfig, generate_jet

    rng = np.random.default_rng(seed)
    cls = LABELS[label]
    jets = [generate_jet(rng, cls, ToyJetsConfig()) for _ in range(n_jets)]
    pf = {k: [] for k in (p if isinstance(p, str) else p[0] for p in PF)}
    sv = {k: [] for k in (s if isinstance(s, str) else s[0] for s in SV)}
    for j in jets:
        p = j["part"]
        pt, e = np.hypot(p["px"], p["py"]), p["energy"]
        charged = p["charge"] != 0
        d0, dz = p["d0val"], p["dzval"]
        d0s = np.where(charged, d0 / np.where(charged, p["d0err"], 1), 0)
        dzs = np.where(charged, dz / np.where(charged, p["dzerr"], 1), 0)
        ip3d = np.hypot(d0, dz)
        cols = {
            "pfcand_pt_log_nopuppi": np.log(pt), "pfcand_e_log_nopuppi": np.log(e),
            "pfcand_etarel": p["deta"], "pfcand_phirel": p["dphi"],
            "pfcand_abseta": np.abs(j["jet_eta"] + p["deta"]), "pfcand_charge": p["charge"],
            "pfcand_VTX_ass": np.where(charged, 7.0, 0.0), "pfcand_lostInnerHits": 0 * pt,
            "pfcand_normchi2": np.where(charged, 1.0, 999.0),
            "pfcand_quality": np.where(charged, 5.0, 0.0), "pfcand_dz": dz, "pfcand_dzsig": dzs,
            "pfcand_dxy": d0, "pfcand_dxysig": d0s,
            "pfcand_btagEtaRel": np.where(charged, np.abs(p["deta"]) * 5, 0),
            "pfcand_btagPtRatio": pt / j["jet_pt"], "pfcand_btagPParRatio": e / j["jet_energy"],
            "pfcand_btagSip3dVal": ip3d, "pfcand_btagSip3dSig": np.hypot(d0s, dzs),
            "pfcand_btagJetDistVal": -0.1 * np.abs(d0),
        }  # fmt: skip
        for k in pf:
            pf[k].append(np.asarray(cols[k], np.float32))
        v = j["sv"]
        vcols = {
            "sv_pt_log": np.log(np.maximum(v["pt"], 1e-3)), "sv_mass": v["mass"],
            "sv_etarel": v["deta"], "sv_phirel": v["dphi"],
            "sv_abseta": np.abs(j["jet_eta"] + v["deta"]), "sv_ntracks": v["ntracks"],
            "sv_normchi2": np.ones_like(v["pt"]), "sv_dxy": v["dxy"],
            "sv_dxysig": v["dxy"] / 0.01, "sv_d3d": v["d3d"], "sv_d3dsig": v["d3dsig"],
        }  # fmt: skip
        for k in sv:
            sv[k].append(np.asarray(vcols[k], np.float32))
    n = np.arange(n_jets)
    flat = {
        "fj_pt": [j["jet_pt"] for j in jets], "fj_eta": [j["jet_eta"] for j in jets],
        "fj_phi": [j["jet_phi"] for j in jets], "fj_sdmass": [j["jet_sdmass"] for j in jets],
        "npfcands": [len(x) for x in pf["pfcand_etarel"]], "jet_tightId": np.ones(n_jets),
        "jet_no": n % 3, "event_no": n + 1000 * seed,
        "sample_isQCD": np.full(n_jets, cls == "QCD"), "fj_isQCD": np.full(n_jets, cls == "QCD"),
        "fj_isTop": np.full(n_jets, cls == "Tbqq"), "fj_isW": np.full(n_jets, cls == "Wqq"),
        **{name: np.full(n_jets, name == label) for name in LABELS},
    }  # fmt: skip
    branches = {
        "pfcand": ak.zip({k[7:]: ak.Array(v) for k, v in pf.items()}),
        "sv": ak.zip({k[3:]: ak.Array(v) for k, v in sv.items()}),
        **{k: np.asarray(v, np.int32 if k.startswith(("label_", "fj_is", "sample_", "jet_",
                                                       "event_", "npf")) else np.float32)
           for k, v in flat.items()},
    }  # fmt: skip
    with uproot.recreate(path) as f:
        f.mktree("Events", {k: v.type if isinstance(v, ak.Array) else v.dtype
                            for k, v in branches.items()}).extend(branches)  # fmt: skip


def write_dataset(folder: Path, n_jets: int) -> list[Path]:
    """One file a class of the 20."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, label in enumerate(LABELS):
        out.append(folder / f"{label.removeprefix('label_')}.root")
        write_file(out[-1], label, n_jets, seed=i + 1)
    return out
