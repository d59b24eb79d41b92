"""What a secondary-vertex collection adds to a tagger (issue 27): H→bb̄ against QCD jets from
Pythia 8 (the `pythia` extra), each tagger trained twice on the same jets with the same seed —
fed the particles alone, and the particles plus `jets.collections.sv` — and scored on the same
test jets, over several seeds. Two particle feature sets: ParT's 17 (with the tracks' impact
parameters, which already carry much of the displacement) and the kinematic ones alone.

What the vertices are (`--detector`): `smeared` (the default), what a detector would give — the
tracks' impact parameters measured with σ(d0) = 20 µm ⊕ 40 µm·GeV/pT and vertices found from the
displaced tracks by voxjet.jets.detector's vertexer, so some heavy-flavour decays are missed and
some vertices are fakes: a reconstructed-like estimate; `truth`, the generator's own decay
vertices with exact tracks — a perfect tracker and vertexer, an upper bound.

The gain a (model, features) is the test AUC with the vertices minus without, for each seed on
the same test jets, and a paired bootstrap over those jets (each resample scored on both, the
seeds' gains averaged) gives its 95% interval.

    .venv/bin/python benchmarks/sv_gain.py [--jets 3000] [--steps 800] [--seeds 3] \
        [--detector smeared] [--boot 1000]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.evaluate import evaluate
from voxjet.jets.metrics import roc_auc
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


def _test_scores(eval_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Hbb score, is Hbb, the jets' (file, entry) keys) of an evaluation's predictions."""
    import h5py
    import hdf5plugin  # noqa: F401  (the LZ4 filter evaluation writes with)

    with h5py.File(eval_dir / "predictions.h5") as f:
        probs, labels = f["probs"][...], f["labels"][...]
        keys = f["file"][...].astype(np.int64) * (1 << 32) + f["entry"][...].astype(np.int64)
    order = np.argsort(keys)
    return probs[order, 1], labels[order] == 1, keys[order]


def paired_bootstrap(pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_boot: int,
                     seed: int = 0) -> tuple[float, float, float]:  # fmt: skip
    """(mean gain, 2.5%, 97.5%) of AUC(with) − AUC(without) over seeds: `pairs` holds, a seed,
    (scores without, scores with, is signal) of the same test jets; each resample of the jets
    is scored on every seed's pair and the gains averaged."""
    rng = np.random.default_rng(seed)
    n = len(pairs[0][2])
    gains = []
    for _ in range(n_boot):
        idx = rng.integers(0, n, n)
        gains.append(np.mean([roc_auc(w[idx], y[idx]) - roc_auc(o[idx], y[idx])
                              for o, w, y in pairs]))  # fmt: skip
    point = float(np.mean([roc_auc(w, y) - roc_auc(o, y) for o, w, y in pairs]))
    lo, hi = np.percentile(gains, [2.5, 97.5])
    return point, float(lo), float(hi)


def main() -> None:
    """Both feature sets and models, with and without the vertices, over the seeds; a table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jets", type=int, default=3000, help="jets a class")
    ap.add_argument("--steps", type=int, default=800, help="training steps a run")
    ap.add_argument("--seeds", type=int, default=3, help="training seeds a (model, features)")
    ap.add_argument("--batch", type=int, default=128, help="jets a batch")
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="taggers to train")
    ap.add_argument(
        "--detector",
        default="smeared",
        choices=["smeared", "truth"],
        help="vertices a detector would reconstruct, or the generator's (a bound)",
    )
    ap.add_argument("--boot", type=int, default=1000, help="bootstrap resamples of the jets")
    a = ap.parse_args()
    from voxjet.jets.pythia import generate_dataset, missing

    if missing():
        raise SystemExit(missing())
    with tempfile.TemporaryDirectory(prefix="voxjet-sv-") as tmp:
        d = Path(tmp)
        generate_dataset(d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=a.jets,
                                                  classes=("QCD", "Hbb"), seed=27,
                                                  detector=a.detector),
                         progress=False, workers=2)  # fmt: skip
        stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
        what = (
            "vertices found from smeared tracks (reconstructed-like)"
            if a.detector == "smeared"
            else "the generator's vertices, exact tracks (a truth-level bound)"
        )
        print(f"{a.jets} H→bb̄ and {a.jets} QCD jets from Pythia 8, {what}; test AUC over "
              f"{a.seeds} seeds, {a.steps} steps of {a.batch} jets; the gain's 95% interval "
              f"from a paired bootstrap of the test jets ({a.boot} resamples)")  # fmt: skip
        print("| tagger | particle features | AUC particles | AUC particles + sv | gain "
              "(seeds' mean) | 95% interval | gain seed by seed |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for feats_name, feats in (("ParT's 17", None), ("kinematic 7", KINEMATIC)):
            for model in a.models:
                scores: dict[bool, list] = {False: [], True: []}
                aucs: dict[bool, list] = {False: [], True: []}
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
                    for seed in range(a.seeds):
                        out = d / f"run_{model}_{tag}_{seed}"
                        train = {"steps": a.steps, "batch_size": a.batch, "lr": 2e-3, "seed": seed,
                                 "eval_every": a.steps}  # fmt: skip
                        run(str(shards), {"model": MODELS[model], "train": train}, str(out))
                        m = evaluate(str(shards), str(out / "model.pt"), str(out / "eval"))
                        aucs[with_sv].append(m["auc_macro"])
                        scores[with_sv].append(_test_scores(out / "eval"))
                pairs = []
                for (o, y, k0), (w, y1, k1) in zip(scores[False], scores[True], strict=True):
                    assert np.array_equal(k0, k1) and np.array_equal(y, y1), "other test jets"
                    pairs.append((o, w, y))
                gain, lo, hi = paired_bootstrap(pairs, a.boot)
                pf, sv = np.array(aucs[False]), np.array(aucs[True])
                sd = lambda v: f" ± {v.std(ddof=1):.4f}" if len(v) > 1 else ""  # noqa: E731
                print(f"| {model} | {feats_name} | {pf.mean():.4f}{sd(pf)} | {sv.mean():.4f}"
                      f"{sd(sv)} | {gain:+.4f} | [{lo:+.4f}, {hi:+.4f}] | "
                      f"{np.round(sv - pf, 4).tolist()} |", flush=True)  # fmt: skip
        print("\ntarget (issue 27): particles + sv above particles alone, i.e. the gain's 95% "
              "interval above 0")  # fmt: skip


if __name__ == "__main__":
    main()
