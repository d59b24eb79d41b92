"""nnU-Net's configurations beside 3d_fullres: 2d (planned for every dataset, the slice axis the
coarsest; a 2D network applied slice by slice, patches that never mix slices in the loader's or
the device's augmentation) and 3d_lowres (planned by nnU-Net's rule, on its own preprocessed
cases); runs of each train, evaluate and take part in choosing the best configuration."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import h5py
import nibabel as nib
import numpy as np
import pytest
import torch
from conftest import toy_cases

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.dataset.synth import ToyVolumesConfig
from voxjet.volumes.networks.models import build_seg_model
from voxjet.volumes.plan.configurations import plan_2d, slice_axis
from voxjet.volumes.plan.plan_file import Plan
from voxjet.volumes.preprocessing.preprocess import preprocess_dataset
from voxjet.volumes.training.patches import PatchSampler

NET2D = {"kernels": [[3, 3]] * 3, "strides": [[1, 1], [2, 2], [2, 2]], "filters": [4, 8, 16]}


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("deep", [False, True])
def test_the_2d_network_is_applied_to_every_slice_along_its_axis(axis, deep):
    cfg = {"name": "dynunet", "in_channels": 2, "out_channels": 3, "slice_axis": axis,
           "network": NET2D, "deep_supervision": deep}  # fmt: skip
    model = build_seg_model(cfg).train(deep)
    x = torch.randn(2, 2, 8, 12, 16)
    with torch.no_grad():
        out = model(x)
        # by hand: each slice through the 2D network, stacked back along the axis
        ref = torch.stack([model.net(x.select(2 + axis, k)) for k in range(x.shape[2 + axis])],
                          dim=(3 if deep else 2) + axis)  # fmt: skip
    assert out.shape == ((2, 2, 3, 8, 12, 16) if deep else (2, 3, 8, 12, 16))
    assert torch.equal(out, ref)


def _sized(spacing: list[float], median: list[float]) -> dict:
    return {"target_spacing": spacing, "median_shape_resampled": median, "gpu_memory_gb": 8}


@pytest.mark.parametrize(
    "spacing,median,axis",
    [
        ([0.8, 0.8, 5.0], [256, 256, 40], 2),  # thick axial slices
        ([4.0, 0.7, 0.7], [30, 200, 180], 0),  # thick sagittal slices (another orientation)
        ([1.0, 1.0, 1.0], [90, 110, 90], 2),  # isotropic: nnU-Net's first axis (z)
    ],
)
def test_a_2d_configuration_slices_along_the_coarsest_axis(spacing, median, axis):
    c = plan_2d(_sized(spacing, median), 50 * np.prod(median), 1, 3, "voxjet", 8.0, 4)
    assert slice_axis(spacing) == axis and c["slice_axis"] == axis
    patch = c["patch_size"]
    assert patch[axis] == 1 and len(patch) == 3
    in_plane = [p for a, p in enumerate(patch) if a != axis]
    median2 = [m for a, m in enumerate(median) if a != axis]
    assert all(p <= m + 16 for p, m in zip(in_plane, median2, strict=True))
    assert all(len(s) == 2 for s in c["network"]["strides"]) and c["batch_size"] >= 2
    # a 2D network of the plan runs on it, through the slice-wise model, in the memory planned
    model = build_seg_model({"name": "dynunet", "in_channels": 1, "out_channels": 3,
                             "slice_axis": axis, "network": c["network"]})  # fmt: skip
    with torch.device("meta"):
        assert model(torch.empty(1, 1, *patch, device="meta")).shape == (1, 3, *patch)


def test_3d_lowres_only_where_the_patch_covers_less_than_a_quarter_of_the_median_case():
    from voxjet.volumes.plan.configurations import plan_lowres

    # thick slices, cases 4x the patch in-plane: the fine axes coarsen first (nnU-Net's rule)
    sized = {"target_spacing": [0.8, 0.8, 3.0], "median_shape_resampled": [256, 256, 40],
             "patch_size": [64, 64, 48]}  # fmt: skip
    low = plan_lowres(sized, 20, 1, 3, "voxjet", 8.0, 4, patch=[64, 64, 40])
    assert low is not None
    sp, median = low["target_spacing"], low["median_shape_resampled"]
    assert sp[2] == 3.0 and sp[0] == sp[1] > 0.8  # x and y coarsened, z untouched
    assert median == [round(256 * 0.8 / sp[0])] * 2 + [40]
    cover = np.prod(low["patch_size"]) / np.prod(median)
    before = np.prod(low["patch_size"]) / (40 * (256 * 0.8 / (sp[0] / 1.03)) ** 2)
    assert before < 0.25 <= cover  # the first spacing, 3% steps, at which the patch covers
    assert (256 / median[0]) ** 2 >= 2  # at least half the voxels gone, else nnU-Net drops it
    # the patch covers a quarter already: no low-resolution stage
    assert plan_lowres({**sized, "patch_size": [128, 128, 40]}, 20, 1, 3, "voxjet", 8.0, 4) is None


def test_a_plan_without_the_configuration_is_refused_naming_the_rerun():
    plan = Plan(labels={0: "background", 1: "a"}, num_classes=2, channels=["CT"],
                normalization=["ct"], target_spacing=[1.0] * 3, patch_size=[32, 32, 16],
                batch_size=2)  # fmt: skip
    with pytest.raises(VoxjetError, match=r"plan.json: the plan has no '2d' .*-R plan_volumes"):
        plan.configured("2d", "cases/plan.json")
    assert plan.configured("3d_fullres", "x").patch_size == [32, 32, 16]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


class _Array:
    """An in-memory array read as the case stores read theirs (`read(lo, hi, out)`)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.shape, self.dtype = a, a.shape, a.dtype

    def read(self, lo, hi, out=None):
        got = self.a[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))]
        if out is None:
            return got.copy()
        out[...] = got
        return out


