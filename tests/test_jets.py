"""Jets: the toy generator's ROOT files, features and padding, shards, the PFN, metrics."""

from __future__ import annotations

import json
from pathlib import Path

import awkward as ak
import h5py
import numpy as np
import pytest
import torch
import uproot

from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.features import compute_features, labels_from_onehot, variables
from voxjet.jets.metrics import jet_metrics, rejection_at, roc_auc, roc_curve
from voxjet.jets.models import PFN
from voxjet.jets.schema import JET_BRANCHES, LABEL_BRANCHES, PARTICLE_BRANCHES
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset, generate_file
from voxjet.stage.transfer import stage


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory):
    out = tmp_path_factory.mktemp("toyjets")
    generate_dataset(out, ToyJetsConfig(files_per_class=1, jets_per_file=300), progress=False)
    return out


def test_toy_files_follow_the_jetclass_schema(toy_root):
    with uproot.open(toy_root / "Wqq_000.root") as f:
        tree = f["tree"]
        assert tree.classname == "TTree"
        assert set(PARTICLE_BRANCHES + JET_BRANCHES + LABEL_BRANCHES) <= set(tree.keys())
        a = tree.arrays(["part_px", "jet_nparticles", "label_Wqq", "label_Hbb"], library="ak")
        assert ak.all(ak.num(a["part_px"]) == a["jet_nparticles"])
        # label branches mix types, as JetClass's do
        assert {tree["label_QCD"].typename, tree["label_Hbb"].typename} == {"float", "bool"}
        assert ak.all(a["label_Wqq"] == 1) and not ak.any(a["label_Hbb"])


def test_toy_generator_is_deterministic(tmp_path):
    cfg = ToyJetsConfig()
    generate_file(tmp_path / "a.root", "Tbqq", 25, 3, cfg)
    generate_file(tmp_path / "b.root", "Tbqq", 25, 3, cfg)
    a = uproot.open(tmp_path / "a.root")["tree"].arrays(library="np")
    b = uproot.open(tmp_path / "b.root")["tree"].arrays(library="np")
    assert all(
        np.array_equal(
            np.concatenate(a[k]) if a[k].dtype == object else a[k],
            np.concatenate(b[k]) if b[k].dtype == object else b[k],
        )
        for k in a
    )


def test_toy_jets_have_the_physics_they_claim(toy_root):
    mass = {}
    for c in ("QCD", "Wqq", "Hbb", "Tbqq"):
        a = uproot.open(toy_root / f"{c}_000.root")["tree"].arrays(
            ["jet_sdmass", "jet_pt", "jet_eta"], library="np"
        )
        mass[c] = np.median(a["jet_sdmass"])
        assert 400 < np.median(a["jet_pt"]) < 1100 and np.abs(a["jet_eta"]).max() < 2.5
    assert 70 < mass["Wqq"] < 100 and 110 < mass["Hbb"] < 140 and 150 < mass["Tbqq"] < 190
    assert mass["QCD"] < mass["Wqq"]


def test_unknown_toy_class_is_refused(tmp_path):
    with pytest.raises(VoxjetError, match="unknown classes"):
        generate_dataset(tmp_path, ToyJetsConfig(classes=["QCD", "Graviton"]), progress=False)


