"""Loading is bounded and strict: non-regular files, size caps, alias amplification, hint
budgets, tags, nulls, exact spellings, overrides of nothing, and the registry's own checks."""

from __future__ import annotations

import functools
import os
import textwrap

import pytest

from warpolicy.bench.decide import (
    alias_fanout,
    format_load_cost,
    measure_load,
    shared_gate_list,
    unknown_names,
)
from warpolicy.errors import InputError, RegistryError, UnreadableSourceError
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import (
    MAX_BYTES,
    MAX_NODES,
    Fragment,
    assemble_registry,
    env_flag_problems,
    load_registry,
    merge,
    validate_sources,
)
from warpolicy.registry.model import Backend, Conditions, Flag, Gate, Registry
from warpolicy.registry.vocabulary import ForwardMode, Placement, WarReadDonePolicy

DECODE, EXTEND, VERIFY = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY


def messages(text: str) -> list[str]:
    return [str(p) for p in validate_sources([Fragment("f.yaml", textwrap.dedent(text))])]


class TestFiles:
    @pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
    def test_a_fifo_is_refused_without_opening_it(self, tmp_path):
        fifo = tmp_path / "pipe.yaml"
        os.mkfifo(fifo)  # opening it for reading would block until a writer comes
        with pytest.raises(UnreadableSourceError, match="not a regular file \\(a FIFO\\)"):
            load_registry([fifo])

    def test_a_device_is_refused(self):
        if not os.path.exists("/dev/zero"):
            pytest.skip("no /dev/zero")
        (problem,) = validate_sources(["/dev/zero"])
        assert problem.unreadable and "not a regular file (a device)" in problem.message

    def test_a_file_over_the_cap_is_refused(self, tmp_path):
        big = tmp_path / "big.yaml"
        big.write_bytes(b"version: 1\n" + b"#" * MAX_BYTES)
        (problem,) = validate_sources([big])
        assert problem.unreadable and "larger than 4 MiB" in problem.message
        assert validate_sources([Fragment("t", "#" * (MAX_BYTES + 1))])[0].message.startswith(
            "larger than"
        )

    def test_every_file_is_reported_and_the_error_is_a_usage_error(self, tmp_path):
        bad = tmp_path / "bad.yaml"
        bad.write_text("version: 1\nflags: {f: {doc: x, default: maybe}}\n")
        with pytest.raises(UnreadableSourceError) as info:
            load_registry([tmp_path / "missing.yaml", bad])
        assert isinstance(info.value, InputError) and isinstance(info.value, RegistryError)
        assert len(info.value.problems) == 2


class TestAliases:
    def test_a_latest_of_list_aliased_into_many_composites_is_refused(self):
        (msg,) = [str(p) for p in validate_sources([Fragment("f.yaml", alias_fanout(1000, 300))])]
        assert f"expands to more than {MAX_NODES} nodes through YAML aliases" in msg

    def test_a_shared_gate_list_is_refused(self):
        found = validate_sources([Fragment("f.yaml", shared_gate_list(100, 1000))])
        assert len(found) == 1 and "through YAML aliases" in found[0].message

    def test_a_self_sharing_plugin_mapping_is_refused(self):
        kids = [f"b{i}" for i in range(1000)]
        data = {"version": 1, "backends": {f"c{i}": {"latest_of": kids} for i in range(300)}}
        (problem,) = validate_sources([Fragment("plugin:x", data)])
        assert "expands to more than" in problem.message

    def test_a_bad_aliased_value_is_reported_once(self):
        msgs = messages("""\
            version: 1
            backends:
              a: {reads_end: &r {decode: soon}}
              b: {reads_end: *r}
              c: {reads_end: *r}
            """)
        assert len(msgs) == 1
        assert msgs[0].startswith("f.yaml:3:30: backends.a.reads_end.decode: unknown policy")

    def test_aliases_below_the_limit_still_load(self):
        reg = load_registry([Fragment("f.yaml", alias_fanout(10, 20))])
        assert reg.backend("c19").latest_of == tuple(f"b{i}" for i in range(10))


class TestHints:
    def test_hints_stop_after_the_budget(self, monkeypatch):
        monkeypatch.setattr(merge, "MAX_SUGGESTION_WORK", 2 * 1005)  # two searches over 1,005 names
        found = validate_sources([Fragment("f.yaml", unknown_names(1000, 5))])
        hinted = [p for p in found if "did you mean" in p.message]
        assert len(found) == 5 and len(hinted) == 2

    def test_a_repeated_unknown_name_is_searched_once(self, monkeypatch):
        calls = []
        real = merge.difflib.get_close_matches
        monkeypatch.setattr(
            merge.difflib, "get_close_matches", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
        )
        text = "version: 1\nbackends:\n  fa3: {}\n" + "".join(
            f"  w{i}: {{inherits: fa4}}\n" for i in range(50)
        )
        found = validate_sources([Fragment("f.yaml", text)])
        assert len(found) == 50 and all("did you mean 'fa3'" in p.message for p in found)
        assert calls == ["fa4"]


