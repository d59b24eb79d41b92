"""Label sets checked as nnU-Net's verify_dataset_integrity checks them: label values
consecutive from 0, every declared label in some training case, no undeclared value; and
`voxjet relabel`, the fix the refusal names."""

from __future__ import annotations

import json
import subprocess

import nibabel as nib
import numpy as np
import pytest
from conftest import BIN
from readme import README

from voxjet.errors import VoxjetError
from voxjet.volumes.dataset.msd import load_dataset
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset
from voxjet.volumes.plan.planning import plan_dataset


@pytest.fixture
def toy(tmp_path):
    small = ToyVolumesConfig(train_cases=4, test_cases=1, min_shape=(40, 40, 16),
                             max_shape=(44, 44, 18))  # fmt: skip
    return generate_dataset(tmp_path / "toy", small, progress=False)


def _renumber(root, old: int, new: int) -> None:
    """Every label file's value `old` written as `new`, and dataset.json to match."""
    meta = json.loads((root / "dataset.json").read_text())
    meta["labels"] = {(str(new) if k == str(old) else k): v for k, v in meta["labels"].items()}
    (root / "dataset.json").write_text(json.dumps(meta))
    for path in (root / "labelsTr").glob("*.nii.gz"):
        img = nib.load(path)
        data = np.asarray(img.dataobj).astype(np.uint8)
        data[data == old] = new
        nib.save(nib.Nifti1Image(data, img.affine), path)


def test_labels_0_1_3_are_refused_naming_them_and_relabel_fixes_it(toy, tmp_path):
    _renumber(toy, 2, 3)  # the lesion: 0, 1, 3
    said = r"label values \[0, 1, 3\] are not consecutive integers from 0 .*--map 3:2"
    with pytest.raises(VoxjetError, match=said):
        load_dataset(toy)
    (tmp_path / "data").mkdir()
    toy = toy.rename(tmp_path / "data" / "Task01_lesions")  # where README's command has it
    fixed = tmp_path / "data" / "Task01_lesions_relabelled"
    r = subprocess.run([str(BIN / "voxjet"), *README["relabel"][1:]], cwd=tmp_path,
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    ds = load_dataset(fixed)
    assert sorted(ds.labels) == [0, 1, 2]
    plan = plan_dataset(ds, VolumePrepConfig())
    assert plan["fingerprint"]["cases"] >= 2 and not plan["skipped"]
    values = {int(v) for c in ds.cases for v in np.unique(nib.load(ds.path(c.label)).dataobj)}
    assert values == {0, 1, 2}
    assert (toy / "dataset.json").read_text() != (fixed / "dataset.json").read_text()


def test_a_declared_label_no_training_case_has_is_refused(toy):
    meta = json.loads((toy / "dataset.json").read_text())
    meta["labels"]["3"] = "metastasis"  # declared, in no case
    (toy / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(VoxjetError, match=r"label\(s\) \{3: 'metastasis'\} are declared but in "
                       r"none of the 4 labelled cases"):  # fmt: skip
        plan_dataset(load_dataset(toy), VolumePrepConfig())


def test_an_undeclared_value_is_refused_naming_the_case(toy):
    meta = json.loads((toy / "dataset.json").read_text())
    meta["labels"].pop("2")  # the lesion's value stays in the files
    (toy / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(VoxjetError, match=r"labelsTr/toy_00\d\.nii\.gz: label values \[2\] are "
                       "not declared"):  # fmt: skip
        plan_dataset(load_dataset(toy), VolumePrepConfig())
