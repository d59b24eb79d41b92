"""nnU-Net 2.8.1's ResEnc presets (`nnUNetPlannerResEncM/L/XL`) against voxjet's
`volumes.plan: resenc_m|l|xl` on the demo's toy CT set: nnU-Net's fingerprint and planner run as
its command lines run them; voxjet plans from that fingerprint (axes turned to RAS) and from its
own. Prints patch, batch and topology side by side; `--record` writes nnU-Net's fingerprint and
plans to tests/data/nnunet_resenc_toy_ct.json, which tests/test_resenc.py compares with where
nnU-Net is not installed.

    .venv-bench/bin/python benchmarks/resenc_plans.py [--record]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
RECORD = ROOT / "tests" / "data" / "nnunet_resenc_toy_ct.json"
PLANNERS = {"resenc_m": "nnUNetPlannerResEncM", "resenc_l": "nnUNetPlannerResEncL",
            "resenc_xl": "nnUNetPlannerResEncXL"}  # fmt: skip
COMPARED = ("patch_size", "batch_size", "strides", "kernels")


def toy_ct(root: Path) -> Path:
    """The demo's toy CT set (its synthetic settings from config/demo-full.yaml)."""
    import yaml

    from voxjet.volumes.dataset.synth import ToyVolumesConfig, generate_dataset

    cfg = yaml.safe_load((ROOT / "config" / "demo-full.yaml").read_text())
    synth = cfg["datasets"]["toy_ct"]["source"]["synthetic"]
    return generate_dataset(root / "msd", ToyVolumesConfig(**synth), progress=False)


def nnunet_plans(msd: Path, root: Path, scale: int = 1) -> dict:
    """nnU-Net's fingerprint of the dataset and each preset's 3d_fullres plan (its axis order);
    with `scale`, the fingerprint's case shapes times that before planning (cases as large as
    a clinical CT's, so the presets shrink the patch and size the batch to their memory)."""
    import nnunet_peer

    environ = nnunet_peer.env(root)
    nnunet_peer.to_raw(msd, root)
    d = str(nnunet_peer.DATASET_ID)
    exe = Path(sys.executable).parent
    run = {"env": environ, "check": True, "capture_output": True}
    subprocess.run([str(exe / "nnUNetv2_extract_fingerprint"), "-d", d, "-np", "1"], **run)
    prep = root / "nnUNet_preprocessed" / nnunet_peer.NAME
    fp = json.loads((prep / "dataset_fingerprint.json").read_text())
    if scale != 1:
        fp["shapes_after_crop"] = [[n * scale for n in s] for s in fp["shapes_after_crop"]]
        (prep / "dataset_fingerprint.json").write_text(json.dumps(fp))
    kept = {k: fp[k] for k in ("spacings", "shapes_after_crop")}
    out = {"fingerprint": kept, "scale": scale, "plans": {}, "plans_2d": {}, "plans_lowres": {}}
    for preset, planner in PLANNERS.items():
        subprocess.run([str(exe / "nnUNetv2_plan_experiment"), "-d", d, "-pl", planner], **run)
        name = {"resenc_m": "M", "resenc_l": "L", "resenc_xl": "XL"}[preset]
        plans = json.loads((prep / f"nnUNetResEncUNet{name}Plans.json").read_text())
        for key, conf in (
            ("plans", "3d_fullres"),
            ("plans_2d", "2d"),
            ("plans_lowres", "3d_lowres"),
        ):
            if conf not in plans["configurations"]:  # no 3d_lowres: the patch covers the case
                out[key][preset] = None
                continue
            c = plans["configurations"][conf]
            arch = c["architecture"]["arch_kwargs"]
            out[key][preset] = {
                "patch_size": c["patch_size"],
                "batch_size": c["batch_size"],
                "spacing": c["spacing"],
                "strides": arch["strides"],
                "kernels": arch["kernel_sizes"],
                "features_per_stage": arch["features_per_stage"],
                "n_blocks_per_stage": arch["n_blocks_per_stage"],
                "transpose_forward": plans["transpose_forward"],
            }
    return out


def voxjet_from(fingerprint: dict, preset: str, in_channels: int = 1, outputs: int = 3) -> dict:
    """voxjet's plan from nnU-Net's fingerprint, its (z, y, x) axes turned to RAS."""
    from voxjet.volumes.plan.resenc import plan_resenc_dataset

    sp = [list(reversed(s)) for s in fingerprint["spacings"]]
    sh = [list(reversed(s)) for s in fingerprint["shapes_after_crop"]]
    return plan_resenc_dataset(sp, sh, in_channels, outputs, preset)


def voxjet_2d_from(fingerprint: dict, preset: str, in_channels: int = 1,
                   outputs: int = 3) -> dict:  # fmt: skip
    """voxjet's 2d configuration from nnU-Net's fingerprint, in nnU-Net's axis order."""
    import numpy as np

    from voxjet.volumes.plan.configurations import in_plane, plan_2d

    sized = voxjet_from(fingerprint, preset, in_channels, outputs)
    voxels = float(np.prod(sized["median_shape_resampled"]) * len(fingerprint["spacings"]))
    c = plan_2d(sized, voxels, in_channels, outputs, preset, sized["gpu_memory_gb"], 4)
    order = sized["nnunet_axes"]
    uv = in_plane(c["slice_axis"])
    to_nn = [uv.index(a) for a in order[1:]]
    return {
        "patch_size": c["nnunet_patch_size"],
        "batch_size": c["batch_size"],
        "strides": [[s[i] for i in to_nn] for s in c["network"]["strides"]],
        "kernels": [[k[i] for i in to_nn] for k in c["network"]["kernels"]],
        "slice_axis": c["slice_axis"],
    }


