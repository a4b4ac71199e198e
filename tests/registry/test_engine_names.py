"""Backend and spec algorithm names are matched ignoring case, as ``--platform`` is: in the
engine's ways in, in the CLI, and in `Registry` lookups; the registry's own spelling is what
every answer carries. Two names equal under folding are refused where the second is defined."""

from __future__ import annotations

import json
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warpolicy.cli.main import main
from warpolicy.errors import RegistryError, UnknownNameError
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import (
    Fragment,
    default_registry_path,
    load_registry,
    validate_sources,
)
from warpolicy.registry.vocabulary import ForwardMode

MIXED = textwrap.dedent(
    """\
    version: 1
    backends:
      MyBackend:
        inherits: fa3
        doc: a mixed-case name
    """
)


@pytest.fixture(scope="module")
def engine():
    return PolicyEngine.load(
        [str(default_registry_path())], fragments=[Fragment("mixed.yaml", MIXED)], environ={}
    )


def spellings(name):
    return st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda ups: "".join(c.upper() if up else c.lower() for c, up in zip(name, ups))
    )


@given(backend=spellings("MyBackend"), spec=spellings("eagle"))
def test_any_case_finds_the_registrys_spelling(engine, backend, spec):
    decision = engine.decision(Context(backend, ForwardMode.DECODE, spec))
    exact = engine.decision(Context("MyBackend", ForwardMode.DECODE, "eagle"))
    assert decision == exact
    assert (decision.context.backend, decision.context.spec) == ("MyBackend", "eagle")


def test_compile_table_explain_and_placement_fold_too(engine):
    folded, exact = engine.compile("FA3", "EAGLE", strict=True), engine.compile("fa3", "eagle")
    assert (folded.backend, folded.spec) == ("fa3", "eagle")
    for mode in ForwardMode:
        assert folded.lookup(mode, False, True) == exact.lookup(mode, False, True)
    rows = engine.table(["MYBACKEND"], ["None"], ["decode"])
    assert [(r.context.backend, r.context.spec) for r in rows] == [("MyBackend", "none")]
    assert engine.explain(Context("mybackend", ForwardMode.DECODE)).backend == "MyBackend"
    assert engine.placement("FA3", ForwardMode.DECODE) == engine.placement(
        "fa3", ForwardMode.DECODE
    )
    assert engine.registry.backend("FA3") is engine.registry.backends["fa3"]


def test_unknown_names_still_raise_with_their_spelling(engine):
    with pytest.raises(UnknownNameError, match="'fa33'"):
        engine.decision(Context("fa33", ForwardMode.DECODE))
    with pytest.raises(UnknownNameError, match="spec algorithm 'EGALE'"):
        engine.decision(Context("fa3", ForwardMode.DECODE, "EGALE"))
    with pytest.raises(UnknownNameError):
        engine.compile("nope", strict=True)


def test_the_implicit_none_folds_where_a_registry_omits_it():
    bare = PolicyEngine.load(
        [],
        fragments=[
            Fragment("bare.yaml", "version: 1\nbackends:\n  b: {reads_end: {decode: in_graph}}\n")
        ],
        environ={},
    )
    assert bare.decision(Context("B", ForwardMode.DECODE, "NONE")).context.spec == "none"


def test_the_cli_folds_backend_and_spec(capsys):
    assert (
        main(
            ["query", "--backend", "FA3", "--mode", "decode", "--spec", "Eagle", "--format", "json"]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert (doc["backend"], doc["spec"]) == ("fa3", "eagle")
    assert (
        main(
            ["table", "--backend", "DSV4", "--spec", "NONE", "--mode", "decode", "--format", "json"]
        )
        == 0
    )
    assert [r["backend"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["dsv4"]


CLASH = textwrap.dedent(
    """\
    version: 1
    spec_algorithms:
      Eagle: {capabilities: {prefill_read_done: true}, doc: x}
    backends:
      mine: {inherits: fa3, doc: mine}
      MINE: {inherits: fa3, doc: again}
      FA3: {inherits: fa3, doc: over the default}
    """
)


def test_names_equal_under_folding_are_refused_where_the_second_is_defined():
    problems = validate_sources([default_registry_path(), Fragment("clash.yaml", CLASH)])
    located = {(p.line, p.col): p.message for p in problems if p.file == "clash.yaml"}
    assert set(located) == {(3, 3), (6, 3), (7, 3)}, problems
    assert "spec algorithm 'Eagle' is spec algorithm 'eagle'" in located[(3, 3)]
    assert "backend 'MINE' is backend 'mine' (defined at clash.yaml:5:3)" in located[(6, 3)]
    assert "'FA3' is backend 'fa3'" in located[(7, 3)] and "override: true" in located[(7, 3)]
    assert len(problems) == 3  # no second "unknown" or cascade


def test_the_model_refuses_a_clash_the_loader_did_not_see():
    """The model's own check (a registry built without the loader) locates both."""
    registry = load_registry([default_registry_path()])
    import attrs

    twin = attrs.evolve(registry.backends["fa3"], name="Fa3")
    with pytest.raises(RegistryError, match="backends.Fa3: the same backend as 'fa3'"):
        attrs.evolve(registry, backends={**registry.backends, "Fa3": twin})