def test_features_sorted_by_pt_with_mask():
    arrays = ak.Array(
        {
            "part_px": [[1.0, 3.0, 2.0], [5.0]],
            "part_py": [[0.0, 0.0, 0.0], [0.0]],
            "part_deta": [[0.1, 0.3, 0.2], [0.0]],
            "part_dphi": [[0.0, 0.0, 0.0], [0.0]],
            "jet_pt": [6.0, 5.0],
            "jet_sdmass": [10.0, 1.0],
        }
    )
    out = compute_features(arrays, variables(), ["part_deta", "part_pt_log"], ["jet_sdmass"], 4)
    assert out["particles"].shape == (4, 2) and out["counts"].tolist() == [3, 1]
    np.testing.assert_allclose(out["particles"][:, 0], [0.3, 0.2, 0.1, 0.0])
    assert out["jets"][:, 0].tolist() == [10.0, 1.0]
    # clipped to the hardest 2 of each jet, in order
    out = compute_features(arrays, variables(), ["part_deta"], [], 2)
    assert out["counts"].tolist() == [2, 1]
    np.testing.assert_allclose(out["particles"][:, 0], [0.3, 0.2, 0.0])
    # already ordered particles come out the same (nothing re-sorted)
    sorted_arrays = ak.Array({**{k: arrays[k] for k in arrays.fields},
                              "part_px": [[3.0, 2.0, 1.0], [5.0]]})  # fmt: skip
    out = compute_features(sorted_arrays, variables(), ["part_deta"], [], 4)
    np.testing.assert_allclose(out["particles"][:, 0], [0.1, 0.3, 0.2, 0.0])


def test_labels_from_mixed_type_onehot():
    arrays = ak.Array(
        {
            "label_A": np.array([1.0, 0.0, 0.0], np.float32),
            "label_B": np.array([False, True, False]),
        }
    )
    assert labels_from_onehot(arrays, ["label_A", "label_B"])[0].tolist() == [0, 1, -1]


def test_shards_split_shuffle_and_index(toy_root, tmp_path):
    stage(str(toy_root), tmp_path / "staged", tmp_path / "manifest.json", patterns=["*.root"])
    cfg = JetDataConfig(
        max_particles=32, jets_per_shard=250, val_fraction=0.1, test_fraction=0.2, shard_jobs=2
    )
    index = shard_jets(tmp_path / "manifest.json", tmp_path / "shards", cfg)
    sp = index["splits"]
    assert sp["train"]["jets"] + sp["val"]["jets"] + sp["test"]["jets"] == 1200
    assert abs(sp["test"]["jets"] - 240) < 45 and abs(sp["val"]["jets"] - 120) < 35
    sizes = [s["jets"] for s in sp["train"]["shards"]]
    assert sum(sizes) == sp["train"]["jets"] and max(sizes) <= 250
    assert {s["file"].split("/")[0] for s in sp["train"]["shards"]} == {"part_0000", "part_0001"}
    with h5py.File(tmp_path / "shards" / sp["train"]["shards"][0]["file"]) as f:
        assert f["particles"].shape[1:] == (len(cfg.particle_features),)
        counts = np.diff(f["offsets"][...])
        assert len(counts) == len(f["labels"]) and counts.max() <= 32
        assert f["offsets"][-1] == len(f["particles"])
        labels = f["labels"][...]
        assert list(f.attrs["classes"]) == ["QCD", "Hbb", "Wqq", "Tbqq"]
    assert len(np.unique(labels)) == 4  # shuffled across the one-class files
    assert sum(sp["train"]["class_counts"].values()) == sp["train"]["jets"]
    assert len(index["particle_mean"]) == len(cfg.particle_features)
    assert not list(tmp_path.glob(".shards*"))  # no temporary folder left behind


def test_split_is_stable_under_reruns_and_added_files():
    from voxjet.jets.shard import split_of

    cfg = JetDataConfig(val_fraction=0.1, test_fraction=0.2)
    entries = np.arange(20000)
    a = split_of("Hbb_000.root", entries, cfg)
    assert np.array_equal(a, split_of("Hbb_000.root", entries, cfg))
    assert abs((a == 2).mean() - 0.2) < 0.02 and abs((a == 1).mean() - 0.1) < 0.02
    # another file's jets get their own, independent assignment
    b = split_of("Hbb_001.root", entries, cfg)
    assert 0.52 < (a == b).mean() < 0.56  # 0.7² + 0.1² + 0.2² for independent draws
    # a prefix of a file's entries keeps its splits when the file grows
    assert np.array_equal(split_of("Hbb_000.root", entries[:500], cfg), a[:500])


