"""Buffer classes in the registry: ``{CLASS: policy}`` declarations, ``reads_classes``,
``buffer_classes``, the cell as the latest class, per-class decisions, and `class_problems`
(validate refuses a wrapper or linear-attention layers that under-declare a class)."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from warpolicy.errors import RegistryError
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.evaluation import Evaluation
from warpolicy.registry.loader import Fragment, load_registry, validate_sources
from warpolicy.registry.model import BUILT_IN_CLASSES, Backend, Registry, class_problems
from warpolicy.registry.schema import registry_json_schema
from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    PRE_REPLAY,
    ForwardMode,
    WarReadDonePolicy,
)

jsonschema = pytest.importorskip("jsonschema")  # a test extra; the GPU machine may lack it

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND

HEAD = """\
version: 1
spec_algorithms:
  none: {capabilities: {prefill_read_done: true}, doc: no spec}
backends:
  base: {abstract: true, reads_end: {decode: in_graph}}
  fa3: {inherits: base}
"""


def frag(text: str, name: str = "f.yaml") -> Fragment:
    """``HEAD`` plus backend entries (any indentation)."""
    return Fragment(name, HEAD + textwrap.indent(textwrap.dedent(text), "  "))


def problems(text: str) -> list[str]:
    return [str(p) for p in validate_sources([frag(text)])]


def engine(text: str) -> PolicyEngine:
    return PolicyEngine(load_registry([frag(text)]))


def test_a_class_map_is_the_mode_release_of_its_latest_class():
    reg = load_registry(
        [
            frag(
                """\
              lin:
                reads_classes: [recurrent_state]
                reads_end: {decode: {metadata: in_graph, recurrent_state: post_replay}}
            """
            )
        ]
    )
    lin = reg.backend("lin")
    assert lin.reads_end[DECODE] is POST_REPLAY
    assert dict(lin.declared_classes(DECODE)) == {
        "metadata": IN_GRAPH,
        "recurrent_state": POST_REPLAY,
    }
    assert dict(reg.backend("fa3").declared_classes(DECODE)) == {}  # inherited, not own
    assert dict(reg.backend("base").declared_classes(DECODE)) == {"metadata": IN_GRAPH}
    assert set(BUILT_IN_CLASSES) <= set(reg.buffer_classes)


def test_unknown_class_is_one_located_line_with_a_suggestion():
    found = problems(
        """\
      lin:
        reads_end: {decode: {metadata: in_graph, recurent_state: post_replay}}
    """
    )
    assert found == [
        "f.yaml:8:46: backends.lin.reads_end.decode: unknown buffer class 'recurent_state'; "
        "did you mean 'recurrent_state'?"
    ]


def test_a_registry_declares_more_classes():
    text = """\
      lin:
        reads_end: {decode: {metadata: in_graph, conv_state: post_replay}}
    """
    assert problems(text)  # not declared yet
    found = [
        str(p)
        for p in validate_sources(
            [
                Fragment(
                    "f.yaml",
                    HEAD.replace(
                        "backends:",
                        "buffer_classes:\n  conv_state: {doc: short convolution state}\nbackends:",
                    )
                    + textwrap.indent(textwrap.dedent(text), "  "),
                )
            ]
        )
    ]
    assert found == []


@pytest.mark.parametrize(
    "value, message",
    [
        ("{}", "an empty class map"),
        ("{metadata: soon}", "unknown policy"),
    ],
)
def test_bad_class_maps_are_refused(value, message):
    found = problems(f"lin: {{reads_end: {{decode: {value}}}}}\n")
    assert len(found) == 1 and message in found[0]


def test_a_reserved_name_cannot_be_a_class():
    found = [
        str(p)
        for p in validate_sources(
            [Fragment("f.yaml", "version: 1\nbuffer_classes:\n  policy: {doc: not a class}\n")]
        )
    ]
    assert len(found) == 1 and "cannot name a buffer class" in found[0]


def test_linear_attention_layers_keeping_the_base_declaration_are_refused():
    found = problems(
        """\
      linear_attn:
        inherits: base
        abstract: true
        reads_classes: [recurrent_state]
    """
    )
    assert len(found) == 1
    assert found[0].startswith("f.yaml:7:3: backends.linear_attn.reads_end.decode: ")
    assert "reads recurrent_state" in found[0]


WRAPPERS = """\
  lin:
    reads_classes: [recurrent_state]
    reads_end: {decode: {metadata: in_graph, recurrent_state: post_replay}}
