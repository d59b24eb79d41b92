"""Config validation (good and bad) and the expansion of sweeps into runs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from voxjet.config import check_config, check_sources, expand_runs, from_dict
from voxjet.errors import VoxjetError
from voxjet.jets.data_config import JetDataConfig

SCHEMA = REPO / "config" / "schema.yaml"


def test_demo_config_is_valid(demo_config):
    check_config(demo_config, SCHEMA)


@pytest.mark.parametrize("example", sorted((REPO / "config" / "examples").glob("*.yaml")))
def test_example_configs_are_valid(example, tmp_path):
    cfg = yaml.safe_load(example.read_text())
    for ds in cfg["datasets"].values():
        weaver = (ds.get("jets") or {}).get("weaver_config")
        if weaver and not (REPO / weaver).exists() and not Path(weaver).exists():
            # a config the user brings (CMS's ak8 one, from weaver-core): its layout here
            from cms_ak8 import ak8_config

            ds["jets"]["weaver_config"] = str(tmp_path / "weaver.yaml")
            (tmp_path / "weaver.yaml").write_text(yaml.safe_dump(ak8_config()))
    check_config(cfg, SCHEMA)


def test_unknown_key_is_named_with_its_path(demo_config):
    bad = copy.deepcopy(demo_config)
    bad["datasets"]["toy_jets"]["jets"]["max_particle"] = 3
    with pytest.raises(VoxjetError, match=r"datasets\.toy_jets\.jets.*unknown key.*max_particle"):
        check_config(bad, SCHEMA)


@pytest.mark.parametrize(
    "key,value,match",
    [
        (
            "augment_on",
            "gpu",
            r"unet\.train\.augment_on': 'gpu' is not one of \['device', 'loader', None\]",
        ),
        ("compile", "yes", r"unet\.train\.compile': expected true or false or null, got 'yes'"),
    ],
)
def test_gpu_settings_are_checked(demo_config, key, value, match):
    bad = copy.deepcopy(demo_config)
    bad["experiments"]["unet"]["train"][key] = value
    with pytest.raises(VoxjetError, match=match):
        check_config(bad, SCHEMA)


def test_wrong_type_names_key_and_expected_type(demo_config):
    bad = copy.deepcopy(demo_config)
    bad["experiments"]["pfn"]["train"]["steps"] = "many"
    with pytest.raises(VoxjetError, match=r"experiments\.pfn\.train\.steps': expected an integer"):
        check_config(bad, SCHEMA)


def test_missing_required_value_is_named(demo_config):
    bad = copy.deepcopy(demo_config)
    del bad["datasets"]["toy_ct"]["source"]
    with pytest.raises(VoxjetError, match=r"datasets\.toy_ct.*'source' is a required property"):
        check_config(bad, SCHEMA)


def test_domain_specific_sections_do_not_mix(demo_config):
    bad = copy.deepcopy(demo_config)
    bad["datasets"]["toy_jets"]["volumes"] = {}
    with pytest.raises(VoxjetError, match=r"datasets\.toy_jets\.volumes"):
        check_config(bad, SCHEMA)


def test_experiment_must_name_a_defined_dataset(demo_config):
    bad = copy.deepcopy(demo_config)
    bad["experiments"]["pfn"]["dataset"] = "nope"
    with pytest.raises(VoxjetError, match=r"experiments\.pfn\.dataset.*'nope'"):
        check_config(bad, SCHEMA)


def test_missing_source_path_is_reported(demo_config, tmp_path):
    cfg = copy.deepcopy(demo_config)
    cfg["datasets"]["toy_jets"]["source"] = {"path": str(tmp_path / "absent")}
    with pytest.raises(VoxjetError, match="absent.*does not exist"):
        check_sources(cfg)
    cfg["datasets"]["toy_jets"]["source"] = {"path": str(tmp_path / "absent" / "*.root")}
    with pytest.raises(VoxjetError, match="does not exist"):
        check_sources(cfg)
    cfg["datasets"]["toy_jets"]["source"] = {"path": str(tmp_path / "*.root")}
    check_sources(cfg)  # an existing folder with a glob is fine even before files exist


def test_missing_file_list_is_reported(demo_config, tmp_path):
    cfg = copy.deepcopy(demo_config)
    cfg["datasets"]["toy_jets"]["source"] = {"file_list": str(tmp_path / "files.txt")}
    check_config(cfg, SCHEMA)
    with pytest.raises(VoxjetError, match=r"source\.file_list': .*files\.txt' does not exist"):
        check_sources(cfg)


def test_sweep_becomes_one_run_per_value(demo_config):
    runs = expand_runs(demo_config)
    jets = sorted(r for r, v in runs.items() if v.domain == "jets" and v.role == "train")
    assert jets == ["part", "particlenet", "pfn_lr-0.001", "pfn_lr-0.003"]
    assert {runs[r].config["train"]["lr"] for r in jets if r.startswith("pfn")} == {0.001, 0.003}
    assert runs["unet_lr-0.003"].params == {"train.lr": 0.003}
    # the experiment's own values stay unchanged by the sweep
    assert demo_config["experiments"]["pfn"]["train"]["lr"] == 0.002


def test_two_sweep_keys_give_the_product(demo_config):
    cfg = copy.deepcopy(demo_config)
    cfg["experiments"]["pfn"]["sweep"] = {"train.lr": [1e-3, 2e-3], "model.phi_sizes": [[8], [16]]}
    runs = expand_runs(cfg).values()
    assert len([r for r in runs if r.experiment == "pfn" and r.role == "train"]) == 4


def test_sweep_of_unknown_section_fails(demo_config):
    cfg = copy.deepcopy(demo_config)
    cfg["experiments"]["pfn"]["sweep"] = {"optim.lr": [1]}
    with pytest.raises(VoxjetError, match="sweep key 'optim.lr'"):
        expand_runs(cfg)


def test_from_dict_refuses_unknown_keys():
    with pytest.raises(VoxjetError, match="unknown keys.*'bogus'"):
        from_dict(JetDataConfig, {"bogus": 1}, "jets config")


def test_names_stay_when_a_sweep_grows(demo_config):
    """A new sweep key whose list holds the experiment's current value (or its default) and a
    new value added to a list leave every existing run's name, and its config, alone."""
    from voxjet.config import with_defaults

    cfg = with_defaults(demo_config, SCHEMA)
    before = expand_runs(cfg)
    grown = copy.deepcopy(cfg)
    sweep = grown["experiments"]["pfn"]["sweep"]
    sweep["train.lr"] = [0.001, 0.003, 0.01]
    sweep["train.weight_decay"] = [0.0001, 0.001]  # 0.0001 is the default
    after = expand_runs(grown)
    assert set(before) <= set(after)
    for name in before:
        assert after[name].config == before[name].config
    new = sorted(set(after) - set(before))
    assert new == [
        "pfn_lr-0.001_weight_decay-0.001",
        "pfn_lr-0.003_weight_decay-0.001",
        "pfn_lr-0.01",
        "pfn_lr-0.01_weight_decay-0.001",
    ]