class _SlicedStore:
    """One case whose label is its slice number along `axis` (1, 2, …): a patch that mixed
    slices would hold two numbers."""

    remote = prefetching = False
    case_ids = ["c"]

    def __init__(self, axis: int) -> None:
        shape = [20, 22, 24]
        k = np.arange(1, shape[axis] + 1, dtype=np.uint8)
        self.label = np.broadcast_to(np.expand_dims(k, [a for a in range(3) if a != axis]),
                                     shape).copy()  # fmt: skip
        self.image = self.label[None].astype(np.float32)

    def volumes(self, case):
        return _Array(self.image), _Array(self.label)

    def foreground(self, case):
        return []


@pytest.mark.parametrize("axis", [0, 2])
@pytest.mark.parametrize("on", ["loader", "device"])
def test_augmented_2d_patches_never_mix_slices(axis, on):
    from voxjet.volumes.training.augment import augment_batch, params_of

    patch = [16, 16, 16]
    patch[axis] = 1
    sampler = PatchSampler(_SlicedStore(axis), patch, 8, 0.0, seed=3, augment=True,
                           spacing=[1.0, 1.0, 1.0], augment_on=on, slice_axis=axis)  # fmt: skip
    turned = 0
    for index in range(12):
        b = sampler.batch(0, 0, index)
        if on == "device":
            turned += int(b["aug_spatial"].sum())
            augment_batch(b["image"], b["label"], params_of(b), (b["big_image"], b["big_label"]))
        for i, src in enumerate(b["source"]):
            centre = json.loads(src.split("@")[1])
            values = set(np.unique(b["label"][i].numpy()).tolist()) - {0}
            assert values == {centre[axis] + 1}, (src, values)
    assert on == "loader" or turned > 0


