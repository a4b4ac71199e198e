"""warpolicy.registry.loader: per-batch facts, fact tests, declarations and capabilities after an
action, per-batch routers and inverted environment aliases (one test per validation error)."""

from __future__ import annotations

import textwrap

import pytest

from warpolicy.registry.loader import Fragment, load_registry, validate_sources, validate_warnings
from warpolicy.registry.model import After, FactTest, Route
from warpolicy.registry.vocabulary import FactType, ForwardMode, WarReadDonePolicy

EXTEND = ForwardMode.EXTEND
P = WarReadDonePolicy

BASE = """\
version: 1
flags:
  fast:
    default: false
    env: [WARPOLICY_FAST, {not: SGLANG_SLOW}, SGLANG_FAST]
    doc: go fast
facts:
  tokens:
    type: int
    doc: query tokens
  snapshot:
    type: action
    doc: the snapshot hook succeeded
  images:
    type: bool
    doc: the batch carries images
  route:
    type: name
    values: [text, image]
    doc: which child ran
spec_algorithms:
  none:
    capabilities: {prefill_read_done: true}
    doc: no spec
  eagle:
    capabilities: {prefill_read_done: {after: snapshot}}
    doc: eagle
backends:
  base:
    abstract: true
    reads_end: {decode: in_graph}
    doc: base contract
  fa3:
    inherits: base
    reads_end:
      extend: {policy: pre_replay, after: snapshot, otherwise: post_replay}
    doc: fa3
  triton:
    inherits: base
    doc: triton
  router:
    routes:
      fact: route
      modes: [extend]
      children: {text: fa3, image: triton}
      default: text
      pinned: true
    doc: a router
gates:
  - id: big
    when: {mode: extend, facts: {tokens: {gt: 100, le: 5000}, snapshot: false, images: true}}
    at_least: none
    because: big batches need the snapshot
  - id: routed
    when: {facts: {route: image, tokens: 7}}
    at_least: post_replay
    because: image batches
"""


def frag(text: str, name: str = "f.yaml") -> Fragment:
    return Fragment(name, textwrap.dedent(text))


def messages(*texts: str) -> list[str]:
    return [str(p) for p in validate_sources([frag(t, f"f{i}.yaml") for i, t in enumerate(texts)])]


def test_base_loads_every_per_batch_shape():
    reg = load_registry([frag(BASE)])
    assert {n: f.type for n, f in reg.facts.items()} == {
        "tokens": FactType.INT,
        "snapshot": FactType.ACTION,
        "images": FactType.BOOL,
        "route": FactType.NAME,
    }
    assert reg.fact("route").values == {"text", "image"}
    assert reg.flag("fast").env == ("WARPOLICY_FAST", "SGLANG_SLOW", "SGLANG_FAST")
    assert reg.flag("fast").inverted == {"SGLANG_SLOW"}
    assert dict(reg.spec("eagle").capabilities_after) == {"prefill_read_done": "snapshot"}
    assert not reg.spec("eagle").has("prefill_read_done")
    fa3 = reg.backend("fa3")
    assert fa3.reads_end[EXTEND] is P.PRE_REPLAY
    assert fa3.reads_end_after[EXTEND] == After("snapshot", P.POST_REPLAY)
    assert reg.backend("router").routes == Route(
        "route", {"text": "fa3", "image": "triton"}, frozenset({EXTEND}), "text", True
    )
    big = reg.gates[0].when.facts
    assert big == {
        "tokens": FactTest(compare=(("gt", 100), ("le", 5000))),
        "snapshot": FactTest(equals=False),
        "images": FactTest(equals=True),
    }
    assert reg.gates[1].when.facts == {
        "route": FactTest(names=frozenset({"image"})),
        "tokens": FactTest(compare=(("eq", 7),)),
    }
    assert validate_warnings([frag(BASE)]) == []


def replace(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new)