class TestStrict:
    @pytest.mark.parametrize(
        "text, expected",
        [
            (
                "version: 1\ngates: [{id: g, at_least: none, because: x, when: }]\n",
                "gates[0].when: expected a when mapping, got null",
            ),
            ("version: 1\nbackends: {a: }\n", "backends.a: expected a backend mapping, got null"),
            (
                "version: 1\nbackends: {a: {reads_end: }}\n",
                "backends.a.reads_end: expected a mapping",
            ),
            ("version: 1\nflags: {1: {doc: x}}\n", "flags: keys must be names, got the integer 1"),
            ("version: 1\nflags: {? !!str f : {doc: x}}\n", "YAML tags (!!str)"),
            ("version: 1\nflags: {f: {doc: x, default: !!bool 'no'}}\n", "YAML tags (!!bool)"),
            ('version: 1\nbackends: {"fa3\\n": {}}\n', "is not a valid backend name"),
            ('version: 1\nflags: {f: {doc: x, env: ["A\\n"]}}\n', "is not an environment variable"),
            ("version: 1\nbackends: {a: {reads_end: {Decode: none}}}\n", "unknown mode 'Decode'"),
            (
                "version: 1\nbackends: {a: {reads_end: {decode: ' none'}}}\n",
                "unknown policy ' none'",
            ),
            ("version: 1\nflags: {f: {doc: '   '}}\n", "flags.f.doc: expected a non-empty string"),
        ],
    )
    def test_refused(self, text, expected):
        msgs = messages(text)
        assert any(expected in m for m in msgs), msgs

    def test_override_of_a_name_nobody_defines_is_an_error(self):
        (msg,) = messages("version: 1\nbackends: {fa3: {override: true}}\n")
        assert msg == (
            "f.yaml:2:12: backends.fa3: override: true, but no earlier source "
            "defines backend 'fa3'; remove override to add it"
        )
        (msg,) = messages(
            "version: 1\ngates: [{id: g, override: true, at_least: none, because: x}]\n"
        )
        assert "no earlier source defines gate id 'g'" in msg


class TestShapes:
    def test_per_mode_with_inherits_is_located(self):
        (msg,) = messages("""\
            version: 1
            backends:
              slow_base: {reads_end: {decode: post_replay}}
              fast: {reads_end: {decode: in_graph}}
              w: {inherits: slow_base, per_mode: {decode: fast}}
            """)
        assert msg.startswith("f.yaml:5:3: backends.w: a per-mode wrapper cannot inherit")

    @pytest.mark.parametrize("parent", ["{latest_of: [x]}", "{per_mode: {decode: x}}"])
    def test_inheriting_from_a_wrapper_is_located(self, parent):
        (msg,) = messages(
            f"version: 1\nbackends:\n  x: {{}}\n  w: {parent}\n  c: {{inherits: w}}\n"
        )
        assert msg == (
            "f.yaml:5:17: backends.c.inherits: 'w' is a composite or per-mode "
            "wrapper; inherit from a plain backend"
        )

    def test_a_registry_built_in_python_is_checked(self):
        with pytest.raises(RegistryError, match="a per-mode wrapper cannot inherit"):
            Backend("w", inherits="a", per_mode={DECODE: "b"})
        with pytest.raises(RegistryError, match="unknown backend 'nope'"):
            Registry(backends={"a": Backend("a", inherits="nope")})
        with pytest.raises(RegistryError, match="cycle: a -> b -> a"):
            Registry(
                backends={"a": Backend("a", latest_of=("b",)), "b": Backend("b", inherits="a")}
            )
        with pytest.raises(RegistryError, match="inherit from a plain backend"):
            Registry(
                backends={
                    "x": Backend("x"),
                    "w": Backend("w", latest_of=("x",)),
                    "c": Backend("c", inherits="w"),
                }
            )
        gate = Gate("g", Conditions(), WarReadDonePolicy.NONE, "x")
        with pytest.raises(RegistryError, match="gate id 'g' is defined twice"):
            Registry(gates=(gate, gate))
        with pytest.raises(RegistryError, match="V sets more than one flag"):
            Registry(flags={"a": Flag("a", env=("V",)), "b": Flag("b", env=("V",))})
        assert Registry(backends={"x": Backend("x"), "w": Backend("w", latest_of=("x",))})


