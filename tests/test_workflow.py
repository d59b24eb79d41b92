"""The Snakemake workflow through its CLI: dry runs (local and SLURM profile), lint, config
errors that stop before any job, and the example configs for real datasets."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import REPO, job_counts, run_snakemake, write_config
from readme import README

# One preprocess_case job a case: the cases are known at the dry run (the generator's, or
# dataset.json's at the source).
DEMO_JOBS = {
    "synth_jets": 1,
    "synth_volumes": 1,
    "stage": 2,
    "shard_jets": 2,
    "index_jets": 1,
    "plan_volumes": 1,
    "preprocess_case": 10,
    "gather_cases": 1,
    "train_jets": 6,  # 4 runs, and particlenet's scaling study at 1 and 2 processes
    "train_seg": 2,
    "evaluate_jets": 4,
    "evaluate_seg": 2,
    "list_runs": 1,
    "plan_runs": 1,
    "aggregate": 1,
    "all": 1,
}


def test_dry_run_lists_every_demo_job(workflow_dir):
    r = run_snakemake(workflow_dir, "-n")
    assert r.returncode == 0, r.stderr + r.stdout
    assert job_counts(r.stdout) == DEMO_JOBS


def test_the_dry_run_says_when_the_toy_generator_stands_in_for_pythia(workflow_dir):
    from conftest import snakemake_env

    r = run_snakemake(workflow_dir, "-n")
    assert "toy generator" not in r.stderr  # pythia8mc is installed here
    hidden = run_snakemake(workflow_dir, "-n", env={**snakemake_env(),
                                                    "HIDE_PACKAGES": "pythia8mc"})  # fmt: skip
    assert hidden.returncode == 0, hidden.stderr[-2000:]
    (line,) = [x for x in hidden.stderr.splitlines() if "toy generator" in x]
    assert line.startswith("voxjet: dataset toy_jets: its jets will come from the toy generator")
    assert "pip install 'voxjet[pythia]'" in line and "README's demo table" in line


def test_dry_run_with_slurm_profile_lists_every_demo_job(workflow_dir):
    """README's cluster dry run as written (what each job asks for: tests/test_cluster.py)."""
    r = run_snakemake(workflow_dir, *README["slurm-dry-run"][1:])
    assert r.returncode == 0, r.stderr + r.stdout
    assert job_counts(r.stdout) == DEMO_JOBS


def test_lint_is_clean(workflow_dir):
    r = run_snakemake(workflow_dir, "--lint")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Lints for" not in r.stdout + r.stderr


def test_bad_config_fails_before_any_job_naming_the_key(workflow_dir, demo_config):
    demo_config["experiments"]["unet"]["train"]["lr"] = "fast"
    demo_config["datasets"]["toy_ct"]["volumes"]["patchsize"] = [1, 2, 3]
    write_config(workflow_dir / "config" / "config.yaml", demo_config)
    r = run_snakemake(workflow_dir, "-n")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "experiments.unet.train.lr': expected a number, got 'fast'" in out
    assert "datasets.toy_ct.volumes': unknown key(s) ['patchsize']" in out
    assert "Job stats" not in out


def test_missing_required_value_fails_before_any_job(workflow_dir, demo_config):
    del demo_config["experiments"]["pfn"]["dataset"]
    write_config(workflow_dir / "config" / "config.yaml", demo_config)
    r = run_snakemake(workflow_dir, "-n")
    assert r.returncode != 0
    assert "experiments.pfn': 'dataset' is a required property" in r.stdout + r.stderr


def test_missing_dataset_path_fails_at_dry_run_with_the_path(workflow_dir, tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "examples" / "msd_spleen.yaml").read_text())
    cfg["datasets"]["spleen"]["source"]["path"] = str(tmp_path / "no" / "Task09_Spleen")
    path = write_config(tmp_path / "c.yaml", cfg)
    r = run_snakemake(workflow_dir, "-n", "--configfile", str(path), "--replace-workflow-config")
    assert r.returncode != 0
    assert f"{tmp_path / 'no' / 'Task09_Spleen'}' does not exist" in r.stdout + r.stderr
    # prepared data given as a local folder without its index.json: named, with the fix
    cfg = yaml.safe_load((REPO / "config" / "examples" / "jetclass_from_s3.yaml").read_text())
    cfg["datasets"]["jetclass"]["source"]["prepared"] = str(tmp_path)
    path = write_config(tmp_path / "c.yaml", cfg)
    r = run_snakemake(workflow_dir, "-n", "--configfile", str(path), "--replace-workflow-config")
    assert r.returncode != 0
    assert "datasets.jetclass.source.prepared" in r.stdout + r.stderr
    assert "has no index.json" in r.stdout + r.stderr