@pytest.mark.parametrize(
    "text,expected",
    [
        # facts
        (
            replace("    type: int\n", "    type: count\n"),
            "f0.yaml:9:11: facts.tokens.type: unknown fact type 'count'",
        ),
        (
            replace("    type: int\n    doc: query tokens\n", "    type: int\n"),
            "missing required key 'doc'",
        ),
        (
            replace("    type: int\n", "    type: int\n    values: [a]\n"),
            "facts.tokens.values: only a name fact lists values",
        ),
        (replace("    type: int\n", "    typ: int\n"), "unknown key 'typ'; did you mean 'type'?"),
        # fact tests
        (
            replace("tokens: {gt: 100, le: 5000}", "tokens: {gt: 100, ne: 5}"),
            "gates[0].when.facts.tokens: unknown key 'ne'",
        ),
        (
            replace("tokens: {gt: 100, le: 5000}", "tokens: {gt: x}"),
            "gates[0].when.facts.tokens.gt: expected an integer, got the string 'x'",
        ),
        (
            replace("tokens: {gt: 100, le: 5000}", "tokens: {}"),
            "gates[0].when.facts.tokens: no comparison; use gt, ge, lt, le or eq",
        ),
        (
            replace("tokens: {gt: 100, le: 5000}", "tokens: 2.5"),
            "gates[0].when.facts.tokens: expected an integer, got the number 2.5",
        ),
        (
            replace("tokens: {gt: 100, le: 5000}", "tokenz: {gt: 100}"),
            "gates[0].when.facts.tokenz: unknown fact 'tokenz'; did you mean 'tokens'?",
        ),
        (
            replace("tokens: {gt: 100, le: 5000}", "tokens: true"),
            "gates[0].when.facts.tokens: fact 'tokens' is int; true/false tests a bool or action",
        ),
        (
            replace("images: true}", "images: {gt: 1}}"),
            "gates[0].when.facts.images: fact 'images' is bool; a number or comparison tests",
        ),
        (
            replace("snapshot: false, images", "snapshot: true, images"),
            "fact 'snapshot' is an action: test it only for false",
        ),
        (
            replace("route: image, tokens: 7", "route: imgae, tokens: 7"),
            "gates[1].when.facts.route: unknown value of fact 'route' 'imgae'; did you mean "
            "'image'?",
        ),
        (
            replace("route: image, tokens: 7", "route: image, images: [a]"),
            "gates[1].when.facts.images: fact 'images' is bool; names test a name fact",
        ),
        # declarations after an action
        (
            replace(
                "after: snapshot, otherwise: post_replay", "after: snapshot, otherwise: pre_replay"
            ),
            "backends.fa3.reads_end.extend: otherwise (pre_replay) must be later than policy",
        ),
        (
            replace("after: snapshot, otherwise: post_replay", "otherwise: post_replay"),
            "backends.fa3.reads_end.extend: missing required key 'after'",
        ),
        (
            replace("after: snapshot, otherwise: post_replay", "after: tokens"),
            "backends.fa3.reads_end.extend.after: fact 'tokens' is int; after names an action fact",
        ),
        (
            replace("after: snapshot, otherwise: post_replay", "after: snapshto"),
            "backends.fa3.reads_end.extend.after: unknown fact 'snapshto'; did you mean "
            "'snapshot'?",
        ),
        # capabilities after an action
        (
            replace(
                "{prefill_read_done: {after: snapshot}}", "{prefill_read_done: {after: images}}"
            ),
            "spec_algorithms.eagle.capabilities.prefill_read_done.after: fact 'images' is bool; "
            "after names an action fact",
        ),
        (
            replace("{prefill_read_done: {after: snapshot}}", "{prefill_read_done: {when: x}}"),
            "spec_algorithms.eagle.capabilities.prefill_read_done: unknown key 'when'",
        ),
        # routers
        (
            replace("      fact: route\n", "      fact: tokens\n"),
            "backends.router.routes.fact: fact 'tokens' is int; a router names its child by a "
            "name fact",
        ),
        (
            replace("children: {text: fa3, image: triton}", "children: {text: fa3, video: triton}"),
            "backends.router.routes.fact: unknown value of fact 'route' 'video'",
        ),
        (
            replace(
                "children: {text: fa3, image: triton}", "children: {text: fa3, image: trition}"
            ),
            "backends.router.routes.children.image: unknown backend 'trition'; did you mean "
            "'triton'?",
        ),
        (
            replace("      default: text\n", "      default: txt\n"),
            "backends.router.routes.default: 'txt' is not a label (text, image)",
        ),
        (
            replace("      modes: [extend]\n", ""),
            "backends.router.routes: default needs modes",
        ),
        (
            replace("children: {text: fa3, image: triton}", "children: {}"),
            "backends.router.routes.children: an empty mapping; a router routes to at least one",
        ),
        (
            replace("    routes:\n", "    inherits: base\n    routes:\n"),
            "backends.router: a router (routes) cannot have inherits",
        ),
        (
            replace("    routes:\n", "    latest_of: [fa3]\n    routes:\n"),
            "backends.router: a router (routes) cannot have latest_of",
        ),
        (
            replace("      pinned: true\n", "      pinned: yes please\n"),
            "backends.router.routes.pinned: expected true or false",
        ),
        (
            replace("      fact: route\n", ""),
            "backends.router.routes: missing required key 'fact'",
        ),
        # inverted environment aliases
        (
            replace("{not: SGLANG_SLOW}", "{not: SGLANG_FAST}"),
            "flags.fast.env: SGLANG_FAST is listed twice",
        ),
        (
            replace("{not: SGLANG_SLOW}", "{nope: SGLANG_SLOW}"),
            "flags.fast.env[1]: expected {not: NAME}, a single key 'not'",
        ),
        (
            replace("{not: SGLANG_SLOW}", "{not: 1X}"),
            "flags.fast.env[1].not: '1X' is not an environment variable name",
        ),
    ],
)
def test_per_batch_problems_are_located_in_the_files_key_names(text, expected):
    found = messages(text)
    assert any(expected in m for m in found), found
    assert all(m.startswith("f0.yaml:") for m in found), found


