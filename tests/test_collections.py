"""Several constituent collections a jet (`jets.collections`): the shards hold each jet's
secondary vertices as the file has them (ordered, clipped, with their own standardisation), a
collection's bad branches are refused by name, and pfn/particlenet/part read them beside the
particles through training, evaluation, predict and export, which agree jet by jet."""

from __future__ import annotations

import json

import awkward as ak
import numpy as np
import pytest
import torch
import uproot

from voxjet.errors import VoxjetError
from voxjet.jets.collections import parse_collections
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.dataset import load_columns, load_index
from voxjet.jets.models import build_model
from voxjet.jets.models.sets import CollectionEmbedding
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage

SV_FEATURES = ["sv_pt_log", "sv_deta", "sv_dphi", "sv_mass", "sv_ntracks", "sv_d3dsig"]
SV = {"sv": {"features": SV_FEATURES, "length": 2, "sort_by": "sv_pt", "count": "nsv"}}
NEW = {"sv_pt_log": "log(sv_pt)"}
LABELS = ["label_QCD", "label_Hbb", "label_Tbqq"]


def _config(**kw) -> JetDataConfig:
    base = {"max_particles": 32, "jets_per_shard": 500, "labels": LABELS, "new_variables": NEW,
            "collections": SV, "test_fraction": 0.3}  # fmt: skip
    return JetDataConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    d = tmp_path_factory.mktemp("coll")
    toy = ToyJetsConfig(files_per_class=1, jets_per_file=400, seed=21,
                        classes=("QCD", "Hbb", "Tbqq"))  # fmt: skip
    generate_dataset(d / "raw", toy, progress=False)
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    return d


@pytest.fixture(scope="module")
def sharded(raw):
    shard_jets(raw / "m.json", raw / "shards", _config())
    return raw / "shards"


def test_shards_hold_each_jets_vertices_as_the_file_has_them(raw, sharded):
    """Every test jet's first two vertices by pT, found in its ROOT file by (file, entry)."""
    index = load_index(sharded)
    assert index["collections"] == [{"name": "sv", "features": SV_FEATURES, "length": 2}]
    c = load_columns(sharded, "test", ("coll_sv", "coll_sv_count", "file", "entry"))
    assert c["coll_sv"].shape[1:] == (2, len(SV_FEATURES))
    files = index["source_files"]
    for k, name in enumerate(files):
        with uproot.open(raw / "staged" / name) as f:
            sv = f["tree"].arrays(["sv_pt", "sv_deta", "sv_dphi", "sv_mass", "sv_ntracks",
                                   "sv_d3dsig"], library="ak")  # fmt: skip
        sel = np.flatnonzero(c["file"] == k)
        for row in sel:
            jet = sv[int(c["entry"][row])]
            order = np.argsort(-ak.to_numpy(jet.sv_pt), kind="stable")[:2]
            rest = ("sv_deta", "sv_dphi", "sv_mass", "sv_ntracks", "sv_d3dsig")
            cols = [np.log(ak.to_numpy(jet.sv_pt))] + [ak.to_numpy(jet[b]) for b in rest]
            want = np.stack(cols, 1)
            n = len(order)
            assert c["coll_sv_count"][row] == n
            np.testing.assert_allclose(c["coll_sv"][row, :n], want[order], rtol=1e-5)
            assert not c["coll_sv"][row, n:].any()  # zeros past the jet's vertices
    assert (c["coll_sv_count"] == 0).any() and (c["coll_sv_count"] == 2).any()
    train = load_columns(sharded, "train", ("coll_sv", "coll_sv_count"))
    real = train["coll_sv"][np.arange(2) < train["coll_sv_count"][:, None]]
    # the robust centre and scale of the training split's real vertices (all of them sampled
    # at this size): weaver's auto definition, as for the particles
    low, mid, high = np.percentile(real.astype(np.float64), [16, 50, 84], axis=0)
    np.testing.assert_allclose(index["coll_sv_mean"], mid, rtol=1e-4, atol=1e-6)
    spread = np.maximum(high - mid, mid - low)
    np.testing.assert_allclose(index["coll_sv_std"], np.where(spread > 0, spread, 1.0),
                               rtol=1e-4, atol=1e-6)  # fmt: skip


