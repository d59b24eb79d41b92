"""What a secondary-vertex collection adds to a tagger (issue 27): H→bb̄ against QCD jets from
Pythia 8 (the `pythia` extra), each tagger trained twice on the same jets with the same seed —
fed the particles alone, and the particles plus `jets.collections.sv` (the b/c-hadron decay
vertices Pythia records, voxjet.jets.pythia) — and scored by test AUC, over several seeds.
Two particle feature sets: ParT's 17 (with the tracks' impact parameters, which already carry
much of the displacement) and the kinematic ones alone.

    .venv/bin/python benchmarks/sv_gain.py [--jets 3000] [--steps 800] [--seeds 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.evaluate import evaluate
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig
from voxjet.jets.train import run
from voxjet.stage.transfer import stage

SV_FEATURES = ["sv_pt_log", "sv_deta", "sv_dphi", "sv_mass", "sv_ntracks", "sv_dxy", "sv_d3d",
               "sv_d3dsig"]  # fmt: skip
SV = {"sv": {"features": SV_FEATURES, "length": 5, "sort_by": "sv_pt", "count": "nsv"}}
KINEMATIC = ["part_deta", "part_dphi", "part_pt_log", "part_e_log", "part_logptrel",
             "part_logerel", "part_deltaR"]  # fmt: skip
MODELS = {
    "pfn": {"name": "pfn", "phi_sizes": [64, 64], "f_sizes": [64]},
    "particlenet": {
        "name": "particlenet",
        "k": 8,
        "conv_channels": [[32, 32], [64, 64]],
        "fc_size": 64,
    },  # fmt: skip
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jets", type=int, default=3000, help="jets a class")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    a = ap.parse_args()
    from voxjet.jets.pythia import generate_dataset, missing

    if missing():
        raise SystemExit(missing())
    with tempfile.TemporaryDirectory(prefix="voxjet-sv-") as tmp:
        d = Path(tmp)
        generate_dataset(d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=a.jets,
                                                  classes=("QCD", "Hbb"), seed=27),
                         progress=False, workers=2)  # fmt: skip
        stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
        print(f"{a.jets} H→bb̄ and {a.jets} QCD jets from Pythia 8; test AUC over {a.seeds} "
              f"seeds, {a.steps} steps of {a.batch} jets; target (issue 27): particles + sv above "
              "particles alone")  # fmt: skip
        print("| tagger | particle features | AUC particles | AUC particles + sv | gain |")
        print("|---|---|---|---|---|")
        for feats_name, feats in (("ParT's 17", None), ("kinematic 7", KINEMATIC)):
            for model in a.models:
                aucs = {}
                for with_sv in (False, True):
                    tag = f"{feats_name[:4]}_{int(with_sv)}"
                    shards = d / f"shards_{tag}"
                    if not shards.exists():
                        extra = {"particle_features": feats} if feats else {}
                        cfg = JetDataConfig(max_particles=64, labels=["label_QCD", "label_Hbb"],
                                            new_variables={"sv_pt_log": "log(sv_pt)"},
                                            collections=SV if with_sv else {},
                                            test_fraction=0.3, **extra)  # fmt: skip
                        shard_jets(d / "m.json", shards, cfg)
                    aucs[with_sv] = []
                    for seed in range(a.seeds):
                        out = d / f"run_{model}_{tag}_{seed}"
                        train = {"steps": a.steps, "batch_size": a.batch, "lr": 2e-3, "seed": seed,
                                 "eval_every": a.steps}  # fmt: skip
                        run(str(shards), {"model": MODELS[model], "train": train}, str(out))
                        m = evaluate(str(shards), str(out / "model.pt"), str(out / "eval"))
                        aucs[with_sv].append(m["auc_macro"])
                pf, sv = np.array(aucs[False]), np.array(aucs[True])
                print(f"| {model} | {feats_name} | {pf.mean():.4f} ± {pf.std():.4f} | "
                      f"{sv.mean():.4f} ± {sv.std():.4f} | {(sv - pf).mean():+.4f} "
                      f"(seed by seed {np.round(sv - pf, 4).tolist()}) |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
