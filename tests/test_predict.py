"""Trained models applied to data they never saw: ROOT files without labels, never sharded,
scored into trees of the same entries in the same order (equal to what evaluation gives the
same jets); NIfTI cases in other orientations and spacings segmented onto their own grids; and
the clear refusals (a missing branch, another domain's model, a wrong channel count)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import awkward as ak
import h5py
import nibabel as nib
import numpy as np
import pytest
import uproot

from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.shard import shard_jets
from voxjet.jets.synth import ToyJetsConfig, generate_dataset
from voxjet.stage.transfer import stage

SELECTION = "jet_pt > 550"


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
    """Toy jets (4 classes) sharded with a selection, a short PFN run and its evaluation."""
    from voxjet.jets.evaluate import evaluate
    from voxjet.jets.train import run

    d = tmp_path_factory.mktemp("tagger")
    generate_dataset(d / "raw", ToyJetsConfig(files_per_class=1, jets_per_file=300, seed=5),
                     progress=False)  # fmt: skip
    stage(str(d / "raw"), d / "staged", d / "m.json", patterns=["*.root"])
    cfg = JetDataConfig(max_particles=32, jets_per_shard=400, selection=SELECTION,
                        test_fraction=0.3)  # fmt: skip
    shard_jets(d / "m.json", d / "shards", cfg)
    train = {"steps": 40, "batch_size": 64, "lr": 3e-3, "eval_every": 20}
    run(str(d / "shards"), {"model": {"name": "pfn", "phi_sizes": [32], "f_sizes": [32]},
                            "train": train}, str(d / "run"))  # fmt: skip
    evaluate(str(d / "shards"), str(d / "run" / "model.pt"), str(d / "eval"))
    return d


def _write_tree(dst, arrays, keep) -> None:
    """A TTree (uproot's `out[name] = ...` would write an RNTuple) of the `keep` branches,
    particle branches grouped under one counter as JetClass has them."""
    part = ak.zip({k.removeprefix("part_"): arrays[k] for k in keep if k.startswith("part_")})
    flat = {k: arrays[k] for k in keep if not k.startswith("part_") and k != "npart"}
    with uproot.recreate(dst) as out:
        branches = {"part": part, **flat}
        out.mktree("tree", {k: v.type for k, v in branches.items()}).extend(branches)


def _without_labels(src, dst) -> None:
    """A copy of a ROOT file without its label branches (new data: nobody knows the truth)."""
    with uproot.open(src) as f:
        arrays = f["tree"].arrays(library="ak")
    _write_tree(dst, arrays, [k for k in arrays.fields if not k.startswith("label_")])


def test_unlabelled_unsharded_files_score_as_evaluation_did(tagger, tmp_path):
    from voxjet.predict import run_predict

    new = tmp_path / "new"
    new.mkdir()
    for f in sorted((tagger / "raw").glob("*.root")):
        _without_labels(f, new / f.name)
    run_predict(str(tagger / "run" / "model.pt"), [str(new)], str(tmp_path / "out"),
                observers=["jet_pt", "jet_sdmass"])  # fmt: skip
    with h5py.File(tagger / "eval" / "predictions.h5") as p:
        probs, files, entries = p["probs"][...], p["file"][...], p["entry"][...]
        sources = [str(s) for s in p.attrs["source_files"]]
    for k, name in enumerate(sources):
        with uproot.open(new / name) as fin, uproot.open(tmp_path / "out" / name) as fout:
            assert "label_QCD" not in fin["tree"] and fin["tree"].classname == "TTree"
            src, got = fin["tree"], fout["tree"].arrays(library="np")
            n = src.num_entries
            assert len(got["selected"]) == n  # every entry, in order
            np.testing.assert_array_equal(got["jet_pt"], src["jet_pt"].array(library="np"))
            passed = src["jet_pt"].array(library="np") > 550
            np.testing.assert_array_equal(got["selected"] == 1, passed)
            scores = np.stack([got[f"score_{c}"] for c in ("QCD", "Hbb", "Wqq", "Tbqq")], 1)
            np.testing.assert_allclose(scores[passed].sum(1), 1, rtol=1e-5)
            assert (scores[~passed] == -1).all()  # unselected: a defined value, not a shift
            mine = files == k
            np.testing.assert_allclose(scores[entries[mine]], probs[mine], atol=1e-6)
            assert mine.sum() > 10


def test_evaluation_read_in_many_small_pieces_equals_one_read(tagger, tmp_path):
    """The test split streamed a few jets at a time (as a split far larger than a read is)
    gives the same stored scores, in the same order, as the default reads."""
    from voxjet.jets.evaluate import evaluate, rows_per_read

    index = json.loads((tagger / "shards" / "index.json").read_text())
    assert rows_per_read(index, 64) == (16 << 20) // (32 * len(index["particle_features"]) * 4)
    assert rows_per_read(index, 10**6) == 10**6  # never less than a batch
    evaluate(str(tagger / "shards"), str(tagger / "run" / "model.pt"), str(tmp_path), chunk=37)
    with (
        h5py.File(tagger / "eval" / "predictions.h5") as a,
        h5py.File(tmp_path / "predictions.h5") as b,
    ):
        assert sorted(a) == sorted(b) and len(a["labels"]) > 37 * 3
        for k in a:
            np.testing.assert_allclose(a[k][...], b[k][...], atol=1e-6, err_msg=k)


def test_a_file_lacking_a_branch_the_model_needs_is_named(tagger, tmp_path):
    from voxjet.predict import run_predict

    src = next((tagger / "raw").glob("*.root"))
    with uproot.open(src) as f:
        arrays = f["tree"].arrays(library="ak")
    _write_tree(tmp_path / "bad.root", arrays, [k for k in arrays.fields if k != "part_dphi"])
    with pytest.raises(
        VoxjetError, match=r"bad\.root: tree 'tree' lacks the branches \['part_dphi'\]"
    ):
        run_predict(str(tagger / "run" / "model.pt"), [str(tmp_path / "bad.root")],
                    str(tmp_path / "out"))  # fmt: skip
    assert not list((tmp_path / "out").glob("*.root"))


def test_new_files_pass_the_test_splits_own_selection(tagger, tmp_path):
    """A model whose data had a test_time_selection scores new files' jets that pass it."""
    import torch

    from voxjet.jets.predict import predict_file
    from voxjet.jets.tagger import load_tagger

    t = load_tagger(tagger / "run" / "model.pt", torch.device("cpu"))
    t.data = dataclasses.replace(t.data, test_time_selection="jet_pt > 800")
    src = next((tagger / "raw").glob("*.root"))
    predict_file(t, src, tmp_path / "o.root")
    with uproot.open(src) as fin, uproot.open(tmp_path / "o.root") as fout:
        pt = fin["tree"]["jet_pt"].array(library="np")
        np.testing.assert_array_equal(fout["tree"]["selected"].array(library="np") == 1, pt > 800)


def test_a_killed_predict_job_leaves_nothing_taken_for_done(tagger, tmp_path):
    from voxjet.io.atomic import HOST
    from voxjet.predict import run_predict

    src = next((tagger / "raw").glob("*.root"))
    out = tmp_path / "out"
    out.mkdir()
    stale = out / f".{src.name}.tmp-{HOST}-999999"  # a killed job's half-written output
    stale.write_bytes(b"half a ROOT file")
    run_predict(str(tagger / "run" / "model.pt"), [str(src)], str(out))
    assert not stale.exists()
    with uproot.open(out / src.name) as f:
        assert f["tree"].num_entries == 300


def test_a_model_of_the_other_domain_is_refused(tagger, tmp_path):
    from voxjet.volumes.networks.models import load_trained

    with pytest.raises(VoxjetError, match=r"model\.pt: a jets model; segmentation needs"):
        load_trained(tagger / "run" / "model.pt")


@pytest.mark.parametrize("name,kw", [
    ("pfn", {"phi_sizes": [16], "f_sizes": [16]}),
    ("particlenet", {"k": 4, "conv_channels": [[16, 16]], "fc_size": 16}),
    ("part", {"dim": 16, "heads": 2, "blocks": 1, "class_blocks": 1, "pair_dim": 8}),
])  # fmt: skip
def test_exported_taggers_equal_the_eager_model(shards, tmp_path, name, kw):
    """ONNX Runtime and TorchScript outputs equal the eager model's for two batch sizes and
    particle counts."""
    import onnxruntime as ort
    import torch

    from voxjet.export import export_model
    from voxjet.jets.evaluate import load_trained
    from voxjet.jets.export import Softmax, _jet_inputs
    from voxjet.jets.train import run

    run(str(shards), {"model": {"name": name, **kw}, "train": {"steps": 3, "batch_size": 32}},
        str(tmp_path / "run"))  # fmt: skip
    model_pt = tmp_path / "run" / "model.pt"
    onnx = export_model(model_pt, "onnx", tmp_path / "onnx")
    ts = export_model(model_pt, "torchscript", tmp_path / "ts")
    eager = Softmax(load_trained(model_pt)[0].eval())
    # deployed as users do: the .onnx copied alone into an empty folder
    assert sorted(p.name for p in onnx.parent.iterdir()) == ["export.json", "model.onnx"]
    (tmp_path / "deployed").mkdir()
    alone = Path(shutil.copy(onnx, tmp_path / "deployed" / "tagger.onnx"))
    session = ort.InferenceSession(str(alone), providers=["CPUExecutionProvider"])
    script = torch.jit.load(str(ts))
    f = load_trained(model_pt)[1]["model_config"]["n_features"]
    for b, p in ((5, 24), (64, 9)):
        x, mask = _jet_inputs(b, p, f, seed=b)
        with torch.no_grad():
            want = eager(x, mask).numpy()
            got_ts = script(x, mask).numpy()
        got_onnx = session.run(None, {"particles": x.numpy(), "mask": mask.numpy()})[0]
        assert np.abs(got_onnx - want).max() <= 1e-4 and np.abs(got_ts - want).max() <= 1e-4
    info = json.loads((tmp_path / "onnx" / "export.json").read_text())
    assert info["files"] == ["model.onnx"]
    assert info["classes"] == ["QCD", "Hbb", "Wqq", "Tbqq"]
    # the inputs as the model reads them (tree null: a ROOT file's `tree`)
    assert info["jets_config"]["particle_features"] and "tree" in info["jets_config"]


@pytest.fixture(scope="module")
def segmenter(tmp_path_factory):
    """Toy CT cases preprocessed and a short U-Net run on them."""
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.dataset.synth import ToyVolumesConfig
    from voxjet.volumes.dataset.synth import generate_dataset as make_volumes
    from voxjet.volumes.preprocessing.preprocess import preprocess_dataset
    from voxjet.volumes.training.train import run

    d = tmp_path_factory.mktemp("segmenter")
    make_volumes(d / "msd", ToyVolumesConfig(train_cases=6, test_cases=2, seed=3,
                 min_shape=(40, 40, 16), max_shape=(48, 48, 20)), progress=False)  # fmt: skip
    (d / "m.json").write_text(json.dumps({"root": str(d / "msd")}))
    preprocess_dataset(d / "m.json", d / "cases", VolumePrepConfig(
        patch_size=[32, 32, 16], val_fraction=0.2, test_fraction=0.2))  # fmt: skip
    run(str(d / "cases"), {"model": {"name": "unet", "channels": [8, 16, 32]},
        "train": {"steps": 60, "lr": 5e-3, "eval_every": 30, "iterations_per_epoch": 20}},
        str(d / "run"))  # fmt: skip
    return d


def _restored(src, dst, perm, flips, zooms):
    """An image stored with other axis order, flips and voxel sizes (the same anatomy)."""
    img = nib.load(str(src))
    data = np.asarray(img.dataobj)
    ornt = np.array([[p, -1 if f else 1] for p, f in zip(perm, flips, strict=True)])
    moved = nib.orientations.apply_orientation(data, ornt)
    aff = img.affine @ nib.orientations.inv_ornt_aff(ornt, data.shape)
    aff = aff @ np.diag([*zooms, 1])
    nib.save(nib.Nifti1Image(moved, aff), str(dst))


def test_unseen_cases_in_other_orientations_segment_onto_their_own_grid(segmenter, tmp_path):
    from voxjet.predict import run_predict

    ts = sorted((segmenter / "msd" / "imagesTs").glob("*.nii.gz"))
    new = tmp_path / "new"
    new.mkdir()
    _restored(ts[0], new / "lps_0000.nii.gz", (0, 1, 2), (True, True, False), (1.0, 1.0, 1.0))
    _restored(ts[1], new / "psr_0000.nii.gz", (1, 2, 0), (True, False, False), (1.5, 1, 3))
    run_predict(str(segmenter / "run" / "model.pt"), [str(new)], str(tmp_path / "out"),
                probabilities=True)  # fmt: skip
    for case in ("lps", "psr"):
        src = nib.load(str(new / f"{case}_0000.nii.gz"))
        out = nib.load(str(tmp_path / "out" / f"{case}.nii.gz"))
        assert out.shape == src.shape and np.allclose(out.affine, src.affine)
        seg = np.asarray(out.dataobj)
        assert seg.dtype == np.uint8 and set(np.unique(seg)) <= {0, 1, 2} and seg.any()
        # the class probabilities on the same grid, in the same axis order: they sum to 1 and
        # their arg-max is the label map (up to boundary voxels, resampled another way)
        soft = nib.load(str(tmp_path / "out" / f"{case}_probabilities.nii.gz"))
        p = np.asarray(soft.dataobj)
        assert p.shape == (*src.shape, 3) and np.allclose(soft.affine, src.affine)
        np.testing.assert_allclose(p.sum(-1), 1, atol=1e-4)
        assert (p.argmax(-1) == seg).mean() > 0.98
    # a case given with another number of channels than the model's
    shutil.copy(new / "lps_0000.nii.gz", new / "lps_0001.nii.gz")
    with pytest.raises(
        VoxjetError, match=r"case 'lps' has 2 channel\(s\), the model was trained on 1"
    ):
        run_predict(str(segmenter / "run" / "model.pt"), [str(new)], str(tmp_path / "out2"))


def test_a_case_larger_than_the_jobs_memory_is_refused_before_any_output(segmenter, tmp_path,
                                                                         monkeypatch):  # fmt: skip
    """The memory a case needs is known from its header: under a small SLURM allocation predict
    stops before the first case, naming it and the numbers, and leaves no output folder."""
    from voxjet.predict import run_predict

    case = sorted((segmenter / "msd" / "imagesTs").glob("*.nii.gz"))[0]
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "64")
    said = (
        rf"{case.name}: predicting case '{case.name[:-7]}' \(\d+×\d+×\d+ voxels, 1 "
        r"channel\(s\), 3 classes\) needs about [\d.]+ GiB, more than the 0\.1 GiB of the "
        r"SLURM allocation \(64 MB a node\)"
    )
    with pytest.raises(VoxjetError, match=said):
        run_predict(str(segmenter / "run" / "model.pt"), [str(case)], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_whole_node_allocation_predicts_as_without_slurm(segmenter, tmp_path, monkeypatch):
    """`sbatch --mem=0` (SLURM_MEM_PER_NODE=0: all of the node's memory) is no limit of 0 MB:
    predict runs, to the same labels as outside SLURM."""
    import nibabel as nib

    from voxjet.predict import run_predict
    from voxjet.volumes.inference.case_memory import memory_limit

    case = sorted((segmenter / "msd" / "imagesTs").glob("*.nii.gz"))[0]
    model = str(segmenter / "run" / "model.pt")
    run_predict(model, [str(case)], str(tmp_path / "plain"))
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "0")
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "0")
    assert memory_limit()[0] > 1 << 20 and "SLURM" not in memory_limit()[1]
    run_predict(model, [str(case)], str(tmp_path / "whole"))
    (plain,), (whole,) = (sorted((tmp_path / d).rglob("*.nii.gz")) for d in ("plain", "whole"))
    assert (nib.load(plain).get_fdata() == nib.load(whole).get_fdata()).all()


