"""The trees of a ROOT file as voxjet reads them: TTrees and RNTuples (ROOT's format for Run-4
analysis files, what uproot 5.7 writes for `file["name"] = {...}`) alike, through uproot's
common interface (`iterate`, `num_entries`, `name in tree`); branch types compared as awkward
types, which both spell the same."""

from __future__ import annotations

from typing import Any

from voxjet.errors import VoxjetError

TREE_CLASSES = ("TTree", "ROOT::RNTuple", "ROOT::Experimental::RNTuple")


def tree_names(f: Any) -> list[str]:
    """The names of the file's TTrees and RNTuples (cycle numbers dropped)."""
    return sorted({k.split(";")[0] for k, c in f.classnames().items()
                   if c in TREE_CLASSES or c.startswith("TTree")})  # fmt: skip


def branch_type(tree: Any, name: str) -> str:
    """A branch's (TTree) or field's (RNTuple) type as awkward writes it, e.g. `var * float32`."""
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