def test_examples_pass_dry_run_when_their_files_exist(workflow_dir, tmp_path):
    from voxjet.jets.synth import ToyJetsConfig, generate_file

    # the dry run opens each dataset's first file (its tree and branches): real files, a few jets
    jetclass = tmp_path / "JetClass" / "Pythia"  # the published train/val/test folders
    for split in ("train_100M", "val_5M", "test_20M"):
        (jetclass / split).mkdir(parents=True)
        for c, toy in (("HToBB", "Hbb"), ("ZJetsToNuNu", "QCD")):
            generate_file(jetclass / split / f"{c}_000.root", toy, 4, 0, ToyJetsConfig())
    spleen = tmp_path / "Task09_Spleen"  # the MSD layout (the cases are read at the dry run)
    training = []
    for sub in ("imagesTr", "labelsTr"):
        (spleen / sub).mkdir(parents=True)
        for c in ("spleen_2", "spleen_3"):
            (spleen / sub / f"{c}.nii.gz").write_bytes(b"")
    for c in ("spleen_2", "spleen_3"):
        training.append({"image": f"./imagesTr/{c}.nii.gz", "label": f"./labelsTr/{c}.nii.gz"})
    (spleen / "dataset.json").write_text(json.dumps({"modality": {"0": "CT"},
        "labels": {"0": "background", "1": "spleen"}, "training": training}))  # fmt: skip
    cms = tmp_path / "ak8_ntuples"  # CMS's AK8 ntuples, and weaver-core's data config for them
    cms.mkdir()
    from cms_ak8 import ak8_config, write_file

    write_file(cms / "QCD_000.root", "label_QCD_bb", 4, 0)

    ak8 = tmp_path / "ak8_points_pf_sv_full.yaml"
    ak8.write_text(yaml.safe_dump(ak8_config("awkward.JaggedArray.ones_like"), sort_keys=False))
    for name, path in (("jetclass", jetclass), ("jetclass_weaver", jetclass),
                       ("msd_spleen", spleen), ("cms_ak8_weaver", cms)):  # fmt: skip
        cfg = yaml.safe_load((REPO / "config" / "examples" / f"{name}.yaml").read_text())
        ds = next(iter(cfg["datasets"]))
        cfg["datasets"][ds]["source"]["path"] = str(path)
        if name == "cms_ak8_weaver":
            cfg["datasets"][ds]["jets"]["weaver_config"] = str(ak8)
        c = write_config(tmp_path / f"{name}.yaml", cfg)
        r = run_snakemake(workflow_dir, "-n", "--configfile", str(c), "--replace-workflow-config")
        assert r.returncode == 0, r.stdout + r.stderr
        counts = job_counts(r.stdout)
        assert counts["stage"] == 1 and "synth_jets" not in counts and "synth_volumes" not in counts
        assert counts["aggregate"] == 1
    # prepared shards at a URL: training and evaluation only, nothing staged or sharded
    c = REPO / "config" / "examples" / "jetclass_from_s3.yaml"
    r = run_snakemake(workflow_dir, "-n", "-p", "--configfile", str(c), "--replace-workflow-config")
    assert r.returncode == 0, r.stdout + r.stderr
    counts = job_counts(r.stdout)
    assert set(counts) == {
        "train_jets",
        "evaluate_jets",
        "plan_runs",
        "list_runs",
        "aggregate",
        "all",
    }, counts
    assert "--shards s3://my-bucket/jetclass/shards --read" in r.stdout