def test_repeats_are_runs_with_other_seeds(demo_config):
    cfg = copy.deepcopy(demo_config)
    cfg["experiments"]["part"]["repeats"] = 3
    cfg["experiments"]["part"]["train"]["seed"] = 5
    runs = expand_runs(cfg)
    reps = sorted(r for r in runs if runs[r].experiment == "part")
    assert reps == ["part", "part_rep-1", "part_rep-2"]
    assert [runs[r].config["train"]["seed"] for r in reps] == [5, 6, 7]
    from voxjet.report.runs import run_infos

    infos = {i.run: i for i in run_infos(runs.values())}
    assert {infos[r].group for r in reps} == {"part"} and infos["part_rep-2"].params == {}


def test_credentials_in_storage_options_are_refused(demo_config):
    cfg = copy.deepcopy(demo_config)
    cfg["datasets"]["toy_jets"]["read"] = {"storage_options": {"secret": "hunter2"}}
    with pytest.raises(VoxjetError, match=r"read\.storage_options\.secret': credentials do not"):
        check_config(cfg, SCHEMA)
    cfg["datasets"]["toy_jets"]["read"] = {
        "storage_options": {"client_kwargs": {"aws_session_token": "x"}}
    }
    with pytest.raises(VoxjetError, match=r"AWS_ACCESS_KEY_ID"):
        check_config(cfg, SCHEMA)
    cfg["datasets"]["toy_jets"]["read"] = {"storage_options": {"profile": "mine", "anon": False}}
    check_config(cfg, SCHEMA)