def test_two_seeds_split_independently():
    """jets.seed keys the split's hash: another seed's split agrees with this one's on the
    fraction of jets chance gives (0.7² + 0.1² + 0.2² = 0.54), never by a relabelling of
    entries (with the seed XORed into the entry number, seed 43 was seed 42 of entry e ^ 1)."""
    from voxjet.jets.shard import split_of

    entries = np.arange(200_000)
    splits = {seed: split_of("Hbb_000.root", entries, JetDataConfig(seed=seed, val_fraction=0.1,
                                                                    test_fraction=0.2))
              for seed in (42, 43, 0, 1)}  # fmt: skip
    for a, b in ((42, 43), (0, 1), (42, 0)):
        agree = (splits[a] == splits[b]).mean()
        assert abs(agree - 0.54) < 0.006, (a, b, agree)  # 3σ of 200k draws is 0.0034
        # no pairing of entries maps one seed's split onto the other's
        assert (splits[a] == splits[b][entries ^ 1]).mean() < 0.56
    # each seed's test jets are a fifth of the entries, and the test sets overlap by chance
    test = {k: v == 2 for k, v in splits.items()}
    assert abs((test[42] & test[43]).mean() - 0.04) < 0.003


def test_shard_errors_name_the_file_and_key(toy_root, tmp_path):
    stage(str(toy_root), tmp_path / "staged", tmp_path / "manifest.json", patterns=["*.root"])
    with pytest.raises(VoxjetError, match=r"Hbb_000\.root.*label_Nope.*jets\.labels"):
        shard_jets(
            tmp_path / "manifest.json",
            tmp_path / "s",
            JetDataConfig(labels=["label_QCD", "label_Nope"]),
        )
    with pytest.raises(
        VoxjetError,
        match=r"\.root: tree 'tree' has no branch 'part_bogus' "
        r"\(read by jets.particle_features\)",
    ):
        shard_jets(
            tmp_path / "manifest.json",
            tmp_path / "s",
            JetDataConfig(particle_features=["part_bogus"]),
        )
    assert not (tmp_path / "s").exists()


def test_pfn_is_permutation_and_padding_invariant():
    torch.manual_seed(0)
    model = PFN(4, 3, [0.0] * 4, [1.0] * 4, phi_sizes=(16, 16), f_sizes=(8,)).eval()
    x = torch.randn(2, 6, 4)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    x[0, 4:] = 99.0  # garbage in padded slots must not matter
    ref = model(x, mask)
    perm = torch.tensor([3, 1, 0, 2, 4, 5])
    torch.testing.assert_close(model(x[:, perm], mask[:, perm]), ref)
    padded = torch.cat([x, torch.zeros(2, 3, 4)], 1)
    torch.testing.assert_close(
        model(padded, torch.cat([mask, torch.zeros(2, 3, dtype=torch.bool)], 1)), ref
    )


def test_auc_and_rejection():
    y = np.array([0, 0, 1, 1])
    assert roc_auc(np.array([0.1, 0.2, 0.8, 0.9]), y) == 1.0
    assert roc_auc(np.array([0.9, 0.8, 0.2, 0.1]), y) == 0.0
    assert roc_auc(np.array([0.5, 0.5, 0.5, 0.5]), y) == 0.5
    rng = np.random.default_rng(0)
    s, b = rng.normal(1, 1, 20000), rng.normal(0, 1, 20000)
    scores, sig = np.concatenate([s, b]), np.r_[np.ones(20000), np.zeros(20000)]
    # Gaussians one sigma apart: AUC = Phi(1/sqrt 2) = 0.760; at eps_S = 0.5 the cut is at 1,
    # so eps_B = 1 - Phi(1) = 0.1587 and the rejection is 6.30
    assert abs(roc_auc(scores, sig) - 0.760) < 0.01
    assert abs(rejection_at(scores, sig, 0.5) - 6.30) < 0.3
    eff_s, eff_b = roc_curve(scores, sig)
    assert eff_s[-1] == 1 and eff_b[-1] == 1 and (np.diff(eff_s) >= 0).all()


