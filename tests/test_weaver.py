"""weaver-core data configs and networks: JetClass's feature sets (full, kin, kinpid, written in
weaver's format as jet-universe/particle_transformer publishes them, with the toy files' four
classes) shard JetClass-shaped files and give exactly the inputs weaver-core's own loader gives
for the same jets; a state dict saved from weaver's ParticleTransformer or ParticleNet loads
into a voxjet model and gives the same outputs; what voxjet cannot do as weaver does is refused
naming the key."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.dataset import load_columns, load_index
from voxjet.jets.jagged import pad_particles
from voxjet.jets.models import build_model
from voxjet.jets.models.weaver import PART_DEFAULTS, PNET_DEFAULTS
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage

pytest.importorskip("weaver", reason="weaver-core is in the test extra")

NEW_VARIABLES = {
    "part_mask": "ak.ones_like(part_energy)",
    "part_pt": "np.hypot(part_px, part_py)",
    "part_pt_log": "np.log(part_pt)",
    "part_e_log": "np.log(part_energy)",
    "part_logptrel": "np.log(part_pt/jet_pt)",
    "part_logerel": "np.log(part_energy/jet_energy)",
    "part_deltaR": "np.hypot(part_deta, part_dphi)",
    "part_d0": "np.tanh(part_d0val)",
    "part_dz": "np.tanh(part_dzval)",
}
KIN = [["part_pt_log", 1.7, 0.7], ["part_e_log", 2.0, 0.7], ["part_logptrel", -4.7, 0.7],
       ["part_logerel", -4.7, 0.7], ["part_deltaR", 0.2, 4.0]]  # fmt: skip
PID = [["part_charge", None], ["part_isChargedHadron", None], ["part_isNeutralHadron", None],
       ["part_isPhoton", None], ["part_isElectron", None], ["part_isMuon", None]]  # fmt: skip
TRACKS = [["part_d0", None], ["part_d0err", 0, 1, 0, 1], ["part_dz", None],
          ["part_dzerr", 0, 1, 0, 1]]  # fmt: skip
ANGLES = [["part_deta", None], ["part_dphi", None]]
FEATURES = {"kin": KIN + ANGLES, "kinpid": KIN + PID + ANGLES, "full": KIN + PID + TRACKS + ANGLES}
CLASSES = ["label_QCD", "label_Hbb", "label_Wqq", "label_Tbqq"]


def data_config(features: str, length: int = 128) -> dict:
    """A JetClass data config in weaver's format (JetClass_{full,kin,kinpid}.yaml's inputs)."""
    group = {"length": length, "pad_mode": "wrap"}
    return copy.deepcopy(
        {
            "selection": None,
            "new_variables": dict(NEW_VARIABLES),
            "preprocess": {"method": "manual", "data_fraction": 0.5},
            "inputs": {
                "pf_points": {**group, "vars": ANGLES},
                "pf_features": {**group, "vars": FEATURES[features]},
                "pf_vectors": {
                    **group,
                    "vars": [
                        ["part_px", None],
                        ["part_py", None],
                        ["part_pz", None],
                        ["part_energy", None],
                    ],
                },
                "pf_mask": {
                    "length": length,
                    "pad_mode": "constant",
                    "vars": [["part_mask", None]],
                },
            },  # fmt: skip
            "labels": {"type": "simple", "value": CLASSES},
            "observers": ["jet_pt", "jet_eta", "jet_sdmass"],
            "weights": None,
        }
    )


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    d = tmp_path_factory.mktemp("weaver")
    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=120), progress=False)
    stage(str(d / "raw"), d / "staged", d / "manifest.json", patterns=["*.root"])
    return d / "manifest.json"


def _shard(manifest, tmp_path, features: str, length: int = 128):
    path = tmp_path / f"JetClass_{features}.yaml"
    path.write_text(yaml.safe_dump(data_config(features, length), sort_keys=False))
    cfg = JetDataConfig(weaver_config=str(path), jets_per_shard=500)
    shard_jets(manifest, tmp_path / "shards", cfg)
    return path, tmp_path / "shards"


def _voxjet_inputs(shards, model):
    """Per (file, entry): the four groups voxjet's weaver model is fed, for every split's jets."""
    index = load_index(shards)
    out = {}
    for split in ("train", "val", "test"):
        cat = load_columns(shards, split, ("particles", "labels", "file", "entry"))
        counts = torch.from_numpy(np.diff(cat["offsets"]))
        p, m = pad_particles(torch.from_numpy(cat["particles"]), counts, index["max_particles"])
        groups = model.weaver_inputs(p, m)
        for i, (f, e) in enumerate(zip(cat["file"], cat["entry"], strict=True)):
            key = (index["source_files"][int(f)], int(e))
            out[key] = ([g[i].numpy() for g in groups], int(cat["labels"][i]))
    return out


@pytest.mark.parametrize("features", ["kin", "kinpid", "full"])
def test_jetclass_feature_sets_give_weavers_own_inputs_for_the_same_jets(manifest, tmp_path,
                                                                         features):  # fmt: skip
    from weaver.utils.dataset import SimpleIterDataset

    cfg_path, shards = _shard(manifest, tmp_path, features)
    index = load_index(shards)
    assert index["classes"] == ["QCD", "Hbb", "Wqq", "Tbqq"]
    assert index["config"]["observers"] == ["jet_pt", "jet_eta", "jet_sdmass"]
    model = build_model("weaver_pnet", n_classes=4, feature_names=index["particle_features"],
                        weaver_inputs=index["config"]["weaver_inputs"])  # fmt: skip
    ours = _voxjet_inputs(shards, model)
    root = manifest.parent / "staged"
    compared = 0
    for name in index["source_files"]:
        ds = SimpleIterDataset({"d": [str(root / name)]}, str(cfg_path), for_training=False,
                               load_range_and_fraction=((0, 1), 1, 1), fetch_by_files=True,
                               fetch_step=1, name="test")  # fmt: skip
        for entry, (x, y, _) in enumerate(ds):
            groups, label = ours[(name, entry)]
            assert label == int(y["_label_"]), (name, entry)
            for key, mine in zip(("pf_points", "pf_features", "pf_vectors", "pf_mask"), groups,
                                 strict=True):  # fmt: skip
                np.testing.assert_allclose(mine, x[key], rtol=1e-5, atol=2e-5,
                                           err_msg=f"{name} entry {entry} {key}")  # fmt: skip
            compared += 1
    assert compared == len(ours) == 4 * 120


def test_automatic_standardisation_is_weavers_from_the_training_jets(manifest, tmp_path):
    """preprocess.method auto: each variable without a centre gets weaver's median and
    1/(84th or 16th percentile distance) from the training split's particles — equal to those
    percentiles computed here, and close to weaver-core's AutoStandardizer over the same files
    (which reads every jet, not only the training split); the model is built from them."""
    from weaver.utils.data.config import DataConfig
    from weaver.utils.data.preprocess import AutoStandardizer

    cfg = data_config("kin")
    cfg["preprocess"] = {"method": "auto", "data_fraction": 1.0}
    cfg["inputs"]["pf_features"]["vars"] = [[v[0]] if len(v) == 3 else v for v in KIN + ANGLES]
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    shard_jets(manifest, tmp_path / "shards", JetDataConfig(weaver_config=str(path)))
    index = load_index(tmp_path / "shards")
    train = load_columns(tmp_path / "shards", "train", ("particles",))["particles"]
    ours = {v["name"]: v for v in index["weaver_inputs"]["pf_features"]["vars"]}
    dc = DataConfig.load(str(path))
    maker = AutoStandardizer([str(manifest.parent / "staged" / f) for f in index["source_files"]],
                             dc)  # fmt: skip
    theirs = maker.make_preprocess_params(maker.read_file(maker._filelist))
    for name, *_ in KIN:
        col = train[:, index["particle_features"].index(name)]
        low, mid, high = np.percentile(col, [16, 50, 84])
        assert ours[name]["center"] == pytest.approx(mid, rel=1e-6)
        assert ours[name]["scale"] == pytest.approx(1 / max(high - mid, mid - low), rel=1e-6)
        assert ours[name]["center"] == pytest.approx(theirs[name]["center"], rel=0.05, abs=0.05)
        assert ours[name]["scale"] == pytest.approx(theirs[name]["scale"], rel=0.1)
    assert ours["part_deta"]["center"] is None  # given as None: not standardised
    model = build_model("weaver_pnet", n_classes=4, feature_names=index["particle_features"],
                        weaver_inputs=index["weaver_inputs"])  # fmt: skip
    assert torch.isfinite(model(*pad_particles(torch.from_numpy(train[:40]),
                                               torch.tensor([10] * 4), 16))).all()  # fmt: skip
    with pytest.raises(VoxjetError, match="automatic standardisation of .* was not computed"):
        build_model("weaver_pnet", n_classes=4, feature_names=index["particle_features"],
                    weaver_inputs=index["config"]["weaver_inputs"])  # fmt: skip


class PartWrapper(nn.Module):
    """particle_transformer's networks/example_ParticleTransformer.py wrapper (how the published
    checkpoints were saved: the network under `mod`)."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        from weaver.nn.model.ParticleTransformer import ParticleTransformer

        self.mod = ParticleTransformer(**kwargs)

    def forward(self, points, features, lorentz_vectors, mask):
        return self.mod(features, v=lorentz_vectors, mask=mask)