def _rewrite(src, dst, change) -> None:
    """A copy of a toy file with its `sv` collection changed by `change(sv) -> sv`."""
    with uproot.open(src) as f:
        a = f["tree"].arrays(library="ak")
    part = ak.zip({k[5:]: a[k] for k in a.fields if k.startswith("part_")})
    sv = change(ak.zip({k[3:]: a[k] for k in a.fields if k.startswith("sv_")}))
    flat = {k: a[k] for k in a.fields if not k.startswith(("part_", "sv_", "npart", "nsv"))}
    with uproot.recreate(dst) as out:
        branches = {"part": part, "sv": sv, **flat}
        out.mktree("tree", {k: v.type for k, v in branches.items()}).extend(branches)


def test_bad_collections_stop_the_shard_job_and_an_empty_one_is_said(raw, tmp_path):
    with pytest.raises(VoxjetError, match=r"count branch 'jet_nparticles' says .* for \d+ jets "
                       r"\(entries \[\d+"):  # fmt: skip
        shard_jets(
            raw / "m.json",
            tmp_path / "a",
            _config(collections={"sv": {**SV["sv"], "count": "jet_nparticles"}}),
        )
    mixed = {"sv": {**SV["sv"], "features": ["sv_pt", "part_deta"]}}
    with pytest.raises(VoxjetError, match=r"collection 'sv': jets\.collections\.sv\.features: "
                       r"'part_deta' has another particle count than 'sv_pt'"):  # fmt: skip
        shard_jets(raw / "m.json", tmp_path / "b", _config(collections=mixed))
    # a file whose jets have no vertex at all
    empty = tmp_path / "empty"
    empty.mkdir()
    for f in sorted((raw / "raw").glob("*.root")):
        _rewrite(f, empty / f.name, (lambda sv: sv[:, :0]) if "Hbb" in f.name else (lambda sv: sv))
    stage(str(empty), tmp_path / "staged", tmp_path / "m.json", patterns=["*.root"])
    # (light-quark jets often have none: said, and kept)
    index = shard_jets(tmp_path / "m.json", tmp_path / "c", _config())
    assert index["empty_collections"] == ["Hbb_000.root"]
    c = load_columns(tmp_path / "c", "train", ("coll_sv_count", "file", "labels"))
    assert (c["coll_sv_count"][c["labels"] == 1] == 0).all()
    assert (c["coll_sv_count"][c["labels"] == 2] > 0).any()


def test_collection_settings_and_leaks_are_refused_by_key():
    from voxjet.jets.leakage import check_inputs

    with pytest.raises(VoxjetError, match=r"'jets\.collections\.particles'"):
        parse_collections({"particles": {"features": ["x"]}})
    with pytest.raises(VoxjetError, match=r"'jets\.collections\.sv\.features'"):
        parse_collections({"sv": {"length": 3}})
    with pytest.raises(VoxjetError, match=r"'jets\.collections\.sv\.features': the input "
                       r"'sv_truth' reads \['label_Hbb'\]"):  # fmt: skip
        check_inputs({"collections": {"sv": {"features": ["sv_truth"]}}, "labels": LABELS,
                      "new_variables": {"sv_truth": "sv_pt * label_Hbb"}}, "jets")  # fmt: skip
    # weaver's taggers read a collection through the data config's groups of it
    with pytest.raises(VoxjetError, match=r"weaver_part reads each collection's features group"):
        build_model("weaver_part", collections=[{"name": "sv", "features": ["sv_x"]}],
                    n_classes=2, feature_names=[], weaver_inputs={})  # fmt: skip


def test_a_collections_objects_join_the_particles_with_shared_features_copied():
    """sv_deta/sv_dphi land in part_deta/part_dphi as they are; the other particle features
    are the learned map, in the particles' units; padding stays zero and masked."""
    seen = {}

    class Probe(torch.nn.Module):
        def forward(self, p, m):
            seen.update(p=p, m=m)
            return p.sum((1, 2))[:, None]

    names = ["part_deta", "part_dphi", "part_e_log"]
    model = CollectionEmbedding(Probe(), names, [0.0, 0.0, 2.0], [1.0, 1.0, 0.5],
                                [{"name": "sv", "features": ["sv_mass", "sv_dphi", "sv_deta"],
                                  "mean": [5.0, 0.0, 0.0], "std": [2.0, 1.0, 1.0]}])  # fmt: skip
    x = torch.tensor([[[7.0, 0.2, -0.1], [0.0, 0.0, 0.0]]])
    mask, sv_mask = torch.ones(1, 4, dtype=torch.bool), torch.tensor([[True, False]])
    with torch.no_grad():
        model(torch.zeros(1, 4, 3), mask, x, sv_mask)
    row = seen["p"][0, 4]
    assert row[0] == -0.1 and row[1] == pytest.approx(0.2)
    lin = model.proj[0]
    with torch.no_grad():
        want = (lin(torch.tensor([[1.0, 0.2, -0.1]])) * 0.5 + 2.0).item()
    assert row[2].item() == pytest.approx(want, rel=1e-6)
    assert not seen["p"][0, 5].any() and seen["m"].tolist() == [[True] * 5 + [False]]


