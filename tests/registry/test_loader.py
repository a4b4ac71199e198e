"""warpolicy.registry.loader: reading, validating and layering registry sources."""

from __future__ import annotations

import os
import pathlib
import textwrap

import pytest

from warpolicy.errors import InputError, Problem, RegistryError, UnreadableSourceError
from warpolicy.registry import loader
from warpolicy.registry.loader import (
    DEFAULT,
    Fragment,
    default_registry_path,
    load_registry,
    registry_sources,
    validate_sources,
)
from warpolicy.registry.model import Conditions, Origin
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy

DECODE, EXTEND, VERIFY = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY

BASE = """\
version: 1
flags:
  fast:
    default: false
    env: [WARPOLICY_FAST, SGLANG_FAST]
    doc: go fast
spec_algorithms:
  none:
    capabilities: {prefill_read_done: true}
    doc: no spec
  eagle:
    family: eagle
    capabilities: {prefill_read_done: false}
    doc: eagle
backends:
  base:
    abstract: true
    reads_end: {decode: in_graph, target_verify: in_graph}
    doc: base contract
  fa3:
    inherits: base
    doc: fa3
gates:
  - id: slow
    when: {flags: {fast: false}, mode: [extend, decode]}
    at_least: post_replay
    because: not fast
"""


def frag(text: str, name: str = "f.yaml") -> Fragment:
    return Fragment(name, textwrap.dedent(text))


def problems(*texts: str) -> list[Problem]:
    return validate_sources([frag(t, f"f{i}.yaml") for i, t in enumerate(texts)])


def messages(*texts: str) -> list[str]:
    return [str(p) for p in problems(*texts)]


# -- a valid registry -------------------------------------------------------------------------


def test_loads_entries_into_frozen_models(composer):
    reg = load_registry([frag(BASE)])
    assert reg.flags["fast"].env == ("WARPOLICY_FAST", "SGLANG_FAST")
    assert reg.flags["fast"].default is False
    assert reg.spec("eagle").family == "eagle"
    assert reg.spec("none").has("prefill_read_done")
    fa3 = reg.backend("fa3")
    assert fa3.inherits == "base" and fa3.reads_end == {}
    assert reg.backend("base").reads_end == {
        DECODE: WarReadDonePolicy.IN_GRAPH,
        VERIFY: WarReadDonePolicy.IN_GRAPH,
    }
    assert reg.backend("base").abstract
    assert reg.concrete_backends() == ["fa3"]
    (gate,) = reg.gates
    assert gate.when == Conditions(mode=frozenset({EXTEND, DECODE}), flags={"fast": False})
    assert gate.at_least is WarReadDonePolicy.POST_REPLAY
    assert gate.scope is None
    assert reg.sources == ("f.yaml",)


def test_origins_are_one_based_and_point_at_keys():
    reg = load_registry([frag(BASE)])
    assert reg.flags["fast"].origin == Origin("f.yaml", 3, 3)
    assert reg.backend("base").origin == Origin("f.yaml", 16, 3)
    assert reg.backend("base").reads_end_origins[DECODE] == Origin("f.yaml", 18, 17)
    assert reg.gates[0].origin == Origin("f.yaml", 24, 5)


def test_aliases_and_scalars_for_sets():
    reg = load_registry(
        [
            frag("""\
        version: 1
        spec_algorithms: {dflash: {family: dflash, capabilities: {tv: true}}}
        backends:
          b: {reads_end: {prefill: pre_replay, verify: coarse, decode: in_replay}}
        gates:
          - id: g
            when: {mode: verify, spec_family: dflash, spec_has: tv, declared: [in_graph, none],
                   platform: hip, eager: false, planted: true, external_events: true,
                   backend: b, spec: dflash, spec_lacks: [tv]}
            at_least: none
            because: all conditions
        """)
        ]
    )
    assert reg.backend("b").reads_end == {
        EXTEND: WarReadDonePolicy.PRE_REPLAY,
        VERIFY: WarReadDonePolicy.NONE,
        DECODE: WarReadDonePolicy.IN_GRAPH,
    }
    when = reg.gates[0].when
    assert when.mode == frozenset({VERIFY})
    assert when.declared == frozenset({WarReadDonePolicy.IN_GRAPH, WarReadDonePolicy.NONE})
    assert when.platform == frozenset({"hip"}) and when.spec_lacks == frozenset({"tv"})
    assert (when.eager, when.planted, when.external_events) == (False, True, True)


