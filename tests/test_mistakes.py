"""A new user's first-week mistakes, each made as the user makes it (`snakemake -n
--configfile my.yaml`, or the `voxjet` command): each is refused with a non-zero exit and a
message naming the key or file and the fix, before any job; then the fix the message gives is
applied and the same command passes that point."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import (
    BIN,
    REPO,
    copy_workflow,
    job_counts,
    run_snakemake,
    snakemake_env,
    write_config,
)

pytestmark = pytest.mark.slow

BASE = {
    "datasets": {
        "mine": {
            "domain": "jets",
            "source": {"path": "src"},
            "jets": {"labels": ["label_QCD", "label_Wqq"], "max_particles": 16},
        }
    },
    "experiments": {
        "pfn": {
            "dataset": "mine",
            "model": {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]},
            "train": {"steps": 4, "eval_every": 2, "batch_size": 16},
            "launch": {"gpus": 0, "threads": 1},
        }
    },
}
WEAVER = yaml.safe_load((REPO / "config/examples/weaver/JetClass_full.yaml").read_text())
# the toy files carry no generator-level particles: weaver's observers of them left out
WEAVER["observers"] = [o for o in WEAVER["observers"] if not o.startswith("aux_")]


@pytest.fixture(scope="module")
def user_wf(tmp_path_factory) -> Path:
    """A fresh copy of the workflow with a user's small ROOT dataset in src/ (JetClass's
    branches, two classes)."""
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset

    wf = copy_workflow(tmp_path_factory.mktemp("user") / "wf")
    generate_dataset(wf / "src", ToyJetsConfig(classes=["QCD", "Wqq"], files_per_class=1,
                     jets_per_file=40, seed=5), progress=False)  # fmt: skip
    return wf


def dry(wf: Path, cfg: dict | str, env: dict[str, str] | None = None):
    """`snakemake -n --configfile my.yaml`, the user's file written first."""
    text = cfg if isinstance(cfg, str) else yaml.safe_dump(cfg, sort_keys=False)
    (wf / "my.yaml").write_text(text)
    return run_snakemake(wf, "-n", "--configfile", "my.yaml", env=env)


def refused(r, *words: str) -> str:
    """The run stopped before any job, voxjet's message last, holding every word."""
    assert r.returncode != 0, r.stdout[-2000:]
    assert "Job stats:" not in r.stdout  # no job was planned, let alone run
    message = r.stderr[r.stderr.rfind("\nvoxjet: ") :]  # from voxjet's message on, to the end
    assert message.startswith("\nvoxjet: "), r.stderr[-3000:]
    for w in words:
        assert w in message, (w, r.stderr[-3000:])
    return message


