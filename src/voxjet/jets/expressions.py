"""A small, safe expression language for new variables and selections over ROOT branches.

`hypot(part_px, part_py)`, `log(part_pt / jet_pt)`, `(jet_pt > 500) & (abs(jet_eta) < 2)`:
numbers, names (branches or other variables), + - * / ** (a numeric exponent) %, comparisons,
& | ~ (and/or/not also work), and the functions below, also under the module names weaver's
data configs use (`np.log`, `ak.ones_like`, `math.sqrt`). The text is parsed with Python's
`ast` and walked node by node: nothing is ever passed to `eval`, and any other construct
(attributes, subscripts, lambdas, comprehensions, unknown functions) is refused with the
expression in the message.
Values are awkward or numpy arrays, so jagged (per-particle) and flat (per-jet) columns mix
with the usual broadcasting.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping

import numpy as np

from voxjet.errors import VoxjetError


def _safe_log(x):
    # padding-free per-particle values can be exactly 0 (a neutral particle's track IP, a
    # massless particle): clamp, as weaver's configs do, instead of producing -inf
    return np.log(np.maximum(x, 1e-8))


FUNCTIONS: dict[str, Callable] = {
    "log": _safe_log,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "hypot": np.hypot,
    "arctan2": np.arctan2,
    "arctanh": np.arctanh,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "minimum": np.minimum,
    "maximum": np.maximum,
    "where": np.where,
    "log1p": np.log1p,
    "clip": np.clip,
    "ones_like": np.ones_like,
    "zeros_like": np.zeros_like,
}

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.BitAnd: np.logical_and,
    ast.BitOr: np.logical_or,
}
_COMPARE = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


# Limits that keep any expression cheap to check and to evaluate: a power's exponent is a
# number no larger than MAX_EXPONENT (so `9**9**9` or `2**x` cannot build a huge integer or
# overflow silently), and the text and its nesting stay short.
MAX_EXPONENT = 64
MAX_LENGTH = 2000
MAX_DEPTH = 40


class Expression:
    """A parsed expression: its names, and evaluation over a mapping of arrays."""

    def __init__(self, text: str, where: str = "expression") -> None:
        self.text = str(text)
        self.where = where
        if len(self.text) > MAX_LENGTH:
            raise VoxjetError(f"{where}: an expression of {len(self.text)} characters; at most "
                              f"{MAX_LENGTH} (split it into several new_variables)")  # fmt: skip
        try:
            self.tree = ast.parse(self.text.strip(), mode="eval").body
        except (SyntaxError, RecursionError, MemoryError) as e:
            why = e.msg if isinstance(e, SyntaxError) else "nested too deeply"
            raise VoxjetError(f"{where}: cannot parse {self.text!r} ({why})") from e
        self.names = sorted(self._check(self.tree))

    def _fail(self, node: ast.AST, why: str) -> VoxjetError:
        return VoxjetError(
            f"{self.where}: {why} in {self.text!r}; allowed are numbers, branch/variable "
            f"names, + - * / ** %, comparisons, & | ~ and the functions {sorted(FUNCTIONS)}"
        )

    def _check(self, node: ast.AST, depth: int = 0) -> set[str]:
        """Refuse anything outside the language; return the variable names used."""
        if depth > MAX_DEPTH:
            raise self._fail(node, f"nesting deeper than {MAX_DEPTH} levels")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exponent = _number(node.right)
            if exponent is None or abs(exponent) > MAX_EXPONENT:
                raise self._fail(
                    node, f"the exponent {ast.unparse(node.right)!r} (a power's exponent must be "
                    f"a number of at most {MAX_EXPONENT} in size; use exp/log for the rest)"
                )  # fmt: skip
            return self._check(node.left, depth + 1)
        return self._check_node(node, depth + 1)

    def _check_node(self, node: ast.AST, depth: int) -> set[str]:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise self._fail(node, f"the constant {node.value!r} is not a number")
            return set()
        if isinstance(node, ast.Name):
            if node.id in FUNCTIONS:
                raise self._fail(node, f"{node.id} is a function, call it")
            return {node.id}
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self._check(node.left, depth) | self._check(node.right, depth)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd | ast.Not):
            return self._check(node.operand, depth)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
            return self._check(node.operand, depth)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self._check(v, depth) for v in node.values))
        if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
            parts = [
                self._check(node.left, depth),
                *(self._check(c, depth) for c in node.comparators),
            ]
            return set().union(*parts)
        if isinstance(node, ast.Call):
            if _function(node.func) not in FUNCTIONS:
                name = ast.unparse(node.func)
                raise self._fail(node, f"unknown function {name!r}")
            if node.keywords:
                raise self._fail(node, "keyword arguments are not supported")
            return set().union(*(self._check(a, depth) for a in node.args))
        raise self._fail(node, f"{type(node).__name__} ({ast.unparse(node)!r}) is not allowed")

    def evaluate(self, values: Mapping[str, object]):
        """The expression's value, looking names up in `values`."""
        return self._eval(self.tree, values)

    def _eval(self, node: ast.AST, values: Mapping[str, object]):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](
                self._eval(node.left, values), self._eval(node.right, values)
            )
        if isinstance(node, ast.UnaryOp):
            v = self._eval(node.operand, values)
            if isinstance(node.op, ast.USub):
                return -v
            if isinstance(node.op, ast.UAdd):
                return v
            return np.logical_not(v)
        if isinstance(node, ast.BoolOp):
            combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            out = self._eval(node.values[0], values)
            for v in node.values[1:]:
                out = combine(out, self._eval(v, values))
            return out
        if isinstance(node, ast.Compare):
            left, out = self._eval(node.left, values), None
            for op, comp in zip(node.ops, node.comparators, strict=True):
                right = self._eval(comp, values)
                part = _COMPARE[type(op)](left, right)
                out = part if out is None else np.logical_and(out, part)
                left = right
            return out
        assert isinstance(node, ast.Call)
        return FUNCTIONS[_function(node.func)](*(self._eval(a, values) for a in node.args))


