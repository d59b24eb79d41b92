"""The trees of a ROOT file as voxjet reads them: TTrees and RNTuples (ROOT's format for Run-4
analysis files, what uproot 5.7 writes for `file["name"] = {...}`) alike, through uproot's
common interface (`iterate`, `num_entries`, `name in tree`); branch types compared as awkward
types, which both spell the same. A Parquet file (voxjet.io.parquet_files) is read through the
same interface as one tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voxjet.errors import VoxjetError
from voxjet.io.parquet_files import ParquetTable, is_parquet

TREE_CLASSES = ("TTree", "ROOT::RNTuple", "ROOT::Experimental::RNTuple")


def tree_names(f: Any) -> list[str]:
    """The names of the file's TTrees and RNTuples (cycle numbers dropped)."""
    return sorted({k.split(";")[0] for k, c in f.classnames().items()
                   if c in TREE_CLASSES or c.startswith("TTree")})  # fmt: skip


def branch_type(tree: Any, name: str) -> str:
    """A branch's (TTree), field's (RNTuple) or column's (Parquet) type as awkward writes it,
    e.g. `var * float32`."""
    if isinstance(tree, ParquetTable):
        return tree.column_type(name)
    obj = tree[name]
    interpretation = getattr(obj, "interpretation", None)
    if interpretation is not None:
        return str(interpretation.awkward_form(None).type)
    form = obj.to_akform()
    form = form[0] if isinstance(form, tuple) else form
    return str(form.contents[0].type if hasattr(form, "contents") else form.type)


def tree_with(f: Any, need: list[str], where: str, fix: str) -> str:
    """The one tree of the file holding every name in `need`; an error listing the trees
    otherwise (none, or several)."""
    names = tree_names(f)
    holding = [n for n in names if all(b in f[n] for b in need)]
    if len(holding) == 1:
        return holding[0]
    if not holding:
        raise VoxjetError(f"{where}: none of its trees {names} holds every branch the model "
                          f"needs ({need}); {fix}")  # fmt: skip
    raise VoxjetError(f"{where}: the trees {holding} each hold every branch the model needs; "
                      f"{fix}")  # fmt: skip


def open_tree(path: str | Path, tree: str, fix: str) -> tuple[Any, Any]:
    """(the open file, its table): a ROOT file's tree `tree`, or a Parquet file's one table;
    VoxjetError when it cannot be opened, or has no such tree (saying `fix`)."""
    if is_parquet(path):
        table = ParquetTable(path)
        return table, table
    import uproot

    try:
        f = uproot.open(path)
    except Exception as e:
        raise VoxjetError(f"{path}: cannot open as ROOT ({e}); re-stage the file") from e
    if tree not in f:
        found = tree_names(f)
        f.close()
        raise VoxjetError(f"{path}: no tree named {tree!r} (it has {found}); {fix}")
    return f, f[tree]


def table_words(path: str | Path, tree: str) -> tuple[str, str]:
    """How messages name a file's table and its columns: ("tree 'events'", "branch") for ROOT,
    ("the Parquet file", "column") for Parquet."""
    return ("the Parquet file", "column") if is_parquet(path) else (f"tree {tree!r}", "branch")
