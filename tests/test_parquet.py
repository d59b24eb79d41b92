"""Parquet jet files (one row a jet, the particles as list columns: JetClass-II's layout, what
weaver's `convert_to_parquet` and `ak.to_parquet(tree.arrays())` write) stage and shard to
exactly the jets, features, labels and splits of the ROOT files they were converted from —
JetClass-shaped toy files, uproot's HZZ sample and a CMS NanoAOD skim — and a Parquet file that
cannot be read as one is refused naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import awkward as ak
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import uproot
import yaml
from conftest import hep_file
from test_jet_data import HZZ, NANO

from voxjet.errors import VoxjetError
from voxjet.io.parquet_files import ParquetTable
from voxjet.io.trees import branch_type
from voxjet.jets.branch_reads import check_source_file
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.shard import shard_jets, split_name
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage


def to_parquet(root_dir: Path, out: Path, tree: str, row_group_size: int) -> None:
    """Every ROOT file's tree as a new user converts it: `ak.to_parquet(tree.arrays())`."""
    out.mkdir(parents=True)
    for p in sorted(root_dir.glob("*.root")):
        with uproot.open(p) as f:
            arrays = f[tree].arrays()
        ak.to_parquet(arrays, out / f"{p.stem}.parquet", row_group_size=row_group_size)


def shard(src: Path | str, tmp: Path, name: str, cfg: JetDataConfig, patterns: list[str]) -> Path:
    stage(str(src), tmp / f"staged_{name}", tmp / f"{name}.json", patterns=patterns,
          tree=cfg.tree_name)  # fmt: skip
    shard_jets(tmp / f"{name}.json", tmp / f"shards_{name}", cfg)
    return tmp / f"shards_{name}"


def assert_same_shards(a: Path, b: Path) -> None:
    """Every shard of every split holds the same arrays; the indexes agree but for the files'
    names (and the tree, which Parquet has none of)."""
    files = sorted(p.relative_to(a) for p in a.rglob("*.h5"))
    assert files and files == sorted(p.relative_to(b) for p in b.rglob("*.h5"))
    for rel in files:
        with h5py.File(a / rel) as x, h5py.File(b / rel) as y:
            assert sorted(x) == sorted(y), rel
            for key in x:
                np.testing.assert_array_equal(x[key][...], y[key][...], err_msg=f"{rel}:{key}")
    ia, ib = (json.loads((d / "index.json").read_text()) for d in (a, b))
    assert [Path(f).stem for f in ia.pop("source_files")] == \
        [Path(f).stem for f in ib.pop("source_files")]  # fmt: skip
    for index in (ia, ib):
        index.pop("config"), index.pop("config_hash")
    assert ia == ib


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("parquet")
    generate_dataset(d / "root", ToyJetsConfig(files_per_class=2, jets_per_file=150),
                     progress=False)  # fmt: skip
    to_parquet(d / "root", d / "parquet", "tree", row_group_size=40)
    return d


def test_a_parquet_copy_of_jetclass_shaped_files_shards_to_the_same_jets(toy, tmp_path):
    # row groups of 40 jets against shard parts of 100: a part starts inside a row group
    cfg = JetDataConfig(max_particles=24, jets_per_shard=130, shard_jobs=3)
    a = shard(toy / "root", tmp_path, "root", cfg, ["*.root"])
    b = shard(toy / "parquet", tmp_path, "parquet", cfg, ["*.parquet"])
    assert_same_shards(a, b)
    index = json.loads((b / "index.json").read_text())
    assert all(index["splits"][s]["jets"] > 0 for s in ("train", "val", "test"))
    assert index["source_files"][0].endswith(".parquet")


def test_weavers_convert_to_parquet_output_is_read_as_it_is(toy, tmp_path):
    """weaver-core 0.5.3's converter (lz4, row groups of 1000) on the toy files, sharded through
    a JetClass data config in weaver's format, as the ROOT originals are."""
    convert = pytest.importorskip("weaver.utils.convert_to_parquet").convert_file
    from test_weaver import data_config

    (tmp_path / "weaver").mkdir()
    for p in sorted((toy / "root").glob("*.root")):
        convert(str(p), str(tmp_path / "weaver" / f"{p.stem}.parquet"), branches=None,
                treename="tree", row_group_size=64)  # fmt: skip
    config = tmp_path / "JetClass_kin.yaml"
    config.write_text(yaml.safe_dump({**data_config("kin", 32), "treename": "tree"}))
    cfg = JetDataConfig(weaver_config=str(config), jets_per_shard=500, shard_jobs=2)
    a = shard(toy / "root", tmp_path, "root", cfg, ["*.root"])
    b = shard(tmp_path / "weaver", tmp_path, "weaver", cfg, ["*.parquet"])
    assert_same_shards(a, b)


