"""warpolicy.environment: one list of every variable, and every read of the environment goes
through it (the tree is scanned; each scan has a positive control that makes it find)."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warpolicy import environment
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import default_registry_path

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULE = ROOT / "warpolicy" / "environment.py"
#: Where product code lives: the package, the plugins' packages, the examples.
SCANNED = [
    *sorted((ROOT / "warpolicy").rglob("*.py")),
    *sorted(p for p in (ROOT / "plugins").rglob("*.py") if "tests" not in p.parts),
    *sorted((ROOT / "examples").rglob("*.py")),
]
NAME = re.compile(r"\bWARPOLICY_[A-Z0-9_]*[A-Z0-9]\b(?!_?\*)")


def direct_reads(source: str) -> list[str]:
    """Every place ``source`` touches the process environment itself: ``os.environ``,
    ``os.getenv``/``os.putenv``, or those names imported from os."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in {"environ", "getenv", "putenv", "environb", "getenvb"}
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"{node.lineno}: os.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                f"{node.lineno}: from os import {a.name}"
                for a in node.names
                if a.name in {"environ", "getenv", "putenv", "environb", "getenvb"}
            ]
    return found


def named_variables(source: str) -> set[str]:
    """Every ``WARPOLICY_*`` name a string (docstrings included) of ``source`` mentions; a
    pattern such as ``WARPOLICY_CANARY_*`` is not a name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names |= set(NAME.findall(node.value))
    return names


def default_flag_names() -> set[str]:
    engine = PolicyEngine.load([str(default_registry_path())], environ={})
    return {var for flag in engine.registry.flags.values() for var in flag.env}


def test_the_scans_find_what_they_look_for():
    """Positive controls: each scan finds a planted read or an undeclared name."""
    planted = (
        "import os\nfrom os import getenv\nx = os.environ.get('A')\ny = os.getenv('B')\n"
        "'''see WARPOLICY_NOT_DECLARED and WARPOLICY_CANARY_*'''\n"
    )
    assert sorted(direct_reads(planted)) == [
        "2: from os import getenv",
        "3: os.environ",
        "4: os.getenv",
    ]
    assert named_variables(planted) == {"WARPOLICY_NOT_DECLARED"}
    assert SCANNED and MODULE in SCANNED


def test_nothing_but_the_module_reads_the_environment():
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in SCANNED
        if path != MODULE and (found := direct_reads(path.read_text()))
    }
    assert not offenders, (
        f"read the environment through warpolicy.environment (declare the variable there): "
        f"{offenders}"
    )
    assert direct_reads(MODULE.read_text()), "the module itself reads os.environ"


def test_every_variable_the_code_names_is_declared():
    declared = {v.name for v in environment.variables()} | default_flag_names()
    stray = {
        str(path.relative_to(ROOT)): sorted(names - declared)
        for path in SCANNED
        if (names := named_variables(path.read_text())) - declared
    }
    assert not stray, f"declare these in warpolicy/environment.py: {stray}"


def _module_file(dotted: str) -> pathlib.Path:
    top = dotted.split(".")[0]
    if top == "warpolicy":
        spec = importlib.util.find_spec(dotted)
        assert spec is not None and spec.origin, dotted
        return pathlib.Path(spec.origin)
    plugin = ROOT / "plugins" / top.replace("_", "-")
    path = plugin.joinpath(*dotted.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@pytest.mark.parametrize("var", environment.variables(), ids=lambda v: v.name)
def test_each_variable_is_read_where_the_list_says(var):
    """``read_by`` is true: that module uses the variable's object from this module."""
    attr = next(k for k, v in vars(environment).items() if v is var)
    source = _module_file(var.read_by).read_text()
    assert re.search(rf"\b{attr}\b", source), f"{var.read_by} does not read {attr}"


def test_every_variable_says_what_it_means_and_what_unset_means():
    names = [v.name for v in environment.variables()]
    assert len(names) == len(set(names))
    for var in environment.variables():
        assert var.meaning.strip().endswith(".") and var.default.strip(), var.name
        assert var.owner in environment.OWNERS


def test_a_name_declared_twice_or_a_stray_owner_is_refused():
    with pytest.raises(ValueError, match="declared twice"):
        environment.declare("WARPOLICY_NVTX", "again.", default="off", read_by="x")
    with pytest.raises(ValueError, match="owner"):
        environment.Variable("X", "x.", "off", "x", owner="somebody")
    assert environment.variable("WARPOLICY_NVTX") is environment.NVTX


@given(st.dictionaries(st.sampled_from(["WARPOLICY_NVTX", "OTHER"]), st.text(max_size=5)))
def test_get_and_is_set_read_the_given_mapping(environ):
    var = environment.NVTX
    assert var.get(environ) == environ.get("WARPOLICY_NVTX", "")
    assert var.is_set(environ) == ("WARPOLICY_NVTX" in environ)
    assert environment.lookup("OTHER", environ) == environ.get("OTHER", "")


def test_none_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("WARPOLICY_NVTX", "yes")
    assert environment.NVTX.get() == "yes" and environment.NVTX.is_set()
    monkeypatch.delenv("WARPOLICY_NVTX")
    assert environment.NVTX.get() == "" and not environment.NVTX.is_set()


def test_overridden_sets_for_the_block_and_puts_back(monkeypatch):
    import os

    var = environment.PYTHONWARNINGS
    monkeypatch.delenv(var.name, raising=False)
    with var.overridden("ignore"):
        assert os.environ[var.name] == "ignore" == var.get()
    assert not var.is_set()
    monkeypatch.setenv(var.name, "default")
    with pytest.raises(RuntimeError), var.overridden("error"):
        raise RuntimeError
    assert var.get() == "default"