@pytest.mark.parametrize(
    "jets,match",
    [
        # a label hidden in a variable: trains to AUC 1.0 on a tagger that knows nothing
        ({"new_variables": {"leak": "part_deta * 0 + label_Tbqq"},
          "particle_features": ["part_deta", "leak"]},
         r"jets.particle_features': the input 'leak' reads \['label_Tbqq'\] \(through "
         r"jets.new_variables.leak\), a label or generator-level truth branch"),
        # generator-level truth as a feature, directly
        ({"jet_features": ["jet_pt", "aux_genpart_pt"]},
         r"jets.jet_features': the input 'aux_genpart_pt' reads \['aux_genpart_pt'\]"),
        # a label branch not among the classes used is still a label
        ({"jet_features": ["label_Hcc"]}, r"the input 'label_Hcc' reads \['label_Hcc'\]"),
        # ordering the particles by truth leaks too
        ({"new_variables": {"key": "aux_genpart_pt * part_deta"}, "sort_by": "key"},
         r"jets.sort_by': the input 'key' reads \['aux_genpart_pt'\]"),
        # an expression that would never finish is refused, not run
        ({"new_variables": {"huge": "9**9**9"}, "jet_features": ["jet_pt", "huge"]},
         r"jets.new_variables.huge: the exponent '9 \*\* 9'"),
        ({"selection": "jet_pt >"}, r"jets.selection: cannot parse"),
        ({"test_time_selection": "9**9**9 > jet_pt"}, r"jets.test_time_selection: the exponent"),
    ],
)  # fmt: skip
def test_inputs_that_read_the_answer_or_never_finish_are_refused_at_the_check(
    demo_config, jets, match
):
    bad = copy.deepcopy(demo_config)
    bad["datasets"]["toy_jets"]["jets"].update(jets)
    with pytest.raises(VoxjetError, match=match):
        check_config(bad, SCHEMA)


def test_truth_inputs_opt_in_covers_truth_branches_but_never_labels(demo_config):
    ok = copy.deepcopy(demo_config)
    ok["datasets"]["toy_jets"]["jets"].update(
        jet_features=["jet_pt", "aux_genpart_pt"], truth_inputs=["aux_genpart_pt"]
    )
    check_config(ok, SCHEMA)
    bad = copy.deepcopy(demo_config)
    bad["datasets"]["toy_jets"]["jets"].update(
        jet_features=["jet_pt", "label_QCD"], truth_inputs=["label_QCD"]
    )
    with pytest.raises(VoxjetError, match=r"the input 'label_QCD' reads \['label_QCD'\]"):
        check_config(bad, SCHEMA)
    # weaver's spelling of the functions is the same language
    weaver = copy.deepcopy(demo_config)
    weaver["datasets"]["toy_jets"]["jets"]["new_variables"] = {
        "part_pt": "np.hypot(part_px, part_py)",
        "part_mask": "ak.ones_like(part_deta)",
    }
    check_config(weaver, SCHEMA)