def test_rejection_is_pumas_on_tied_and_small_samples():
    """1/eps_B equals atlas-ftag-tools' calculate_rejection (puma's calc_rej) on scores tied at
    the cut and on 10 + 10 jets (tests/data/puma_rejection.json, recorded from it): the cut is
    the signal scores' interpolated percentile and background at the cut passes."""
    recorded = json.loads((Path(__file__).parent / "data" / "puma_rejection.json").read_text())
    for name in ("tied", "ten_jets"):
        case = recorded[name]
        scores = np.r_[case["signal"], case["background"]]
        sig = np.r_[np.ones(len(case["signal"])), np.zeros(len(case["background"]))]
        for eff, want in case["rejection"].items():
            assert rejection_at(scores, sig, float(eff)) == pytest.approx(want, abs=1e-6), (
                name, eff)  # fmt: skip
    # the first version took the first score at or past (1 − eps_S)(n − 1): 10 signal jets at
    # eps_S = 0.3 kept 4 of them (40%); the interpolated cut keeps 3
    ten = recorded["ten_jets"]
    cut = np.percentile(ten["signal"], 70)
    assert (np.asarray(ten["signal"]) >= cut).sum() == 3


def test_jet_metrics_per_class_against_the_background():
    labels = np.array([0, 0, 1, 1, 2, 2])
    probs = np.eye(3)[labels] * 0.9 + 0.1 / 3
    m = jet_metrics(probs, labels, ["QCD", "Wqq", "Tbqq"])
    assert m["accuracy"] == 1.0 and m["auc_macro"] == 1.0 and m["background"] == "QCD"
    assert set(m["vs_QCD"]) == {"Wqq", "Tbqq"} and m["vs_QCD"]["Wqq"]["auc"] == 1.0
    # no background passes: N_B bounds the rejection from below, flagged; the mean over every
    # class includes it and is flagged a lower bound too
    assert m["vs_QCD"]["Wqq"]["rej50"] == 2 and m["vs_QCD"]["Wqq"]["rej50_lower_bound"]
    assert m["rej50_mean"] == 2 and m["rej50_mean_lower_bound"]
    assert m["rej50_lower_bounds"] == ["Tbqq", "Wqq"]
    # any class list, any background (the HZZ example's signal/background)
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 4000)
    p1 = 1 / (1 + np.exp(-(2 * y - 1) * 1.5 - rng.normal(0, 1, 4000)))
    probs = np.stack([p1, 1 - p1], 1)
    m = jet_metrics(probs, y, ["background", "signal"])
    assert set(m["vs_background"]) == {"signal"} and m["background"] == "background"
    assert m["vs_background"]["signal"]["rej50_lower_bound"] is False
    assert m["rej50_mean"] == m["vs_background"]["signal"]["rej50"] > 1
    assert m["rej50_mean_lower_bound"] is False
    m = jet_metrics(probs[:, ::-1], y, ["signal", "background"], background="background")
    assert set(m["vs_background"]) == {"signal"}
    with pytest.raises(VoxjetError, match="jets.background: 'QCD' is none of the classes"):
        jet_metrics(probs, y, ["signal", "background"], background="QCD")


NAMES = JetDataConfig().particle_features


def _cloud(b: int = 3, p: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, p, len(NAMES), generator=g)
    x[..., NAMES.index("part_pt_log")] = torch.rand(b, p, generator=g) * 4
    mask = torch.ones(b, p, dtype=torch.bool)
    mask[0, 6:] = False
    x[0, 6:] = 7.0  # padded slots hold garbage: it must not matter
    return x, mask