# weaver's data configs call numpy, awkward and math by their module names
# (`np.hypot(part_px, part_py)`, `ak.ones_like(part_deta)`): the same functions here
MODULES = ("np", "numpy", "ak", "awkward", "math")


def _function(func: ast.AST) -> str | None:
    """The function a call names: `log`, or `np.log` (a module prefix weaver's configs use)."""
    if isinstance(func, ast.Name):
        return func.id
    root = func
    while isinstance(root, ast.Attribute):  # awkward-0's awkward.JaggedArray.ones_like too
        root = root.value
    if isinstance(func, ast.Attribute) and isinstance(root, ast.Name):
        return func.attr if root.id in MODULES else None
    return None


def _number(node: ast.AST) -> float | None:
    """The value of a numeric literal (with a sign), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _number(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return None if isinstance(node.value, bool) else float(node.value)
    return None


class Variables:
    """Named expressions resolved lazily over a batch of branches, each computed once."""

    def __init__(
        self, definitions: Mapping[str, str], where: str = "jets.new_variables",
        keys: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        # `keys`: config keys of entries that are not variables (the selections)
        keys = keys or {}
        self.exprs = {
            name: Expression(text, keys.get(name) or f"{where}.{name}")
            for name, text in definitions.items()
        }

    def branches(self, names: list[str]) -> list[str]:
        """The ROOT branches that computing `names` reads (variables expanded, cycles refused)."""
        out: set[str] = set()
        done: set[str] = set()

        def visit(name: str, stack: tuple[str, ...]) -> None:
            if name in stack:
                raise VoxjetError(f"jets.new_variables: {' → '.join((*stack, name))} is a cycle")
            if name in done:
                return
            done.add(name)
            if name in self.exprs:
                for dep in self.exprs[name].names:
                    visit(dep, (*stack, name))
            else:
                out.add(name)

        for n in names:
            visit(n, ())
        return sorted(out)

    def evaluate(self, names: list[str], arrays) -> dict[str, object]:
        """{name: value} for `names`, computed over `arrays` (an awkward record array)."""
        cache: dict[str, object] = {}

        def get(name: str):
            if name not in cache:
                cache[name] = (
                    self.exprs[name].evaluate(_Lookup(get)) if name in self.exprs else arrays[name]
                )
            return cache[name]

        return {n: get(n) for n in names}


class _Lookup(Mapping):
    def __init__(self, get: Callable[[str], object]) -> None:
        self._get = get

    def __getitem__(self, key: str):
        return self._get(key)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0