def test_scoped_gates_carry_their_backend():
    reg = load_registry(
        [
            frag("""\
        version: 1
        backends:
          b:
            gates:
              - {id: only-b, when: {mode: extend}, at_least: none, because: b rereads}
        """)
        ]
    )
    assert reg.gates == ()
    (gate,) = reg.backend("b").gates
    assert gate.scope == "b" and gate.id == "only-b"


def test_composite_and_per_mode_shapes():
    reg = load_registry(
        [
            frag("""\
        version: 1
        backends:
          x: {reads_end: {decode: in_graph}}
          y: {reads_end: {decode: pre_replay}}
          both: {latest_of: [x, y]}
          split: {per_mode: {prefill: x, decode: y}, reads_end: {target_verify: none}}
          mixed: {latest_of: [x, y], inherits: x, reads_end: {extend: none}}
        """)
        ]
    )
    assert reg.backend("both").latest_of == ("x", "y")
    assert reg.backend("split").per_mode == {EXTEND: "x", DECODE: "y"}
    assert reg.backend("mixed").inherits == "x" and reg.backend("mixed").latest_of == ("x", "y")


def test_null_sections_are_empty():
    reg = load_registry([frag("version: 1\nflags:\nbackends:\ngates:\n")])
    assert not reg.flags and not reg.backends and not reg.gates


def test_doc_is_folded_to_one_line():
    reg = load_registry([frag("version: 1\nflags:\n  f:\n    doc: >\n      two\n      lines\n")])
    assert reg.flags["f"].doc == "two lines"


# -- broken files: one located problem each ---------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "f0.yaml:1:1: empty registry"),
        ("# only a comment\n", "f0.yaml:1:1: empty registry"),
        ("version: 1\nbackends: {a: [}\n", "f0.yaml:2:1"),  # column differs by composer
        ("version: 1\n\tbad: tab\n", "f0.yaml:2:1: invalid YAML"),
        ("- version: 1\n", "f0.yaml:1:1: expected a registry mapping, got a list"),
        ("just text", "f0.yaml:1:1: expected a registry mapping, got the string 'just text'"),
        ("flags: {}\n", "f0.yaml:1:1: missing required key 'version' (the integer 1)"),
        ("version: '1'\n", "f0.yaml:1:10: version: expected the integer 1, got the string '1'"),
        ("version: 2\n", "f0.yaml:1:10: version: unsupported registry version 2"),
        ("version: true\n", "f0.yaml:1:10: version: expected the integer 1, got the boolean true"),
        ("version: 0x2\n", "f0.yaml:1:10: version: unsupported registry version 0x2"),
        ("version: !!int one\n", "f0.yaml:1:10: YAML tags (!!int) are not part of the registry"),
        ("version: 1.0\n", None),  # JSON Schema's integer includes 1.0; so does the loader
        ("version: 1\n---\nversion: 1\n", "f0.yaml:2:1: invalid YAML"),
        ("version: 1\nx: \x07\n", "f0.yaml:2:4: invalid YAML: unacceptable character"),
    ],
)
def test_broken_file_is_one_located_problem(composer, text, expected):
    if expected is None:
        assert messages(text) == []
        return
    (problem,) = messages(text)
    assert problem.startswith(expected)
    assert len(problem.splitlines()) == 1


def test_not_utf8_is_located(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"version: 1\nflags:\n  f\xe9: {doc: x}\n")
    (problem,) = validate_sources([path])
    assert (problem.file, problem.line, problem.col) == (str(path), 3, 4)
    assert "not UTF-8" in problem.message


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbfversion: 1\n")
    assert validate_sources([path]) == []


@pytest.mark.parametrize(
    "text, column",
    [
        ("version: 1\nflags: " + "[" * 100_000 + "]" * 100_000 + "\n", 107),  # flow
        ("version: 1\nflags:\n" + "- " * 200_000 + "x\n", 199),  # block: no bracket at all
    ],
)
def test_deep_nesting_is_a_problem_not_a_crash(composer, text, column):
    # yaml.compose recurses per level (RecursionError; a segfault with libyaml) and parsing
    # is quadratic in flow depth: refused from the event stream, before composing
    (problem,) = messages(text)
    line = 2 if "[" in text else 3
    ours = (
        f"f0.yaml:{line}:{column}: YAML nested more than {loader.MAX_DEPTH} "
        "levels deep; not a registry"
    )
    # libyaml >= the one in PyYAML 6.0.4 refuses flow nesting past 1000 levels in its scanner,
    # which reads ahead of our composer: also one located line, never a crash
    libyaml_limit = (
        f"f0.yaml:{line}:1007: invalid YAML: while increasing flow level; "
        "exceeded maximum nesting depth"
    )
    assert problem in (ours, libyaml_limit)


