"""The best configuration (nnU-Net's find_best_configuration): the choice and the post-processing
equal a hand computation on stored fold predictions; the folds' validation predictions come from
evaluate-seg --split val; the workflow runs find_best after every fold's validation."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import nibabel as nib
import numpy as np
import pytest
from conftest import job_counts, run_snakemake, toy_cases, write_config
from scipy import ndimage

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.dataset.synth import ToyVolumesConfig
from voxjet.volumes.evaluation.find_best import find_best
from voxjet.volumes.inference.probabilities import PROBABILITIES, save_probabilities
from voxjet.volumes.plan.plan_file import Plan

SMALL = ToyVolumesConfig(
    train_cases=5, test_cases=1, min_shape=(40, 40, 16), max_shape=(48, 48, 20)
)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("best")
    return toy_cases(tmp, SMALL, VolumePrepConfig(patch_size=[32, 32, 16], network_depth=2))


def _references(cases: Path) -> dict[str, np.ndarray]:
    splits = json.loads((cases / "splits.json").read_text())
    out = {}
    for cid in sorted(splits["train"] + splits["val"])[:4]:
        with h5py.File(cases / f"{cid}.h5") as f:
            out[cid] = f["original_label"][...]
    return out


def _probs(labels: np.ndarray, confidence: np.ndarray) -> np.ndarray:
    """Channels-last probabilities whose arg-max is `labels`, `confidence` on it."""
    p = np.repeat(((1 - confidence) / 2)[..., None], 3, axis=-1)
    np.put_along_axis(p, labels[..., None].astype(np.int64), confidence[..., None], axis=-1)
    return p.astype(np.float32)


def _hand_dice(pred: np.ndarray, ref: np.ndarray) -> dict[int, float]:
    """nnU-Net's Dice a class: NaN only where both are empty (a false positive scores 0)."""
    out = {}
    for c in (1, 2):
        both = (pred == c).sum() + (ref == c).sum()
        out[c] = 2 * ((pred == c) & (ref == c)).sum() / both if both else float("nan")
    return out


def _hand_score(maps: dict, refs: dict) -> tuple[dict[int, float], float]:
    per = [_hand_dice(maps[c], refs[c]) for c in refs]
    cls = {k: float(np.nanmean([d[k] for d in per])) for k in (1, 2)}
    return cls, float(np.mean(list(cls.values())))


def _largest(labels: np.ndarray, values: list[int]) -> np.ndarray:
    comp, n = ndimage.label(np.isin(labels, values), np.ones((3, 3, 3)))
    if n <= 1:
        return labels
    keep = np.argmax(np.bincount(comp.ravel())[1:]) + 1
    out = labels.copy()
    out[(comp > 0) & (comp != keep)] = 0
    return out


