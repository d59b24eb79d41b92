"""The config schema (config/schema.yaml, shipped inside the package so that every `voxjet`
command finds it from any folder and from a non-editable install), its errors said in the
user's terms (the key path, what is expected, the fix), and numbers as ML users write them."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, MutableMapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

TYPE_WORDS = {
    "object": "a mapping (key: value)",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}
# what YAML 1.2 and Python read as a number but PyYAML (YAML 1.1) as a string: 1e-3, 5E+4
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_PYTHON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def schema_file() -> Path:
    """The installed package's copy of the schema (the repository's config/schema.yaml)."""
    return Path(str(files("voxjet") / "schema.yaml"))


def load_schema(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The schema as a dict: the file at `path`, or the package's own."""
    return yaml.safe_load(Path(path or schema_file()).read_text())


def key_path(path: Iterable[Any]) -> str:
    """`a.b[0].c` of a jsonschema path."""
    parts: list[str] = []
    for p in path:
        parts.append(f"[{p}]" if isinstance(p, int) else ("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


def _walk(errors: Iterable[Any]) -> Iterator[Any]:
    for e in errors:
        yield e
        yield from _walk(e.context or [])


def numbers_as_written(config: MutableMapping[str, Any], validator: Any) -> list[str]:
    """Strings like `1e-3` where the schema wants a number made numbers, in place (PyYAML reads
    YAML 1.1, where `1e-3` is not a float); the key paths changed."""
    changed: list[str] = []
    for _ in range(1000):  # each pass fixes what validation reaches; nested ones come next
        fixes = []
        for e in _walk(validator.iter_errors(config)):
            want = e.validator_value if e.validator == "type" else None
            want = [want] if isinstance(want, str) else (want or [])
            if ({"number", "integer"} & set(want) and isinstance(e.instance, str)
                    and _NUMBER.fullmatch(e.instance.strip())):  # fmt: skip
                value = float(e.instance)
                if "number" not in want and value.is_integer():
                    value = int(value)
                fixes.append((list(e.absolute_path), value))
        fixes = [(p, v) for p, v in fixes if p]
        if not fixes:
            return changed
        for path, value in fixes:
            target: Any = config
            for p in path[:-1]:
                target = target[p]
            target[path[-1]] = value
            changed.append(key_path(path))
    return changed


_BOUNDS = {"minimum": "at least", "maximum": "at most", "exclusiveMinimum": "more than",
           "exclusiveMaximum": "less than"}  # fmt: skip


def did_you_mean(given: Iterable[str], known: Iterable[str]) -> str:
    """`; did you mean 'lr'?` for a key close to a known one, else ""."""
    import difflib

    known = list(known)
    close = []
    for g in map(str, given):
        # `lrate` for `lr`: a known key that starts the given one is what was meant more often
        # than difflib's closest spelling
        starts = [k for k in known if len(k) >= 2 and g.startswith(k)]
        close += sorted(starts, key=len)[-1:] or difflib.get_close_matches(g, known, n=1)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def _describe(schema: dict[str, Any]) -> str:
    """A schema alternative in words: `'auto'`, `an integer ≥ 0`, `a mapping with branch,
    classes`."""
    if "const" in schema:
        return repr(schema["const"])
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else (kinds or [])
    words = " or ".join(TYPE_WORDS.get(k, k) for k in kinds)
    if "minimum" in schema:
        words += f" ≥ {schema['minimum']}"
    if "minItems" in schema:
        words += f" of at least {schema['minItems']}"
    if schema.get("required"):
        words = (words or "a mapping") + " with " + ", ".join(schema["required"])
    return words or "a value of another form"


def _matches_type(schema: dict[str, Any], instance: Any) -> bool:
    kinds = schema.get("type")
    if kinds is None:
        return "const" not in schema or schema["const"] == instance
    kinds = [kinds] if isinstance(kinds, str) else kinds
    for k in kinds:
        if k in ("integer", "number"):
            if isinstance(instance, (int, float)) and not isinstance(instance, bool):
                return True
        elif k == "null":
            if instance is None:
                return True
        elif isinstance(instance, _PYTHON_TYPES[k]):
            return True
    return False


def _characters(pattern: str) -> str:
    """`^[A-Za-z0-9_-]+$` as words: letters, digits, '_' and '-'."""
    m = re.fullmatch(r"\^\[(.*)\]\+\$", pattern)
    if not m:
        return f"the pattern {pattern}"
    body, words = m[1], []
    for span, word in (("A-Za-z", "letters"), ("0-9", "digits")):
        if span in body:
            words.append(word)
            body = body.replace(span, "")
    words += [repr(c) for c in body]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def _closest(fitting: list[int], alts: list[dict[str, Any]], instance: Any) -> list[int]:
    """Of several mapping forms, the one sharing most keys with what the user wrote."""
    if len(fitting) < 2 or not isinstance(instance, dict):
        return fitting
    shared = {i: len(set(instance) & (set(alts[i].get("properties", {}))
                                      | set(alts[i].get("required", []))))
              for i in fitting}  # fmt: skip
    best = max(shared.values())
    top = [i for i in fitting if shared[i] == best]
    return top if best else fitting


def _shown(instance: Any) -> str:
    """The user's value as they would recognise it: a mapping by its keys."""
    if isinstance(instance, dict):
        return f"a mapping with key(s) {', '.join(map(str, instance))}"
    return repr(instance)


def explain(error: Any) -> list[str]:
    """What a jsonschema error means for the user, one line a problem, each naming its key."""
    where = key_path(error.absolute_path)
    v, schema = error.validator, error.schema
    if v in ("oneOf", "anyOf"):
        alts = error.validator_value
        if all(set(a) == {"required"} for a in alts):
            keys = [a["required"][0] for a in alts]
            given = [k for k in keys if k in (error.instance or {})]
            if given:
                return [f"config key '{where}': give only one of {', '.join(keys)}; it has "
                        f"{' and '.join(given)}"]  # fmt: skip
            return [f"config key '{where}': give one of {', '.join(keys)} "
                    "(see config/README.md)"]  # fmt: skip
        fitting = _closest([i for i, a in enumerate(alts) if _matches_type(a, error.instance)],
                           alts, error.instance)  # fmt: skip
        if len(fitting) == 1:  # the form the user meant: what is wrong inside it
            inner = [e for e in (error.context or []) if e.schema_path[0] == fitting[0]]
            if inner:
                return [line for e in inner for line in explain(e)]
        forms = " or ".join(_describe(a) for a in alts)
        return [f"config key '{where}': expected {forms}, got {_shown(error.instance)}"]
    if v == "type":
        want = error.validator_value
        words = " or ".join(
            TYPE_WORDS.get(t, t) for t in ([want] if isinstance(want, str) else want)
        )
        return [f"config key '{where}': expected {words}, got {error.instance!r}"]
    if v == "additionalProperties":
        extra = sorted(set(error.instance) - set(schema.get("properties", {})))
        known = sorted(schema.get("properties", {}))
        return [f"config key '{where}': unknown key(s) {extra}{did_you_mean(extra, known)}"
                + (f"; allowed: {known}" if known else "") + " (see config/README.md)"]  # fmt: skip
    if v in _BOUNDS:
        return [f"config key '{where}': expected {_BOUNDS[v]} {error.validator_value}, "
                f"got {error.instance!r}"]  # fmt: skip
    if v == "minItems":
        return [f"config key '{where}': needs at least {error.validator_value} entries, got "
                f"{len(error.instance)}: {error.instance!r}"]  # fmt: skip
    if v == "not":
        why = schema.get("description", "not allowed here")
        return [f"config key '{where}': {why}; remove it"]
    if v == "pattern" and error.schema_path and "propertyNames" in error.schema_path:
        name = error.instance
        allowed = _characters(error.validator_value)
        tip = ("; run names join an experiment's name and its sweep settings with '_'"
               if where == "experiments" else "")  # fmt: skip
        fixed = re.sub(r"[^A-Za-z0-9-]" if where == "experiments" else r"[^A-Za-z0-9_-]", "-",
                       str(name))  # fmt: skip
        return [f"config key '{where}.{name}': a name of {allowed} only{tip}; e.g. {fixed!r}"]
    if v == "pattern":
        return [f"config key '{where}': {error.instance!r} may hold "
                f"{_characters(error.validator_value)} only"]  # fmt: skip
    if v == "required":
        return [f"config key '{where}': {error.message} (see config/README.md)"]
    if v == "enum":
        return [f"config key '{where}': {error.instance!r} is not one of {error.validator_value}"]
    return [f"config key '{where}': {error.message}"]