def test_nesting_at_the_limit_composes(composer):
    text = "version: 1\nflags: " + "[" * 99 + "]" * 99 + "\n"  # 100 levels with the top mapping
    (problem,) = messages(text)
    assert problem.startswith("f0.yaml:2:8: flags: expected a mapping")


def test_unreadable_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="missing.yaml: cannot read registry file"):
        load_registry([tmp_path / "missing.yaml"])
    with pytest.raises(UnreadableSourceError) as info:  # a RegistryError too: every problem
        load_registry([tmp_path])
    assert "not a regular file (a directory)" in str(info.value)


def test_validate_reports_every_source_unreadable_ones_included(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 2\n")
    found = validate_sources([tmp_path / "missing.yaml", bad, tmp_path])
    assert [(p.file, p.unreadable) for p in found] == [
        (str(tmp_path / "missing.yaml"), True),
        (str(bad), False),
        (str(tmp_path), True),
    ]


def test_not_a_source_is_an_input_error():
    with pytest.raises(InputError, match="not a registry source"):
        load_registry([42])


# -- keys, types and names --------------------------------------------------------------------


def test_duplicate_keys_are_rejected_at_every_level(composer):
    msgs = messages("""\
        version: 1
        backends:
          a: {reads_end: {decode: in_graph, decode: none}}
          a: {}
        version: 1
        """)
    assert "f0.yaml:3:37: backends.a.reads_end: duplicate key 'decode' (first at line 3)" in msgs[0]
    assert msgs[1].startswith("f0.yaml:4:3: backends: duplicate key 'a'")
    assert msgs[2].startswith("f0.yaml:5:1: duplicate key 'version'")
    assert len(msgs) == 3


def test_mode_aliases_collide_like_duplicates():
    (msg,) = messages("version: 1\nbackends:\n  a: {reads_end: {extend: none, prefill: none}}\n")
    assert msg.endswith(
        "backends.a.reads_end: 'prefill' is mode 'extend', already given as 'extend'"
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("verison: 1\n", "unknown top-level key 'verison'; did you mean 'version'?"),
        (
            "version: 1\nbackends: {a: {read_end: {}}}\n",
            "backends.a: unknown key 'read_end'; did you mean 'reads_end'?",
        ),
        (
            "version: 1\ngates: [{id: g, at_least: none, because: x, wen: {}}]\n",
            "gates[0]: unknown key 'wen'; did you mean 'when'?",
        ),
        (
            "version: 1\ngates: [{id: g, at_least: none, because: x, when: {modes: decode}}]\n",
            "gates[0].when: unknown key 'modes'; did you mean 'mode'?",
        ),
        (
            "version: 1\nflags: {f: {doc: x, zzz: 1}}\n",
            "flags.f: unknown key 'zzz'; known keys: default, env, doc, override",
        ),
    ],
)
def test_unknown_keys_name_close_matches(text, expected):
    msgs = messages(text)
    assert any(m.endswith(expected) for m in msgs), msgs


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "version: 1\nflags: {f: {doc: x, default: 'yes'}}\n",
            "f0.yaml:2:30: flags.f.default: expected true or false, got the string 'yes'",
        ),
        (
            "version: 1\nflags: {f: {doc: x, env: [1]}}\n",
            "flags.f.env[0]: expected an environment variable name or {not: NAME}, got the integer 1",
        ),
        (
            "version: 1\nflags: {f: {doc: x, env: [A-B]}}\n",
            "flags.f.env[0]: 'A-B' is not an environment variable name",
        ),
        ("version: 1\nflags: {f: {doc: ''}}\n", "flags.f.doc: expected a non-empty string"),
        ("version: 1\nflags: {f: {default: true}}\n", "flags.f: missing required key 'doc'"),
        ("version: 1\nflags: [f]\n", "flags: expected a mapping of name -> flag, got a list"),
        ("version: 1\nflags: {f: 3}\n", "flags.f: expected a flag mapping, got the integer 3"),
        (
            "version: 1\nspec_algorithms: {s: {capabilities: {c: 1}}}\n",
            "spec_algorithms.s.capabilities.c: expected true or false, got the integer 1",
        ),
        (
            "version: 1\nspec_algorithms: {s: {capabilities: [c]}}\n",
            "spec_algorithms.s.capabilities: expected a mapping of capability -> true/false or "
            "{after: ACTION}, got a list",
        ),
        (
            "version: 1\nbackends: {a: {reads_end: {decode: in_grph}}}\n",
            "backends.a.reads_end.decode: unknown policy 'in_grph'; did you mean 'in_graph'",
        ),
        (
            "version: 1\nbackends: {a: {reads_end: {decod: none}}}\n",
            "backends.a.reads_end: unknown mode 'decod'; did you mean 'decode'?",
        ),
        (
            "version: 1\nbackends: {a: {reads_end: {decode: 1}}}\n",
            "backends.a.reads_end.decode: expected a read end (nothing, pre_replay, in_graph, "
            "post_replay, none), got the integer 1",
        ),
        (
            "version: 1\nbackends: {a: {latest_of: b}}\n",
            "backends.a.latest_of: expected a list of names, got the string 'b'",
        ),
        (
            "version: 1\nbackends: {a: {latest_of: []}}\n",
            "backends.a.latest_of: an empty list; leave the key out instead",
        ),
        (
            "version: 1\nbackends: {a: {abstract: 'no'}}\n",
            "backends.a.abstract: expected true or false, got the string 'no'",
        ),
        (
            "version: 1\nbackends: {a: {inherits: [b]}}\n",
            "backends.a.inherits: expected a name, got a list",
        ),
        ("version: 1\nbackends: {'a b': {}}\n", "backends: 'a b' is not a valid backend name"),
        (
            "version: 1\nbackends: {a: {inherits: 'x=y'}}\n",
            "backends.a.inherits: 'x=y' is not a valid name",
        ),
        (
            "version: 1\nbackends: {a: {gates: {id: g}}}\n",
            "backends.a.gates: expected a list of gates, got a mapping",
        ),
        ("version: 1\ngates: [{id: g, because: x}]\n", "gates[0]: missing required key 'at_least'"),
        (
            "version: 1\ngates: [{id: g, at_least: none}]\n",
            "gates[0]: missing required key 'because'",
        ),
        (
            "version: 1\ngates: [{at_least: none, because: x}]\n",
            "gates[0]: missing required key 'id'",
        ),
        (
            "version: 1\ngates: [{id: g, at_least: later, because: x}]\n",
            "gates[0].at_least: unknown policy 'later'",
        ),
        (
            "version: 1\ngates: [{id: g, at_least: none, because: x, when: {mode: [decoed]}}]\n",
            "gates[0].when.mode[0]: unknown mode 'decoed'; did you mean 'decode'?",
        ),
        (
            "version: 1\ngates: [{id: g, at_least: none, because: x, when: {mode: []}}]\n",
            "gates[0].when.mode: an empty list; leave the key out instead",
        ),
        (
            "version: 1\ngates: [{id: g, at_least: none, because: x, when: {eager: 1}}]\n",
            "gates[0].when.eager: expected true or false, got the integer 1",
        ),
        (
            "version: 1\ngates: [{id: g, at_least: none, because: x, when: [mode]}]\n",
            "gates[0].when: expected a when mapping, got a list",
        ),
        ("version: 1\ngates: [5]\n", "gates[0]: expected a gate mapping, got the integer 5"),
        ("version: 1\ngates: {id: g}\n", "gates: expected a list of gates, got a mapping"),
        ("version: 1\nbackends: {a: {doc: !custom x}}\n", "YAML tags (!custom) are not part"),
        ("version: 1\nbase: &b {doc: x}\n", "unknown top-level key 'base'"),
        (
            "version: 1\nbackends:\n  a: {doc: x}\n  b: {<<: {doc: y}}\n",
            "backends.b: YAML merge keys (<<) are not supported",
        ),
        ("version: 1\nbackends: {[a]: {}}\n", "backends: keys must be names, got a list"),
    ],
)
def test_wrong_values_are_located_with_the_files_key_names(text, expected):
    msgs = messages(text)
    assert any(expected in m for m in msgs), msgs
    assert all(m.startswith("f0.yaml:") for m in msgs)