def _stored_folds(cases: Path, root: Path) -> tuple[dict, dict, dict]:
    """Two configurations' predictions of four validation cases in two folds each: A misses a
    slab of the organ and adds a detached lesion blob; B misses another slab, adds an organ
    blob, and is surer than A on one half of each case and less sure on the other."""
    refs = _references(cases)
    pa, pb = {}, {}
    for i, (cid, ref) in enumerate(refs.items()):
        a, b = ref.copy(), ref.copy()
        x = ref.shape[0]
        a[: x // 3][a[: x // 3] == 1] = 0
        b[2 * x // 3 :][b[2 * x // 3 :] == 1] = 0
        a[:3, -3:, :3] = 2  # a corner (air, far from the body) where B is unsure
        b[-3:, -3:, -3:] = 1
        half = np.zeros(ref.shape, bool)
        half[:, : ref.shape[1] // 2] = True
        pa[cid] = _probs(a, np.full(ref.shape, 0.6))
        pb[cid] = _probs(b, np.where(half, 0.7, 0.45))
        for name, p in (("A", pa[cid]), ("B", pb[cid])):
            save_probabilities(root / f"{name}_fold-{i % 2}" / PROBABILITIES, cid, p)
    configs = {n: [str(root / f"{n}_fold-{k}") for k in (0, 1)] for n in ("A", "B")}
    return refs, {"A": pa, "B": pb}, configs


def test_choice_and_postprocessing_equal_a_hand_computation(cases, tmp_path):
    refs, probs, configs = _stored_folds(cases, tmp_path)
    choice = find_best(str(cases), configs, str(tmp_path / "best"))
    # every candidate's Dice by hand: the float16 probabilities, averaged, arg-max
    stored = {n: {c: p.astype(np.float16).astype(np.float32) for c, p in ps.items()}
              for n, ps in probs.items()}  # fmt: skip
    hand = {}
    for cand in (("A",), ("B",), ("A", "B")):
        maps = {c: (sum(stored[n][c] for n in cand) / len(cand)).argmax(-1) for c in refs}
        hand[cand] = (maps, *_hand_score(maps, refs))
    got = {tuple(c["configurations"]): c for c in choice["candidates"]}
    assert set(got) == set(hand)
    for cand, (_, cls, mean) in hand.items():
        assert got[cand]["dice_mean"] == pytest.approx(mean, abs=1e-9), cand
        assert got[cand]["per_class"]["organ"] == pytest.approx(cls[1], abs=1e-9)
    best = max(hand, key=lambda c: hand[c][2])
    assert tuple(choice["configurations"]) == best and choice["ensemble"] == (len(best) == 2)
    # post-processing by hand: the foreground's largest component, then each class's, each
    # kept only where it raised (the mean, then that class's) Dice
    maps, cls, mean = hand[best]
    trial = {c: _largest(m, [1, 2]) for c, m in maps.items()}
    t_cls, t_mean = _hand_score(trial, refs)
    fg = t_mean > mean
    if fg:
        maps, cls, mean = trial, t_cls, t_mean
    kept = []
    for value, name in ((1, "organ"), (2, "lesion")):
        trial = {c: _largest(m, [value]) for c, m in maps.items()}
        t_cls, t_mean = _hand_score(trial, refs)
        if t_cls[value] > cls[value]:
            maps, cls, mean = trial, t_cls, t_mean
            kept.append(name)
    post = choice["postprocessing"]
    assert post["foreground_largest_component"] == fg
    assert post["largest_component_classes"] == kept
    assert post["dice_mean_after"] == pytest.approx(mean, abs=1e-9)
    # the detached blobs make some step worth keeping, and none is kept that lowered Dice
    assert fg or kept
    assert all(s["kept"] == (s.get("dice_mean_after", s.get("dice_after")) >
                             s.get("dice_mean_before", s.get("dice_before")))
               for s in post["steps"])  # fmt: skip
    saved = json.loads((tmp_path / "best" / "choice.json").read_text())
    assert saved["configurations"] == choice["configurations"]
    assert "(chosen)" in (tmp_path / "best" / "summary.md").read_text()
    # the workflow's summary carries the choice: a row a dataset
    from voxjet.report.aggregate import aggregate

    (tmp_path / "ct" / "best").mkdir(parents=True)
    (tmp_path / "ct" / "best" / "choice.json").write_text(json.dumps(choice))
    aggregate([], tmp_path / "summary", best=[str(tmp_path / "ct" / "best" / "choice.json")])
    summary = (tmp_path / "summary" / "summary.md").read_text()
    row = next(ln for ln in summary.splitlines() if ln.startswith("| ct |"))
    assert f"| {' + '.join(best)} | 4 | {hand[best][2]:.4f} |" in row and f"{mean:.4f} |" in row
    assert ("largest component: foreground" in row) == fg


def test_folds_that_do_not_match_are_refused_naming_the_configuration(cases, tmp_path):
    refs, _, configs = _stored_folds(cases, tmp_path)
    lost = next(iter(refs))
    (Path(configs["B"][0]) / PROBABILITIES / f"{lost}.npz").unlink(missing_ok=True)
    (Path(configs["B"][1]) / PROBABILITIES / f"{lost}.npz").unlink(missing_ok=True)
    with pytest.raises(VoxjetError, match=rf"configuration [AB]: .*{lost}"):
        find_best(str(cases), configs, str(tmp_path / "out"))
    assert not (tmp_path / "out" / "choice.json").exists()
    # a case validated by two folds of one configuration
    refs, probs, configs = _stored_folds(cases, tmp_path / "twice")
    cid = next(iter(refs))
    for k in (0, 1):
        save_probabilities(Path(configs["A"][k]) / PROBABILITIES, cid, probs["A"][cid])
    with pytest.raises(VoxjetError, match=rf"configuration A: case {cid} was validated by two"):
        find_best(str(cases), configs, str(tmp_path / "out"))
    # a damaged probability file
    refs, _, configs = _stored_folds(cases, tmp_path / "bad")
    bad = next((Path(configs["A"][0]) / PROBABILITIES).glob("*.npz"))
    bad.write_bytes(b"not a zip")
    with pytest.raises(VoxjetError, match=rf"{bad.name}: not a readable probability file"):
        find_best(str(cases), configs, str(tmp_path / "out"))
    with pytest.raises(VoxjetError, match="configuration A: no validation probabilities"):
        find_best(str(cases), {"A": [str(tmp_path / "empty")]}, str(tmp_path / "out"))


def test_fold_runs_validate_their_folds_and_predict_applies_the_choice(cases, tmp_path):
    """Two fold runs validate their own folds (probabilities on the original grids), find-best
    chooses from them, and predict with the choice averages the chosen models and applies the
    chosen post-processing to what they predict."""
    from voxjet.predict import run_predict
    from voxjet.volumes.dataset.splits import fold_splits
    from voxjet.volumes.evaluation.evaluate import evaluate
    from voxjet.volumes.postprocessing.connected_components import apply_postprocessing
    from voxjet.volumes.training.train import run

    splits = json.loads((cases / "splits.json").read_text())
    folders, models = [], []
    for fold in (0, 1):
        cfg = {"model": {"name": "unet", "channels": [8, 16], "num_res_units": 0},
               "train": {"steps": 2, "batch_size": 2, "fold": fold, "folds": 2, "eval_every": 2,
                         "iterations_per_epoch": 2}}  # fmt: skip
        run(str(cases), cfg, str(tmp_path / f"run{fold}"))
        models.append(str(tmp_path / f"run{fold}" / "model.pt"))
        folders.append(str(tmp_path / f"val{fold}"))
        m = evaluate(str(cases), models[-1], folders[-1], split="val", probabilities=True)
        _, val = fold_splits(splits, fold, 2, 42, "splits.json")
        assert m["split"] == "val" and sorted(m["per_case"]) == sorted(val)
        files = sorted((Path(folders[-1]) / PROBABILITIES).glob("*.npz"))
        assert [f.name[:-4] for f in files] == sorted(val)
        with h5py.File(cases / f"{val[0]}.h5") as f, np.load(files[0]) as z:
            p = z["probabilities"]
            assert p.shape == (*f.attrs["original_shape"][:3], 3) and p.dtype == np.float16
            assert np.allclose(p.astype(np.float32).sum(-1), 1, atol=5e-3)
    choice = find_best(str(cases), {"unet": folders}, str(tmp_path / "best"),
                       models={"unet": models})  # fmt: skip
    assert choice["configurations"] == ["unet"] and choice["cases"] == 4
    # force a post-processing step, so that predict's applying it shows
    choice["postprocessing"]["largest_component_classes"] = ["organ"]
    (tmp_path / "best" / "choice.json").write_text(json.dumps(choice))
    image = sorted((cases.parent / "msd" / "imagesTs").glob("*.nii.gz"))[0]
    plain = run_predict(models, [str(image)], str(tmp_path / "plain"))[0]
    best = run_predict(models, [str(image)], str(tmp_path / "bestpred"),
                       choice=str(tmp_path / "best" / "choice.json"))[0]  # fmt: skip
    plan = Plan.from_dict(json.loads((cases / "plan.json").read_text()))
    expected = apply_postprocessing(np.asarray(nib.load(plain).dataobj), choice["postprocessing"],
                                    plan.label_set)  # fmt: skip
    assert np.array_equal(np.asarray(nib.load(best).dataobj), expected)
    with pytest.raises(VoxjetError, match="names models this job was not given"):
        run_predict(models[:1], [str(image)], str(tmp_path / "x"),
                    choice=str(tmp_path / "best" / "choice.json"))  # fmt: skip


def test_workflow_validates_every_fold_then_finds_the_best_and_predicts_with_it(
    workflow_dir, demo_config, tmp_path
):
    """Dry run: one validate_seg job a fold run, find_best after all of them, and a predict
    section naming `run: best` waits for the choice and is given every fold model."""
    cfg = json.loads(json.dumps(demo_config))
    cfg["experiments"]["unet"]["folds"] = 2
    cfg["experiments"]["unet2"] = {**cfg["experiments"]["unet"], "sweep": {}}
    (tmp_path / "new_0000.nii.gz").write_bytes(b"")  # the dry run only lists the inputs
    cfg["predict"] = {"new": {"run": "best", "input": str(tmp_path)}}
    write_config(workflow_dir / "config" / "config.yaml", cfg)
    r = run_snakemake(workflow_dir, "-n", "-p", "--until", "predict")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    counts = job_counts(r.stdout)
    assert counts["validate_seg"] == 6 and counts["find_best"] == 1 and counts["train_seg"] == 6
    assert counts["predict"] == 1 and "evaluate_seg" not in counts  # validations, not the test
    (predict,) = [b for b in r.stdout.split("\nrule ") if b.startswith("predict:")]
    assert "--choice results/toy_ct/best/choice.json" in predict
    assert predict.count("model.pt") >= 6
    r = run_snakemake(workflow_dir, "-n", "-p")  # the whole DAG: the summary reports it
    (aggregate,) = [b for b in r.stdout.split("\nrule ") if b.startswith("aggregate:")]
    assert "--best results/toy_ct/best/choice.json" in aggregate
    # the best of a dataset without cross-validated experiments: refused at the dry run
    cfg["experiments"]["unet"].pop("folds")
    cfg["experiments"]["unet2"].pop("folds")
    write_config(workflow_dir / "config" / "config.yaml", cfg)
    r = run_snakemake(workflow_dir, "-n", "--until", "predict")
    assert r.returncode != 0
    assert "predict.new.run': best needs a dataset with cross-validated experiments" in r.stderr
