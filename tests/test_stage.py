"""Staging: checksums, atomic copies, manifests, skipping verified files, clear failures."""

from __future__ import annotations

import hashlib
import json
import os
import zlib

import pytest

from voxjet.errors import VoxjetError
from voxjet.stage.checksum import Adler32, algorithm_for, checksum_file
from voxjet.stage.transfer import load_expected, stage


def test_adler32_streams_like_zlib():
    data = os.urandom(100_000)
    h = Adler32()
    for i in range(0, len(data), 7777):
        h.update(data[i : i + 7777])
    assert h.hexdigest() == f"{zlib.adler32(data) & 0xFFFFFFFF:08x}"
    assert Adler32().hexdigest() == "00000001"


def test_algorithm_follows_file_type(tmp_path):
    assert algorithm_for("a/b.ROOT") == "adler32"
    assert algorithm_for("case.nii.gz") == "sha256"
    p = tmp_path / "x.nii.gz"
    p.write_bytes(b"abc")
    assert checksum_file(str(p)) == hashlib.sha256(b"abc").hexdigest()


@pytest.fixture
def source(tmp_path):
    src = tmp_path / "src"
    (src / "imagesTr").mkdir(parents=True)
    (src / "dataset.json").write_text("{}")
    (src / "imagesTr" / "a.nii.gz").write_bytes(os.urandom(5000))
    (src / "b.root").write_bytes(os.urandom(3000))
    (src / ".hidden").write_text("skip me")
    return src


def test_stage_copies_checksums_and_writes_manifest(source, tmp_path):
    m = stage(str(source), tmp_path / "dst", tmp_path / "manifest.json")
    files = {f["path"]: f for f in m["files"]}
    assert set(files) == {"dataset.json", "imagesTr/a.nii.gz", "b.root"}
    assert (tmp_path / "dst" / "imagesTr" / "a.nii.gz").read_bytes() == (
        source / "imagesTr" / "a.nii.gz"
    ).read_bytes()
    assert files["b.root"]["checksum"] == {"adler32": checksum_file(str(source / "b.root"))}
    assert files["imagesTr/a.nii.gz"]["size"] == 5000
    assert json.loads((tmp_path / "manifest.json").read_text()) == m
    assert not list((tmp_path / "dst").rglob("*.part"))


def test_rerun_skips_verified_files_and_recopies_corrupt_ones(source, tmp_path):
    stage(str(source), tmp_path / "dst", tmp_path / "manifest.json")
    good = tmp_path / "dst" / "b.root"
    bad = tmp_path / "dst" / "imagesTr" / "a.nii.gz"
    os.utime(good, (1, 1))
    bad.write_bytes(b"\0" * 5000)  # same size, wrong content
    stage(str(source), tmp_path / "dst", tmp_path / "manifest.json")
    assert good.stat().st_mtime == 1  # untouched
    assert bad.read_bytes() == (source / "imagesTr" / "a.nii.gz").read_bytes()


def test_glob_source_and_patterns(source, tmp_path):
    m = stage(str(source / "*.root"), tmp_path / "dst", tmp_path / "m.json")
    assert [f["path"] for f in m["files"]] == ["b.root"]
    m = stage(str(source), tmp_path / "dst2", tmp_path / "m2.json", patterns=["*.nii.gz"])
    assert [f["path"] for f in m["files"]] == ["imagesTr/a.nii.gz"]
    m = stage(str(source / "imagesT[r]" / "?.nii.gz"), tmp_path / "dst3", tmp_path / "m3.json")
    assert [f["path"] for f in m["files"]] == ["imagesTr/a.nii.gz"]
    m = stage("file://" + str(source / "b.root"), tmp_path / "dst4", tmp_path / "m4.json")
    assert [f["path"] for f in m["files"]] == ["b.root"]


def test_checksum_mismatch_fails_naming_the_file_and_leaves_nothing(source, tmp_path):
    with pytest.raises(VoxjetError, match=r"b\.root: adler32 .* does not match"):
        stage(
            str(source),
            tmp_path / "dst",
            tmp_path / "m.json",
            patterns=["*.root"],
            expected={"b.root": "deadbeef"},
        )
    assert not (tmp_path / "dst" / "b.root").exists()
    assert not list((tmp_path / "dst").rglob("*.part"))
    assert not (tmp_path / "m.json").exists()


