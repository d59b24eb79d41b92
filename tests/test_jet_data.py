"""The jets data config: the expression language, label forms, real ROOT files that
scikit-hep-testdata ships (other tree names, naming and compressions), and every bad input."""

from __future__ import annotations

import re
import shutil

import awkward as ak
import numpy as np
import pytest
import torch
import uproot
from conftest import hep_file

from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.expressions import Expression, Variables
from voxjet.jets.shard import jet_labels, shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage


def test_expressions_compute_over_jagged_and_flat_columns():
    a = ak.Array({"px": [[3.0, 0.0], [1.0]], "py": [[4.0, 1.0], [0.0]], "jpt": [10.0, 2.0]})
    v = Variables({"pt": "hypot(px, py)", "rel": "log(pt / jpt)", "hard": "jpt > 5"})
    out = v.evaluate(["pt", "rel", "hard"], a)
    assert ak.to_list(out["pt"]) == [[5.0, 1.0], [1.0]]
    assert ak.to_list(out["rel"])[0][0] == pytest.approx(np.log(0.5))
    assert ak.to_list(out["hard"]) == [True, False]
    assert v.branches(["rel"]) == ["jpt", "px", "py"]
    e = Expression("(jpt > 1) & ~(jpt > 5) | (abs(-jpt) == 10) and jpt ** 2 % 7 >= 0")
    assert ak.to_list(e.evaluate(a)) == [True, True]
    assert Expression("1 < jpt <= 2").evaluate({"jpt": np.array([1.0, 2.0, 3.0])}).tolist() == [
        False,
        True,
        False,
    ]
    # log clamps at 1e-8 rather than giving -inf for an exact zero
    assert Expression("log(x)").evaluate({"x": np.array([0.0])})[0] == pytest.approx(np.log(1e-8))


@pytest.mark.parametrize(
    "text,why",
    [
        ("__import__('os').system('true')", "unknown function"),
        ("__import__('os')", "unknown function '__import__'"),
        ("part_px.real", "Attribute"),
        ("part_px[0]", "Subscript"),
        ("open('x')", "unknown function 'open'"),
        ("(lambda: 1)()", "unknown function"),
        ("'a' + part_px", "is not a number"),
        ("log", "is a function, call it"),
        ("hypot(x=1, y=2)", "keyword arguments"),
        ("part_px +", "cannot parse"),
    ],
)
def test_expressions_refuse_everything_else(text, why):
    with pytest.raises(VoxjetError, match=why) as e:
        Expression(text, "jets.new_variables.bad")
    assert "jets.new_variables.bad" in str(e.value)


def test_variable_cycles_are_refused():
    v = Variables({"a": "b + 1", "b": "a * 2"})
    with pytest.raises(VoxjetError, match="a → b → a is a cycle"):
        v.branches(["a"])


def test_three_label_forms():
    a = ak.Array(
        {"label_QCD": [1, 0, 0, 1], "label_Top": [0.0, 1.0, 0.0, 1.0], "cls": [1, 0, 7, 0]}
    )
    labels, bad = jet_labels(a, ["label_QCD", "label_Top"], "f.root")
    assert labels.tolist() == [0, 1, -1, -1]  # none set, and two set: no class
    assert bad["none"].tolist() == [False, False, True, False]
    assert bad["several"].tolist() == [False, False, False, True]
    labels, bad = jet_labels(a, {"branch": "cls", "classes": ["q", "t"]}, "f.root")
    assert labels.tolist() == [1, 0, -1, 0] and bad["out_of_range"].tolist() == [0, 0, 1, 0]
    by_file = {"by_file": {"qcd": "qcd_*.root", "top": "top_*.root"}}
    assert jet_labels(a, by_file, "top_003.root")[0].tolist() == [1, 1, 1, 1]
    with pytest.raises(VoxjetError, match="matches 0 of the jets.labels.by_file patterns"):
        jet_labels(a, by_file, "w_000.root")


HZZ = dict(
    tree="events",
    new_variables={
        "part_pt": "hypot(Jet_Px, Jet_Py)",
        "part_eta": "arctanh(Jet_Pz / sqrt(Jet_Px**2 + Jet_Py**2 + Jet_Pz**2))",
        "part_pt_log": "log(part_pt)",
        "part_e_log": "log(Jet_E)",
        "met": "hypot(MET_px, MET_py)",
    },
    particle_features=["part_pt_log", "part_e_log", "part_eta", "Jet_btag"],
    jet_features=["met", "NJet"],
    selection="NJet >= 1",
    labels={"by_file": {"zlib": "*zlib*", "lz4": "*lz4*", "lzma": "*lzma*"}},
    max_particles=8,
    jets_per_shard=1000,
    shard_jobs=2,
)