class PNetWrapper(nn.Module):
    """particle_transformer's networks/example_ParticleNet.py wrapper."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        from weaver.nn.model.ParticleNet import ParticleNet

        self.mod = ParticleNet(**kwargs)

    def forward(self, points, features, lorentz_vectors, mask):
        return self.mod(points, features, mask)


SMALL_PART = {"embed_dims": [32, 64, 32], "pair_embed_dims": [16, 16], "num_heads": 4,
              "num_layers": 2, "num_cls_layers": 1}  # fmt: skip
SMALL_PNET = {"conv_params": [[4, [16, 16]], [4, [32, 32]]], "fc_params": [[32, 0.1]]}


def _weaver_net(kind: str, n_classes: int, n_features: int) -> nn.Module:
    if kind == "weaver_part":
        return PartWrapper(input_dim=n_features, num_classes=n_classes,
                           **{**PART_DEFAULTS, **SMALL_PART})  # fmt: skip
    cfg = {**PNET_DEFAULTS, **SMALL_PNET}
    cfg["conv_params"] = [(k, tuple(c)) for k, c in cfg["conv_params"]]
    cfg["fc_params"] = [tuple(f) for f in cfg["fc_params"]]
    return PNetWrapper(input_dims=n_features, num_classes=n_classes, **cfg)


@pytest.mark.parametrize("kind,small", [("weaver_part", SMALL_PART), ("weaver_pnet", SMALL_PNET)])
def test_a_state_dict_saved_from_weavers_network_gives_the_same_outputs(manifest, tmp_path,
                                                                         kind, small):  # fmt: skip
    _, shards = _shard(manifest, tmp_path, "kin", length=32)
    index = load_index(shards)
    torch.manual_seed(7)
    theirs = _weaver_net(kind, 4, len(KIN + ANGLES)).eval()
    torch.save(theirs.state_dict(), tmp_path / "weights.pt")
    kw = {"n_classes": 4, "feature_names": index["particle_features"],
          "weaver_inputs": index["config"]["weaver_inputs"], "network": small}  # fmt: skip
    ours = build_model(kind, pretrained=str(tmp_path / "weights.pt"), **kw).eval()
    fresh = build_model(kind, **kw).eval()
    cat = load_columns(shards, "train", ("particles",))
    counts = torch.from_numpy(np.diff(cat["offsets"]))[:64]
    flat = torch.from_numpy(cat["particles"][: int(counts.sum())])
    p, m = pad_particles(flat, counts, index["max_particles"])
    with torch.no_grad():
        want = theirs(*ours.weaver_inputs(p, m))
        got = ours(p, m)
        assert torch.equal(got, want)
        assert not torch.allclose(fresh(p, m), want)  # the weights did load
    # fine-tuning to other classes: the classifier starts afresh, the rest is weaver's
    torch.save(_weaver_net(kind, 10, len(KIN + ANGLES)).state_dict(), tmp_path / "ten.pt")
    tuned = build_model(kind, pretrained=str(tmp_path / "ten.pt"), **kw)
    assert tuned(p, m).shape == (64, 4)


def test_fine_tuning_a_weaver_network_trains_from_the_saved_weights(manifest, tmp_path):
    from voxjet.jets.train import run

    _, shards = _shard(manifest, tmp_path, "kin", length=32)
    torch.manual_seed(3)
    torch.save(_weaver_net("weaver_part", 4, len(KIN + ANGLES)).state_dict(), tmp_path / "w.pt")
    model = {"name": "weaver_part", "pretrained": str(tmp_path / "w.pt"), "network": SMALL_PART}
    train = {"steps": 12, "batch_size": 32, "lr": 1e-3, "log_every": 4, "eval_every": 12,
             "warmup_steps": 2}  # fmt: skip
    out = run(str(shards), {"model": model, "train": train}, str(tmp_path / "run"))
    assert out["step"] == 12
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=False)
    assert saved["model_config"]["weaver_inputs"]["pf_features"]["vars"][0]["center"] == 1.7
    from voxjet.export import export_model

    with pytest.raises(VoxjetError, match="a weaver_part model is exported by weaver itself"):
        export_model(tmp_path / "run" / "model.pt", "onnx", tmp_path / "export")


def _refused(tmp_path, change, match):
    cfg = data_config("kin")
    change(cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(VoxjetError, match=match):
        JetDataConfig(weaver_config=str(path))


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda c: c.update(weights={"reweight_method": "flat"}), "weights.reweight_vars: two"),
        (lambda c: c.update(labels={"type": "hybrid", "value": ["x"]}),
         "labels of type 'hybrid'"),
        (lambda c: c["preprocess"].update(method="standard"), "method 'standard'"),
        (lambda c: c["inputs"]["pf_mask"].update(pad_mode="wrap"), "a mask is padded with"),
        (lambda c: c["inputs"]["pf_features"].update(pad_mode="edge"), "pad_mode 'edge'"),
        (lambda c: c.update(extra=1), r"keys \['extra'\] are not weaver data-config keys"),
    ],
)  # fmt: skip
def test_what_voxjet_cannot_do_as_weaver_does_is_refused(tmp_path, change, match):
    _refused(tmp_path, change, rf"bad\.yaml.*{match}|{match}.*bad\.yaml")


def test_a_weaver_weights_section_becomes_the_datasets_reweighting(tmp_path):
    cfg = data_config("kin")
    cfg["weights"] = {"use_precomputed_weights": False, "reweight_method": "flat",
                      "reweight_vars": {"jet_pt": [500, 750, 1000], "jet_sdmass": [0, 500]},
                      "reweight_classes": CLASSES, "class_weights": [1, 1, 1, 1],
                      "reweight_threshold": 15, "reweight_hists": None}  # fmt: skip
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert JetDataConfig(weaver_config=str(path)).weights == cfg["weights"]
    with pytest.raises(VoxjetError, match="has its own weights section"):
        JetDataConfig(weaver_config=str(path), weights=cfg["weights"])


def test_a_weaver_test_time_selection_selects_the_test_split(tmp_path):
    cfg = data_config("kin")
    cfg.update(selection="jet_pt > 600", test_time_selection="jet_pt > 500")
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(cfg))
    jets = JetDataConfig(weaver_config=str(path))
    assert (jets.selection, jets.test_time_selection) == ("jet_pt > 600", "jet_pt > 500")


def test_weaver_config_and_its_keys_in_the_dataset_config_are_refused(demo_config, tmp_path):
    from voxjet.config import check_config

    path = tmp_path / "kin.yaml"
    path.write_text(yaml.safe_dump(data_config("kin")))
    cfg = copy.deepcopy(demo_config)
    cfg["datasets"]["toy_jets"]["jets"] = {"weaver_config": str(path), "max_particles": 64}
    with pytest.raises(VoxjetError, match=r"\['max_particles'\] are set by weaver_config"):
        check_config(cfg, "config/schema.yaml")
    cfg["datasets"]["toy_jets"]["jets"] = {"weaver_config": str(tmp_path / "nope.yaml")}
    with pytest.raises(VoxjetError, match=r"nope\.yaml: no such weaver data config"):
        check_config(cfg, "config/schema.yaml")
    leaky = data_config("kin")
    leaky["new_variables"]["part_leak"] = "part_deta * 0 + label_Tbqq"
    leaky["inputs"]["pf_features"]["vars"].append(["part_leak", None])
    path.write_text(yaml.safe_dump(leaky))
    cfg["datasets"]["toy_jets"]["jets"] = {"weaver_config": str(path)}
    with pytest.raises(VoxjetError, match=r"'part_leak' reads \['label_Tbqq'\]"):
        check_config(cfg, "config/schema.yaml")


def test_a_weaver_model_without_a_weaver_config_says_what_it_needs():
    with pytest.raises(VoxjetError, match="give the dataset jets.weaver_config"):
        build_model("weaver_part", n_classes=4, feature_names=["part_deta"])


def test_pretrained_weights_that_do_not_fit_are_refused_naming_the_file(manifest, tmp_path):
    _, shards = _shard(manifest, tmp_path, "kin", length=32)
    index = load_index(shards)
    torch.save({"mod.something": torch.zeros(3)}, tmp_path / "other.pt")
    kw = {"n_classes": 4, "feature_names": index["particle_features"],
          "weaver_inputs": index["config"]["weaver_inputs"], "network": SMALL_PART}  # fmt: skip
    with pytest.raises(VoxjetError, match=r"other\.pt: does not fit this network"):
        build_model("weaver_part", pretrained=str(tmp_path / "other.pt"), **kw)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(VoxjetError, match=r"junk\.pt: not a PyTorch state dict"):
        build_model("weaver_part", pretrained=str(tmp_path / "junk.pt"), **kw)


def test_a_weaver_model_on_a_dataset_without_a_weaver_config_stops_the_check(demo_config):
    from voxjet.config import check_config

    cfg = copy.deepcopy(demo_config)
    cfg["experiments"]["part"]["model"] = {"name": "weaver_part"}
    with pytest.raises(VoxjetError, match=r"part\.model\.name': 'weaver_part' reads the input "
                                          r"groups of a weaver data config; give dataset "
                                          r"'toy_jets' jets\.weaver_config"):  # fmt: skip
        check_config(cfg, "config/schema.yaml")


def test_a_weaver_configs_treename_is_the_tree_staging_checks(demo_config, workflow_dir, tmp_path):
    # NanoAOD's tree is `Events`: the stage job checks the tree the weaver config names
    from conftest import run_snakemake, write_config

    doc = {**data_config("kin"), "treename": "Events"}
    path = tmp_path / "nano.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = copy.deepcopy(demo_config)
    cfg["datasets"]["toy_jets"]["jets"] = {"weaver_config": str(path), "tree": "Events"}
    config = write_config(tmp_path / "c.yaml", cfg)
    r = run_snakemake(workflow_dir, "-n", "-p", "--until", "stage", "--configfile", str(config),
                      "--replace-workflow-config")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--tree Events" in r.stdout, r.stdout[-3000:]
    cfg["datasets"]["toy_jets"]["jets"]["tree"] = "events"
    config = write_config(tmp_path / "c.yaml", cfg)
    r = run_snakemake(workflow_dir, "-n", "--configfile", str(config), "--replace-workflow-config")
    assert r.returncode != 0
    assert "toy_jets.jets'.tree is 'events', but weaver_config" in r.stdout + r.stderr


def test_groups_of_another_collection_become_a_collection_at_the_config_check(demo_config,
                                                                             tmp_path):  # fmt: skip
    # CMS's ParticleNet-AK8 config feeds pf_* groups of 100 particles and sv_* groups of 10
    # secondary vertices: the check maps them before anything is staged
    from voxjet.config import check_config
    from voxjet.jets.weaver_config import resolve

    doc = data_config("kin")
    doc["inputs"]["sv_points"] = {"length": 10, "vars": [["sv_etarel", None], ["sv_phirel", None]]}
    path = tmp_path / "pf_sv.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = copy.deepcopy(demo_config)
    cfg["datasets"]["toy_jets"]["jets"] = {"weaver_config": str(path)}
    check_config(cfg, "config/schema.yaml")
    jets = resolve({"weaver_config": str(path)}, "jets")
    assert jets["collections"]["sv"]["features"] == ["sv_etarel", "sv_phirel"]
    assert jets["max_particles"] == 128 and "sv_etarel" not in jets["particle_features"]


SV_GROUPS = {
    "sv_points": {"length": 4, "pad_mode": "constant", "vars": [["sv_deta", None],
                                                               ["sv_dphi", None]]},
    "sv_features": {"length": 4, "pad_mode": "constant",
                    "vars": [["sv_pt_log", 4, 0.6], ["sv_mass", 1.2, 0.3], ["sv_deta", None],
                             ["sv_dphi", None], ["sv_ntracks", 3, 1], ["sv_d3dsig", 7, 0.02]]},
    "sv_mask": {"length": 4, "pad_mode": "constant", "vars": [["sv_mask", None]]},
}  # fmt: skip


def pf_sv_config() -> dict:
    """CMS's ak8_points_pf_sv layout (pf_points/pf_features/pf_mask of 32 particles, then
    sv_points/sv_features/sv_mask of 4 vertices) on the toy files' branches."""
    cfg = data_config("kinpid", 32)
    for g in cfg["inputs"].values():
        g["pad_mode"] = "constant"
    del cfg["inputs"]["pf_vectors"]
    cfg["inputs"].update(copy.deepcopy(SV_GROUPS))
    cfg["new_variables"].update({"sv_pt_log": "np.log(sv_pt)", "sv_mask": "ak.ones_like(sv_deta)"})
    return cfg


