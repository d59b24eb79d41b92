"""config/README.md's tables of keys, generated from config/schema.yaml (the one place where
defaults and meanings are written). `python tests/config_tables.py` rewrites the tables between
the `<!-- schema-table: NAME -->` and `<!-- end schema-table -->` markers; the tests check that
the README is what this renders."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = ROOT / "config" / "schema.yaml"
README_PATH = ROOT / "config" / "README.md"

# table name → where its keys are in the schema
SECTIONS = {
    "dataset": "$defs/dataset",
    "source": "$defs/source",
    "read": "$defs/read",
    "synthetic_jets": "$defs/synthetic_jets",
    "synthetic_volumes": "$defs/synthetic_volumes",
    "jets": "$defs/jets_data",
    "volumes": "$defs/volumes_data",
    "experiment": "$defs/experiment",
    "model": "$defs/model",
    "train": "$defs/train",
    "evaluate": "$defs/evaluate",
    "launch": "$defs/launch",
    "prediction": "$defs/prediction",
    "stage": "properties/stage",
    "site": "properties/site",
    "slurm_site": "$defs/slurm_site",
}
MARK = re.compile(r"<!-- schema-table: (\w+) -->\n.*?<!-- end schema-table -->", re.S)


def load_schema() -> dict:
    """config/schema.yaml as a dict."""
    return yaml.safe_load(SCHEMA_PATH.read_text())


def node(schema: dict, pointer: str) -> dict:
    """The schema node at a `a/b/c` pointer."""
    out = schema
    for part in pointer.split("/"):
        out = out[part]
    return out


def resolve(schema: dict, prop: dict) -> dict:
    """A property with its $ref followed (the property's own keys win)."""
    if "$ref" in prop:
        return {**node(schema, prop["$ref"].removeprefix("#/")), **prop}
    return prop


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list) and len(v) > 6:
        return f"{len(v)} names (config/schema.yaml)"
    if isinstance(v, list | dict):
        return json.dumps(v).replace('"', "")
    return str(v)


def default_text(prop: dict, required: bool) -> str:
    """How the default reads in a table."""
    if required:
        return "required"
    if "default" not in prop:
        return "–"
    d = prop["default"]
    if d == {}:
        return "defaults" if "$ref" in prop else "none"
    return f"`{_value(d)}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def key_table(schema: dict, section: dict) -> str:
    """| key | meaning | default | for the properties of one section."""
    rows = ["| key | meaning | default |", "|---|---|---|"]
    required = set(section.get("required", []))
    for key, prop in section.get("properties", {}).items():
        full = resolve(schema, prop)
        meaning = full.get("description", "")
        rows.append(f"| `{key}` | {_cell(meaning)} | {default_text(prop, key in required)} |")
    return "\n".join(rows)


def model_table(schema: dict, section: dict) -> str:
    """| name | what | keys (default) | for each model."""
    rows = ["| `name` | what | keys (default) |", "|---|---|---|"]
    for branch in section["allOf"]:
        name = branch["if"]["properties"]["name"]["const"]
        then = branch["then"]
        keys = [
            f"`{k}`: {_cell(p.get('description', ''))}"
            + (f" ({_value(p['default'])})" if "default" in p else " (required)")
            for k, p in then["properties"].items()
            if k != "name"
        ]
        rows.append(f"| `{name}` | {_cell(then.get('description', ''))} | {'; '.join(keys)} |")
    return "\n".join(rows)


def render(name: str, schema: dict | None = None) -> str:
    """The table `name` as Markdown."""
    schema = schema or load_schema()
    section = node(schema, SECTIONS[name])
    return model_table(schema, section) if name == "model" else key_table(schema, section)


def rewritten(text: str, schema: dict | None = None) -> str:
    """README text with every marked table rendered afresh."""
    schema = schema or load_schema()
    return MARK.sub(
        lambda m: (
            f"<!-- schema-table: {m[1]} -->\n{render(m[1], schema)}\n<!-- end schema-table -->"
        ),
        text,
    )


if __name__ == "__main__":
    new = rewritten(README_PATH.read_text())
    README_PATH.write_text(new)
    print(f"{README_PATH}: {len(MARK.findall(new))} tables from {SCHEMA_PATH}", file=sys.stderr)
