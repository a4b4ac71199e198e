"""The JSON Schema shipped as a file in the package, and the editor modeline that points at it."""

from __future__ import annotations

import importlib.resources
import json
import pathlib
import re

import pytest
import yaml

from warpolicy.cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA_FILE = importlib.resources.files("warpolicy") / "capabilities.schema.json"
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")


def test_shipped_schema_is_what_warpolicy_schema_prints(capsys):
    assert main(["schema"]) == 0
    printed = capsys.readouterr().out
    assert SCHEMA_FILE.read_text(encoding="utf-8") == printed, (
        "warpolicy/capabilities.schema.json is stale: run scripts/gen-schema"
    )


def test_default_registry_modeline_names_the_shipped_schema():
    first = (ROOT / "capabilities.yaml").read_text(encoding="utf-8").splitlines()[0]
    match = MODELINE.match(first)
    assert match, first
    target = (ROOT / match.group(1)).resolve()  # relative to the YAML file, as editors read it
    assert target == pathlib.Path(str(SCHEMA_FILE)).resolve()


def test_default_registry_is_valid_under_the_shipped_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    document = yaml.safe_load((ROOT / "capabilities.yaml").read_text(encoding="utf-8"))
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(document)]
    assert errors == []


def test_shipped_schema_rejects_an_unknown_policy():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    bad = {"version": 1, "backends": {"b": {"reads_end": {"decode": "early"}, "doc": "x"}}}
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(bad))