def test_a_2d_run_trains_evaluates_exports_and_ensembles_with_3d(tmp_path):
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.inference.export import export_torchscript_unet
    from voxjet.volumes.networks.models import load_trained
    from voxjet.volumes.training.train import run

    small = ToyVolumesConfig(train_cases=4, test_cases=1, min_shape=(36, 36, 12),
                             max_shape=(40, 40, 14))  # fmt: skip
    toy_cases(tmp_path, small, VolumePrepConfig(patch_size=[32, 32, 8], network_depth=2,
                                                val_fraction=0.25, test_fraction=0.2))  # fmt: skip
    plan = json.loads((tmp_path / "cases" / "plan.json").read_text())
    two = plan["configurations"]["2d"]
    assert two["slice_axis"] == 2 and two["patch_size"][2] == 1  # the toy CT: thick z slices
    cfg = {"configuration": "2d", "model": {"name": "dynunet", "deep_supervision": True},
           "train": {"steps": 4, "eval_every": 2, "batch_size": 4, "augment": True}}  # fmt: skip
    run(str(tmp_path / "cases"), cfg, str(tmp_path / "run"))
    model, saved = load_trained(tmp_path / "run" / "model.pt")
    mc = saved["model_config"]
    assert mc["slice_axis"] == 2 and mc["plan"]["configuration"] == "2d"
    assert mc["patch_size"] == two["patch_size"]
    m = evaluate(str(tmp_path / "cases"), str(tmp_path / "run" / "model.pt"),
                 str(tmp_path / "eval"), mirror=True)  # fmt: skip
    assert m["n_cases"] == 1 and 0 <= m["dice_mean"] <= 1
    (cid,) = m["per_case"]
    with h5py.File(tmp_path / "cases" / f"{cid}.h5") as f:
        shape = tuple(f.attrs["original_shape"])
    assert nib.load(tmp_path / "eval" / "predictions" / f"{cid}.nii.gz").shape == shape
    assert export_torchscript_unet(model.eval(), mc, tmp_path / "m.ts") < 1e-4
    # case files of another spacing (another configuration's) are refused, naming both
    preprocess_dataset(tmp_path / "manifest.json", tmp_path / "coarse",
                       VolumePrepConfig(patch_size=[32, 32, 8], network_depth=2,
                                        target_spacing=[2.0, 2.0, 4.0], val_fraction=0.25,
                                        test_fraction=0.2))  # fmt: skip
    with pytest.raises(VoxjetError, match=r"coarse/.*\.h5: preprocessed at \[2\.0, 2\.0, 4\.0\]"):
        evaluate(str(tmp_path / "coarse"), str(tmp_path / "run" / "model.pt"),
                 str(tmp_path / "eval_coarse"))  # fmt: skip
    # an ensemble of the 2d and a 3d_fullres model (find-best's pair): each configuration in
    # its own plan space, their probabilities averaged on the image's own grid
    from voxjet.distributed.runtime import init_runtime
    from voxjet.volumes.inference.predict import run_volume_predict

    run(str(tmp_path / "cases"), {**cfg, "configuration": "3d_fullres"}, str(tmp_path / "run3"))
    models = [str(tmp_path / r / "model.pt") for r in ("run", "run3")]
    (image,) = sorted((tmp_path / "msd" / "imagesTs").glob("*.nii.gz"))
    rt = init_runtime()
    soft = []
    for k, path in enumerate(models):
        run_volume_predict([path], [str(image)], _mkdir(tmp_path / f"alone{k}"), rt,
                           probabilities=True)  # fmt: skip
        (p,) = (tmp_path / f"alone{k}").glob("*_probabilities.nii.gz")
        soft.append(nib.load(p).get_fdata())
    (seg,) = run_volume_predict(models, [str(image)], _mkdir(tmp_path / "both"), rt)
    expected = np.argmax((soft[0] + soft[1]) / 2, axis=-1)
    got = np.asarray(nib.load(seg).dataobj)
    assert got.shape == nib.load(image).shape[:3]
    assert (got == expected).mean() > 0.999  # float32 NIfTI round trip of the probabilities
    # pipeline stages are for 3D networks
    with pytest.raises(VoxjetError, match="configuration 2d and train.pipeline_stages"):
        run(str(tmp_path / "cases"), {**cfg, "train": {**cfg["train"], "pipeline_stages": 2}},
            str(tmp_path / "run2"))  # fmt: skip


def test_the_config_check_refuses_2d_where_it_cannot_run(demo_config):
    from voxjet.config import check_config

    schema = Path(__file__).parents[1] / "config" / "schema.yaml"
    cfg = json.loads(json.dumps(demo_config))
    cfg["experiments"]["pfn"]["configuration"] = "2d"
    with pytest.raises(VoxjetError, match=r"experiments.pfn.configuration': 2d is a segm"):
        check_config(cfg, schema)
    cfg = json.loads(json.dumps(demo_config))
    cfg["experiments"]["unet"].update(configuration="2d", train={"pipeline_stages": 2})
    with pytest.raises(VoxjetError, match=r"experiments.unet.train.pipeline_stages'"):
        check_config(cfg, schema)


