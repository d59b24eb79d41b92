"""Which cases train, validate and test: the dataset's test split and its train/val split or
cross-validation folds (dataset.json's splits_final.json, or seeded), used alike by planning,
training and evaluation."""

from __future__ import annotations

import numpy as np

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.msd import MSDDataset
from voxjet.volumes.dataset.settings import VolumePrepConfig


def split_cases(case_ids: list[str], cfg: VolumePrepConfig, ds: MSDDataset) -> dict:
    """The splits: dataset.json's folds (splits_final.json) when it has them — then the test
    split is whatever labelled case no fold uses — else a seeded train/val/test split. An
    empty split is an error naming the fraction to change."""
    ids = sorted(case_ids)
    if ds.folds:
        in_folds = {c for f in ds.folds for part in f.values() for c in part}
        folds = [{k: [c for c in f[k] if c in ids] for k in ("train", "val")} for f in ds.folds]
        test = [c for c in ids if c not in in_folds]
        if not test:
            raise VoxjetError(
                f"{ds.root / 'splits_final.json'}: its folds use every case, which leaves none "
                "for the test set the evaluation reports on; leave some cases out of every fold"
            )
        return {"test": test, **folds[0], "folds": folds}
    perm = [ids[i] for i in np.random.default_rng(cfg.seed).permutation(len(ids))]
    n_test = int(round(len(ids) * cfg.test_fraction))
    n_val = int(round(len(ids) * cfg.val_fraction))
    n_test = max(n_test, 1) if cfg.test_fraction > 0 else 0
    n_val = max(n_val, 1) if cfg.val_fraction > 0 else 0
    split = {
        "test": perm[:n_test],
        "val": perm[n_test : n_test + n_val],
        "train": perm[n_test + n_val :],
    }
    if not split["train"]:
        raise VoxjetError(
            f"{len(ids)} cases leave none for training: lower volumes.val_fraction / "
            "volumes.test_fraction or add cases"
        )
    if not split["val"]:
        raise VoxjetError(
            f"volumes.val_fraction={cfg.val_fraction} leaves no validation case of {len(ids)}; "
            "raise it (the best checkpoint is picked on validation cases)"
        )
    return split


def kfold(case_ids: list[str], k: int, seed: int) -> list[dict[str, list[str]]]:
    """k folds of the cases (seeded): each case is validated in exactly one."""
    ids = sorted(case_ids)
    if len(ids) < k:
        raise VoxjetError(f"{k} folds need at least {k} training cases; there are {len(ids)}")
    perm = [ids[i] for i in np.random.default_rng([seed, k]).permutation(len(ids))]
    parts = [perm[i::k] for i in range(k)]
    return [
        {
            "train": sorted(c for j, p in enumerate(parts) if j != i for c in p),
            "val": sorted(parts[i]),
        }
        for i in range(k)
    ]


def fold_splits(splits: dict, fold: int | None, n_folds: int | None, seed: int,
                where: str) -> tuple[list, list]:  # fmt: skip
    """(train, val) case ids of a run: the dataset's split, or fold `fold` of `n_folds`
    (splits_final.json's folds when the dataset has that many, else seeded folds of the
    training and validation cases)."""
    if fold is None:
        return splits["train"], splits["val"]
    folds = splits.get("folds")
    if not folds or (n_folds and len(folds) != n_folds):
        folds = kfold(splits["train"] + splits["val"], n_folds or 5, seed)
    if fold >= len(folds):
        raise VoxjetError(f"{where}: train.fold={fold}, but there are {len(folds)} folds")
    return folds[fold]["train"], folds[fold]["val"]


def evaluation_cases(splits: dict, split: str, settings: dict, seed: int,
                     where: str) -> list[str]:  # fmt: skip
    """The cases an evaluation scores: the test split, or (`val`) the validation cases of the
    run whose training `settings` (fold, folds) made the model."""
    if split == "test":
        cases = splits["test"]
        if not cases:
            raise VoxjetError(
                f"{where}: the test split is empty (a model would be scored on cases it was "
                "selected on); raise the dataset's volumes.test_fraction"
            )
        return cases
    return fold_splits(splits, settings.get("fold"), settings.get("folds"), seed, where)[1]