def test_every_problem_is_reported_at_once(composer):
    msgs = messages("""\
        version: 2
        flags:
          f: {default: maybe}
        backends:
          a: {inherits: nope, reads_end: {decode: soon}}
          b: {latest_of: [a, a]}
        gates:
          - {id: g, at_least: none, because: x, when: {flags: {ghost: true}, eager: 1}}
        extra: 1
        """)
    expected = [
        "1:10: version",
        "3:16: flags.f.default",
        "3:6: flags.f: missing required key",
        "5:43: backends.a.reads_end.decode",
        "6:22: backends.b.latest_of",
        "8:56: gates[0].when.flags: unknown flag 'ghost'",
        "8:77: gates[0].when.eager",
        "9:1: unknown top-level key",
    ]
    for piece in expected:
        assert any(piece in m for m in msgs), (piece, msgs)
    assert len(msgs) == len(expected) + 1  # + unknown backend 'nope' (a is broken, not b)


def test_problems_are_sorted_by_source_then_position():
    found = problems("version: 1\nbackends: {b: {inherits: z}}\nzz: 1\n", "version: 1\nx: 1\n")
    keys = [(p.file, p.line, p.col) for p in found]
    assert keys == sorted(keys, key=lambda k: (k[0], k[1], k[2]))
    assert [p.file for p in found] == ["f0.yaml", "f0.yaml", "f1.yaml"]