# a CMS NanoAOD Drell-Yan skim (`Jet_pt` naming, unsigned counters) labelled by an integer branch
NANO = dict(
    tree="tree",
    new_variables={"part_pt_log": "log(Jet_pt)", "met_log": "log(MET_pt)"},
    particle_features=["part_pt_log", "Jet_jetId"],
    jet_features=["met_log", "nJet"],
    sort_by="Jet_pt",
    selection="nJet >= 1",
    labels={"branch": "nMuon", "classes": ["0mu", "1mu", "2mu"]},
    bad_labels="drop",  # events with 3+ muons are none of these classes: left out, counted
    max_particles=10,
    val_fraction=0.2,
    test_fraction=0.2,
)


def test_real_root_files_stage_and_shard(tmp_path):
    """uproot's HZZ sample in zlib, lz4 and lzma (tree `events`, `Jet_Px` naming, a counter
    branch), with the config adapted through new_variables; and a CMS NanoAOD Drell-Yan skim
    (`Jet_pt` naming, unsigned counters) labelled by an integer branch."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for c in ("zlib", "lz4", "lzma"):
        shutil.copy(hep_file(f"uproot-HZZ-{c}.root"), raw)
    m = stage(str(raw), tmp_path / "staged", tmp_path / "m.json", patterns=["uproot-HZZ-*"])
    assert [list(f["checksum"]) for f in m["files"]] == [["adler32"]] * 3
    index = shard_jets(tmp_path / "m.json", tmp_path / "hzz", JetDataConfig(**HZZ))
    counts = {c: sum(index["splits"][s]["class_counts"][c] for s in index["splits"]) for c in
              ("zlib", "lz4", "lzma")}  # fmt: skip
    # the same events in three compressions: identical counts after the same selection
    n_sel = int(np.sum(uproot.open(raw / "uproot-HZZ-zlib.root")["events"]["NJet"].array() >= 1))
    assert counts == {"zlib": n_sel, "lz4": n_sel, "lzma": n_sel}
    assert len(index["particle_mean"]) == 4 and np.isfinite(index["particle_std"]).all()

    nano_file = hep_file("uproot-small-dy-withoffsets.root")
    (tmp_path / "nano_raw").mkdir()
    shutil.copy(nano_file, tmp_path / "nano_raw")
    stage(str(tmp_path / "nano_raw"), tmp_path / "nano", tmp_path / "n.json", patterns=["*"])
    nano = JetDataConfig(**NANO)
    index = shard_jets(tmp_path / "n.json", tmp_path / "nano_shards", nano)
    t = uproot.open(nano_file)["tree"]
    n_mu, n_jet = t["nMuon"].array(library="np"), t["nJet"].array(library="np")
    want = np.bincount(np.minimum(n_mu[n_jet >= 1], 3), minlength=4)[:3]
    got = [sum(index["splits"][s]["class_counts"][c] for s in index["splits"]) for c in
           ("0mu", "1mu", "2mu")]  # fmt: skip
    assert got == want.tolist()
    assert index["dropped_labels"] == {"out_of_range": int(((n_mu >= 3) & (n_jet >= 1)).sum())}


@pytest.fixture(scope="module")
def toy_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("toyjets")
    generate_dataset(d, ToyJetsConfig(files_per_class=1, jets_per_file=150), progress=False)
    return d


def _dataset(toy_files, tmp_path, damage=None):
    src = tmp_path / "src"
    shutil.copytree(toy_files, src)
    # a second Wqq file (other jets: a copy would be refused as a duplicate): the class keeps
    # jets when the damaged one is skipped
    generate_dataset(tmp_path / "more", ToyJetsConfig(classes=["Wqq"], files_per_class=1,
                     jets_per_file=150, seed=5), progress=False)  # fmt: skip
    shutil.copy(tmp_path / "more" / "Wqq_000.root", src / "Wqq_001.root")
    if damage:
        damage(src)
    stage(str(src), tmp_path / "staged", tmp_path / "m.json", patterns=["*.root"], retries=0)
    return tmp_path / "m.json"


def _truncate(src):
    p = src / "Wqq_000.root"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _cut_short(src):
    """The last few hundred bytes gone: the tree still opens and counts its entries."""
    p = src / "Wqq_000.root"
    p.write_bytes(p.read_bytes()[:-300])


def _not_root(src):
    (src / "Wqq_000.root").write_bytes(b"not a ROOT file at all" * 100)


def _other_tree(src):
    with uproot.recreate(src / "Wqq_000.root") as f:
        f.mktree("other", {"x": np.float32}).extend({"x": np.zeros(3, np.float32)})


def _other_type(src):
    with uproot.open(src / "Hbb_000.root") as f:
        arrays = f["tree"].arrays(library="ak")
    fields = {k: arrays[k] for k in arrays.fields}
    fields["jet_pt"] = ak.values_astype(fields["jet_pt"], np.float64)
    with uproot.recreate(src / "Wqq_000.root") as f:
        f.mktree("tree", {k: v.type for k, v in fields.items()}).extend(fields)


def _nan(src):
    with uproot.open(src / "Hbb_000.root") as f:
        arrays = f["tree"].arrays(library="ak")
    fields = {k: arrays[k] for k in arrays.fields}
    jet_pt = ak.to_numpy(fields["jet_pt"]).copy()
    jet_pt[7] = np.nan
    fields["jet_pt"] = jet_pt
    with uproot.recreate(src / "Wqq_000.root") as f:
        f.mktree(
            "tree", {k: v.type if isinstance(v, ak.Array) else v.dtype for k, v in fields.items()}
        ).extend(fields)


@pytest.mark.parametrize(
    "damage,match",
    [
        (_truncate, r"Wqq_000\.root.*(cannot open as ROOT|truncated or corrupt)"),
        (_not_root, r"Wqq_000\.root: cannot open as ROOT"),
        (_other_tree, r"Wqq_000\.root: no tree named 'tree' \(it has \['other'\]\)"),
        (
            _other_type,
            r"Wqq_000\.root: branch 'jet_pt' of tree 'tree' is float64, but float32",
        ),
        (
            _nan,
            r"Wqq_000\.root, tree 'tree', entries 0-150: branch 'jet_pt' holds NaN/inf at entry 7",
        ),
    ],
)
def test_bad_files_fail_naming_file_tree_and_branch_or_are_skipped(
    toy_files, tmp_path, damage, match
):
    manifest = _dataset(toy_files, tmp_path, damage)
    cfg = dict(max_particles=16, jets_per_shard=500, jet_features=["jet_pt", "jet_sdmass"])
    with pytest.raises(VoxjetError, match=match):
        shard_jets(manifest, tmp_path / "shards", JetDataConfig(**cfg))
    assert not (tmp_path / "shards").exists()  # never a partial shard
    index = shard_jets(manifest, tmp_path / "shards", JetDataConfig(**cfg, on_bad_file="skip"))
    assert [s["file"] for s in index["skipped"]] == ["Wqq_000.root"]
    assert index["splits"]["train"]["class_counts"]["Wqq"] > 0  # from Wqq_001.root
    # a class that loses every file is named, with the files skipped, even under skip
    (tmp_path / "staged" / "Wqq_001.root").write_bytes(b"gone" * 100)
    shutil.rmtree(tmp_path / "shards")
    with pytest.raises(VoxjetError, match=r"classes \['Wqq'\] have no jets at all; skipped "
                       r"files: \['Wqq_000.root', 'Wqq_001.root'\]"):  # fmt: skip
        shard_jets(manifest, tmp_path / "shards", JetDataConfig(**cfg, on_bad_file="skip"))


def test_a_branch_missing_or_a_selection_that_keeps_nothing_names_it(toy_files, tmp_path):
    manifest = _dataset(toy_files, tmp_path)
    with pytest.raises(
        VoxjetError, match=r"has no branch 'jet_bogus' \(read by jets.jet_features\)"
    ):
        shard_jets(manifest, tmp_path / "s", JetDataConfig(jet_features=["jet_bogus"]))
    with pytest.raises(VoxjetError, match=r"no jet passes the selection 'jet_pt > 1e9'"):
        shard_jets(manifest, tmp_path / "s", JetDataConfig(selection="jet_pt > 1e9"))
    with pytest.raises(VoxjetError, match="'jet_pt' has one value a jet.*jet_features"):
        shard_jets(manifest, tmp_path / "s", JetDataConfig(particle_features=["jet_pt"]))
    assert not (tmp_path / "s").exists()


def test_the_test_split_takes_its_own_selection(toy_files, tmp_path):
    """test_time_selection (weaver's): test jets pass it instead of the selection; train and
    val jets pass the selection; which split a jet is in does not depend on either."""
    from voxjet.jets.dataset import load_columns
    from voxjet.jets.shard import split_of

    manifest = _dataset(toy_files, tmp_path)
    cfg = JetDataConfig(max_particles=8, selection="jet_pt > 700",
                        test_time_selection="jet_pt > 550", test_fraction=0.3)  # fmt: skip
    shards = tmp_path / "shards"
    index = shard_jets(manifest, shards, cfg)
    col = index["jet_features"].index("jet_pt")
    want = {"train": 0, "val": 0, "test": 0}
    for name in index["source_files"]:
        with uproot.open(tmp_path / "staged" / name) as f:
            pt = f["tree"]["jet_pt"].array(library="np")
        split = split_of(name, np.arange(len(pt)), cfg)
        for code, key in enumerate(("train", "val", "test")):
            want[key] += int(((split == code) & (pt > (550 if code == 2 else 700))).sum())
    for key in want:
        got = load_columns(shards, key, ("jets",))["jets"][:, col]
        assert len(got) == want[key] > 0, key
        assert (got > (550 if key == "test" else 700)).all()
    assert (load_columns(shards, "test", ("jets",))["jets"][:, col] <= 700).any()


@pytest.fixture(scope="module")
def many_shards(toy_files, tmp_path_factory):
    d = tmp_path_factory.mktemp("stream")
    stage(str(toy_files), d / "staged", d / "m.json", patterns=["*.root"])
    cfg = JetDataConfig(max_particles=8, jets_per_shard=60, shard_jobs=2, val_fraction=0.1,
                        test_fraction=0.1)  # fmt: skip
    shard_jets(d / "m.json", d / "shards", cfg)
    return d / "shards"


def _sources(batches) -> list[tuple[int, int]]:
    return [tuple(r) for b in batches for r in b["source"].tolist()]


def test_stream_ranks_and_workers_read_disjoint_jets_and_equal_batch_counts(many_shards):
    from voxjet.jets.stream import JetStream

    seen, counts = [], []
    for rank in range(2):
        s = JetStream(many_shards, "train", 16, seed=1, rank=rank, world=2, block_jets=20,
                      buffer_blocks=3).at(0, 0)  # fmt: skip
        loader = torch.utils.data.DataLoader(s, batch_size=None, num_workers=2)
        batches = list(loader)
        counts.append(len(batches))
        seen += _sources(batches)
        # the shuffle buffer mixes jets of several shards into one batch
        assert max(len(set(b["source"][:, 0].tolist())) for b in batches) > 1
    assert counts[0] == counts[1] > 0
    assert len(seen) == len(set(seen))  # no jet twice in an epoch, across ranks and workers
    n_train = sum(s["jets"] for s in s.index["splits"]["train"]["shards"])
    assert len(seen) > 0.6 * n_train


def test_stream_batches_flat_for_a_gpu_or_padded_by_the_workers_for_a_cpu(many_shards):
    from voxjet.jets.dataset import load_split
    from voxjet.jets.jagged import pad_particles
    from voxjet.jets.stream import JetStream

    flat = list(JetStream(many_shards, "train", 16, seed=3, block_jets=20).at(0, 0))
    s = JetStream(many_shards, "train", 16, seed=3, block_jets=20, pad_to=8).at(0, 0)
    padded = list(torch.utils.data.DataLoader(s, batch_size=None, num_workers=1))
    # padded in this process (a whole shuffle buffer at a time, batches its views) the same
    here = list(s)
    assert len(flat) == len(padded) == len(here) > 0
    for a, b in zip(here, padded, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in b) and set(a) == set(b)
    whole = load_split(many_shards, "train")  # the stored jets, for the truth
    sizes = [sh["jets"] for sh in s.index["splits"]["train"]["shards"]]
    first = np.cumsum(sizes) - sizes  # each shard's first jet in the loaded split
    for a, b in zip(flat, padded, strict=True):
        assert set(a) == {"particles", "offsets", "jets", "labels", "source"}
        p, m = pad_particles(a["particles"], a["offsets"].diff(), 8)
        assert torch.equal(p, b["particles"]) and torch.equal(m, b["mask"])
        assert torch.equal(a["labels"], b["labels"]) and torch.equal(a["jets"], b["jets"])
        truth = whole.take(np.array([first[k] + j for k, j in b["source"].tolist()]))
        assert torch.equal(truth["particles"], b["particles"])


def test_jet_stream_through_the_returning_loader_gives_the_in_process_batches(many_shards):
    from voxjet.io.handover import ReturningLoader
    from voxjet.jets.stream import JetStream

    for pad in (None, 8):
        s = JetStream(many_shards, "train", 16, seed=3, block_jets=20, pad_to=pad).at(0, 0)
        here = list(s)
        loader = ReturningLoader(s, num_workers=1, slots=2)
        got, held = [], []
        for i, b in enumerate(loader):
            got.append({k: v.clone() for k, v in b.items()})
            if i % 3 == 0:
                held.append(b)  # some batches kept while the worker goes on
        assert len(got) == len(here) > 3
        for a, b in zip(here, got, strict=True):
            assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
        for b in held:
            i = next(j for j, g in enumerate(got) if torch.equal(g["source"], b["source"]))
            assert all(torch.equal(b[k], got[i][k]) for k in b)


@pytest.mark.parametrize("workers", [0, 2])
def test_stream_is_seeded_and_resumes_at_any_batch(many_shards, workers):
    from voxjet.jets.stream import JetStream

    def run(epoch, start, seed=1):
        s = JetStream(many_shards, "train", 16, seed=seed, block_jets=20, buffer_blocks=3)
        s.at(epoch, start)
        it = s if workers == 0 else torch.utils.data.DataLoader(s, batch_size=None,
                                                                  num_workers=workers)  # fmt: skip
        return _sources(list(it))

    full = run(0, 0)
    assert full == run(0, 0)
    assert full != run(1, 0) and full != run(0, 0, seed=2)
    for start in (1, 3, 4):
        assert run(0, start) == full[start * 16 :]


@pytest.mark.parametrize("generator", ["toy", "pythia"])
def test_constituents_separate_classes_better_than_the_jet_mass(tmp_path, generator):
    """Both generators: a jet-mass likelihood alone separates the classes clearly worse than a
    small PFN that sees the constituents (test split, macro one-vs-rest AUC)."""
    from voxjet.jets.evaluate import evaluate
    from voxjet.jets.train import run

    cfg = ToyJetsConfig(files_per_class=1, jets_per_file=800, seed=3)
    if generator == "pythia":
        pytest.importorskip("pythia8mc", reason="the pythia extra is not installed")
        from voxjet.jets.pythia import generate_dataset as make
    else:
        make = generate_dataset
    make(tmp_path / "raw", cfg, progress=False, **({"workers": 2} if generator == "pythia" else {}))
    stage(str(tmp_path / "raw"), tmp_path / "staged", tmp_path / "m.json", patterns=["*.root"])
    shards = tmp_path / "shards"
    shard_jets(tmp_path / "m.json", shards, JetDataConfig(max_particles=48, test_fraction=0.25))
    run_cfg = {
        "model": {"name": "pfn", "phi_sizes": [64, 64], "f_sizes": [64]},
        "train": {"steps": 600, "batch_size": 128, "lr": 3e-3, "eval_every": 200, "seed": 1},
    }
    run(str(shards), run_cfg, str(tmp_path / "run"))
    m = evaluate(str(shards), str(tmp_path / "run" / "model.pt"), str(tmp_path / "eval"))
    mass_auc = m["baseline_jet_mass"]["auc_macro"]
    assert 0.6 < mass_auc < m["auc_macro"] - 0.03, (m["auc_macro"], mass_auc)


def test_stream_reads_shards_from_a_slow_remote_url_with_the_same_batches(many_shards):
    """Shards behind 20 ms a request (the latency filesystem): the stream fetches them in
    concurrent ranges, files ahead, and yields exactly the local stream's batches; a read
    that keeps failing stops it naming the URL and bytes."""
    import latency_fs  # noqa: F401  (registers latency://)

    from voxjet.io.fetch import FetchConfig, FetchError
    from voxjet.jets.stream import JetStream

    opts = {"delay_s": 0.02}
    fetch = FetchConfig(threads=8, block_bytes=32 << 10)
    remote = JetStream(f"latency://{many_shards}", "train", 16, seed=1, fetch=fetch,
                       storage_options=opts)  # fmt: skip
    # a remote stream's blocks are whole shards: the local stream with the same blocks
    local = JetStream(many_shards, "train", 16, seed=1, block_jets=None,
                      buffer_blocks=remote.buffer_blocks)  # fmt: skip
    assert _sources(remote.at(0, 0)) == _sources(local.at(0, 0))
    failing = {"delay_s": 0.0, "fail_every": 1, "fail_match": ".h5"}
    broken = JetStream(f"latency://{many_shards}", "train", 16, seed=1,
                       fetch=FetchConfig(retries=1), storage_options=failing)  # fmt: skip
    with pytest.raises(FetchError, match=r"shards/part_\d+/train_\d+\.h5: bytes \d+-\d+ unread"):
        list(broken.at(0, 0))


def test_a_split_loads_from_a_url_as_from_the_folder_and_a_wrong_url_names_it(many_shards):
    """Evaluation reads prepared shards at an fsspec URL through the fetch layer."""
    from voxjet.errors import VoxjetError
    from voxjet.io.remote import ReadOptions
    from voxjet.jets.dataset import load_split

    opts = ReadOptions.from_config({"storage_options": {"delay_s": 0.002}, "block_mb": 0.01})
    assert opts.fetch.block_bytes == 10485 and opts.fetch.threads == 8
    local, far = (
        load_split(many_shards, "test"),
        load_split(f"latency://{many_shards}", "test", opts),
    )
    assert torch.equal(local.particles, far.particles) and np.array_equal(
        local.offsets, far.offsets
    )
    assert torch.equal(local.labels, far.labels)
    with pytest.raises(VoxjetError, match=r"latency:///nowhere/index.json: not found"):
        load_split("latency:///nowhere", "test", opts)


def _relabel(src, entries, both: bool) -> None:
    """Hbb_000.root with some jets given a second label (Tbqq) or none at all."""
    with uproot.open(src / "Hbb_000.root") as f:
        arrays = f["tree"].arrays(library="ak")
    fields = {k: arrays[k] for k in arrays.fields}
    for name, value in (("label_Tbqq", 1), ("label_Hbb", 0)):
        if (name == "label_Tbqq") == both:
            col = ak.to_numpy(fields[name]).copy()
            col[entries] = value
            fields[name] = col
    with uproot.recreate(src / "Hbb_000.root") as f:
        f.mktree("tree", {k: v.type if isinstance(v, ak.Array) else v.dtype
                          for k, v in fields.items()}).extend(fields)  # fmt: skip


@pytest.mark.parametrize("both,what", [(True, "more than one label set"),
                                       (False, "no label set")])  # fmt: skip
def test_jets_with_two_labels_or_none_fail_naming_entries_or_are_dropped_and_counted(
    toy_files, tmp_path, both, what
):
    """A top jet that also carries the Hbb label is not quietly made Hbb by an arg-max."""
    manifest = _dataset(toy_files, tmp_path, lambda src: _relabel(src, [3, 17, 40], both))
    cfg = dict(max_particles=16, jets_per_shard=500, jet_features=["jet_pt"])
    want = (
        rf"Hbb_000\.root, tree 'tree', entries 0-150: 3 jets with {what} \(entries \[3, 17, 40\]\)"
    )
    with pytest.raises(VoxjetError, match=want + ".*jets.bad_labels: drop"):
        shard_jets(manifest, tmp_path / "shards", JetDataConfig(**cfg))
    index = shard_jets(manifest, tmp_path / "shards", JetDataConfig(**cfg, bad_labels="drop"))
    assert index["dropped_labels"] == {"several" if both else "none": 3}
    total = sum(index["splits"][s]["class_counts"]["Hbb"] for s in index["splits"])
    assert total == 150 - 3


def test_an_empty_file_is_named_as_empty(toy_files, tmp_path):
    def empty(src):
        with uproot.open(src / "Hbb_000.root") as f:
            arrays = f["tree"].arrays(library="ak", entry_stop=0)
        with uproot.recreate(src / "Hbb_001.root") as f:
            f.mktree("tree", {k: arrays[k].type for k in arrays.fields}).extend(
                {k: arrays[k] for k in arrays.fields}
            )

    manifest = _dataset(toy_files, tmp_path, empty)
    cfg = dict(max_particles=16, jets_per_shard=500, jet_features=["jet_pt"])
    with pytest.raises(VoxjetError, match=r"Hbb_001\.root: tree 'tree' has 0 entries"):
        shard_jets(manifest, tmp_path / "shards", JetDataConfig(**cfg))
    index = shard_jets(manifest, tmp_path / "shards", JetDataConfig(**cfg, on_bad_file="skip"))
    assert [s["file"] for s in index["skipped"]] == ["Hbb_001.root"]


def test_predefined_splits_take_whole_files_as_jetclass_ships_them(toy_files, tmp_path):
    """train_100M/, val_5M/, test_20M/ as JetClass ships them: every jet of a file goes to its
    folder's split, none by hash; a file in no split stops the job, naming it."""
    src = tmp_path / "JetClass"
    layout = {
        "train_100M": ["Hbb_000", "QCD_000", "Tbqq_000", "Wqq_000"],
        "val_5M": ["Hbb_000", "QCD_000"],
        "test_20M": ["Tbqq_000"],
    }
    for folder, files in layout.items():
        (src / folder).mkdir(parents=True)
        for f in files:
            shutil.copy(toy_files / f"{f}.root", src / folder / f"{f}.root")
    # one toy file a class serves several folders here: duplicates are another test's subject
    stage(str(src), tmp_path / "staged", tmp_path / "m.json", patterns=["*.root"],
          on_duplicate="ignore")  # fmt: skip
    splits = {"train": "train_100M/*", "val": "val_5M/*", "test": ["test_20M/*.root"]}
    cfg = dict(max_particles=16, jets_per_shard=500, jet_features=["jet_pt"], split_files=splits)
    index = shard_jets(tmp_path / "m.json", tmp_path / "shards", JetDataConfig(**cfg))
    counts = {s: index["splits"][s]["class_counts"] for s in ("train", "val", "test")}
    assert counts["train"] == {"QCD": 150, "Hbb": 150, "Wqq": 150, "Tbqq": 150}
    assert counts["val"] == {"QCD": 150, "Hbb": 150, "Wqq": 0, "Tbqq": 0}
    assert counts["test"] == {"QCD": 0, "Hbb": 0, "Wqq": 0, "Tbqq": 150}
    del splits["val"]
    with pytest.raises(
        VoxjetError, match=r"val_5M/Hbb_000.root: matches none of the jets.split_files"
    ):
        shard_jets(tmp_path / "m.json", tmp_path / "s2", JetDataConfig(**cfg))


CUT_SHORT = r"truncated ROOT file \(\d+ bytes where its header says \d+\)"


@pytest.mark.parametrize("damage,why", [(_not_root, "not a readable ROOT file"),
                                        (_other_tree, "no tree named 'tree'"),
                                        (_cut_short, CUT_SHORT)])  # fmt: skip
def test_skip_covers_files_the_stage_finds_unreadable(toy_files, tmp_path, damage, why):
    """The stage job reads each ROOT file's entry count: with on_bad_file: skip a file it cannot
    read is staged marked unreadable, and the shard job skips it with that reason."""
    src = tmp_path / "src"
    shutil.copytree(toy_files, src)
    shutil.copy(src / "Wqq_000.root", src / "Wqq_001.root")
    damage(src)
    with pytest.raises(VoxjetError, match=rf"Wqq_000\.root: {why}"):
        stage(str(src), tmp_path / "staged", tmp_path / "m.json", patterns=["*.root"],
              tree="tree", retries=0)  # fmt: skip
    m = stage(str(src), tmp_path / "staged", tmp_path / "m.json", patterns=["*.root"],
              tree="tree", retries=0, on_bad_file="skip")  # fmt: skip
    bad = [f for f in m["files"] if "unreadable" in f]
    assert [f["path"] for f in bad] == ["Wqq_000.root"] and re.search(why, bad[0]["unreadable"])
    cfg = JetDataConfig(max_particles=16, jets_per_shard=500, jet_features=["jet_pt"],
                        on_bad_file="skip")  # fmt: skip
    index = shard_jets(tmp_path / "m.json", tmp_path / "shards", cfg)
    assert [s["file"] for s in index["skipped"]] == ["Wqq_000.root"]
    assert re.search(why, index["skipped"][0]["reason"])
