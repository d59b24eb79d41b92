"""The run graph (voxjet.workflow.graph) without Snakemake: what every rule is given, how a
source's content (not its times) decides what reruns, and which case files count as current."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import h5py
import pytest

from voxjet.config import fill_defaults
from voxjet.errors import VoxjetError
from voxjet.io.ledger import state_path
from voxjet.stage.fingerprint import quick_fingerprint
from voxjet.stage.transfer import stage
from voxjet.workflow import paths
from voxjet.workflow.graph import Graph, build, build_or_exit, one_of


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Work in a fresh folder, as Snakemake runs in the workflow's."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def jets_config(**jets) -> dict:
    """A config of one local jets dataset (src/) and one PFN experiment."""
    return {"datasets": {"j": {"domain": "jets", "source": {"path": "src"},
                               "jets": {"labels": ["label_QCD", "label_Wqq"], **jets}}},
            "experiments": {"pfn": {"dataset": "j", "model": {"name": "pfn"},
                                    "launch": {"gpus": 0, "threads": 1}}}}  # fmt: skip


@pytest.fixture
def jet_sources(in_tmp) -> Path:
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset

    generate_dataset(in_tmp / "src", ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=2,
                     jets_per_file=50, seed=3), progress=False)  # fmt: skip
    return in_tmp / "src"


def test_the_demo_graph_has_every_job_the_rules_ask_for(demo_config, in_tmp):
    g = build(copy.deepcopy(demo_config), fill_defaults)
    assert g.datasets_of("jets") == ["toy_jets"] and g.datasets_of("volumes") == ["toy_ct"]
    assert g.shard_parts("toy_jets") == [f"results/toy_jets/shards/part_{k:04d}" for k in (0, 1)]
    assert g.case_ids("toy_ct") == [f"toy_{i:03d}" for i in range(10)]
    jets = ["part", "particlenet", "particlenet_scale-1", "particlenet_scale-2", "pfn_lr-0.001",
            "pfn_lr-0.003"]  # fmt: skip
    assert sorted(g.runs_of("jets")) == jets
    # scaling runs are timed, never evaluated
    assert len(g.evaluations()) == 6 and len(g.train_logs()) == 8
    assert "results/toy_jets/runs/particlenet_scale-2/eval/metrics.json" not in g.evaluations()
    assert g.synth_args("toy_ct") == "--train-cases 10 --test-cases 2 --seed 7"
    # generated data is not a local source: any restage reruns what reads it
    assert not g.untimed_sources("toy_jets") and g.source_digest("toy_jets") == ""
    assert g.stage_input("toy_jets") == g.generated("toy_jets") == ["resources/synthetic/toy_jets"]
    assert g.stage_options("toy_ct") == "--pattern '*' --on-duplicate ignore"
    res = g.run_resources("pfn_lr-0.001")
    assert res["gpu"] is None and res["cpus_per_task"] == 2 and res["nodes"] == 1
    assert g.launch("particlenet_scale-2").cpu_processes == 2
    assert g.plan_inputs() == ["results/toy_ct/cases/cases.json",
                               "results/toy_jets/shards/index.json"]  # fmt: skip
    assert g.verify_targets() == [] and g.best_targets() == [] and g.prediction_targets() == []


def test_a_wildcard_regex_matches_exactly_the_names():
    import re

    assert re.fullmatch(one_of(["a.b", "c"]), "a.b") and not re.fullmatch(one_of(["a.b"]), "axb")
    assert not re.fullmatch(one_of([]), "")


def test_a_bad_config_exits_before_any_job_with_voxjets_message(demo_config, in_tmp, capsys):
    bad = copy.deepcopy(demo_config)
    bad["experiments"]["pfn"]["dataset"] = "nope"
    with pytest.raises(SystemExit) as e:
        build_or_exit(bad, fill_defaults)
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("voxjet: config key 'experiments.pfn.dataset': no dataset named 'nope'")


def test_a_touched_source_keeps_its_key_and_a_changed_one_does_not(jet_sources):
    g = build(jets_config(), fill_defaults)
    before = g.source_digest("j")
    assert g.untimed_sources("j") and len(before) == 16
    stage("src", paths.fill(paths.STAGED, dataset="j"), "resources/j/manifest.json",
          patterns=["*.root"])  # fmt: skip
    # the stage's ledger knows each file's fingerprint: the same keys, from the ledger
    assert build(jets_config(), fill_defaults).source_digest("j") == before
    later = time.time() + 5
    for f in jet_sources.glob("*.root"):
        os.utime(f, (later, later))  # touch, cp without -p, a move
    assert build(jets_config(), fill_defaults).source_digest("j") == before
    data = bytearray((jet_sources / "QCD_001.root").read_bytes())
    data[-3] ^= 0xFF
    (jet_sources / "QCD_001.root").write_bytes(bytes(data))
    assert build(jets_config(), fill_defaults).source_digest("j") != before


def test_a_dry_run_writes_no_state_and_a_run_makes_them_cleared(in_tmp):
    made = ["results/x/shards/part_0000"]
    assert Graph.states(made, {}, executes=False) == []
    assert not state_path(made[0]).exists()
    (states,) = Graph.states(["results/{d}/shards/part_0000"], {"d": "x"}, executes=True)
    assert Path(states) == state_path(made[0]) and os.stat(states).st_mtime == 0


def test_auto_gpus_follow_the_plan_once_it_exists(in_tmp, shards):
    cfg = {"datasets": {"p": {"domain": "jets", "source": {"prepared": str(shards)}}},
           "experiments": {"pfn": {"dataset": "p", "model": {"name": "pfn"},
                                   "launch": {"gpus": "auto"}}},
           "site": {"gpu_budget": 8, "gpus_per_node": 4}}  # fmt: skip
    g = build(cfg, fill_defaults)
    assert g.plan_for_auto("pfn") == ["results/plan/runs.json"]
    assert (g.launch("pfn").gpus, g.launch("pfn").nodes) == (1, 1)  # shown before the plan
    Path("results/plan").mkdir(parents=True)
    Path(paths.RUN_PLAN).write_text(json.dumps({"allocation": {"choice": 8}}))
    launch = g.launch("pfn")
    assert (launch.gpus, launch.nodes, g.run_resources("pfn")["gres"]) == (4, 2, "gpu:4")
    # prepared data is no file of the workflow's: nothing to wait for
    assert g.data_input("p", paths.SHARD_INDEX) == [] and g.plan_inputs() == []


def test_predictions_come_in_chunks_of_files_per_job(jet_sources, in_tmp):
    cfg = jets_config()
    cfg["predict"] = {"new": {"experiment": "pfn", "input": "src", "files_per_job": 3}}
    g = build(cfg, fill_defaults)
    assert g.prediction_targets() == ["results/predict/new/part_0000",
                                      "results/predict/new/part_0001"]  # fmt: skip
    assert len(g.chunks["new"][0]) == 3 and len(g.chunks["new"][1]) == 1
    assert g.prediction_models("new") == ["results/j/runs/pfn/model.pt"]
    assert "--overlap" in g.prediction_options("new")


@pytest.fixture
def volume_sources(in_tmp) -> Path:
    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset

    cfg = ToyVolumesConfig(train_cases=3, test_cases=1, min_shape=(16, 16, 8),
                           max_shape=(18, 18, 8))  # fmt: skip
    return generate_dataset(in_tmp / "msd", cfg, progress=False)


def volumes_config() -> dict:
    return {"datasets": {"v": {"domain": "volumes", "source": {"path": "msd"}}},
            "experiments": {"unet": {"dataset": "v", "model": {"name": "unet",
                                                               "channels": [4, 8]}}}}  # fmt: skip


def test_a_cases_digest_follows_its_own_files_and_dataset_json_only(volume_sources):
    g = build(volumes_config(), fill_defaults)
    before = {c: g.case_digest("v", c) for c in g.case_ids("v")}
    assert len(set(before.values())) == 3
    label = volume_sources / "labelsTr" / "toy_001.nii.gz"
    label.write_bytes(label.read_bytes()[:-8] + bytes(8))  # another gzip trailer
    after = {c: build(volumes_config(), fill_defaults).case_digest("v", c) for c in before}
    assert [c for c in before if before[c] != after[c]] == ["toy_001"]
    meta = volume_sources / "dataset.json"
    meta.write_text(meta.read_text().replace("organ", "liver"))
    again = {c: build(volumes_config(), fill_defaults).case_digest("v", c) for c in before}
    assert all(again[c] != after[c] for c in before)  # every case reads dataset.json
    changed = volumes_config()
    changed["datasets"]["v"]["volumes"] = {"patch_size": [16, 16, 8]}
    assert build(changed, fill_defaults).case_digest("v", "toy_000") != again["toy_000"]


def test_a_case_file_is_current_only_when_made_from_what_the_dry_run_knows(volume_sources):
    g = build(volumes_config(), fill_defaults)
    case = Path(paths.fill(paths.CASE, dataset="v", cases="cases", case="toy_000"))
    assert not g.case_current("v", "cases", "toy_000")  # none yet
    case.parent.mkdir(parents=True)
    with h5py.File(case, "w") as f:
        f.attrs.update(made_from=g.case_digest("v", "toy_000"), plan_digest="")
    assert g.case_current("v", "cases", "toy_000")  # no plan yet, as when it was made
    with h5py.File(case, "a") as f:
        f.attrs["made_from"] = "an earlier digest"
    assert not g.case_current("v", "cases", "toy_000")


def test_a_volumes_folder_without_dataset_json_is_named_before_its_files(in_tmp):
    (in_tmp / "msd").mkdir()
    with pytest.raises(VoxjetError, match=r"datasets\.v\.source'.*no dataset\.json"):
        build(volumes_config(), fill_defaults)


def test_the_quick_fingerprint_sees_edges_and_samples_of_a_large_file(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (6 << 12))  # 6 MiB: sampled, not read whole
    first = quick_fingerprint(big)
    data = bytearray(big.read_bytes())
    data[len(data) // 17] ^= 1  # the first sample
    big.write_bytes(bytes(data))
    assert quick_fingerprint(big) != first
    data[len(data) // 17] ^= 1
    data[len(data) // 2 + 100_000] ^= 1  # between samples: the stage's checksum finds it
    big.write_bytes(bytes(data))
    assert quick_fingerprint(big) == first