# -- cross references and shapes --------------------------------------------------------------


def test_unknown_references_are_located_at_the_referencing_key():
    msgs = messages("""\
        version: 1
        spec_algorithms: {s: {family: fam, capabilities: {cap: true}}}
        flags: {f: {doc: x}}
        backends:
          fa3: {}
          a: {inherits: fa33}
          b: {latest_of: [fa3, nope]}
          c: {per_mode: {decode: fa4}}
        gates:
          - id: g
            when: {backend: fa2, spec: eagle, spec_family: famm, spec_has: capp,
                   spec_lacks: [cap, cop], flags: {g: true}}
            at_least: none
            because: x
        """)
    expected = [
        "f0.yaml:6:17: backends.a.inherits: unknown backend 'fa33'; did you mean 'fa3'?",
        "f0.yaml:7:24: backends.b.latest_of[1]: unknown backend 'nope'",
        "f0.yaml:8:26: backends.c.per_mode.decode: unknown backend 'fa4'; did you mean 'fa3'?",
        "f0.yaml:11:21: gates[0].when.backend: unknown backend 'fa2'; did you mean 'fa3'?",
        "f0.yaml:11:32: gates[0].when.spec: unknown spec algorithm 'eagle'",
        "f0.yaml:11:52: gates[0].when.spec_family: unknown spec family 'famm'; did you mean 'fam'?",
        "f0.yaml:11:68: gates[0].when.spec_has: unknown capability 'capp'; did you mean 'cap'?",
        "f0.yaml:12:30: gates[0].when.spec_lacks: unknown capability 'cop'; did you mean 'cap'?",
        "f0.yaml:12:44: gates[0].when.flags: unknown flag 'g'",
    ]
    assert [m.split("; known")[0] for m in msgs] == expected


def test_a_broken_entry_is_not_also_unknown():
    msgs = messages("version: 1\nbackends:\n  a: {reads_end: {decode: bad}}\n  b: {inherits: a}\n")
    assert len(msgs) == 1 and "unknown policy 'bad'" in msgs[0]


@pytest.mark.parametrize(
    "backends, cycle, where",
    [
        ("a: {inherits: a}", "cycle: a -> a", "backends.a.inherits"),
        ("a: {inherits: b}\n  b: {inherits: a}", "cycle: a -> b -> a", "backends.b.inherits"),
        (
            "a: {latest_of: [b]}\n  b: {per_mode: {decode: c}}\n  c: {latest_of: [a]}",
            "cycle: a -> b -> c -> a",
            "backends.c.latest_of[0]",
        ),
    ],
)
def test_cycles_are_reported_once(backends, cycle, where):
    (msg,) = messages(f"version: 1\nbackends:\n  {backends}\n")
    assert msg.endswith(f"{where}: {cycle}")