def test_every_per_batch_problem_is_reported_at_once():
    text = replace("after: snapshot, otherwise: post_replay", "after: snapshto")
    text = text.replace("route: image, tokens: 7", "route: imgae, tokens: 7")
    text = text.replace("      default: text\n", "      default: txt\n")
    found = messages(text)
    assert len(found) == 3, found


def test_facts_resolve_across_layers():
    first = frag(BASE.split("backends:")[0].split("facts:")[0] + "backends:\n  b: {doc: b}\n")
    second = frag(
        """\
        version: 1
        facts:
          n: {type: int, doc: count}
        gates:
          - {id: g, when: {facts: {n: {gt: 1}}}, at_least: none, because: big}
        """,
        "second.yaml",
    )
    assert validate_sources([first, second]) == []
    redefined = frag("version: 1\nfacts:\n  n: {type: bool, doc: again}\n", "third.yaml")
    found = [str(p) for p in validate_sources([first, second, redefined])]
    assert any("fact 'n' already defined at second.yaml" in m for m in found), found


def test_an_unpinned_router_is_a_warning_not_a_problem():
    text = replace("      pinned: true\n", "")
    assert messages(text) == []
    (warning,) = validate_warnings([frag(text)])
    assert "backends.router.routes" in warning.message and "pinned: true" in warning.message
    assert (warning.file, warning.line) == ("f.yaml", 41)  # the router's name


def test_plugin_mappings_carry_per_batch_shapes():
    mapping = {
        "version": 1,
        "facts": {"n": {"type": "int", "doc": "count"}},
        "backends": {
            "b": {"reads_end": {"extend": {"policy": "pre_replay", "after": "s"}}, "doc": "b"},
        },
    }
    found = [str(p) for p in validate_sources([Fragment("plugin:p", mapping)])]
    assert found == ["plugin:p: backends.b.reads_end.extend.after: unknown fact 's'; known: n"]