def test_gpu_job_without_gpus_stops_before_training_and_says_why(workflow_dir, shards, tmp_path):
    """`launch.gpus: 1` on this CPU machine: the job stops before training with what torch
    reports, and that message (from the job's log) reaches the console; `gpus: 0` trains."""
    exp = {
        "dataset": "prepared",
        "model": {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]},
        "train": {"steps": 6, "eval_every": 3, "batch_size": 32},
    }
    cfg = {
        "datasets": {"prepared": {"domain": "jets", "source": {"prepared": str(shards)}}},
        "experiments": {
            "on-gpu": {**exp, "launch": {"gpus": 1, "threads": 1}},
            "on-cpu": {**exp, "launch": {"gpus": 0, "threads": 1}},
        },
    }
    path = write_config(tmp_path / "gpu.yaml", cfg)
    runs = workflow_dir / "results" / "prepared" / "runs"
    r = run_snakemake(
        workflow_dir,
        "--configfile",
        str(path),
        "--replace-workflow-config",
        "--keep-going",
        "results/prepared/runs/on-gpu/model.pt",
        "results/prepared/runs/on-cpu/model.pt",
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "voxjet launch: error: launch.gpus: 1 GPU(s) asked for, but" in out, out[-3000:]
    assert "or set launch.gpus: 0 to run on the CPU" in out
    assert (runs / "on-cpu" / "model.pt").is_file()
    assert not (runs / "on-gpu" / "checkpoints").exists()  # stopped before training began


@pytest.mark.slow
def test_predict_section_applies_the_sweeps_best_run_in_chunks(workflow_dir, shards, tmp_path):
    """`snakemake --until predict`: the experiment's runs train, and the best of them scores
    new files, two files a job."""
    from voxjet.jets.synth import ToyJetsConfig, generate_dataset

    generate_dataset(tmp_path / "new", ToyJetsConfig(files_per_class=1, jets_per_file=40,
                     classes=["QCD", "Wqq", "Tbqq"], seed=11), progress=False)  # fmt: skip
    cfg = {
        "datasets": {"prep": {"domain": "jets", "source": {"prepared": str(shards)}}},
        "experiments": {
            "pfn": {
                "dataset": "prep",
                "model": {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]},
                "train": {"steps": 6, "eval_every": 3, "batch_size": 32},
                "sweep": {"train.lr": [0.001, 0.003]},
                "launch": {"gpus": 0, "threads": 1},
            }
        },
        "predict": {"new": {"experiment": "pfn", "input": str(tmp_path / "new"),
                            "files_per_job": 2, "observers": ["jet_pt"]}},
    }  # fmt: skip
    write_config(workflow_dir / "config" / "config.yaml", cfg)
    r = run_snakemake(workflow_dir, *README["predict"][1:])  # as README shows it
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = job_counts(r.stdout + r.stderr)
    assert jobs["predict"] == 2 and jobs["train_jets"] == 2
    out = workflow_dir / "results" / "predict" / "new"
    assert sorted(p.name for p in out.rglob("*.root")) == ["QCD_000.root", "Tbqq_000.root",
                                                            "Wqq_000.root"]  # fmt: skip
    log = (workflow_dir / "logs" / "predict" / "new" / "0000.log").read_text()
    assert "the best of 2 runs by validation score" in log