def test_long_chains_are_not_cycles():
    lines = ["version: 1", "backends:", "  b0: {reads_end: {decode: in_graph}}"]
    lines += [f"  b{i}: {{inherits: b{i - 1}}}" for i in range(1, 3000)]
    reg = load_registry([frag("\n".join(lines))])
    assert reg.backend("b2999").inherits == "b2998"


def test_latest_of_and_per_mode_exclude_each_other():
    (msg,) = messages(
        "version: 1\nbackends:\n  x: {}\n  a: {latest_of: [x], per_mode: {decode: x}}\n"
    )
    assert msg == (
        "f0.yaml:4:3: backends.a: use either latest_of (a composite) or per_mode "
        "(a per-mode wrapper), not both"
    )


def test_per_mode_and_reads_end_must_not_both_declare_a_mode():
    (msg,) = messages(
        "version: 1\nbackends:\n  x: {}\n"
        "  a: {per_mode: {decode: x}, reads_end: {decode: none, extend: none}}\n"
    )
    assert msg.endswith(
        "backends.a.per_mode: mode 'decode' is delegated here and also "
        "declared in reads_end; keep one"
    )


def test_latest_of_names_a_child_once():
    (msg,) = messages("version: 1\nbackends:\n  x: {}\n  a: {latest_of: [x, x]}\n")
    assert msg.endswith("backends.a.latest_of: 'x' is listed twice")


def test_one_env_var_sets_one_flag():
    msgs = messages(
        "version: 1\nflags:\n  a: {doc: x, env: [V]}\n  b: {doc: y, env: [W, V]}\n"
        "  c: {doc: z, env: [U, U]}\n"
    )
    assert msgs == [
        "f0.yaml:4:24: flags.b.env: V already sets flag 'a' at f0.yaml:3:21",
        "f0.yaml:5:24: flags.c.env: 'U' is listed twice",
    ]


def test_gate_ids_are_unique_across_the_registry():
    msgs = messages(
        "version: 1\nbackends:\n  b:\n"
        "    gates: [{id: g, at_least: none, because: x}]\n"
        "gates: [{id: g, at_least: none, because: y}]\n"
    )
    assert msgs == [
        "f0.yaml:5:9: gates[0]: gate id 'g' already defined at f0.yaml:4:13; "
        "names must be unique within a file"
    ]


# -- layering ---------------------------------------------------------------------------------


def test_later_sources_add_entries():
    reg = load_registry(
        [frag(BASE, "a.yaml"), frag("version: 1\nbackends: {fa4: {inherits: base}}\n", "b.yaml")]
    )
    assert reg.backend("fa4").origin.file == "b.yaml"
    assert reg.sources == ("a.yaml", "b.yaml")


@pytest.mark.parametrize(
    "section, entry, what",
    [
        ("backends", "fa3: {}", "backend 'fa3'"),
        ("flags", "fast: {doc: again}", "flag 'fast'"),
        ("spec_algorithms", "none: {}", "spec algorithm 'none'"),
        ("gates", "[{id: slow, at_least: none, because: again}]", "gate id 'slow'"),
    ],
)
def test_redefinition_names_both_places(section, entry, what):
    body = f"{section}: [{entry[1:-1]}]" if section == "gates" else f"{section}: {{{entry}}}"
    found = validate_sources([frag(BASE, "a.yaml"), frag(f"version: 1\n{body}\n", "b.yaml")])
    (problem,) = found
    assert problem.file == "b.yaml" and problem.line == 2
    assert f"{what} already defined at a.yaml:" in problem.message
    assert problem.message.endswith("add override: true to replace it")


def test_override_replaces_the_whole_entry_in_place():
    reg = load_registry(
        [
            frag(BASE, "a.yaml"),
            frag(
                """\
        version: 1
        backends:
          fa3: {override: true, reads_end: {decode: post_replay}}
        gates:
          - {id: slow, override: true, at_least: none, because: replaced}
        """,
                "b.yaml",
            ),
        ]
    )
    fa3 = reg.backend("fa3")
    assert fa3.inherits is None and fa3.reads_end == {DECODE: WarReadDonePolicy.POST_REPLAY}
    assert fa3.origin.file == "b.yaml"
    assert list(reg.backends) == ["base", "fa3"]
    (gate,) = reg.gates
    assert gate.because == "replaced" and gate.when == Conditions()