@pytest.fixture(scope="module")
def pf_sv(manifest, tmp_path_factory):
    """The toy jets sharded through the pf + sv weaver config: (config path, shards)."""
    d = tmp_path_factory.mktemp("pf_sv")
    path = d / "pf_sv.yaml"
    path.write_text(yaml.safe_dump(pf_sv_config(), sort_keys=False))
    shard_jets(manifest, d / "shards", JetDataConfig(weaver_config=str(path), jets_per_shard=500))
    return path, d / "shards"


def test_pf_and_sv_groups_give_weavers_own_inputs_for_every_jet(manifest, pf_sv):
    """Groups of two collections (pf_*, sv_*) map to the particles and a `sv` collection; the
    six groups fed to weaver's ParticleNetTagger equal weaver's SimpleIterDataset for every
    jet, jets without a vertex among them."""
    from weaver.utils.dataset import SimpleIterDataset

    path, shards = pf_sv
    cfg = JetDataConfig(weaver_config=str(path), jets_per_shard=500)
    assert cfg.collections == {"sv": {"features": ["sv_deta", "sv_dphi", "sv_pt_log", "sv_mass",
                                                   "sv_ntracks", "sv_d3dsig", "sv_mask"],
                                      "length": 4, "sort_by": None, "count": None}}  # fmt: skip
    assert cfg.max_particles == 32
    index = load_index(shards)
    colls = [{**c, "mean": index["coll_sv_mean"], "std": index["coll_sv_std"]}
             for c in index["collections"]]  # fmt: skip
    model = build_model("weaver_pnet", n_classes=4, feature_names=index["particle_features"],
                        weaver_inputs=index["config"]["weaver_inputs"], collections=colls,
                        network={"conv_params": [[4, [16, 16]]],
                                 "fc_params": [[16, 0.0]]})  # fmt: skip
    assert type(model.mod).__name__ == "ParticleNetTagger"
    keys = ("pf_points", "pf_features", "pf_mask", "sv_points", "sv_features", "sv_mask")
    ours, empty = {}, 0
    for split in ("train", "val", "test"):
        cat = load_columns(shards, split, ("particles", "file", "entry", "coll_sv",
                                           "coll_sv_count"))  # fmt: skip
        counts = torch.from_numpy(np.diff(cat["offsets"]))
        p, m = pad_particles(torch.from_numpy(cat["particles"]), counts, 32)
        sv = torch.from_numpy(cat["coll_sv"])
        sv_mask = torch.arange(4) < torch.from_numpy(cat["coll_sv_count"])[:, None]
        groups = model.weaver_inputs(p, m, sv, sv_mask)
        with torch.no_grad():
            assert model.eval()(p[:8], m[:8], sv[:8], sv_mask[:8]).shape == (8, 4)
        for i, (f, e) in enumerate(zip(cat["file"], cat["entry"], strict=True)):
            ours[(index["source_files"][int(f)], int(e))] = [g[i].numpy() for g in groups]
        empty += int((cat["coll_sv_count"] == 0).sum())
    assert empty > 0
    compared = 0
    for name in index["source_files"]:
        ds = SimpleIterDataset({"d": [str(manifest.parent / "staged" / name)]}, str(path),
                               for_training=False, load_range_and_fraction=((0, 1), 1, 1),
                               fetch_by_files=True, fetch_step=1, name="test")  # fmt: skip
        for entry, (x, _, _) in enumerate(ds):
            for key, mine in zip(keys, ours[(name, entry)], strict=True):
                np.testing.assert_allclose(mine, x[key], rtol=1e-5, atol=2e-5,
                                           err_msg=f"{name} entry {entry} {key}")  # fmt: skip
            compared += 1
    assert compared == len(ours) == 4 * 120


