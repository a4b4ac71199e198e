"""warpolicy.registry.schema: the JSON Schema and the key tables the loader shares with it."""

from __future__ import annotations

import json

import pytest
import yaml

from warpolicy.registry.loader import Fragment, default_registry_path, validate_sources
from warpolicy.registry.model import Conditions
from warpolicy.registry.schema import SECTIONS, registry_json_schema
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy, mode_names

jsonschema = pytest.importorskip("jsonschema")  # a test extra; the GPU machine may lack it


def check(instance, schema: dict, _root: dict) -> list[str]:
    """Every JSON Schema error of ``instance``, from a real draft 2020-12 validator."""
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(instance)]


@pytest.fixture(scope="module")
def the_schema() -> dict:
    return registry_json_schema()


def test_schema_is_draft_2020_12_json(the_schema):
    assert the_schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert json.loads(json.dumps(the_schema)) == the_schema
    assert the_schema["required"] == ["version"]


def test_every_section_is_closed_and_described(the_schema):
    for name in ["flag", "spec_algorithm", "backend", "gate", "when"]:
        section = the_schema["$defs"][name]
        assert section["additionalProperties"] is False, name
        assert section["description"]
        assert all(p["description"] for p in section["properties"].values()), name
    assert the_schema["additionalProperties"] is False


def test_schema_keys_are_the_loaders_keys(the_schema):
    """Both come from schema.SECTIONS, so they cannot drift; check the mapping holds."""
    defs = the_schema["$defs"]
    assert set(the_schema["properties"]) == {k.name for k in SECTIONS["registry"]}
    for section in ["flag", "spec_algorithm", "backend", "gate", "when"]:
        keys = {k.name for k in SECTIONS[section]}
        assert set(defs[section]["properties"]) == keys, section
        required = {k.name for k in SECTIONS[section] if k.required}
        assert set(defs[section].get("required", ())) == required


def test_backend_shapes_exclude_each_other(the_schema):
    assert the_schema["$defs"]["backend"]["not"] == {
        "anyOf": [
            {"required": ["latest_of", "per_mode"]},
            {"required": ["per_mode", "inherits"]},
            {"required": ["routes", "inherits"]},
            {"required": ["routes", "latest_of"]},
            {"required": ["routes", "per_mode"]},
        ]
    }


def test_when_keys_are_the_condition_fields():
    assert {k.name for k in SECTIONS["when"]} == set(attrs_fields(Conditions))


def attrs_fields(cls) -> list[str]:
    import attrs

    return [f.name for f in attrs.fields(cls)]


def test_the_loader_rejects_a_key_the_schema_does_not_know():
    (problem,) = validate_sources([Fragment("f", "version: 1\nflags: {f: {doc: x, color: red}}\n")])
    assert "unknown key 'color'" in problem.message


def test_enums_include_aliases(the_schema):
    policies = the_schema["$defs"]["policy"]["enum"]
    read_ends = the_schema["$defs"]["read_end"]["enum"]
    assert {p.label for p in WarReadDonePolicy} - {"nothing"} <= set(policies)
    assert "nothing" not in policies  # a gate's at_least is a release point
    assert set(read_ends) == set(policies) | {"nothing"}
    assert {"coarse", "unknown", "in_replay"} <= set(policies)
    for name in read_ends:
        WarReadDonePolicy.parse(name)  # every spelling the schema offers loads
    modes = the_schema["$defs"]["mode"]["enum"]
    assert set(modes) == set(mode_names())
    assert {"prefill", "verify"} <= set(modes)
    assert {m.value for m in ForwardMode} <= set(modes)


def test_default_registry_conforms(the_schema):
    data = yaml.safe_load(default_registry_path().read_text())
    assert check(data, the_schema, the_schema) == []


@pytest.mark.parametrize(
    "bad",
    [
        {"version": 2},
        {"version": 1, "backends": {"a": {"reads_end": {"decode": "soon"}}}},
        {"version": 1, "backends": {"a": {"reads_end": {"decodes": "none"}}}},
        {"version": 1, "backends": {"a b": {}}},
        {"version": 1, "flags": {"f": {"default": False}}},
        {"version": 1, "flags": {"f": {"doc": "x", "env": ["A-B"]}}},
        {
            "version": 1,
            "gates": [{"id": "g", "at_least": "none", "because": "x", "when": {"x": 1}}],
        },
        {
            "version": 1,
            "gates": [{"id": "g", "at_least": "none", "because": "x", "when": {"mode": []}}],
        },
        {"version": 1, "backends": {"a": {"latest_of": ["b", "b"]}}},
        {"flags": {}},
    ],
)
def test_the_checker_and_schema_reject_bad_documents(the_schema, bad):
    assert check(bad, the_schema, the_schema)
    text = yaml.safe_dump(bad)
    assert validate_sources([Fragment("f", text)]), "the loader must reject it too"


def test_scalar_or_list_sets(the_schema):
    good = {
        "version": 1,
        "gates": [
            {
                "id": "g",
                "at_least": "coarse",
                "because": "x",
                "when": {"mode": "prefill", "backend": ["a"], "declared": "in_graph"},
            }
        ],
        "backends": {"a": {}},
    }
    assert check(good, the_schema, the_schema) == []
    assert validate_sources([Fragment("f", yaml.safe_dump(good))]) == []