def test_overriding_a_backend_drops_its_scoped_gates():
    first = "version: 1\nbackends:\n  b:\n    gates: [{id: g, at_least: none, because: x}]\n"
    second = "version: 1\nbackends:\n  b: {override: true}\n"
    reg = load_registry([frag(first, "a.yaml"), frag(second, "b.yaml")])
    assert reg.backend("b").gates == ()
    again = (
        "version: 1\nbackends:\n  b:\n    override: true\n"
        "    gates: [{id: g, at_least: post_replay, because: y}]\n"
    )
    reg = load_registry([frag(first, "a.yaml"), frag(again, "b.yaml")])
    assert [g.at_least for g in reg.backend("b").gates] == [WarReadDonePolicy.POST_REPLAY]


def test_a_rejected_redefinition_contributes_nothing():
    first = "version: 1\nbackends: {b: {}}\n"
    second = (
        "version: 1\nbackends:\n  b:\n    reads_end: {decode: pre_replay}\n"
        "    gates: [{id: g, at_least: none, because: x}]\n"
    )
    with pytest.raises(RegistryError):
        load_registry([frag(first, "a.yaml"), frag(second, "b.yaml")])
    reg, found = loader._load([frag(first, "a.yaml"), frag(second, "b.yaml")])
    assert len(found) == 1 and reg.backend("b").reads_end == {} and reg.backend("b").gates == ()


def test_override_within_one_file_is_still_a_duplicate():
    msgs = messages(
        "version: 1\ngates:\n  - {id: g, at_least: none, because: x}\n"
        "  - {id: g, override: true, at_least: none, because: y}\n"
    )
    assert len(msgs) == 1 and "names must be unique within a file" in msgs[0]


def test_references_resolve_across_layers():
    reg = load_registry(
        [
            frag(BASE, "a.yaml"),
            frag(
                """\
        version: 1
        backends: {tbo: {latest_of: [fa3]}}
        gates: [{id: g2, when: {backend: tbo, spec_family: eagle, flags: {fast: true}},
                 at_least: none, because: x}]
        """,
                "b.yaml",
            ),
        ]
    )
    assert reg.backend("tbo").latest_of == ("fa3",)


def test_cycles_can_span_layers():
    found = validate_sources(
        [
            frag(BASE, "a.yaml"),
            frag("version: 1\nbackends:\n  base: {override: true, inherits: fa3}\n", "b.yaml"),
        ]
    )
    # reported once, where the depth-first walk closes it (base is visited first)
    assert [str(p) for p in found] == [
        "a.yaml:21:15: backends.fa3.inherits: cycle: base -> fa3 -> base"
    ]


# -- fragments from plugins -------------------------------------------------------------------


def test_mapping_fragments_validate_without_marks():
    data = {
        "version": 1,
        "backends": {
            "x": {
                "inherits": "fa3",
                "reads_end": {ForwardMode.EXTEND: WarReadDonePolicy.PRE_REPLAY},
            },
            "y": {"inherits": "nope", "abstract": "yes"},
        },
    }
    found = validate_sources([frag(BASE), Fragment("plugin:demo", data)])
    assert [str(p) for p in found] == [
        "plugin:demo: backends.y.abstract: expected true or false, got the string 'yes'",
        "plugin:demo: backends.y.inherits: unknown backend 'nope'; known: base, fa3, x, y",
    ]
    reg = load_registry(
        [frag(BASE), Fragment("plugin:demo", {**data, "backends": {"x": data["backends"]["x"]}})]
    )
    assert reg.backend("x").reads_end == {EXTEND: WarReadDonePolicy.PRE_REPLAY}
    assert reg.backend("x").origin == Origin("plugin:demo")


def test_mapping_fragment_with_unrepresentable_values():
    found = validate_sources([Fragment("p", {"version": 1, "flags": {"f": {"doc": object()}}})])
    (problem,) = found
    assert problem.message.startswith("flags.f.doc: expected a non-empty string")


def test_self_referencing_mapping_fragment():
    data: dict = {"version": 1}
    data["flags"] = data
    (problem,) = validate_sources([Fragment("p", data)])
    assert str(problem) == "p: mapping nested too deeply (or containing itself)"


def test_bytes_fragment():
    assert validate_sources([Fragment("p", b"version: 1\n")]) == []


def test_a_lone_source_is_accepted():
    assert load_registry(Fragment("p", "version: 1\n")).sources == ("p",)


