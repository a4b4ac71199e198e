"""``warpolicy env``: every declared variable with its value here, the registry's flag
variables, and docs/environment.md generated from the same list (stale -> this test fails)."""

from __future__ import annotations

import json
import pathlib

from warpolicy import environment
from warpolicy.cli.main import main

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "environment.md"
LAYER = """\
version: 1
flags:
  my_switch: {default: false, env: [MY_ENGINE_SWITCH], doc: My engine's switch.}
"""


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_the_docs_page_is_generated_from_the_list(capsys):
    page = run(capsys, "env", "--format", "markdown")
    assert DOC.read_text() == page, "docs/environment.md is stale: run scripts/gen-env-docs"
    for var in environment.variables():
        assert f"`{var.name}`" in page and var.meaning in page
    assert "`WARPOLICY_PREFILL_READ_DONE`" in page  # a flag of the packaged registry
    assert "`SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER` (`not:`)" in page


def test_the_page_does_not_depend_on_the_shell(capsys, monkeypatch, tmp_path):
    layer = tmp_path / "layer.yaml"
    layer.write_text(LAYER)
    monkeypatch.setenv("WARPOLICY_CAPABILITIES", f"default:{layer}")
    monkeypatch.setenv("WARPOLICY_NVTX", "1")
    assert run(capsys, "env", "--format", "markdown") == DOC.read_text()


def test_json_says_what_is_set_here(capsys, monkeypatch):
    monkeypatch.setenv("WARPOLICY_CANARY_RATE", "1/1000")
    monkeypatch.setenv("WARPOLICY_HIERARCHICAL_CACHE", "yes")
    rows = {r["name"]: r for r in json.loads(run(capsys, "env", "--format", "json"))["rows"]}
    assert {v.name for v in environment.variables()} <= set(rows)
    assert (
        rows["WARPOLICY_CANARY_RATE"]["set"] and rows["WARPOLICY_CANARY_RATE"]["value"] == "1/1000"
    )
    assert not rows["WARPOLICY_NVTX"]["set"] and rows["WARPOLICY_NVTX"]["value"] is None
    flag = rows["WARPOLICY_HIERARCHICAL_CACHE"]
    assert flag["value"] == "yes" and flag["read_by"] == "registry"
    assert rows["WARPOLICY_PROFILE_RANGES"]["read_by"] == "warpolicy.runtime.fence"


def test_a_registry_layer_adds_its_flags_variables(capsys, tmp_path):
    layer = tmp_path / "layer.yaml"
    layer.write_text(LAYER)
    out = run(
        capsys, "env", "--capabilities", "default", "--capabilities", str(layer), "--format", "json"
    )
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    assert "flag `my_switch`" in rows["MY_ENGINE_SWITCH"]["meaning"]
    assert "WARPOLICY_PREFILL_READ_DONE" in rows  # the default below it


def test_text_fits_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = run(capsys, "env")
    assert max(len(line) for line in text.splitlines()) <= 80
    assert all(var.name in text for var in environment.variables())