@pytest.mark.long
@pytest.mark.slow
def test_the_workflow_cross_validates_2d_and_3d_lowres_beside_3d_and_chooses(tmp_path):
    """Real snakemake on tiny data: 3d_fullres, 2d and 3d_lowres experiments, two folds each,
    every fold validated, then the best configuration chosen among them and their pairs."""
    from conftest import copy_workflow, job_counts, run_snakemake, write_config

    wf = copy_workflow(tmp_path / "wf")
    exp = {"dataset": "ct", "folds": 2, "model": {"name": "dynunet"},
           "train": {"steps": 2, "eval_every": 2, "batch_size": 2},
           "launch": {"gpus": 0, "threads": 1}}  # fmt: skip
    cfg = {
        "datasets": {
            "ct": {
                "domain": "volumes",
                "source": {"synthetic": {"train_cases": 4, "test_cases": 1}},
                "volumes": {"patch_size": [32, 32, 16], "network_depth": 2,
                            "val_fraction": 0.25, "test_fraction": 0.2},
            }
        },
        "experiments": {"fullres": exp, "slices": {**exp, "configuration": "2d"},
                        "coarse": {**exp, "configuration": "3d_lowres"},
                        "cascade": {**exp, "configuration": "3d_cascade_fullres",
                                    "previous": "coarse"}},
    }  # fmt: skip
    write_config(wf / "c.yaml", cfg)
    args = ["--cores", "2", "--configfile", "c.yaml", "--replace-workflow-config"]
    # the cascade's jobs wait for every fold of the lowres experiment (the dry run's DAG)
    dry = run_snakemake(wf, *args, "-n", "-p", "results/ct/best/choice.json")
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    for block in dry.stdout.split("\nrule "):
        if block.startswith(("train_seg", "validate_seg")) and "cascade_fold" in block[:400]:
            inputs = block.splitlines()[1]
            assert all(f"coarse_fold-{k}/validation/metrics.json" in inputs for k in (0, 1))
            assert "--previous-validations results/ct/runs/coarse_fold-0/validation" in block
    r = run_snakemake(wf, *args, "results/ct/best/choice.json",
                      "results/ct/runs/cascade_fold-0/eval/metrics.json")  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    counts = job_counts(r.stdout + r.stderr)
    assert counts["train_seg"] == 8 and counts["validate_seg"] == 8
    assert counts["gather_cases"] == 2  # the cases at full and at low resolution
    choice = json.loads((wf / "results/ct/best/choice.json").read_text())
    candidates = {tuple(sorted(c["configurations"])) for c in choice["candidates"]}
    names = ("cascade", "coarse", "fullres", "slices")
    assert candidates == {(n,) for n in names} | set(itertools.combinations(names, 2))
    cascade = torch.load(wf / "results/ct/runs/cascade_fold-0/model.pt", weights_only=False)
    assert cascade["model_config"]["in_channels"] == 1 + 2  # the image, organ and lesion
    test = json.loads((wf / "results/ct/runs/cascade_fold-0/eval/metrics.json").read_text())
    assert test["n_cases"] >= 1
    # predict chains the stages: the lowres models' segmentation of the image fed on; with the
    # fold-0 models of both it equals what evaluation predicted for the test case
    from voxjet.distributed.runtime import init_runtime
    from voxjet.volumes.inference.predict import run_volume_predict

    splits = json.loads((wf / "results/ct/cases/splits.json").read_text())
    cid = splits["test"][0]
    image = wf / "resources/ct/data/imagesTr" / f"{cid}.nii.gz"  # the staged copy
    out = tmp_path / "predicted"
    out.mkdir()
    runs = wf / "results/ct/runs"
    (seg,) = run_volume_predict([str(runs / "cascade_fold-0/model.pt")], [str(image)], out,
                                init_runtime(),
                                previous_models=[str(runs / "coarse_fold-0/model.pt")])  # fmt: skip
    got = np.asarray(nib.load(seg).dataobj)
    evaluated = np.asarray(nib.load(runs / f"cascade_fold-0/eval/predictions/{cid}.nii.gz").dataobj)
    assert got.shape == evaluated.shape and (got == evaluated).mean() > 0.999
    with pytest.raises(VoxjetError, match="give that experiment's fold models"):
        run_volume_predict([str(runs / "cascade_fold-0/model.pt")], [str(image)], out,
                           init_runtime())  # fmt: skip
    # and the workflow's predict of the cascade is given the lowres fold models
    cfg["predict"] = {"new": {"experiment": "cascade", "input": str(image)}}
    write_config(wf / "c.yaml", cfg)
    dry = run_snakemake(wf, *args, "-n", "-p", "--until", "predict")
    (block,) = [b for b in dry.stdout.split("\nrule ") if b.startswith("predict:")]
    assert all(f"coarse_fold-{k}/model.pt" in block.split("--previous-model")[1] for k in (0, 1))
    plans = {}
    for name in names:
        saved = torch.load(wf / f"results/ct/runs/{name}_fold-0/model.pt", weights_only=False)
        plans[name] = saved["model_config"]["plan"]
    assert plans["slices"]["configuration"] == "2d"
    assert plans["coarse"]["configuration"] == "3d_lowres"
    # the low-resolution cases at the coarser spacing, every fold's validation on the
    # original grids (where find_best compared them)
    with h5py.File(next((wf / "results/ct/cases_3d_lowres").glob("*.h5"))) as f:
        assert list(f.attrs["spacing"]) == plans["coarse"]["target_spacing"]
    assert plans["coarse"]["target_spacing"][0] > plans["fullres"]["target_spacing"][0]