def test_registry_error_carries_every_problem():
    with pytest.raises(RegistryError) as info:
        load_registry([frag("version: 3\nx: 1\n")])
    assert len(info.value.problems) == 2
    assert str(info.value).splitlines()[0].startswith("f.yaml:1:10: version:")


# -- choosing sources -------------------------------------------------------------------------


def test_default_registry_path_in_the_source_tree_is_the_repository_file():
    repo = pathlib.Path(__file__).resolve().parents[2]
    if (repo / "warpolicy" / "capabilities.yaml").is_file():
        pytest.skip("this checkout ships a packaged copy")
    assert default_registry_path() == repo / "capabilities.yaml"


def test_default_registry_path_prefers_the_packaged_file(tmp_path, monkeypatch):
    """Both branches, against a stand-in tree: the file next to the module wins; without it,
    the repository's (one directory up)."""
    from warpolicy.registry.loader import reading

    package = tmp_path / "warpolicy"
    (package / "registry" / "loader").mkdir(parents=True)
    module = pathlib.Path(reading.__file__).name  # the module that resolves the path
    monkeypatch.setitem(
        reading.default_path.__globals__,
        "__file__",
        str(package / "registry" / "loader" / module),
    )
    (tmp_path / "capabilities.yaml").write_text("version: 1\n")
    assert default_registry_path() == tmp_path / "capabilities.yaml"
    (package / "capabilities.yaml").write_text("version: 1\n")
    assert default_registry_path() == package / "capabilities.yaml"


def test_registry_sources_precedence():
    default = default_registry_path()
    assert registry_sources(None, {}) == [default]
    assert registry_sources([], {"WARPOLICY_CAPABILITIES": ""}) == [default]
    env = {"WARPOLICY_CAPABILITIES": os.pathsep.join(["a.yaml", "", "b.yaml"])}
    assert registry_sources(None, env) == ["a.yaml", "b.yaml"]
    assert registry_sources(["c.yaml"], env) == ["c.yaml"]


def test_default_token_expands_in_files_and_environment():
    default = default_registry_path()
    assert registry_sources([DEFAULT, "mine.yaml"], {}) == [default, "mine.yaml"]
    assert registry_sources([":default:"], {}) == [default]
    env = {"WARPOLICY_CAPABILITIES": f"mine.yaml{os.pathsep}default"}
    assert registry_sources(None, env) == ["mine.yaml", default]
    assert registry_sources(["./default"], {}) == ["./default"]


def test_layering_on_the_default_with_a_file(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("version: 1\nbackends:\n  my_attn: {inherits: base, doc: mine}\n")
    reg = load_registry(registry_sources([DEFAULT, str(mine)], {}))
    assert reg.backend("my_attn").origin == Origin(str(mine), 3, 3)
    assert "fa3" in reg.backends
    assert reg.sources == (str(default_registry_path()), str(mine))


def test_loading_from_a_path_object(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(BASE)
    reg = load_registry([pathlib.Path(path)])
    assert reg.flags["fast"].origin.file == str(path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: *nope\n", "found undefined alias 'nope'"),
        ("a: &x 1\nb: &x 2\n", "found duplicate anchor 'x'"),
        ("a: 1\n---\nb: 2\n", "expected a single document in the stream"),
    ],
)
def test_composer_errors_match_pyyaml(composer, text, message):
    (problem,) = problems(text)
    assert message in problem.message


def test_nothing_is_a_read_end_never_a_gates_at_least():
    """Issue 26: ``nothing`` (reads no scheduler-shared state) is declared in ``reads_end``;
    a gate only makes a decision later, so its ``at_least`` refuses it, located."""
    from warpolicy.registry.vocabulary import WarReadDonePolicy

    ok = (
        "version: 1\nbackends:\n  b:\n    reads_end:\n      draft_extend: nothing\n"
        "      decode: {policy: nothing, after: act, otherwise: in_graph}\n    doc: x\n"
        "facts: {act: {type: action, doc: x}}\n"
    )
    registry = load_registry([Fragment("ok", ok)])
    assert registry.backend("b").reads_end[ForwardMode.DRAFT_EXTEND] is WarReadDonePolicy.NOTHING
    msgs = messages("version: 1\ngates:\n  - {id: g, at_least: nothing, because: x}\n")
    assert any(
        m.startswith("f0.yaml:3:") and "gates[0].at_least: 'nothing' is a read end" in m
        for m in msgs
    ), msgs