@pytest.mark.parametrize(
    "name,kw",
    [
        ("particlenet", {"k": 4, "conv_channels": [[16, 16], [32, 32]], "fc_size": 32}),
        ("part", {"dim": 32, "heads": 4, "blocks": 2, "class_blocks": 1, "pair_dim": 16}),
    ],
)
def test_graph_and_transformer_taggers_are_order_and_padding_invariant(name, kw):
    from voxjet.jets.models import build_model

    torch.manual_seed(0)
    f = len(NAMES)
    model = build_model(
        name,
        n_features=f,
        n_classes=3,
        particle_mean=[0.0] * f,
        particle_std=[1.0] * f,
        feature_names=NAMES,
        **kw,
    ).eval()
    x, mask = _cloud()
    ref = model(x, mask)
    assert torch.isfinite(ref).all()
    perm = torch.tensor([4, 2, 0, 5, 1, 3, 6, 7, 8, 9])
    torch.testing.assert_close(model(x[:, perm], mask[:, perm]), ref, atol=1e-5, rtol=1e-4)
    more = torch.cat([x, torch.full((3, 5, f), 3.0)], 1)
    more_mask = torch.cat([mask, torch.zeros(3, 5, dtype=torch.bool)], 1)
    torch.testing.assert_close(model(more, more_mask), ref, atol=1e-5, rtol=1e-4)


def test_pairwise_features_match_four_vectors():
    from voxjet.jets.models import pairwise_features

    deta = torch.tensor([[0.1, -0.2]])
    dphi = torch.tensor([[0.3, 3.0]])  # crosses the ±π seam with the first after wrapping
    pt = torch.tensor([[50.0, 20.0]])
    u = pairwise_features(deta, dphi, pt)[0, :, 0, 1]
    e = pt * torch.cosh(deta)
    px, py, pz = pt * torch.cos(dphi), pt * torch.sin(dphi), pt * torch.sinh(deta)
    m2 = e.sum() ** 2 - px.sum() ** 2 - py.sum() ** 2 - pz.sum() ** 2
    dphi_w = (3.0 - 0.3 + np.pi) % (2 * np.pi) - np.pi
    delta = np.hypot(0.3, dphi_w)
    assert torch.allclose(
        u,
        torch.tensor(
            [np.log(delta), np.log(20 * delta), np.log(20 / 70), float(torch.log(m2))]
        ).float(),
        atol=1e-3,
    )


def test_mass_baseline_separates_by_mass():
    from voxjet.jets.baseline import fit_mass_histograms, mass_probabilities

    rng = np.random.default_rng(0)
    mass = np.r_[rng.normal(40, 10, 500), rng.normal(90, 5, 500), rng.normal(170, 10, 500)]
    labels = np.repeat([0, 1, 2], 500)
    edges, table = fit_mass_histograms(mass, labels, 3)
    probs = mass_probabilities(np.array([40.0, 90.0, 170.0, 500.0]), edges, table)
    assert probs[:3].argmax(1).tolist() == [0, 1, 2]
    np.testing.assert_allclose(probs.sum(1), 1)


def test_models_name_missing_geometry_features():
    from voxjet.jets.models import build_model

    with pytest.raises(VoxjetError, match=r"'part' needs particle features \['part_pt_log'\]"):
        build_model(
            "part",
            n_features=2,
            n_classes=2,
            particle_mean=[0, 0],
            particle_std=[1, 1],
            feature_names=["part_deta", "part_dphi"],
        )


def test_pythia_demo_falls_back_to_the_toy_generator_where_pythia_is_missing(
    tmp_path, monkeypatch, capsys
):
    """Where no pythia8mc wheel exists (aarch64, CPython 3.14) the demo's `generator: pythia`
    still produces its files, from the toy generator, and says so."""
    import sys

    from voxjet.cli import main

    monkeypatch.setitem(sys.modules, "pythia8mc", None)  # import fails as if not installed
    argv = ["synth-jets", "--out", str(tmp_path / "raw"), "--generator", "pythia"]
    assert (
        main([*argv, "--classes", "QCD", "Wqq", "--files-per-class", "1", "--jets-per-file", "50"])
        == 0
    )
    err = capsys.readouterr().err
    assert "pip install 'voxjet[pythia]'" in err and "toy generator instead" in err
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["QCD_000.root", "Wqq_000.root"]
    with uproot.open(tmp_path / "raw" / "Wqq_000.root") as f:
        assert f["tree"].num_entries == 50