class TestPlacement:
    TEXT = """\
        version: 1
        spec_algorithms:
          eagle: {last_reader: draft_extend}
          dflash: {last_reader: target_verify}
          plain: {}
        backends:
          base: {reads_end: {decode: in_graph}, plant: {decode: derived}}
          child: {inherits: base, plant: {extend: derived}}
          all: {plant: derived}
          marker: {}
          both: {latest_of: [all, base]}
          mixed: {latest_of: [all, marker]}
          wrap: {per_mode: {decode: marker, extend: all}}
        """

    def test_plant_and_last_reader_load(self):
        reg = load_registry([Fragment("f.yaml", textwrap.dedent(self.TEXT))])
        assert reg.backend("base").plant == {DECODE: Placement.DERIVED}
        assert set(reg.backend("all").plant) == set(ForwardMode)
        assert reg.spec("eagle").last_reader is ForwardMode.DRAFT_EXTEND
        assert reg.spec("dflash").last_reader is VERIFY
        assert reg.spec("plain").last_reader is None

    @pytest.mark.parametrize(
        "backend, mode, expected",
        [
            ("base", DECODE, Placement.DERIVED),
            ("base", EXTEND, Placement.MARKER),
            ("child", DECODE, Placement.DERIVED),
            ("child", EXTEND, Placement.DERIVED),
            ("marker", DECODE, Placement.MARKER),
            ("both", DECODE, Placement.DERIVED),
            ("both", EXTEND, Placement.MARKER),
            ("mixed", DECODE, Placement.MARKER),
            ("wrap", DECODE, Placement.MARKER),
            ("wrap", EXTEND, Placement.DERIVED),
        ],
    )
    def test_engine_placement(self, backend, mode, expected):
        engine = PolicyEngine(
            load_registry([Fragment("f.yaml", textwrap.dedent(self.TEXT))]), environ={}
        )
        assert engine.placement(backend, mode) is expected
        assert engine.compile(backend, "plain").placement(mode) is expected

    @pytest.mark.parametrize(
        "text, expected",
        [
            ("backends: {a: {plant: later}}", "unknown placement 'later'"),
            ("backends: {a: {plant: {decode: x}}}", "unknown placement 'x'"),
            ("backends: {a: {plant: {decode: derived, decod: marker}}}", "unknown mode 'decod'"),
            ("spec_algorithms: {s: {last_reader: decode}}", "unknown last reader 'decode'"),
        ],
    )
    def test_bad_values_are_located(self, text, expected):
        msgs = messages(f"version: 1\n{text}\n")
        assert any(expected in m for m in msgs), msgs


class TestAssembly:
    def test_files_fragments_and_blame_in_one_call(self, tmp_path):
        mine = tmp_path / "mine.yaml"
        mine.write_text("version: 1\nbackends: {mine: {reads_end: {decode: in_graph}}}\n")
        frag = Fragment("plugin:p", "version: 1\nbackends: {p: {inherits: nope}}\n")
        blame = functools.partial(
            lambda tag, ps: [p.__class__(p.file, p.line, p.col, tag + p.message) for p in ps],
            "BLAMED ",
        )
        assembly = assemble_registry([str(mine)], [frag], blame=blame, environ={})
        assert assembly.sources == (str(mine), "plugin:p") and assembly.registry is None
        (problem,) = assembly.problems
        assert problem.message.startswith("BLAMED backends.p.inherits: unknown backend")
        with pytest.raises(RegistryError):
            assembly.checked()
        ok = assemble_registry([str(mine)], environ={})
        assert PolicyEngine.load([str(mine)], environ={}).registry == ok.checked()

    def test_engine_load_does_not_collect_plugins_itself(self):
        with pytest.raises(TypeError, match="plugins"):  # no such switch: fragments only
            PolicyEngine.load(plugins=True, environ={})

    def test_env_flag_problems(self):
        reg = load_registry(
            [
                Fragment(
                    "f.yaml",
                    "version: 1\nflags:\n  a: {doc: x, env: [A1, A2]}\n  b: {doc: y, env: [B]}\n",
                )
            ]
        )
        found = env_flag_problems(reg, {"A1": "1", "A2": "maybe", "B": "", "C": "x"})
        assert [str(p) for p in found] == [
            (
                "f.yaml:3:3: flags.a: environment A2='maybe' is not a boolean (use 1/0, "
                "true/false, yes/no, on/off)"
            )
        ]


def test_load_cost_is_measured_for_the_bench():
    result = measure_load(backends=50, gates=10, repeats=1)
    assert set(result) == {
        "large",
        "alias_fanout",
        "shared_gates",
        "alias_within_limit",
        "composite_chain",
        "unknown_names",
    }
    assert result["large"]["problems"] == 0 and result["alias_fanout"]["problems"] == 1
    assert "load large" in format_load_cost(result)