def test_a_group_whose_collection_is_ambiguous_is_named_at_the_config_check(tmp_path):
    cfg = pf_sv_config()
    cfg["inputs"]["sv_mask"]["length"] = 5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(VoxjetError, match=r"inputs\.sv_mask has length 5, but inputs\.sv_\w+ "
                       r"4: groups named sv_\* read one collection"):  # fmt: skip
        JetDataConfig(weaver_config=str(path))


@pytest.mark.parametrize("model", [
    {"name": "weaver_pnet", "network": {"conv_params": [[4, [16, 16]]], "fc_params": [[16, 0.0]]}},
    {"name": "particlenet", "k": 4, "conv_channels": [[16, 16]], "fc_size": 16},
])  # fmt: skip
def test_the_pf_sv_config_trains_and_predicts_with_either_particlenet(manifest, pf_sv, tmp_path,
                                                                      model):  # fmt: skip
    """weaver's ParticleNetTagger and voxjet's own ParticleNet (the vertices joined to the
    particles) on the pf + sv shards: predict on the raw files equals evaluation's scores."""
    from conftest import assert_predict_equals_evaluation

    from voxjet.jets.evaluate import evaluate
    from voxjet.jets.train import run
    from voxjet.predict import run_predict

    _, shards = pf_sv
    train = {"steps": 6, "batch_size": 32, "eval_every": 6}
    run(str(shards), {"model": model, "train": train}, str(tmp_path / "run"))
    evaluate(str(shards), str(tmp_path / "run" / "model.pt"), str(tmp_path / "eval"))
    run_predict(str(tmp_path / "run" / "model.pt"), [str(manifest.parent / "staged")],
                str(tmp_path / "pred"))  # fmt: skip
    assert_predict_equals_evaluation(tmp_path / "eval", tmp_path / "pred",
                                     {"score_Hbb": ("probs", 1)}, atol=1e-5)  # fmt: skip