def test_hep_figures_for_any_class_list_leave_the_global_style_alone(tmp_path):
    """Score distributions, ROC in pT bins and mass sculpting (mplhep style) for the HZZ
    example's classes; the style applies to these figures only."""
    import matplotlib

    from voxjet.jets import figures as hep_figures
    from voxjet.plotting import pyplot

    pyplot()  # the headless backend every voxjet figure selects, before the style is compared
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 3000)
    s = 1 / (1 + np.exp(-(2 * labels - 1) * 1.2 - rng.normal(0, 1, 3000)))
    probs = np.stack([s, 1 - s], 1)
    pt = rng.uniform(300, 1000, 3000)
    mass = np.where(labels == 0, rng.normal(125, 10, 3000), rng.exponential(40, 3000))
    before = dict(matplotlib.rcParams)
    classes, bkg = ["signal", "background"], "background"
    hep_figures.score_distributions(tmp_path / "scores.png", probs, labels, classes, bkg)
    hep_figures.roc_in_pt_bins(tmp_path / "roc_pt.png", probs, labels, classes, bkg, pt)
    hep_figures.mass_sculpting(tmp_path / "mass.png", probs, labels, classes, bkg, mass)
    for name in ("scores.png", "roc_pt.png", "mass.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    assert dict(matplotlib.rcParams) == before


def test_interleave_equals_stacking_the_columns_then_taking_rows():
    from voxjet.jets.features import ROWS_A_PASS, interleave

    rng = np.random.default_rng(0)
    n = 2 * ROWS_A_PASS + 123  # several passes and a short last one
    cols = [rng.normal(size=n + 50).astype(dt) for dt in (np.float32, np.float64, np.int32)]
    take = rng.permutation(n + 50)[:n]
    assert np.array_equal(interleave(cols, take, n), np.stack(cols, 1)[take].astype(np.float32))
    whole = [c[:n] for c in cols]
    assert np.array_equal(interleave(whole, None, n), np.stack(whole, 1).astype(np.float32))
    assert interleave(whole, None, 0).shape == (0, 3)


def test_all_finite_sees_nan_and_inf_and_not_an_overflowing_sum():
    from voxjet.jets.features import all_finite

    big = np.full(1000, 3e38, np.float32)  # finite values whose float32 sum overflows
    assert all_finite(big) and all_finite(np.arange(5)) and all_finite(np.zeros(0, np.float32))
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones(10_000, np.float32)
        x[7777] = bad
        assert not all_finite(x)
    x = np.ones(4, np.float64)
    x[[1, 2]] = [np.inf, -np.inf]  # their sum is NaN; still not finite
    assert not all_finite(x)


def test_generated_files_never_share_a_seed():
    """A hash of (seed, class, file): with 101 files a class, QCD_100 and Hbb_000 were the same
    events (seed * 1000 + class * 100 + i); now no two files of 5 classes × 400 files × 3
    seeds share one, nor do Pythia's seeds (the hash folded into its range)."""
    from voxjet.jets.synth import file_seed

    classes = ["QCD", "Hbb", "Zqq", "Wqq", "Tbqq"]
    seeds = [file_seed(s, c, i) for s in (1, 2, 3) for c in classes for i in range(400)]
    assert len(set(seeds)) == len(seeds)
    assert len({s % 900_000_000 + 1 for s in seeds}) == len(seeds)
    assert file_seed(1, "QCD", 100) != file_seed(1, "Hbb", 0)
    assert file_seed(1, "QCD", 0) == file_seed(1, "QCD", 0)  # the same files on a rerun