def test_a_scaling_study_is_one_short_run_a_size_on_gpus_or_cpu_processes(demo_config):
    cfg = copy.deepcopy(demo_config)
    cfg["experiments"]["part"]["scaling"] = {"gpus": [1, 2], "nodes": [1, 2], "steps": 30}
    cfg["experiments"]["part"]["launch"] = {"gpus": 4}
    runs = expand_runs(cfg)
    scale = {k: r for k, r in runs.items() if r.role == "scaling" and r.experiment == "part"}
    assert sorted(scale) == ["part_scale-1", "part_scale-1x2", "part_scale-2", "part_scale-2x2"]
    r = scale["part_scale-2x2"]
    assert (r.launch.gpus, r.launch.nodes) == (2, 2) and r.params == {"processes": 4, "nodes": 2}
    assert r.config["train"]["steps"] == 30 and r.config["train"]["eval_every"] == 30
    assert r.config["model"] == cfg["experiments"]["part"]["model"]
    cpu = {k: r for k, r in expand_runs(demo_config).items() if r.role == "scaling"}
    assert {k: (r.launch.gpus, r.launch.cpu_processes, r.launch.nodes) for k, r in cpu.items()} == {
        "particlenet_scale-1": (0, 1, 1),
        "particlenet_scale-2": (0, 2, 1),
    }
    assert "lr" not in "".join(cpu)  # the experiment's own settings, not its sweep


@pytest.mark.parametrize(
    "scaling,site,match",
    [
        ({"gpus": [0, 1]}, {},
         r"experiments\.part\.scaling\.gpus\[0\]': expected at least 1, got 0"),
        ({"gpus": [4, 8]}, {"gpus_per_node": 4},
         r"experiments\.part\.scaling\.gpus': 8 GPUs a node, but site\.gpus_per_node is 4"),
        ({"gpus": [2]}, {}, r"all its sizes are \[2\] processes; a fit needs at least two"),
        ({"gpus": [2, 4], "nodes": [1, 2]}, {"gpu_budget": 4},
         r"its largest size is 8 GPUs, but site\.gpu_budget is 4"),
    ],
)  # fmt: skip
def test_scaling_studies_that_cannot_run_or_fit_are_refused(demo_config, scaling, site, match):
    cfg = copy.deepcopy(demo_config)
    cfg["experiments"]["part"]["scaling"] = scaling
    cfg["experiments"]["part"]["launch"] = {"gpus": 1}
    cfg["site"] = site
    with pytest.raises(VoxjetError, match=match):
        check_config(cfg, "config/schema.yaml")


@pytest.mark.parametrize(
    "change,said",
    [
        (lambda c: c["experiments"]["pfn"]["launch"].update(gpus="fast"),
         "experiments.pfn.launch.gpus': expected an integer ≥ 0 or 'auto', got 'fast'"),
        (lambda c: c["datasets"]["toy_jets"]["jets"].update(labels=["label_QCD"]),
         "datasets.toy_jets.jets.labels': needs at least 2 entries, got 1"),
        (lambda c: c["datasets"]["toy_jets"]["jets"].update(labels={"branch": "y"}),
         "datasets.toy_jets.jets.labels': 'classes' is a required property"),
        (lambda c: c["datasets"].update({"my data": c["datasets"]["toy_jets"]}),
         "datasets.my data': a name of letters, digits, '_' and '-' only; e.g. 'my-data'"),
        (lambda c: c["experiments"]["pfn"]["train"].update(lr="1e-3x"),
         "experiments.pfn.train.lr': expected a number, got '1e-3x'"),
        (lambda c: c["experiments"]["pfn"]["train"].update(lrate=0.1),
         "experiments.pfn.train': unknown key(s) ['lrate']; did you mean 'lr'?"),
    ],
)  # fmt: skip
def test_schema_errors_are_said_in_the_users_terms(demo_config, change, said):
    """Every oneOf / pattern / bound of the schema explained by key, never as jsonschema's raw
    "is not valid under any of the given schemas"."""
    cfg = copy.deepcopy(demo_config)
    change(cfg)
    with pytest.raises(VoxjetError) as e:
        check_config(cfg)
    assert said in str(e.value)
    assert "valid under" not in str(e.value) and "{'" not in str(e.value)