def test_missing_source_and_empty_match_are_clear(tmp_path):
    with pytest.raises(VoxjetError, match="does not exist"):
        stage(str(tmp_path / "nope"), tmp_path / "dst", tmp_path / "m.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(VoxjetError, match="no files matching"):
        stage(str(tmp_path / "empty"), tmp_path / "dst", tmp_path / "m.json")


def test_user_checksum_manifest_forms(tmp_path):
    p = tmp_path / "sums.json"
    p.write_text(json.dumps({"a.root": "0000abcd"}))
    assert load_expected(str(p)) == {"a.root": "0000abcd"}
    p.write_text(json.dumps({"files": [{"path": "a.root", "checksum": {"adler32": "01"}}]}))
    assert load_expected(str(p)) == {"a.root": "01"}
    p.write_text("[1, 2]")
    with pytest.raises(VoxjetError, match="expected a JSON object"):
        load_expected(str(p))


def test_stage_records_root_entries(tmp_path):
    from voxjet.jets.synth import ToyJetsConfig, generate_file

    src = tmp_path / "src"
    src.mkdir()
    generate_file(src / "QCD_000.root", "QCD", 20, 0, ToyJetsConfig())
    m = stage(str(src), tmp_path / "dst", tmp_path / "m.json", tree="tree")
    assert m["files"][0]["entries"] == 20
    with pytest.raises(VoxjetError, match="no tree named 'Events'"):
        stage(str(src), tmp_path / "dst", tmp_path / "m.json", tree="Events")


def test_file_list_mixing_paths_and_urls(source, tmp_path):
    listing = tmp_path / "files.txt"
    listing.write_text(
        f"# from xrdfs ls\n{source / 'b.root'}\n\nfile://{source / 'imagesTr' / 'a.nii.gz'}\n"
    )
    m = stage(None, tmp_path / "dst", tmp_path / "m.json", file_list=str(listing))
    assert [f["path"] for f in m["files"]] == ["a.nii.gz", "b.root"]
    assert (tmp_path / "dst" / "b.root").read_bytes() == (source / "b.root").read_bytes()
    m = stage(
        None, tmp_path / "dst", tmp_path / "m.json", file_list=str(listing), patterns=["*.root"]
    )
    assert [f["path"] for f in m["files"]] == ["b.root"]


def test_file_list_errors_name_the_list_and_entry(source, tmp_path):
    listing = tmp_path / "files.txt"
    (source / "sub").mkdir()
    (source / "sub" / "b.root").write_bytes(b"x")
    listing.write_text(f"{source / 'b.root'}\n{source / 'sub' / 'b.root'}\n")
    with pytest.raises(VoxjetError, match=r"files\.txt: several entries share .*b\.root"):
        stage(None, tmp_path / "dst", tmp_path / "m.json", file_list=str(listing))
    listing.write_text(f"{source / 'nope.root'}\n")
    with pytest.raises(VoxjetError, match=r"files\.txt: listed file .*nope\.root.* does not exist"):
        stage(None, tmp_path / "dst", tmp_path / "m.json", file_list=str(listing))


def _keys(source, dest):
    from voxjet.stage.fingerprint import content_keys
    from voxjet.stage.transfer import LEDGER, list_sources

    return content_keys(list_sources(str(source), ["*"])[1], dest / LEDGER)


def _flip_between_samples(path):
    """A same-size change where the quick fingerprint does not look, the time moved on."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 100_000] ^= 1
    path.write_bytes(bytes(data))
    later = os.stat(path).st_mtime + 10
    os.utime(path, (later, later))


def test_a_change_the_fingerprint_misses_is_found_by_verify_then_restaged(tmp_path):
    from voxjet.stage.verify import verify_sources

    src, dest = tmp_path / "src", tmp_path / "staged"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(6 << 20))
    stage(str(src), dest, tmp_path / "m.json")
    keys = _keys(src, dest)
    _flip_between_samples(src / "big.bin")
    assert _keys(src, dest) == keys  # the dry run cannot tell
    with pytest.raises(VoxjetError, match="changed since they were staged though their size"):
        verify_sources(str(src), dest, ["*"], tmp_path / "v.json")
    assert _keys(src, dest) != keys  # its generation moved: the next run redoes what read it
    stage(str(src), dest, tmp_path / "m.json")  # copies it again, refusing nothing
    assert (dest / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    settled = _keys(src, dest)
    verify_sources(str(src), dest, ["*"], tmp_path / "v.json")
    assert json.loads((tmp_path / "v.json").read_text())["checked"] == 0
    assert _keys(src, dest) == settled != keys


def test_the_stage_refuses_a_change_the_fingerprint_missed_and_records_it(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "staged"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(6 << 20))
    stage(str(src), dest, tmp_path / "m.json")
    keys = _keys(src, dest)
    _flip_between_samples(src / "big.bin")
    (tmp_path / "m.json").unlink()  # Snakemake removes a job's outputs before it runs
    with pytest.raises(VoxjetError, match="run snakemake again"):
        stage(str(src), dest, tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists() and _keys(src, dest) != keys
    stage(str(src), dest, tmp_path / "m.json")
    assert (dest / "big.bin").read_bytes() == (src / "big.bin").read_bytes()


def test_touched_sources_are_verified_and_keep_their_keys(tmp_path):
    from voxjet.stage.verify import verify_sources

    src, dest = tmp_path / "src", tmp_path / "staged"
    src.mkdir()
    for k in range(3):
        (src / f"f{k}.bin").write_bytes(os.urandom(1000 + k))
    stage(str(src), dest, tmp_path / "m.json")
    keys = _keys(src, dest)
    for p in src.iterdir():
        os.utime(p, (os.stat(p).st_mtime + 10,) * 2)
    summary = verify_sources(str(src), dest, ["*"], tmp_path / "v.json")
    assert summary == {"files": 3, "checked": 3, "changed": []}
    assert _keys(src, dest) == keys
    assert verify_sources(str(src), dest, ["*"], tmp_path / "v.json")["checked"] == 0