"""


@pytest.mark.parametrize(
    "wrapper",
    [
        "latest_of: [fa3, lin]",
        "routes: {fact: route, children: {a: fa3, b: lin}, pinned: true}",
    ],
)
def test_a_wrapper_declaring_only_its_primary_child_is_refused(wrapper):
    facts = "facts:\n  route: {type: name, values: [a, b], doc: route}\n"
    text = WRAPPERS + f"  wrapped: {{{wrapper}, reads_end: {{decode: in_graph}}}}\n"
    found = [str(p) for p in validate_sources([Fragment("f.yaml", facts + HEAD + text)])]
    found = [p for p in found if "pinned" not in p]
    assert len(found) == 1, found
    assert "backends.wrapped.reads_end.decode: wrapped runs lin for decode" in found[0]
    assert found[0].startswith("f.yaml:")


def test_a_per_mode_wrapper_declares_only_modes_no_child_runs():
    text = WRAPPERS + "  wrapped: {per_mode: {extend: lin}, reads_end: {decode: in_graph}}\n"
    assert problems(text) == []


def test_a_wrapper_declaring_the_latest_of_every_child_is_accepted():
    text = WRAPPERS + (
        "  wrapped:\n    latest_of: [fa3, lin]\n"
        "    reads_end: {decode: {metadata: in_graph, recurrent_state: none}}\n"
        "  plain_composite: {latest_of: [fa3, lin]}\n"
    )
    assert problems(text) == []


def test_class_problems_hold_for_a_registry_built_in_python():
    lin = Backend(
        "lin",
        reads_end={DECODE: POST_REPLAY},
        reads_end_classes={DECODE: {"metadata": IN_GRAPH, "recurrent_state": POST_REPLAY}},
        reads_classes={"recurrent_state"},
    )
    wrapper = Backend("w", reads_end={DECODE: IN_GRAPH}, latest_of=("lin",))
    reg = Registry(backends={"lin": lin, "w": wrapper})
    assert len(class_problems(reg)) == 1


def test_the_cell_must_be_the_latest_of_its_classes():
    with pytest.raises(RegistryError, match="latest of its classes"):
        Backend(
            "lin",
            reads_end={DECODE: IN_GRAPH},
            reads_end_classes={DECODE: {"metadata": IN_GRAPH, "recurrent_state": POST_REPLAY}},
        )


def test_an_unknown_class_in_python_is_refused_by_the_registry():
    lin = Backend(
        "lin", reads_end={DECODE: IN_GRAPH}, reads_end_classes={DECODE: {"nope": IN_GRAPH}}
    )
    with pytest.raises(RegistryError, match="unknown buffer class 'nope'"):
        Registry(backends={"lin": lin})


def decide_class(eng: PolicyEngine, backend: str, cls, mode=DECODE) -> WarReadDonePolicy:
    ctx = Context(backend, mode, "none")
    flags = eng.flag_values({})
    return (
        Evaluation(eng.registry, ctx, eng.spec("none"), flags, buffer_class=cls)
        .explain(backend)
        .decision.policy
    )


def test_per_class_decisions_of_a_composite():
    eng = engine(WRAPPERS + "  hybrid: {latest_of: [fa3, lin]}\n")
    assert decide_class(eng, "hybrid", None) is POST_REPLAY  # the cell: today's decision
    assert decide_class(eng, "hybrid", "metadata") is IN_GRAPH
    assert decide_class(eng, "hybrid", "recurrent_state") is POST_REPLAY
    assert decide_class(eng, "hybrid", "kv_pages") is NONE  # no child declares it: unknown
    assert decide_class(eng, "fa3", "recurrent_state") is NONE


def test_a_read_class_left_undeclared_is_none_at_runtime():
    # a registry built in Python skips the loader's check: the engine still fails closed
    base = Backend("base", reads_end={DECODE: IN_GRAPH}, abstract=True)
    lin = Backend("lin", inherits="base", reads_classes={"recurrent_state"})
    eng = PolicyEngine(Registry(backends={"base": base, "lin": lin}))
    assert decide_class(eng, "lin", None) is NONE
    assert decide_class(eng, "lin", "recurrent_state") is NONE
    assert decide_class(eng, "lin", "metadata") is IN_GRAPH


def test_the_schema_accepts_class_maps_and_refuses_reserved_keys():
    schema = registry_json_schema()
    good = yaml.safe_load(
        HEAD + "  lin: {reads_end: {decode: {metadata: in_graph, recurrent_state: none}}}\n"
    )
    jsonschema.validate(good, schema)
    bad = yaml.safe_load(HEAD + "  lin: {reads_end: {decode: {policy: in_graph, x: none}}}\n")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


POLICIES = st.sampled_from([PRE_REPLAY, IN_GRAPH, POST_REPLAY, NONE])


@given(
    st.dictionaries(st.sampled_from(sorted(BUILT_IN_CLASSES)), POLICIES, min_size=1, max_size=4),
    POLICIES,
)
def test_the_cell_is_never_earlier_than_any_class_or_child(classes, other):
    # oracle: a max written here, not the engine's
    lin = Backend(
        "lin",
        reads_end={DECODE: max(classes.values())},
        reads_end_classes={DECODE: classes},
    )
    plain = Backend("plain", reads_end={DECODE: other})
    hybrid = Backend("hybrid", latest_of=("lin", "plain"))
    eng = PolicyEngine(Registry(backends={"lin": lin, "plain": plain, "hybrid": hybrid}))
    cell = decide_class(eng, "hybrid", None)
    expected = max([*classes.values(), other])
    assert cell == expected
    for name, policy in classes.items():
        per = decide_class(eng, "hybrid", name)
        floor = max(policy, other) if name == "metadata" else policy
        assert per >= floor and per <= cell


def test_diff_fails_on_a_class_made_earlier_while_the_cell_stays():
    from warpolicy.registry.cells import cell_space
    from warpolicy.registry.compare import diff_engines

    def lin(metadata: str) -> str:
        return (
            "lin:\n  reads_classes: [recurrent_state]\n"
            f"  reads_end: {{decode: {{metadata: {metadata}, recurrent_state: post_replay}}}}\n"
        )

    old, new = engine(lin("post_replay")), engine(lin("in_graph"))
    found = diff_engines(old, new, cell_space([old.registry, new.registry]))
    assert found.needs_audit
    changed = {(c.backend, c.mode, c.old, c.new, c.change) for c in found.cells}
    assert ("lin", "decode:metadata", "post_replay", "in_graph", "earlier") in changed
    assert not any(c.mode == "decode" for c in found.cells)  # the cell did not move
    back = diff_engines(new, old, cell_space([old.registry, new.registry]))
    assert {c.change for c in back.cells} == {"later"}


def test_explain_and_table_show_each_class():
    from warpolicy.registry.report import format_explanation, format_table

    eng = engine(WRAPPERS + "  hybrid: {latest_of: [fa3, lin]}\n")
    exp = eng.explain(Context("hybrid", DECODE, "none"))
    assert [(n, d.policy) for n, d in exp.classes] == [
        ("metadata", IN_GRAPH),
        ("recurrent_state", POST_REPLAY),
    ]
    text = format_explanation(exp)
    assert "class metadata: in_graph" in text and "class recurrent_state: post_replay" in text
    assert '"recurrent_state"' in format_explanation(exp, "json")
    assert eng.explain(Context("fa3", DECODE, "none")).classes == ()  # no class named
    rows = eng.table(["fa3", "hybrid"], ["none"], [DECODE])
    table = format_table(rows, "text", eng.class_table(rows))
    assert "metadata in_graph, recurrent_state post_replay" in table
    assert table.splitlines()[0].split()[-1] == "classes"


def test_compile_classes_gives_a_runner_its_class_policies():
    eng = engine(WRAPPERS + "  hybrid: {latest_of: [fa3, lin]}\n")
    per = eng.compile_classes("hybrid")
    assert set(per) == {"metadata", "recurrent_state"}
    assert per["metadata"](DECODE, False, True) is IN_GRAPH
    assert per["metadata"](DECODE, False, False) is POST_REPLAY  # sound demotion: no node
    assert per["recurrent_state"](EXTEND, False, True) is NONE  # undeclared mode
    assert eng.compile_classes("fa3") == {}
