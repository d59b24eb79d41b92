"""CMS's ParticleNet-AK8 data config (weaver-core's data/ak8_points_pf_sv_full.yaml: 100 pf
candidates and 10 secondary vertices, 20 classes, a selection on the ntuple's bookkeeping,
reweighting by grouped classes) on files of its schema: the six input groups equal weaver-core's
SimpleIterDataset for every selected jet, and the whole workflow runs it with weaver's
ParticleNetTagger and with voxjet's own ParticleNet."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import uproot
import yaml
from cms_ak8 import LABELS, ak8_config, write_dataset

from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.dataset import load_columns
from voxjet.jets.jagged import pad_particles
from voxjet.jets.models import build_model
from voxjet.jets.shard import shard_jets
from voxjet.stage.transfer import stage

pytest.importorskip("weaver", reason="weaver-core is in the test extra")
KEYS = ("pf_points", "pf_features", "pf_mask", "sv_points", "sv_features", "sv_mask")


@pytest.fixture(scope="module")
def cms(tmp_path_factory):
    d = tmp_path_factory.mktemp("cms")
    write_dataset(d / "raw", 24)
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    return d


def test_the_ak8_config_gives_weavers_own_inputs_for_every_selected_jet(cms):
    from weaver.utils.dataset import SimpleIterDataset

    path = cms / "ak8.yaml"
    path.write_text(yaml.safe_dump(ak8_config(), sort_keys=False))
    # the ntuple's jet-level branches (the default jet_features are JetClass's)
    cfg = JetDataConfig(weaver_config=str(path), jets_per_shard=200, tree="Events",
                        jet_features=["fj_pt", "fj_sdmass"])  # fmt: skip
    index = shard_jets(cms / "m.json", cms / "shards", cfg)
    assert index["collections"][0]["length"] == 10 and index["max_particles"] == 100
    assert len(index["classes"]) == 20 and len(index["reweight"]["tables"]) == 9
    colls = [{**c, "mean": index["coll_sv_mean"], "std": index["coll_sv_std"]}
             for c in index["collections"]]  # fmt: skip
    model = build_model("weaver_pnet", n_classes=20, feature_names=index["particle_features"],
                        weaver_inputs=index["config"]["weaver_inputs"],
                        collections=colls)  # fmt: skip
    ours = {}
    for split in ("train", "val", "test"):
        c = load_columns(cms / "shards", split, ("particles", "file", "entry", "coll_sv",
                                                 "coll_sv_count"))  # fmt: skip
        p, m = pad_particles(torch.from_numpy(c["particles"]),
                             torch.from_numpy(np.diff(c["offsets"])), 100)  # fmt: skip
        sv = torch.from_numpy(c["coll_sv"])
        groups = model.weaver_inputs(p, m, sv, torch.arange(10) < torch.from_numpy(
            c["coll_sv_count"])[:, None])  # fmt: skip
        for i, (f, e) in enumerate(zip(c["file"], c["entry"], strict=True)):
            ours[(index["source_files"][int(f)], int(e))] = [g[i].numpy() for g in groups]
    compared = 0
    for name in index["source_files"]:
        with uproot.open(cms / "staged" / name) as f:
            b = f["Events"].arrays(["jet_no", "event_no"], library="np")
        selected = np.flatnonzero((b["jet_no"] < 2) & (b["event_no"] % 7 != 0))
        ds = SimpleIterDataset({"d": [str(cms / "staged" / name)]}, str(path), for_training=False,
                               load_range_and_fraction=((0, 1), 1, 1), fetch_by_files=True,
                               fetch_step=1, name="test")  # fmt: skip
        for entry, (x, _, _) in zip(selected, ds, strict=True):
            for key, mine in zip(KEYS, ours[(name, int(entry))], strict=True):
                np.testing.assert_allclose(mine, x[key], rtol=1e-5, atol=2e-5,
                                           err_msg=f"{name} entry {entry} {key}")  # fmt: skip
            compared += 1
    assert compared == len(ours) > 20 * 12


@pytest.mark.long
@pytest.mark.slow
def test_the_workflow_runs_the_published_ak8_config_with_both_particlenets(cms, workflow_dir):
    """As published (awkward-0's `awkward.JaggedArray.ones_like`, tree named by the
    dataset): staged, sharded, trained with weaver's ParticleNetTagger and voxjet's
    ParticleNet, evaluated and summarised."""
    from conftest import job_counts, run_snakemake, write_config

    path = cms / "ak8_published.yaml"
    path.write_text(yaml.safe_dump(ak8_config("awkward.JaggedArray.ones_like"), sort_keys=False))
    small = {"steps": 4, "eval_every": 4, "batch_size": 32}
    launch = {"gpus": 0, "threads": 1}
    cfg = {
        "datasets": {"cms": {"domain": "jets", "source": {"path": str(cms / "raw")},
                             "jets": {"weaver_config": str(path), "tree": "Events",
                                      "jet_features": ["fj_pt", "fj_sdmass"]}}},
        "experiments": {
            "pnet": {"dataset": "cms", "launch": launch, "train": small,
                     "model": {"name": "weaver_pnet",
                               "network": {"conv_params": [[4, [16, 16]]],
                                           "fc_params": [[16, 0.0]]}}},
            "particlenet": {"dataset": "cms", "launch": launch, "train": small,
                            "model": {"name": "particlenet", "k": 4, "conv_channels": [[16, 16]],
                                      "fc_size": 16}},
        },
    }  # fmt: skip
    write_config(workflow_dir / "config" / "config.yaml", cfg)
    r = run_snakemake(workflow_dir, "-c", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert job_counts(r.stdout + r.stderr)["train_jets"] == 2
    for run in ("pnet", "particlenet"):
        (m,) = (workflow_dir / "results").rglob(f"{run}*/eval/metrics.json")
        assert json.loads(m.read_text())["classes"] == [c.removeprefix("label_") for c in LABELS]
