"""What a dataset's data config reads from its ROOT (or Parquet) files (the branches its
features, labels, targets, collections, selection and weights need), which key asks for each,
and a file checked against it: the shard jobs refuse a file without them, and the dry run
checks the first local source file the same way, so a misnamed branch or tree stops before
any job."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.io.parquet_files import is_parquet
from voxjet.io.trees import open_tree, table_words
from voxjet.jets import reweight
from voxjet.jets.collections import collection_inputs, parse_collections
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.expressions import Variables
from voxjet.jets.features import SELECTION, TEST_SELECTION, branches_needed, variables
from voxjet.jets.leakage import label_branches, reweight_labels
from voxjet.jets.targets import expression_names, parse_targets, variable_name


@dataclass
class Reads:
    """A data config's expressions and the branches they read, in reading order."""

    v: Variables
    branches: list[str]
    targets: list
    colls: list
    rw: dict | None


def reads_of(cfg: JetDataConfig) -> Reads:
    """The branches the features, sort key, selection, targets, collections and weights read
    (labels come on top: `needed`)."""
    targets = parse_targets(cfg.targets)
    v = variables({**cfg.new_variables, **expression_names(targets)}, cfg.selection,
                  cfg.test_time_selection)  # fmt: skip
    branches = branches_needed(v, cfg.particle_features, cfg.jet_features, cfg.sort_by)
    colls = parse_collections(cfg.collections)
    more = v.branches([variable_name(t.name) for t in targets] + collection_inputs(colls))
    more += [c.count for c in colls if c.count]
    branches += [b for b in dict.fromkeys(more) if b not in branches]
    rw = reweight.parse(cfg.weights, reweight_labels(cfg.labels), "jets.weights")
    if rw is not None:
        wanted = rw["vars"] + (rw["classes"] if rw.get("by_branches") else [])
        branches += [b for b in v.branches(wanted) if b not in branches]
    return Reads(v, branches, targets, colls, rw)


def needed(cfg: JetDataConfig, reads: Reads) -> list[str]:
    """Every branch a file must have: what the config reads and the label branches."""
    return reads.branches + [b for b in label_branches(cfg.labels) if b not in reads.branches]


def readers(branch: str, cfg: JetDataConfig, reads: Reads) -> list[str]:
    """The data-config keys that read `branch`, directly or through new_variables."""
    v = reads.v

    def reading(names: list[str]) -> list[str]:
        return [n for n in names if branch in v.branches([n])]

    named = {"particle_features": cfg.particle_features, "jet_features": cfg.jet_features,
             "sort_by": [cfg.sort_by] if cfg.sort_by else []}  # fmt: skip
    named |= {f"targets.{t.name}": [variable_name(t.name)] for t in reads.targets}
    named |= {f"collections.{c.name}": collection_inputs([c]) for c in reads.colls}
    named["selection"] = [k for k in (SELECTION, TEST_SELECTION) if k in v.exprs]
    rw = reads.rw or {}
    named["weights"] = rw.get("vars", []) + (rw["classes"] if rw.get("by_branches") else [])
    keys = []
    for key, names in named.items():
        hits = reading(names)
        through = [n for n in hits if n != branch and n not in (SELECTION, TEST_SELECTION)]
        if hits:
            keys.append(f"jets.{key}" + (f" (through new_variables {through})" if through else ""))
    if branch in label_branches(cfg.labels):
        keys.append("jets.labels")
    return keys


def missing_message(path: Any, tree: Any, cfg: JetDataConfig, reads: Reads,
                    missing: list[str]) -> str:  # fmt: skip
    """Which branches a tree (or columns a Parquet file) lacks, what asks for each, and where
    to fix it."""
    table, column = table_words(path, cfg.tree_name)
    said = []
    for b in missing:
        keys = readers(b, cfg, reads) or ["the data config"]
        close = difflib.get_close_matches(b, list(tree.keys()), n=1, cutoff=0.8)
        said.append(f"{b!r} (read by {', '.join(keys)}"
                    + (f"; it has {close[0]!r}" if close else "") + ")")  # fmt: skip
    where = (f"the weaver data config {cfg.weaver_config} (its inputs, new_variables and "
             "labels), or the dataset's jets section" if cfg.weaver_config
             else "those keys of the dataset's jets section")  # fmt: skip
    return (f"{path}: {table} has no {column} {'; no '.join(said)}; fix {where}, or "
            "drop files that lack it (jets.on_bad_file: skip)")  # fmt: skip


def tree_key(cfg: JetDataConfig, dataset: str = "") -> str:
    """Where the tree was set: a weaver config's treename, or the jets section's tree."""
    if cfg.weaver_config:
        return f"the treename of weaver_config {cfg.weaver_config}"
    return f"datasets.{dataset}.jets.tree" if dataset else "the dataset's jets.tree"


def check_source_file(path: str | Path, cfg: JetDataConfig, dataset: str) -> None:
    """A source file has the tree and every branch the config reads (the dry run's look at
    one file: a typo found before staging and sharding, not after)."""
    if is_parquet(path) and cfg.tree is not None and not cfg.weaver_config:
        raise VoxjetError(f"{path}: a Parquet file has no trees, but datasets.{dataset}.jets.tree "
                          f"is {cfg.tree!r}: remove it")  # fmt: skip
    try:
        f, tree = open_tree(
            path, cfg.tree_name, f"set {tree_key(cfg, dataset)} to the tree your files hold"
        )
    except VoxjetError as e:  # the stage reports unreadable files with their own message
        raise VoxjetError(str(e).replace("; re-stage the file", "")) from e
    with f:
        reads = reads_of(cfg)
        missing = [b for b in needed(cfg, reads) if b not in tree]
        if missing:
            raise VoxjetError(missing_message(path, tree, cfg, reads, missing))