@pytest.mark.parametrize("sample", ["hzz", "nano"])
def test_a_parquet_copy_of_the_field_packages_files_shards_to_the_same_jets(sample, tmp_path):
    """uproot's HZZ sample (tree `events`, Jet_Px naming, a counter branch) and a CMS NanoAOD
    Drell-Yan skim (unsigned counters, an integer label branch, jets with no label dropped)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    if sample == "hzz":
        # one of its three compressions: their Parquet copies are one file, refused as duplicates
        shutil.copy(hep_file("uproot-HZZ-zlib.root"), raw)
        settings = {**HZZ, "labels": {"by_file": {"hzz": "*HZZ*"}}}
    else:
        shutil.copy(hep_file("uproot-small-dy-withoffsets.root"), raw)
        settings = {**NANO, "shard_jobs": 3}
    to_parquet(raw, tmp_path / "pq", settings["tree"], row_group_size=333)
    a = shard(raw, tmp_path, "root", JetDataConfig(**settings), ["*.root"])
    b = shard(tmp_path / "pq", tmp_path, "pq", JetDataConfig(**{**settings, "tree": None}),
              ["*.parquet"])  # fmt: skip
    assert_same_shards(a, b)


def test_a_parquet_copy_keeps_each_jets_split():
    assert split_name("QCD_000.parquet") == "QCD_000.root"
    assert split_name("sub/x.ROOT") == "sub/x.ROOT"


def test_nullable_columns_read_as_root_branches_and_a_null_is_refused(tmp_path):
    """pyarrow and pandas write nullable columns: read without option types when they hold no
    null; a null is named with its column and entry."""
    table = pa.table({
        "part_px": pa.array([[1.0, 2.0], [3.0], [4.0, None]], pa.list_(pa.float32())),
        "jet_pt": pa.array([1.0, 2.0, 3.0], pa.float32()),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=2)
    t = ParquetTable(tmp_path / "x.parquet")
    assert branch_type(t, "part_px") == "var * float32" and branch_type(t, "jet_pt") == "float32"
    assert str(t.arrays(["part_px"], 0, 2).type) == "2 * {part_px: var * float32}"
    with pytest.raises(VoxjetError, match=r"x.parquet: column 'part_px' holds a null .* entry 2"):
        t.arrays(["part_px"])


def test_a_text_column_and_a_broken_file_are_refused_naming_them(tmp_path):
    pq.write_table(pa.table({"name": ["a", "b"]}), tmp_path / "s.parquet")
    with pytest.raises(VoxjetError, match="s.parquet: column 'name' is string"):
        ParquetTable(tmp_path / "s.parquet").column_type("name")
    good, cut = tmp_path / "t.parquet", tmp_path / "src" / "cut.parquet"
    pq.write_table(pa.table({"x": [1.0, 2.0]}), good)
    cut.parent.mkdir()
    cut.write_bytes(good.read_bytes()[:-20])
    with pytest.raises(VoxjetError, match="cut.parquet: not a readable Parquet file"):
        ParquetTable(cut)
    with pytest.raises(VoxjetError, match="cut.parquet: not a readable Parquet file"):
        stage(str(cut.parent), tmp_path / "staged", tmp_path / "m.json", patterns=["*.parquet"],
              tree="tree", retries=0)  # fmt: skip


def test_a_tree_for_parquet_files_and_mixed_formats_are_refused(toy, tmp_path):
    one = next((toy / "parquet").glob("*.parquet"))
    with pytest.raises(VoxjetError, match="a Parquet file has no trees.*jets.tree is 'events'"):
        check_source_file(one, JetDataConfig(tree="events"), "jc")
    check_source_file(one, JetDataConfig(), "jc")  # no tree: the columns checked
    with pytest.raises(VoxjetError, match=r"has no column 'part_px2' \(read by"):
        check_source_file(one, JetDataConfig(new_variables={"part_pt": "part_px2"}), "jc")
    mixed = tmp_path / "mixed"
    shutil.copytree(toy / "parquet", mixed)
    shutil.copy(next((toy / "root").glob("*.root")), mixed)
    stage(str(mixed), tmp_path / "staged", tmp_path / "m.json", patterns=["*.root", "*.parquet"],
          tree="tree")  # fmt: skip
    with pytest.raises(VoxjetError, match=r"1 ROOT files .* and 8 Parquet files .* one format"):
        shard_jets(tmp_path / "m.json", tmp_path / "shards", JetDataConfig())


def test_parquet_files_stage_from_s3_and_shard_as_local_ones(toy, tmp_path, monkeypatch):
    """A bucket of Parquet files (an S3-compatible server on loopback) staged by URL glob."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed")
    try:
        server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
    except Exception as e:  # no free port, a sandbox without sockets
        pytest.skip(f"cannot start the S3 server: {e}")
    import fsspec.config

    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    try:
        host, port = server.get_host_and_port()
        # how a user points fsspec at a site's S3 endpoint: its environment variables
        monkeypatch.setenv("FSSPEC_S3_ENDPOINT_URL", f"http://{host}:{port}")
        monkeypatch.setenv("FSSPEC_S3_KEY", "test")
        monkeypatch.setenv("FSSPEC_S3_SECRET", "test")
        fsspec.config.set_conf_env(fsspec.config.conf)
        fs = s3fs.S3FileSystem()
        fs.mkdir("jets")
        fs.put(str(toy / "parquet"), "jets/jc2", recursive=True)
        cfg = JetDataConfig(max_particles=24, jets_per_shard=130, shard_jobs=2)
        remote = shard("s3://jets/jc2/*.parquet", tmp_path, "s3", cfg, ["*.parquet"])
        local = shard(toy / "parquet", tmp_path, "local", cfg, ["*.parquet"])
        assert_same_shards(local, remote)
    finally:
        fsspec.config.conf.clear()
        fsspec.config.conf.update(saved)
        server.stop()
