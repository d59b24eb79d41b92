"""Reading and writing the image formats users have: NIfTI through nibabel, and NRRD, MHA/MHD
and the rest through SimpleITK (the `voxjet[imaging]` extra), as an array with its axes in
storage order (x, y, z[, channels]) and a RAS affine — one convention for every format, so
reorientation, resampling and writing back are done once."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path

NIFTI_ENDINGS = (".nii.gz", ".nii")
ENDINGS = (*NIFTI_ENDINGS, ".nrrd", ".nhdr", ".mha", ".mhd", ".tif", ".tiff")


def ending_of(path: str | Path) -> str | None:
    """The image file ending of a name (".nii.gz", ".mha", ...), or None."""
    name = str(path).lower()
    return next((e for e in ENDINGS if name.endswith(e)), None)


def _sitk():
    try:
        import SimpleITK as sitk
    except ImportError as e:
        raise VoxjetError(
            "reading .nrrd/.mha/.mhd images needs SimpleITK: pip install 'voxjet[imaging]'"
        ) from e
    return sitk


def _lps_to_ras_affine(direction, spacing, origin) -> np.ndarray:
    aff = np.eye(4)
    aff[:3, :3] = np.asarray(direction, float).reshape(3, 3) @ np.diag(spacing)
    aff[:3, 3] = origin
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ aff  # ITK's physical space is LPS


def read_image(path: str | Path, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(array [x, y, z] or [x, y, z, c] as stored, RAS affine) of an image file; `dtype` None
    keeps the stored type (after the header's scaling, which nibabel applies in float)."""
    path = Path(path)
    try:
        if ending_of(path) in NIFTI_ENDINGS:
            import nibabel as nib

            img = nib.load(str(path))
            data = np.asanyarray(img.dataobj) if dtype is None else np.asarray(img.dataobj, dtype)
            return data, np.asarray(img.affine, float)
        sitk = _sitk()
        img = sitk.ReadImage(str(path))
    except VoxjetError:
        raise
    except Exception as e:
        raise VoxjetError(f"{path}: not a readable image ({e})") from e
    if img.GetDimension() != 3:
        raise VoxjetError(f"{path}: a {img.GetDimension()}-D image; expected 3-D")
    arr = sitk.GetArrayFromImage(img)  # z, y, x[, c]
    arr = np.transpose(arr, (2, 1, 0, *range(3, arr.ndim)))
    arr = arr if dtype is None else arr.astype(dtype, copy=False)
    return arr, _lps_to_ras_affine(img.GetDirection(), img.GetSpacing(), img.GetOrigin())


def write_image(path: str | Path, data: np.ndarray, affine: np.ndarray) -> None:
    """Write `data` [x, y, z] with a RAS affine in the format the name's ending says."""
    path = Path(path)
    if ending_of(path) in NIFTI_ENDINGS or ending_of(path) is None:
        import nibabel as nib

        nib.save(nib.Nifti1Image(data, affine), str(path))
        return
    sitk = _sitk()
    img = sitk.GetImageFromArray(np.transpose(data, (2, 1, 0)))
    lps = np.diag([-1.0, -1.0, 1.0, 1.0]) @ affine
    spacing = np.sqrt((lps[:3, :3] ** 2).sum(0))
    img.SetSpacing([float(s) for s in spacing])
    img.SetDirection([float(v) for v in (lps[:3, :3] / spacing).ravel()])
    img.SetOrigin([float(v) for v in lps[:3, 3]])
    sitk.WriteImage(img, str(path), useCompression=True)


def save_nifti(target: str | Path, data: np.ndarray, affine: np.ndarray) -> None:
    """`data` as a NIfTI file at `target` (named .nii.gz), whole or not at all."""
    import nibabel as nib

    with atomic_path(target) as tmp:
        nib.save(nib.Nifti1Image(data, affine), str(tmp) + ".nii.gz")
        os.replace(str(tmp) + ".nii.gz", tmp)
