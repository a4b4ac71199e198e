"""The JSON Schema shipped as a file in the package, and the editor modeline that points at it."""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import pathlib
import re

import pytest
import yaml

from warpolicy.cli.main import main
from warpolicy.registry.loader import default_registry_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA_NAME = "capabilities.schema.json"
SCHEMA_FILE = importlib.resources.files("warpolicy") / SCHEMA_NAME
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")


def test_shipped_schema_is_what_warpolicy_schema_prints(capsys):
    assert main(["schema"]) == 0
    printed = capsys.readouterr().out
    assert SCHEMA_FILE.read_text(encoding="utf-8") == printed, (
        "warpolicy/capabilities.schema.json is stale: run scripts/gen-schema"
    )


def modeline_target(registry: pathlib.Path) -> pathlib.Path:
    first = registry.read_text(encoding="utf-8").splitlines()[0]
    match = MODELINE.match(first)
    assert match, first
    return (registry.parent / match.group(1)).resolve()  # relative to the file, as editors read


def test_the_repositorys_modeline_names_the_shipped_schema():
    assert modeline_target(ROOT / "capabilities.yaml") == ROOT / "warpolicy" / SCHEMA_NAME


def test_the_registry_in_use_names_a_schema_that_exists_beside_the_package():
    """Run from the repository this is the file above; run against an installed package (CI
    installs the sdist and runs these tests from it), the packaged copy in site-packages, whose
    modeline 0.2 pointed at ``site-packages/warpolicy/warpolicy/capabilities.schema.json``."""
    registry = default_registry_path()
    target = modeline_target(registry)
    assert target.is_file(), f"{registry}: the modeline names {target}, which does not exist"
    assert target == pathlib.Path(str(SCHEMA_FILE)).resolve() or target == (
        ROOT / "warpolicy" / SCHEMA_NAME
    )


def test_the_wheel_rewrites_the_modeline_for_the_package(tmp_path):
    """hatch_build.py: the packaged copy sits in warpolicy/ beside the schema."""
    spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    packaged = tmp_path / "warpolicy" / "capabilities.yaml"
    packaged.parent.mkdir()
    (packaged.parent / SCHEMA_NAME).write_text("{}")
    text = (ROOT / "capabilities.yaml").read_text(encoding="utf-8")
    packaged.write_text(hook.packaged_registry(text), encoding="utf-8")
    assert modeline_target(packaged) == (packaged.parent / SCHEMA_NAME).resolve()
    assert packaged.read_text(encoding="utf-8").splitlines()[1:] == text.splitlines()[1:]
    with pytest.raises(ValueError, match="must start with a schema modeline"):
        hook.packaged_registry("version: 1\n")


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