@pytest.mark.parametrize("name,kw", [
    ("pfn", {"phi_sizes": [16], "f_sizes": [16]}),
    ("particlenet", {"k": 4, "conv_channels": [[16, 16]], "fc_size": 16}),
    ("part", {"dim": 16, "heads": 2, "blocks": 1, "class_blocks": 1, "pair_dim": 8}),
])  # fmt: skip
def test_taggers_read_the_vertices_through_evaluation_predict_and_export(raw, sharded, tmp_path,
                                                                         name, kw):  # fmt: skip
    from conftest import assert_predict_equals_evaluation

    from voxjet.export import export_model
    from voxjet.jets.evaluate import evaluate
    from voxjet.jets.train import run
    from voxjet.predict import run_predict

    train = {"steps": 30, "batch_size": 64, "lr": 3e-3, "eval_every": 30}
    run(str(sharded), {"model": {"name": name, **kw}, "train": train}, str(tmp_path / "run"))
    model = tmp_path / "run" / "model.pt"
    evaluate(str(sharded), str(model), str(tmp_path / "eval"))
    run_predict(str(model), [str(raw / "raw")], str(tmp_path / "pred"))
    assert_predict_equals_evaluation(tmp_path / "eval", tmp_path / "pred",
                                     {"score_Hbb": ("probs", 1)})  # fmt: skip
    # the vertices change the scores: the model reads them
    from voxjet.jets.dataset import load_split
    from voxjet.jets.tagger import load_trained
    from voxjet.jets.train import predict

    m, saved = load_trained(model)
    data = load_split(sharded, "test")
    colls = saved["model_config"]["collections"]
    with_sv = predict(m, data, torch.device("cpu"), 3, colls)[0]
    data.extras["coll_sv_count"] = torch.zeros_like(data.extras["coll_sv_count"])
    without = predict(m, data, torch.device("cpu"), 3, colls)[0]
    assert np.abs(with_sv - without).max() > 1e-3
    if name == "pfn":
        export_model(model, "onnx", tmp_path / "x")
        info = json.loads((tmp_path / "x" / "export.json").read_text())
        assert list(info["inputs"]) == ["particles", "mask", "sv", "sv_mask"]


@pytest.mark.slow
def test_the_workflow_runs_a_vertex_collection_and_a_mass_target_to_the_summary(workflow_dir):
    """Real snakemake on toy files: a dataset with a `sv` collection and a regression target
    stages, shards, trains, evaluates and reports the target's resolution in the summary."""
    from conftest import run_pfn_workflow

    jets = {"labels": ["label_QCD", "label_Hbb"], "max_particles": 24, "new_variables": NEW,
            "collections": SV, "targets": {"gen_mass": {"expr": "aux_genjet_mass"}},
            "jet_features": ["jet_pt", "jet_sdmass"]}  # fmt: skip
    source = {"synthetic": {"generator": "toy", "classes": ["QCD", "Hbb"], "files_per_class": 1,
                            "jets_per_file": 300, "seed": 3}}  # fmt: skip
    r = run_pfn_workflow(workflow_dir, source, jets,
                         {"steps": 20, "eval_every": 10, "batch_size": 32})  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (metrics,) = (workflow_dir / "results").rglob("eval/metrics.json")
    m = json.loads(metrics.read_text())
    assert set(m["regression"]) == {"gen_mass"} and m["regression"]["gen_mass"]["n_jets"] > 0
    assert (metrics.parent / "regression.png").exists()
    (summary,) = (workflow_dir / "results").rglob("summary.md")
    assert "resolution_gen_mass_median_baseline" in summary.read_text()