def _weaver(wf: Path, change=None) -> str:
    doc = copy.deepcopy(WEAVER)
    if change:
        change(doc)
    (wf / "w.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return "w.yaml"


def _jets(cfg: dict) -> dict:
    return cfg["datasets"]["mine"]["jets"]


def _exp(cfg: dict) -> dict:
    return cfg["experiments"]["pfn"]


def _rename(cfg: dict, new: str) -> None:
    cfg["experiments"][new] = cfg["experiments"].pop("pfn")


def _set_weaver(wf: Path, change=None):
    def apply(cfg):
        cfg["datasets"]["mine"]["jets"] = {"weaver_config": _weaver(wf, change)}

    return apply


# (mistake, words the message must hold, the fix the message gives)
CASES = {
    "sweep_key": (
        lambda wf, c: _exp(c).update(sweep={"train.lrr": [0.1, 0.2]}),
        ["experiments.pfn.sweep.train.lrr", "names no setting", "did you mean 'lr'"],
        lambda wf, c: _exp(c).update(sweep={"train.lr": [0.1, 0.2]}),
    ),
    "sweep_value": (
        lambda wf, c: _exp(c).update(sweep={"train.lr": [0.1, "fast"]}),
        ["experiments.pfn.sweep.train.lr", "value 'fast'", "expected a number"],
        lambda wf, c: _exp(c).update(sweep={"train.lr": [0.1, 0.2]}),
    ),
    "model_inputs": (
        lambda wf, c: (
            _exp(c).update(model={"name": "particlenet"}),
            _jets(c).update(particle_features=["part_pt_log", "part_e_log"]),
        ),
        [
            "experiments.pfn.model.name",
            "datasets.mine.jets.particle_features lacks",
            "'part_deta', 'part_dphi'",
        ],
        lambda wf, c: _jets(c).update(
            particle_features=["part_pt_log", "part_e_log", "part_deta", "part_dphi"]
        ),
    ),  # fmt: skip
    "empty_source": (
        lambda wf, c: c["datasets"]["mine"].update(source={}),
        ["datasets.mine.source", "give one of path, file_list, synthetic, prepared"],
        lambda wf, c: c["datasets"]["mine"].update(source={"path": "src"}),
    ),
    "volumes_in_jets": (
        lambda wf, c: c["datasets"]["mine"].update(volumes={"patch_size": [32, 32, 16]}),
        ["datasets.mine.volumes", "only for domain volumes", "remove it"],
        lambda wf, c: c["datasets"]["mine"].pop("volumes"),
    ),
    "experiment_name": (
        lambda wf, c: _rename(c, "pfn_v2"),
        ["experiments.pfn_v2", "letters, digits and '-' only", "e.g. 'pfn-v2'"],
        lambda wf, c: (
            _rename(c, "pfn-v2")
            if "pfn_v2" not in c["experiments"]
            else c["experiments"].__setitem__("pfn-v2", c["experiments"].pop("pfn_v2"))
        ),
    ),  # fmt: skip
    "predict_run_and_experiment": (
        lambda wf, c: c.update(predict={"p": {"run": "pfn", "experiment": "pfn", "input": "src"}}),
        ["predict.p", "give only one of run, experiment"],
        lambda wf, c: c["predict"]["p"].pop("experiment"),
    ),  # fmt: skip
    "unset_variable": (
        lambda wf, c: c["datasets"]["mine"]["source"].update(path="$VOXJET_MY_DATA/src"),
        ["datasets.mine.source.path", "$VOXJET_MY_DATA", "is not set"],
        "VOXJET_MY_DATA",  # the fix: export it
    ),
    "missing_branch": (
        lambda wf, c: _jets(c).update(particle_features=["part_deta", "part_detaa"]),
        ["datasets.mine", "'part_detaa'", "jets.particle_features", "it has 'part_deta'"],
        lambda wf, c: _jets(c).update(particle_features=["part_deta", "part_dphi"]),
    ),
    "wrong_tree": (
        lambda wf, c: _jets(c).update(tree="Events"),
        ["no tree named 'Events'", "it has ['tree']", "datasets.mine.jets.tree"],
        lambda wf, c: _jets(c).update(tree="tree"),
    ),
    "label_as_input": (
        lambda wf, c: _jets(c).update(particle_features=["part_deta", "label_QCD"]),
        ["datasets.mine.jets.particle_features", "'label_QCD'", "never an input"],
        lambda wf, c: _jets(c).update(particle_features=["part_deta"]),
    ),
    "weaver_function": (
        lambda wf, c: _set_weaver(
            wf, lambda d: d["new_variables"].update(part_pt="np.hypott(part_px, part_py)")
        )(c),
        ["w.yaml: new_variables.part_pt", "np.hypott"],
        lambda wf, c: _set_weaver(wf)(c),
    ),  # fmt: skip
    "weaver_treename": (
        lambda wf, c: _set_weaver(wf, lambda d: d.update(treename="Events"))(c),
        ["no tree named 'Events'", "the treename of weaver_config w.yaml"],
        lambda wf, c: _set_weaver(wf, lambda d: d.update(treename="tree"))(c),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_mistake_stops_the_dry_run_and_its_fix_passes(user_wf, name):
    mistake, words, fix = CASES[name]
    cfg = copy.deepcopy(BASE)
    mistake(user_wf, cfg)
    refused(dry(user_wf, cfg), *words)
    env = snakemake_env()
    if isinstance(fix, str):  # an environment variable to export
        env[fix] = str(user_wf)
    else:
        fix(user_wf, cfg)
    r = dry(user_wf, cfg, env=env)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize(
    "hide,change,env,words",
    [
        ("s3fs", lambda c: c["datasets"]["mine"]["source"].update(path="s3://bucket/jets"), {},
         ["datasets.mine.source.path", "s3fs", 'pip install "voxjet[remote]"']),
        ("mlflow", lambda c: None, {"MLFLOW_TRACKING_URI": "file:///tmp/mlruns"},
         ["MLFLOW_TRACKING_URI=file:///tmp/mlruns", 'pip install "voxjet[track]"']),
        ("weaver", lambda c: _exp(c).update(model={"name": "weaver_pnet"}), {},
         ["experiments.pfn.model.name", "weaver-core", 'pip install "voxjet[weaver]"']),
    ],
)  # fmt: skip
def test_a_missing_extra_is_named_at_the_dry_run(user_wf, hide, change, env, words):
    """On a machine without the extra (the tests hide its package), the dry run names the key
    and the pip line; with the package there (the fix), it passes."""
    cfg = copy.deepcopy(BASE)
    change(cfg)
    if "weaver" in hide:
        _set_weaver(user_wf)(cfg)
        _exp(cfg)["model"] = {"name": "weaver_pnet"}
    without = {**snakemake_env(), **env, "HIDE_PACKAGES": hide}
    refused(dry(user_wf, cfg, env=without), *words)
    assert dry(user_wf, cfg, env={**snakemake_env(), **env}).returncode == 0


def test_numbers_as_ml_code_writes_them(user_wf):
    """`lr: 1e-3` (a string to PyYAML's YAML 1.1) is the number 0.001, in a sweep too."""
    cfg = copy.deepcopy(BASE)
    _exp(cfg)["train"]["lr"] = "LR"
    _exp(cfg)["sweep"] = {"train.weight_decay": ["WD1", "WD2"]}
    text = yaml.safe_dump(cfg, sort_keys=False)
    text = text.replace("LR", "1e-3").replace("WD1", "1e-3").replace("WD2", "5e-4")
    assert yaml.safe_load(text)["experiments"]["pfn"]["train"]["lr"] == "1e-3"  # PyYAML's
    r = dry(user_wf, text)
    assert r.returncode == 0, r.stderr[-3000:]
    assert '"lr": 0.001' in r.stdout
    runs = set(re.findall(r"run=([^,\s]+)", r.stdout))
    assert runs == {"pfn_weight_decay-0.001", "pfn_weight_decay-0.0005"}, runs


def test_a_users_config_stands_alone(user_wf):
    """`snakemake -n --configfile my.yaml`, no other flag: only my.yaml's dataset and runs."""
    r = dry(user_wf, BASE)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = job_counts(r.stdout)
    assert "synth_jets" not in jobs and "synth_volumes" not in jobs and "train_seg" not in jobs
    assert jobs["train_jets"] == 1 and jobs["stage"] == 1
    assert "toy_jets" not in r.stdout and "toy_ct" not in r.stdout


def test_a_volumes_folder_without_dataset_json_says_what_it_needs(user_wf, tmp_path):
    (tmp_path / "ct" / "imagesTr").mkdir(parents=True)
    cfg = {"datasets": {"ct": {"domain": "volumes", "source": {"path": str(tmp_path / "ct")}}},
           "experiments": {"unet": {"dataset": "ct", "model": {"name": "unet",
                                                               "channels": [8, 16]}}}}  # fmt: skip
    refused(dry(user_wf, cfg), "no dataset.json", "Medical Segmentation Decathlon",
            "imagesTr")  # fmt: skip
    # the fix: a dataset folder with its dataset.json
    voxjet = str(BIN / "voxjet")
    subprocess.run([voxjet, "synth-volumes", "--out", str(tmp_path / "msd"), "--train-cases", "3",
                    "--test-cases", "0"], check=True, capture_output=True)  # fmt: skip
    cfg["datasets"]["ct"]["source"]["path"] = str(tmp_path / "msd")
    r = dry(user_wf, cfg)
    assert r.returncode == 0, r.stderr[-3000:]


def test_one_bad_file_among_good_ones_names_on_bad_file_skip(user_wf, tmp_path):
    """A truncated file the dry run does not open (it looks at the first): the stage stops
    naming it and on_bad_file: skip, and with that set the stage passes."""
    wf = Path(shutil.copytree(user_wf, tmp_path / "wf"))
    bad = wf / "src" / "Wqq_000.root"
    bad.write_bytes(bad.read_bytes()[:20000])
    (wf / "my.yaml").write_text(yaml.safe_dump(BASE))
    r = run_snakemake(wf, "--cores", "1", "--configfile", "my.yaml", "--until", "stage")
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()
    (line,) = [ln for ln in last if ln.startswith("voxjet: stage failed")]
    assert "Wqq_000.root" in line and "jets.on_bad_file: skip" in line
    fixed = copy.deepcopy(BASE)
    _jets(fixed)["on_bad_file"] = "skip"
    (wf / "my.yaml").write_text(yaml.safe_dump(fixed))
    r = run_snakemake(wf, "--cores", "1", "--configfile", "my.yaml", "--until", "stage")
    assert r.returncode == 0, r.stderr[-3000:]


# ---- the voxjet command -----------------------------------------------------------------------


def voxjet(*args: str, cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run([str(BIN / "voxjet"), *args], cwd=cwd, capture_output=True, text=True,
                          env=env or snakemake_env())  # fmt: skip


def test_predict_with_a_wrong_model_or_input_says_which_and_leaves_no_folder(finished_jets,
                                                                            tmp_path):  # fmt: skip
    model = finished_jets / "results/j/runs/pfn/model.pt"
    source = str(finished_jets / "src" / "QCD_000.root")
    r = voxjet("predict", "--model", "/nope/model.pt", "--input", source, "--out", "out",
               cwd=tmp_path)  # fmt: skip
    assert r.returncode != 0 and "/nope/model.pt: no such file" in r.stderr
    assert "delete" not in r.stderr and not (tmp_path / "out").exists()
    r = voxjet("predict", "--model", str(model), "--input", "/nope/x.root", "--out", "out",
               cwd=tmp_path)  # fmt: skip
    assert r.returncode != 0 and "'/nope/x.root' does not exist: fix --input" in r.stderr
    assert "source.path" not in r.stderr and not (tmp_path / "out").exists()
    r = voxjet("predict", "--model", str(model), "--input", source, "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "out" / "QCD_000.root").is_file()


def test_onnx_export_without_the_extra_names_it_and_leaves_no_folder(finished_jets, tmp_path):
    model = str(finished_jets / "results/j/runs/pfn/model.pt")
    args = ("export", "--model", model, "--format", "onnx", "--out", "exported")
    r = voxjet(*args, cwd=tmp_path, env={**snakemake_env(), "HIDE_PACKAGES": "onnx"})
    assert r.returncode != 0 and 'pip install "voxjet[export]"' in r.stderr
    assert not (tmp_path / "exported").exists()
    r = voxjet(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list((tmp_path / "exported").glob("*.onnx"))


def test_a_failed_training_ends_with_voxjets_message(finished_jets, tmp_path):
    """Two processes that stop with voxjet's error under torchrun: the launcher's last line is
    their message, not torchrun's ChildFailedError."""
    env = {**snakemake_env(), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    r = voxjet("launch", "--gpus", "0", "--cpu-processes", "2", "--threads", "2", "--",
               "train-jets", "--shards", str(tmp_path / "nope"), "--run-config",
               '{"dataset": "j", "experiment": "pfn", "run": "pfn", "model": {"name": "pfn"},'
               ' "train": {"steps": 2}}', "--out", str(tmp_path / "run"), cwd=tmp_path,
               env=env)  # fmt: skip
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("launch: ranks 0, 1 failed: voxjet train-jets: error:"), last
    assert "index.json" in last and "ChildFailedError" in r.stderr  # torchrun's report above


def test_train_folds_in_a_users_config_is_refused_at_the_dry_run(tmp_path):
    """The issue's case: `train: {folds: 2}` stops the dry run naming experiments.<name>.folds."""
    wf = copy_workflow(tmp_path / "wf")
    cfg = {"datasets": {"v": {"domain": "volumes", "source": {"synthetic": {"train_cases": 4}}}},
           "experiments": {"unet": {"dataset": "v", "model": {"name": "unet",
                                    "channels": [8, 16]}, "train": {"folds": 2}}}}  # fmt: skip
    write_config(wf / "my.yaml", cfg)
    r = run_snakemake(wf, "-n", "--configfile", "my.yaml")
    refused(r, "'experiments.unet.train.folds'", "folds: k under experiments.unet")