def test_cross_validation_folds_are_one_job_each_and_predict_takes_all_of_them(
    workflow_dir, demo_config, tmp_path
):
    """`folds: 5` on a volumes experiment: five training jobs (one a fold), and a predict
    section naming the experiment ensembles their five models in each job."""
    demo_config["experiments"]["unet"]["folds"] = 5
    demo_config["experiments"]["unet"].pop("sweep")
    (tmp_path / "new_0000.nii.gz").write_bytes(b"")  # the dry run only lists the inputs
    demo_config["predict"] = {"new": {"experiment": "unet", "input": str(tmp_path)}}
    write_config(workflow_dir / "config" / "config.yaml", demo_config)
    r = run_snakemake(workflow_dir, "-n", "-p", "--until", "predict")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    jobs = job_counts(r.stdout)
    assert jobs["train_seg"] == 5 and jobs["predict"] == 1
    blocks = r.stdout.split("\nrule ")
    (predict,) = [b for b in blocks if b.startswith("predict:")]
    for k in range(5):
        assert f"results/toy_ct/runs/unet_fold-{k}/model.pt" in predict
    train = [b for b in blocks if b.startswith("train_seg:")]
    assert sorted(re.search(r'"fold": (\d)', b).group(1) for b in train) == list("01234")


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda c: c["experiments"]["unet"]["model"].update(channels=[8, 16, 32, 64, 128]),
         "experiments.unet.model.channels': a U-Net of 5 levels halves each axis 4 times, but "
         "the plan's patch divides by 2^3 only (datasets.toy_ct.volumes.network_depth: 3)"),
        (lambda c: c["experiments"]["unet"].update(model={"name": "pfn"}),
         "experiments.unet.model.name': 'pfn' is a jet tagger, but dataset 'toy_ct' holds "
         "volumes"),
        (lambda c: c["experiments"]["unet"].update(model={"name": "unet"}),
         "experiments.unet.model': 'channels' is a required property"),
        (lambda c: c["datasets"]["toy_ct"]["volumes"].update(test_fraction=0),
         "datasets.toy_ct.volumes.test_fraction'"),
        (lambda c: c["experiments"]["pfn"].update(folds=3),
         "experiments.pfn.folds': cross-validation folds are for volumes datasets"),
    ],
)  # fmt: skip
def test_a_model_that_does_not_fit_its_dataset_stops_the_dry_run(
    workflow_dir, demo_config, change, message
):
    change(demo_config)
    write_config(workflow_dir / "config" / "config.yaml", demo_config)
    r = run_snakemake(workflow_dir, "-n")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Job stats" not in out
    assert message in out, out[-3000:]


def test_a_sweep_on_auto_gpus_follows_the_planners_allocation(workflow_dir, shards, tmp_path):
    """8 runs, `launch.gpus: auto`, a budget of 8 GPUs on nodes of 4: before the plan the dry
    run lists the planning and the runs waiting for it (their GPUs are read from the plan just
    before they run); with a plan that chose 8 GPUs a run, every job asks for 2 nodes of 4
    GPUs; without a budget the config check refuses `auto`."""
    exp = {"dataset": "prepared", "model": {"name": "pfn", "phi_sizes": [16], "f_sizes": [16]},
           "train": {"steps": 6, "batch_size": 32},
           "sweep": {"train.lr": [1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2]},
           "launch": {"gpus": "auto", "threads": 1}}  # fmt: skip
    cfg = {"datasets": {"prepared": {"domain": "jets", "source": {"prepared": str(shards)}}},
           "experiments": {"pfn": exp}, "site": {"gpu_budget": 8, "gpus_per_node": 4}}  # fmt: skip
    path = write_config(tmp_path / "auto.yaml", cfg)
    args = ("-n", "-p", "--configfile", str(path), "--replace-workflow-config")
    before = run_snakemake(workflow_dir, *args)
    assert before.returncode == 0, before.stderr[-3000:]
    assert "rule plan_runs" in before.stdout and job_counts(before.stdout)["plan_runs"] == 1
    plan = workflow_dir / "results" / "plan" / "runs.json"
    plan.parent.mkdir(parents=True)
    options = [{"processes": n, "slots": 8 // n, "makespan_s": 3600.0 / n, "device_hours": 8.0}
               for n in (1, 2, 4, 8)]  # fmt: skip
    plan.write_text(json.dumps({"runs": [], "allocation": {"budget": 8, "choice": 8,
                                                           "options": options}}))  # fmt: skip
    after = run_snakemake(workflow_dir, *args)
    assert after.returncode == 0, after.stderr[-3000:]
    train = [b for b in after.stdout.split("\nrule ") if b.startswith("train_jets")]
    assert len(train) == 8
    for b in train:
        assert "gres=gpu:4" in b and "-- launch --gpus 4 --cpu-processes 1 --nodes 2" in b, b
    del cfg["site"]["gpu_budget"]
    refused = run_snakemake(workflow_dir, "-n", "--configfile",
                            str(write_config(tmp_path / "nobudget.yaml", cfg)),
                            "--replace-workflow-config")  # fmt: skip
    assert refused.returncode != 0
    assert "launch.gpus': auto takes the planner's sweep allocation, which needs " \
           "site.gpu_budget" in refused.stdout + refused.stderr  # fmt: skip