def test_monai_bundle_runs_through_monais_runner_and_matches_predict(segmenter, tmp_path):
    from voxjet.export import export_model
    from voxjet.predict import run_predict
    from voxjet.volumes.inference.export import run_bundle

    case = sorted((segmenter / "msd" / "imagesTs").glob("*.nii.gz"))[0]
    bundle = export_model(segmenter / "run" / "model.pt", "bundle", tmp_path / "export")
    for f in ("configs/inference.json", "configs/metadata.json", "models/model.ts"):
        assert (bundle / f).is_file()
    run_bundle(bundle, [str(case)], tmp_path / "monai")
    run_predict(str(segmenter / "run" / "model.pt"), [str(case)], str(tmp_path / "voxjet"))
    (theirs,) = (tmp_path / "monai").glob("*.nii.gz")
    a = nib.load(str(theirs))
    b = nib.load(str(tmp_path / "voxjet" / case.name.replace("_0000", "")))
    assert a.shape[:3] == b.shape and np.allclose(a.affine, b.affine, atol=1e-4)
    sa, sb = np.asarray(a.dataobj).reshape(b.shape), np.asarray(b.dataobj)
    # the same preparation expressed in MONAI's transforms: resampling rounds grids apart by
    # a voxel at most, so boundaries may move by one
    assert (sa == sb).mean() > 0.99
    for c in (1, 2):
        inter = ((sa == c) & (sb == c)).sum()
        if (sb == c).sum() > 50:
            assert 2 * inter / ((sa == c).sum() + (sb == c).sum()) > 0.9