def test_numbers_written_as_ml_code_writes_them_become_numbers(demo_config):
    cfg = copy.deepcopy(demo_config)
    cfg["experiments"]["pfn"]["train"]["lr"] = "5e-4"
    cfg["experiments"]["pfn"]["train"]["steps"] = "1e3"
    check_config(cfg)
    assert cfg["experiments"]["pfn"]["train"]["lr"] == 0.0005
    assert cfg["experiments"]["pfn"]["train"]["steps"] == 1000
    assert isinstance(cfg["experiments"]["pfn"]["train"]["steps"], int)


@pytest.mark.parametrize(
    "launch,site,match",
    [
        ({"gpus": 8}, {"gpus_per_node": 4},
         r"launch\.gpus': 8 GPUs a node, but site\.gpus_per_node is 4.*launch\.nodes"),
        ({"gpus": 0, "threads": 64}, {"cores_per_node": 32},
         r"launch\.threads': 64 cores a node, but site\.cores_per_node is 32"),
        ({"gpus": 1, "mem_mb": 900000}, {"mem_mb_per_node": 512000},
         r"launch\.mem_mb': 900000 MB of memory a node, but site\.mem_mb_per_node is 512000"),
    ],
)  # fmt: skip
def test_a_launch_larger_than_a_node_is_refused_naming_both_keys(demo_config, launch, site,
                                                                 match):  # fmt: skip
    bad = copy.deepcopy(demo_config)
    bad["experiments"]["part"]["launch"] = launch
    bad["site"] = site
    with pytest.raises(VoxjetError, match=match):
        check_config(bad, SCHEMA)
    # spread over two nodes, the same GPUs fit
    if "gpus_per_node" in site:
        bad["experiments"]["part"]["launch"] = {"gpus": 4, "nodes": 2}
        check_config(bad, SCHEMA)


def test_gpus_a_node_are_asked_per_node_across_nodes_with_the_sites_model():
    from voxjet.config import Launch, SlurmSite

    site = SlurmSite(gpu_partition="gpu", cpu_partition="cpu", gpu_model="a100")
    one = Launch(gpus=4, threads=8).resources(site)
    assert (one["gpu"], one["gpu_model"], one["gres"]) == (4, "a100", None)
    two = Launch(gpus=4, nodes=2, threads=8).resources(site)
    assert (two["gpu"], two["gpu_model"], two["gres"]) == (None, None, "gpu:a100:4")
    assert (two["nodes"], two["tasks"], two["tasks_per_gpu"], two["mpi"]) == (2, 2, 0, "srun")
    assert two["request_gpus"] == 4 and two["classad_MaxRuntime"] == 120 * 60
    assert Launch(gpus=2, nodes=2).resources(SlurmSite())["gres"] == "gpu:2"
    cpu = Launch(gpus=0, mem_mb=3000).resources(site)
    assert cpu["slurm_partition"] == "cpu" and cpu["request_gpus"] is None
    assert cpu["htcondor_request_mem_mb"] == cpu["mem_mb"] == 3000


@pytest.mark.parametrize("where", ["train", "sweep"])
def test_a_key_the_workflow_sets_is_refused_naming_the_one_meant(demo_config, where):
    """`train: {folds: 2}` would train one run and no cross-validation, with no word."""
    bad = copy.deepcopy(demo_config)
    if where == "train":
        bad["experiments"]["unet"]["train"]["folds"] = 2
    else:
        bad["experiments"]["unet"]["sweep"] = {"train.fold": [0, 1]}
    key = "train.folds" if where == "train" else "sweep.train.fold"
    with pytest.raises(VoxjetError, match=rf"'experiments\.unet\.{key}': the workflow sets "
                       r"train\.folds? for each run itself.*experiments\.unet"):  # fmt: skip
        check_config(bad, SCHEMA)