def voxjet_lowres_from(fingerprint: dict, preset: str, in_channels: int = 1,
                       outputs: int = 3) -> dict | None:  # fmt: skip
    """voxjet's 3d_lowres configuration from nnU-Net's fingerprint (None where it plans
    none), in nnU-Net's axis order."""
    from voxjet.volumes.plan.configurations import plan_lowres

    sized = voxjet_from(fingerprint, preset, in_channels, outputs)
    c = plan_lowres(sized, len(fingerprint["spacings"]), in_channels, outputs, preset,
                    sized["gpu_memory_gb"], 4)  # fmt: skip
    if c is None:
        return None
    return {**in_nnunet_axes(c), "spacing": [c["target_spacing"][a] for a in c["nnunet_axes"]]}


def in_nnunet_axes(plan: dict) -> dict:
    """A voxjet plan's patch and topology in nnU-Net's axis order."""
    order = plan["nnunet_axes"]
    net = plan["network"]
    return {
        "patch_size": [plan["patch_size"][a] for a in order],
        "batch_size": plan["batch_size"],
        "spacing": [plan["target_spacing"][a] for a in order],
        "strides": [[s[a] for a in order] for s in net["strides"]],
        "kernels": [[k[a] for a in order] for k in net["kernels"]],
        "features_per_stage": net["filters"],
        "n_blocks_per_stage": net["blocks_per_stage"],
    }


def voxjet_own(msd: Path, preset: str) -> dict:
    """voxjet's plan from its own fingerprint of every training case (as nnU-Net's covers)."""
    from voxjet.volumes.dataset.msd import load_dataset
    from voxjet.volumes.dataset.settings import VolumePrepConfig
    from voxjet.volumes.plan.fingerprint import inspect_cases
    from voxjet.volumes.plan.resenc import plan_resenc_dataset

    ds = load_dataset(msd)
    stats, _ = inspect_cases(ds, [c.case_id for c in ds.cases], VolumePrepConfig())
    return plan_resenc_dataset([s["spacing"] for s in stats.values()],
                               [s["shape"] for s in stats.values()], 1, 3, preset)  # fmt: skip


def _other_table(refs: dict, key: str, voxjet_of) -> None:
    """One configuration's rows (nnU-Net's beside voxjet's from the same fingerprint); a
    configuration a planner does not plan is `none`."""
    print("| cases | preset | planner | spacing | patch (nnU-Net's axes) | batch | as nnU-Net's |")
    print("|---|---|---|---|---|---|---|")
    for name, ref in refs.items():
        for preset, theirs in ref[key].items():
            mine = voxjet_of(ref["fingerprint"], preset)
            for who, p in (("nnU-Net 2.8.1", theirs), ("voxjet, nnU-Net's fingerprint", mine)):
                if p is None:
                    same = (mine is None) == (theirs is None)
                    print(f"| {name} | {preset} | {who} | none | | | {'yes' if same else 'NO'} |")
                    continue
                same = theirs is not None and all(p[k] == theirs[k] for k in COMPARED)
                sp = ", ".join(f"{x:.3f}" for x in p.get("spacing", []))
                print(f"| {name} | {preset} | {who} | {sp} | {p['patch_size']} | "
                      f"{p['batch_size']} | {'yes' if same else 'NO'} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--record", action="store_true", help=f"write {RECORD.relative_to(ROOT)}")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        msd = toy_ct(Path(tmp))
        refs = {"toy_ct": nnunet_plans(msd, Path(tmp) / "nnunet"),
                "toy_ct_x6": nnunet_plans(msd, Path(tmp) / "nnunet_x6", scale=6)}  # fmt: skip
        own = {p: in_nnunet_axes(voxjet_own(msd, p)) for p in PLANNERS}
    print("| cases | preset | planner | patch (nnU-Net's axes) | batch | stages | as nnU-Net's |")
    print("|---|---|---|---|---|---|---|")
    for name, ref in refs.items():
        for preset, theirs in ref["plans"].items():
            mine = in_nnunet_axes(voxjet_from(ref["fingerprint"], preset))
            rows = [("nnU-Net 2.8.1", theirs), ("voxjet, nnU-Net's fingerprint", mine)]
            if name == "toy_ct":
                rows.append(("voxjet, its own fingerprint", own[preset]))
            for who, p in rows:
                same = all(p[k] == theirs[k] for k in COMPARED)
                print(f"| {name} | {preset} | {who} | {p['patch_size']} | {p['batch_size']} | "
                      f"{len(p['strides'])} | {'yes' if same else 'NO'} |")  # fmt: skip
    for title, key, of in (("2d", "plans_2d", voxjet_2d_from),
                           ("3d_lowres", "plans_lowres", voxjet_lowres_from)):  # fmt: skip
        print(f"\n{title} configurations\n")
        _other_table(refs, key, of)
    if args.record:
        RECORD.parent.mkdir(exist_ok=True)
        RECORD.write_text(json.dumps({"nnunetv2": "2.8.1", **refs}, indent=1) + "\n")
        print(f"recorded {RECORD}")


if __name__ == "__main__":
    main()
