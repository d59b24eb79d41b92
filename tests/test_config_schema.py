"""config/schema.yaml is the one source of defaults and meanings: the package's dataclasses,
model constructors and CLI defaults equal it, and config/README.md's tables are rendered from
it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from config_tables import README_PATH, SECTIONS, load_schema, node, rewritten

from voxjet.cli import build_parser
from voxjet.io.fetch import FetchConfig
from voxjet.io.remote import ReadOptions
from voxjet.jets.data_config import JetDataConfig
from voxjet.jets.synth import ToyJetsConfig
from voxjet.planner.plan import Site
from voxjet.training.task import TrainSettings
from voxjet.volumes.dataset.settings import VolumePrepConfig
from voxjet.volumes.dataset.synth import ToyVolumesConfig

SCHEMA = load_schema()


def schema_defaults(pointer: str) -> dict:
    """{key: default} of a schema section's properties that have one."""
    props = node(SCHEMA, pointer)["properties"]
    return {k: p["default"] for k, p in props.items() if "default" in p}


def field_defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


@pytest.mark.parametrize(
    "cls,pointer",
    [
        (TrainSettings, "$defs/train"),
        (JetDataConfig, "$defs/jets_data"),
        (VolumePrepConfig, "$defs/volumes_data"),
        (Site, "properties/site"),
    ],
)
def test_config_dataclasses_have_the_schemas_keys_and_defaults(cls, pointer):
    keys = set(node(SCHEMA, pointer)["properties"])
    assert {f.name for f in dataclasses.fields(cls)} == keys
    assert field_defaults(cls) == schema_defaults(pointer)


def test_read_options_default_to_the_schemas_read_section():
    d = schema_defaults("$defs/read")
    opts = ReadOptions.from_config({})
    assert opts == ReadOptions.from_config(d) and opts.lookahead == d["lookahead"]
    f = FetchConfig()
    assert opts.fetch == f
    assert (f.threads, f.retries, f.timeout_s, f.ordered) == tuple(
        d[k] for k in ("threads", "retries", "timeout_s", "ordered")
    )
    assert (f.block_bytes, f.max_bytes_in_flight) == (
        d["block_mb"] * 2**20,
        d["max_mb_in_flight"] * 2**20,
    )


# keys whose null default means "what the plan derived", filled in before the constructor
FROM_PLAN = {("dynunet", "filters")}


def test_model_defaults_are_the_constructors():
    from voxjet.jets.models import MODELS
    from voxjet.volumes.networks.models import build_dynunet, build_resenc, build_unet

    def as_config(v):  # tuples in signatures, lists in YAML
        return [as_config(x) for x in v] if isinstance(v, tuple | list) else v

    for branch in node(SCHEMA, "$defs/model")["allOf"]:
        name = branch["if"]["properties"]["name"]["const"]
        ctor = {**MODELS, "unet": build_unet, "dynunet": build_dynunet, "resenc": build_resenc}[
            name
        ]
        params = inspect.signature(ctor).parameters
        props = branch["then"]["properties"]
        for key, prop in props.items():
            if key == "name":
                continue
            assert key in params, f"model {name}: schema key {key} is no constructor argument"
            if (name, key) in FROM_PLAN:  # null in the config: the plan's value is passed
                assert prop["default"] is None and params[key].default is inspect.Parameter.empty
            elif "default" in prop:
                assert as_config(params[key].default) == prop["default"], (name, key)
            else:
                assert params[key].default is inspect.Parameter.empty, (name, key)


def test_generators_and_cli_default_to_the_schema():
    jets, vols = schema_defaults("$defs/synthetic_jets"), schema_defaults("$defs/synthetic_volumes")
    toy_jets = field_defaults(ToyJetsConfig)
    assert {k: toy_jets[k] for k in jets if k != "generator"} == {
        k: v for k, v in jets.items() if k != "generator"
    }
    toy_vols = field_defaults(ToyVolumesConfig)
    assert {k: toy_vols[k] for k in vols} == vols
    sub = build_parser()._subparsers._group_actions[0].choices
    cli = {a.dest: a.default for a in sub["synth-jets"]._actions}
    assert {k: cli[k] for k in jets} == jets
    cli = {a.dest: a.default for a in sub["synth-volumes"]._actions}
    assert {k: cli[k] for k in vols} == vols
    cli = {a.dest: a.default for a in sub["stage"]._actions}
    assert {k: cli[k] for k in ("workers", "retries")} == schema_defaults("properties/stage")
    cli = {a.dest: a.default for a in sub["evaluate-seg"]._actions}
    assert {k: cli[k] for k in ("overlap", "mirror")} == schema_defaults("$defs/evaluate")


def test_config_readme_tables_are_rendered_from_the_schema():
    text = README_PATH.read_text()
    assert text == rewritten(text), "config/README.md is stale: run python tests/config_tables.py"
    assert text.count("<!-- schema-table:") == len(SECTIONS)  # every section has its table