def test_a_lowres_segmentation_reaches_the_cascade_as_the_case_files_label_did(tmp_path):
    """The previous stage's label map, given on the original grid (a validation's
    probabilities, or a test prediction), lands in the plan's space exactly where
    preprocessing put the case's own label (flipped, non-RAS and anisotropic cases)."""
    from voxjet.volumes.inference.cascade import CascadeImage, PreviousStage
    from voxjet.volumes.inference.probabilities import save_probabilities
    from voxjet.volumes.preprocessing.store import CaseStore

    small = ToyVolumesConfig(train_cases=4, test_cases=0, min_shape=(36, 36, 12),
                             max_shape=(40, 40, 14))  # fmt: skip
    toy_cases(tmp_path, small, VolumePrepConfig(patch_size=[16, 16, 8], network_depth=2))
    plan = Plan.from_dict(json.loads((tmp_path / "cases" / "plan.json").read_text()))
    cids = sorted(p.stem for p in (tmp_path / "cases").glob("*.h5"))
    val, pred = tmp_path / "fold0" / "validation", tmp_path / "fold0" / "eval" / "predictions"
    pred.mkdir(parents=True)
    refs = {}
    for k, cid in enumerate(cids):
        with h5py.File(tmp_path / "cases" / f"{cid}.h5") as f:
            original = f["original_label"][...]
            refs[cid] = f["label"][...]
            affine = f.attrs["original_affine"]
        if k % 2:  # as a lowres fold validated it: probabilities, channels last
            save_probabilities(val / "probabilities", cid, np.eye(3)[original])
        else:  # as the lowres run predicted a test case
            nib.save(nib.Nifti1Image(original, affine), pred / f"{cid}.nii.gz")
    stage = PreviousStage([str(val)], [str(pred)], plan)
    assert stage.channels == 2
    store = CaseStore(tmp_path / "cases", cids, previous=stage)
    for cid in cids:
        image, _ = store.volumes(cid)
        assert isinstance(image, CascadeImage) and image.shape[0] == 3
        assert np.array_equal(stage.segmentation(cid, store.file(cid).attrs), refs[cid])
        # a region across the image's and the previous stage's channels
        lo, hi = (0, 2, 3, 1), (3, 14, 15, 7)
        got = image.read(lo, hi)
        region = refs[cid][2:14, 3:15, 1:7]
        assert np.array_equal(got[1], region == 1) and np.array_equal(got[2], region == 2)
        assert np.array_equal(got[0], image.image.read((0, 2, 3, 1), (1, 14, 15, 7))[0])
    store.close()
    with pytest.raises(VoxjetError, match=r"case 'nope': no 3d_lowres segmentation"):
        stage.original_labels("nope")


def test_a_cascade_without_its_lowres_folds_is_refused_at_the_config_check(demo_config):
    from voxjet.config import check_config

    schema = Path(__file__).parents[1] / "config" / "schema.yaml"
    base = json.loads(json.dumps(demo_config))
    base["experiments"]["unet"].update(folds=2, sweep={})
    low = {**base["experiments"]["unet"], "configuration": "3d_lowres"}
    casc = {**base["experiments"]["unet"], "configuration": "3d_cascade_fullres"}
    for exps, match in (
        ({"casc": casc}, r"experiments.casc.previous': .*none yet: add one"),
        ({"casc": {**casc, "previous": "unet"}}, r"name one \(none yet.*not 'unet'"),
        ({"low": low, "casc": {**casc, "previous": "low", "folds": 3}},
         r"same `folds:`.*'toy_ct'/3 and 'toy_ct'/2"),
        ({"low": {**low, "folds": None}, "casc": {**casc, "previous": "low"}}, r"same `folds:`"),
    ):  # fmt: skip
        cfg = json.loads(json.dumps(base))
        cfg["experiments"].update(exps)
        with pytest.raises(VoxjetError, match=match):
            check_config(cfg, schema)
    cfg = json.loads(json.dumps(base))
    cfg["experiments"].update({"low": low, "casc": {**casc, "previous": "low"}})
    check_config(cfg, schema)
