"""The best configuration of a segmentation dataset, as `nnUNetv2_find_best_configuration`
chooses it: from the cross-validation folds' validation predictions of every configuration (an
experiment, or a point of its sweep, trained with `folds:`), the single configuration or pair of
configurations (their probabilities averaged) with the highest mean Dice over the validation
cases; then the post-processing nnU-Net tries on it (`choose_postprocessing`; applied by
voxjet.volumes.postprocessing). Everything is scored on each case's original grid against the label
as given.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from voxjet.errors import VoxjetError
from voxjet.io.atomic import atomic_path, write_json
from voxjet.io.remote import ReadOptions
from voxjet.volumes.evaluation.metrics import Scores, score
from voxjet.volumes.inference.probabilities import PROBABILITIES, labels_of, load_probabilities
from voxjet.volumes.plan.plan_file import LabelSet, class_values, read_plan
from voxjet.volumes.postprocessing.connected_components import keep_largest
from voxjet.volumes.preprocessing.store import CaseStore, case_sizes


def case_files(folders: list[Path], config: str) -> dict[str, Path]:
    """A configuration's validation probability files by case, over its folds' folders."""
    out: dict[str, Path] = {}
    for folder in folders:
        for f in sorted((folder / PROBABILITIES).glob("*.npz")):
            cid = f.name[: -len(".npz")]
            if cid in out:
                raise VoxjetError(
                    f"configuration {config}: case {cid} was validated by two folds ({out[cid]} "
                    f"and {f}); its folds must split the cases"
                )
            out[cid] = f
    if not out:
        raise VoxjetError(f"configuration {config}: no validation probabilities in "
                          f"{[str(f) for f in folders]}; run its validate_seg jobs")  # fmt: skip
    return out


def choose(
    files: dict[str, dict[str, Path]],
    refs: dict[str, np.ndarray],
    classes: LabelSet,
    progress: Callable[[str], None] = lambda s: None,
) -> dict:
    """Every single configuration and pair scored (pairs: probabilities averaged), the best
    (ties: the fewer configurations, then the name), and its post-processing."""
    cases = sorted(refs)
    for name, by_case in files.items():
        if sorted(by_case) != cases:
            missing = sorted(set(cases) - set(by_case))
            extra = sorted(set(by_case) - set(cases))
            raise VoxjetError(
                f"configuration {name}: its folds validated other cases than the others "
                f"(missing {missing[:5]}, extra {extra[:5]}); every configuration must use the "
                "same folds (the same `folds:` and the dataset's splits)"
            )
    names = sorted(files)
    candidates = [(n,) for n in names] + list(itertools.combinations(names, 2))
    # each probability file read once: a case's configurations loaded together, every
    # candidate's label map made from them
    maps: dict[tuple, dict[str, np.ndarray]] = {cand: {} for cand in candidates}
    for cid in cases:
        probs = {n: load_probabilities(files[n][cid]) for n in names}
        for cand in candidates:
            maps[cand][cid] = labels_of(sum(probs[n] for n in cand) / len(cand), classes)
    scored = []
    for cand in candidates:
        s = score(maps[cand], refs, classes)
        progress(f"{' + '.join(cand)}: mean Dice {s.mean:.4f}")
        scored.append((cand, s, maps[cand]))
    best_cand, best, maps = min(scored, key=lambda t: (-t[1].mean, len(t[0]), t[0]))
    post = choose_postprocessing(maps, refs, classes, best)
    return {
        "configurations": list(best_cand),
        "ensemble": len(best_cand) > 1,
        "dice_mean": best.mean,
        "per_class": best.per_class,
        "cases": len(cases),
        "candidates": [
            {"configurations": list(c), "dice_mean": s.mean, "per_class": s.per_class}
            for c, s, _ in scored
        ],  # fmt: skip
        "postprocessing": post,
    }


def summary_markdown(choice: dict) -> str:
    """The choice as a page: every candidate's validation Dice, the winner, post-processing."""
    lines = ["# Best configuration", "",
             f"Chosen from the cross-validation folds' validation predictions ({choice['cases']} "
             "cases, each scored on its original grid), as nnU-Net's "
             "`nnUNetv2_find_best_configuration`.", "",
             "| configuration(s) | mean Dice | " + " | ".join(choice["per_class"]) + " |",
             "|---|---|" + "---|" * len(choice["per_class"])]  # fmt: skip
    for c in sorted(choice["candidates"], key=lambda c: -c["dice_mean"]):
        mark = " **(chosen)**" if c["configurations"] == choice["configurations"] else ""
        cells = " | ".join(
            f"{c['per_class'].get(k, float('nan')):.4f}" for k in choice["per_class"]
        )
        lines.append(
            f"| {' + '.join(c['configurations'])}{mark} | {c['dice_mean']:.4f} | {cells} |"
        )
    lines += ["", "## Post-processing", "", "| step | Dice before | Dice after | kept |",
              "|---|---|---|---|"]  # fmt: skip
    for s in choice["postprocessing"]["steps"]:
        before = s.get("dice_mean_before", s.get("dice_before"))
        after = s.get("dice_mean_after", s.get("dice_after"))
        lines.append(
            f"| {s['step']} | {before:.4f} | {after:.4f} | {'yes' if s['kept'] else 'no'} |"
        )
    lines += ["", f"Mean Dice after post-processing: "
              f"{choice['postprocessing']['dice_mean_after']:.4f}", ""]  # fmt: skip
    return "\n".join(lines)