def test_outputs_never_go_over_inputs(tagger, tmp_path):
    """predict --out the input folder (or inside it, or above it), stage --dest inside its
    source, export --out the run folder: refused naming both; the inputs byte-identical."""
    from voxjet.cli import main

    data = tmp_path / "data"
    shutil.copytree(tagger / "raw", data)
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    model = str(tagger / "run" / "model.pt")
    for out, how in ((data, "is"), (data / "scores", "lies inside"), (tmp_path, "holds")):
        with pytest.raises(VoxjetError, match=rf"predict: --out {out} {how} the input"):
            main_or_raise(main, ["predict", "--model", model, "--input", str(data),
                                 "--out", str(out)])  # fmt: skip
    with pytest.raises(VoxjetError, match=r"predict: --out .* the input .*\*\.root"):
        main_or_raise(main, ["predict", "--model", model, "--input", f"{data}/*.root",
                             "--out", str(data)])  # fmt: skip
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before
    with pytest.raises(VoxjetError, match=r"stage: --dest .*/data/staged lies inside the input"):
        main_or_raise(main, ["stage", "--source", str(data), "--dest", str(data / "staged"),
                             "--manifest", str(tmp_path / "m.json")])  # fmt: skip
    with pytest.raises(VoxjetError, match=r"export: --out .*/run holds the input .*model\.pt"):
        main_or_raise(main, ["export", "--model", model, "--format", "torchscript",
                             "--out", str(tagger / "run")])  # fmt: skip
    assert sorted(p.name for p in data.iterdir()) == sorted(before)


