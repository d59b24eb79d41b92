"""ROOT files as the experiments write them: RNTuple sources (ROOT's Run-4 format; what
uproot writes for `file[name] = {...}`) stage and shard exactly as the same jets in a TTree,
and a weaver config's `treename` decides the tree staging checks."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
import uproot
import yaml

from voxjet.errors import VoxjetError
from voxjet.io.trees import branch_type, tree_names
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.jets.weaver_config import check_not_both
from voxjet.stage.transfer import stage


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("trees")
    generate_dataset(d / "tt", ToyJetsConfig(files_per_class=1, jets_per_file=120), progress=False)
    (d / "rn").mkdir()
    for p in sorted((d / "tt").glob("*.root")):
        with uproot.open(p) as f:
            arrays = f["tree"].arrays(library="ak")
        with uproot.recreate(d / "rn" / p.name) as out:
            out["tree"] = {k: arrays[k] for k in arrays.fields}
    return d


def test_an_rntuple_source_stages_and_shards_as_its_ttree(toy, tmp_path):
    one = next((toy / "rn").glob("*.root"))
    with uproot.open(one) as f, uproot.open(toy / "tt" / one.name) as g:
        assert "RNTuple" in f.classname_of("tree") and tree_names(f) == ["tree"]
        # the same types spelled alike: a dataset may mix TTree and RNTuple files
        assert branch_type(f["tree"], "part_px") == branch_type(g["tree"], "part_px")
    cfg = JetDataConfig(max_particles=24, jets_per_shard=200)
    for src in ("tt", "rn"):
        stage(str(toy / src), tmp_path / f"staged_{src}", tmp_path / f"{src}.json",
                         patterns=["*.root"], tree="tree")  # fmt: skip
        shard_jets(tmp_path / f"{src}.json", tmp_path / f"shards_{src}", cfg)
    files = sorted(p.relative_to(tmp_path / "shards_tt") for p in
                   (tmp_path / "shards_tt").rglob("*.h5"))  # fmt: skip
    assert files
    for rel in files:
        with (
            h5py.File(tmp_path / "shards_tt" / rel) as a,
            h5py.File(tmp_path / "shards_rn" / rel) as b,
        ):
            for key in ("particles", "offsets", "jets", "labels"):
                np.testing.assert_array_equal(a[key][...], b[key][...], err_msg=f"{rel}:{key}")


def test_staging_an_rntuple_without_the_tree_names_what_it_has(toy, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(next((toy / "rn").glob("*.root")), src / "a.root")
    with pytest.raises(VoxjetError, match=r"a\.root: no tree named 'Events' \(it has \['tree'\]\)"):
        stage(str(src), tmp_path / "staged", tmp_path / "m.json", patterns=["*.root"],
              tree="Events")  # fmt: skip


def _weaver(tmp_path, treename):
    doc = {"treename": treename} if treename else {}
    doc.update({"inputs": {}, "labels": {"type": "simple", "value": ["label_QCD", "label_Hbb"]}})
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def test_a_tree_beside_a_weaver_config_is_accepted_when_it_is_the_configs_own(tmp_path):
    where = "config key 'datasets.d.jets'"
    check_not_both({"weaver_config": _weaver(tmp_path, "Events"), "tree": "Events"}, where)
    check_not_both({"weaver_config": _weaver(tmp_path, None), "tree": "Events"}, where)
    with pytest.raises(
        VoxjetError,
        match=r"datasets\.d\.jets'\.tree is 'events', but "
        r"weaver_config .*w\.yaml reads the tree 'Events' \(its treename\)",
    ):
        check_not_both({"weaver_config": _weaver(tmp_path, "Events"), "tree": "events"}, where)