def summary_rows(choices: dict[str, dict]) -> str:
    """The datasets' choices as one section of the workflow's summary (dataset → choice.json
    content): the configuration or ensemble chosen, its cross-validation Dice before and after
    the post-processing kept."""
    if not choices:
        return ""
    lines = ["", "## Best configuration (cross-validation)", "",
             "| dataset | chosen | validation cases | mean Dice | post-processing | after |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for ds, c in sorted(choices.items()):
        post = c["postprocessing"]
        kept = (["foreground"] if post["foreground_largest_component"] else []) + list(
            post["largest_component_classes"]
        )
        what = ", ".join(f"largest component: {k}" for k in kept) or "none"
        chosen = " + ".join(c["configurations"])
        lines.append(f"| {ds} | {chosen} | {c['cases']} | {c['dice_mean']:.4f} | {what} | "
                     f"{post['dice_mean_after']:.4f} |")  # fmt: skip
    lines.append("")
    return "\n".join(lines)


def find_best(cases_dir: str, configs: dict[str, list[str]], out_dir: str,
              models: dict[str, list[str]] | None = None) -> dict:  # fmt: skip
    """Read the references and every configuration's fold validations, choose, and write
    `choice.json` and `summary.md` into `out_dir`."""
    opts = ReadOptions.from_config({})
    plan = read_plan(cases_dir, opts)
    files = {
        name: case_files([Path(f) for f in folders], name) for name, folders in configs.items()
    }
    cases = sorted(next(iter(files.values())))
    store = CaseStore(cases_dir, cases, fetch=opts.fetch, sizes=case_sizes(cases_dir, opts))
    refs = {}
    try:
        for cid in cases:
            f = store.file(cid)
            refs[cid] = f["original_label"][...]
    finally:
        store.close()
    choice = choose(files, refs, plan.label_set, progress=print)
    if models:
        choice["models"] = {n: models[n] for n in choice["configurations"]}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "summary.md") as tmp:
        tmp.write_text(summary_markdown(choice))
    write_json(out / "choice.json", choice)
    return choice


def choose_postprocessing(maps: dict[str, np.ndarray], refs: dict[str, np.ndarray],
                          classes: LabelSet, base: Scores) -> dict:  # fmt: skip
    """nnU-Net's two steps, each kept only where it raises Dice: the foreground's largest
    component (the mean over classes), then each class's own (that class's Dice)."""
    values = class_values(classes)
    fg = sorted({v for vs in values.values() for v in vs})
    trial = {cid: keep_largest(m, fg) for cid, m in maps.items()}
    s = score(trial, refs, classes)
    use_fg = s.mean > base.mean
    steps = [{"step": "foreground largest component", "dice_mean_before": base.mean,
              "dice_mean_after": s.mean, "kept": use_fg}]  # fmt: skip
    if use_fg:
        maps, base = trial, s
    kept = []
    for name, vals in values.items():
        if name not in base.per_class:
            continue
        trial = {cid: keep_largest(m, vals) for cid, m in maps.items()}
        s = score(trial, refs, classes)
        raised = s.per_class[name] > base.per_class[name]
        steps.append({"step": f"{name} largest component", "dice_before": base.per_class[name],
                      "dice_after": s.per_class[name], "kept": raised})  # fmt: skip
        if raised:
            maps, base = trial, s
            kept.append(name)
    return {"foreground_largest_component": use_fg, "largest_component_classes": kept,
            "dice_mean_after": base.mean, "per_class_after": base.per_class,
            "steps": steps}  # fmt: skip