def main_or_raise(main, argv) -> None:
    """The CLI's exit code 2 turned back into the error it printed."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    if code:
        raise VoxjetError(err.getvalue().strip())


def _write(dst, trees: dict[str, ak.Array], rntuple: bool = False) -> None:
    """Trees of the given arrays: TTrees, or RNTuples (what uproot writes for out[name] = …)."""
    with uproot.recreate(dst) as out:
        for name, arrays in trees.items():
            cols = {k: arrays[k] for k in arrays.fields}
            if rntuple:
                out[name] = cols
            else:
                out.mktree(name, {k: v.type for k, v in cols.items()}).extend(cols)


def _scores(path, tree="tree") -> np.ndarray:
    with uproot.open(path) as f:
        got = f[tree].arrays(library="np")
    return np.stack([got[f"score_{c}"] for c in ("QCD", "Hbb", "Wqq", "Tbqq")], 1)


def test_an_rntuple_file_scores_as_its_ttree_and_gets_an_rntuple_back(tagger, tmp_path):
    from voxjet.predict import run_predict

    src = sorted((tagger / "raw").glob("*.root"))[1]
    with uproot.open(src) as f:
        arrays = f["tree"].arrays(library="ak")
    (tmp_path / "in_tt").mkdir()
    (tmp_path / "in_rn").mkdir()
    _write(tmp_path / "in_tt" / "a.root", {"tree": arrays})
    _write(tmp_path / "in_rn" / "a.root", {"tree": arrays}, rntuple=True)
    model = str(tagger / "run" / "model.pt")
    run_predict(model, [str(tmp_path / "in_tt")], str(tmp_path / "out_tt"))
    run_predict(model, [str(tmp_path / "in_rn")], str(tmp_path / "out_rn"))
    with uproot.open(tmp_path / "out_rn" / "a.root") as f:
        assert "RNTuple" in f.classname_of("tree") and f["tree"].num_entries == len(arrays)
    np.testing.assert_allclose(_scores(tmp_path / "out_rn" / "a.root"),
                               _scores(tmp_path / "out_tt" / "a.root"), atol=1e-6)  # fmt: skip


def test_a_tree_of_another_name_is_found_by_its_branches_or_named(tagger, tmp_path):
    from voxjet.predict import run_predict

    src = sorted((tagger / "raw").glob("*.root"))[1]
    with uproot.open(src) as f:
        arrays = f["tree"].arrays(library="ak")
    model = str(tagger / "run" / "model.pt")
    run_predict(model, [str(src)], str(tmp_path / "ref"))
    ref = _scores(tmp_path / "ref" / src.name)
    # an analysis ntuple: the jets under `events`, beside a tree of run metadata
    meta = ak.Array({"run": np.arange(3)})
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "a.root", {"events": arrays, "runs": meta})
    run_predict(model, [str(tmp_path / "in")], str(tmp_path / "auto"))
    np.testing.assert_allclose(_scores(tmp_path / "auto" / "a.root", "events"), ref, atol=1e-6)
    run_predict(model, [str(tmp_path / "in")], str(tmp_path / "named"), tree="events")
    np.testing.assert_allclose(_scores(tmp_path / "named" / "a.root", "events"), ref, atol=1e-6)
    with pytest.raises(VoxjetError, match=r"a\.root: no tree 'Events' \(found \['events', "
                       r"'runs'\]\); name it with voxjet predict --tree NAME"):  # fmt: skip
        run_predict(model, [str(tmp_path / "in")], str(tmp_path / "wrong"), tree="Events")
    # two trees that could be the jets: refused, naming both
    (tmp_path / "two").mkdir()
    _write(tmp_path / "two" / "a.root", {"events": arrays, "jets": arrays})
    with pytest.raises(
        VoxjetError,
        match=r"the trees \['events', 'jets'\] each hold every "
        r"branch the model needs; name it with voxjet predict --tree NAME",
    ):
        run_predict(model, [str(tmp_path / "two")], str(tmp_path / "out2"))
    assert not list((tmp_path / "out2").glob("*.root"))
    (tmp_path / "none").mkdir()
    _write(tmp_path / "none" / "a.root", {"runs": meta})
    with pytest.raises(VoxjetError, match=r"none of its trees \['runs'\] holds every branch"):
        run_predict(model, [str(tmp_path / "none")], str(tmp_path / "out3"))


def test_an_output_whose_columns_come_back_misplaced_is_refused(tmp_path):
    # uproot 5.7's RNTuple writer, given fields out of alphabetical order, stores each in
    # another's column: the read-back check catches it (predict sorts the names first)
    from voxjet.jets.predict import _check_written

    cols = {"score_QCD": np.array([0.9, 0.8], np.float32),
            "score_Hbb": np.array([0.1, 0.2], np.float32)}  # fmt: skip
    with uproot.recreate(tmp_path / "o.root") as f:
        f.mkrntuple("tree", {k: v.dtype for k, v in cols.items()}).extend(cols)
    with uproot.open(tmp_path / "o.root") as f:
        misplaced = not np.array_equal(f["tree"]["score_QCD"].array(library="np"),
                                       cols["score_QCD"])  # fmt: skip
    if not misplaced:
        pytest.skip("this uproot writes RNTuple fields in place")
    with pytest.raises(VoxjetError, match=r"out\.root: the columns \['score_QCD', 'score_Hbb'\] "
                       r"read back differ from what was written"):  # fmt: skip
        _check_written(tmp_path / "o.root", "tree", cols, tmp_path / "out.root")
