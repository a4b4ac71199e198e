"""Engine semantics on hand-built registries (no YAML involved)."""

from __future__ import annotations

import warnings

import pytest

from warpolicy.errors import InputError, RegistryError, UnknownNameError
from warpolicy.registry.decision import FORCE_COARSE_ID, SOUND_DEMOTION_ID
from warpolicy.registry.engine import (
    CompiledPolicy,
    Context,
    PolicyEngine,
)
from warpolicy.registry.inputs import parse_bool
from warpolicy.registry.model import (
    Backend,
    Conditions,
    Flag,
    Gate,
    Origin,
    Registry,
    SpecAlgorithm,
)
from warpolicy.registry.vocabulary import TABLE_MODES
from warpolicy.registry.vocabulary import ForwardMode as M
from warpolicy.registry.vocabulary import WarReadDonePolicy as P


def make_registry(extra_backends=(), gates=()) -> Registry:
    backends = {
        "base": Backend(
            "base",
            {M.DECODE: P.IN_GRAPH, M.TARGET_VERIFY: P.IN_GRAPH},
            abstract=True,
            origin=Origin("caps.yaml", 10, 3),
        ),
        "fa3": Backend("fa3", inherits="base"),
        "trtllm_mha": Backend("trtllm_mha", {M.EXTEND: P.PRE_REPLAY}, inherits="base"),
        "dsv4": Backend("dsv4", {M.TARGET_VERIFY: P.POST_REPLAY}, inherits="base"),
    }
    for b in extra_backends:
        backends[b.name] = b
    return Registry(
        flags={
            "force_coarse": Flag(
                "force_coarse", False, ("WARPOLICY_FORCE_COARSE", "SGLANG_FORCE_COARSE_WAR_BARRIER")
            ),
            "prefill_read_done": Flag(
                "prefill_read_done",
                False,
                ("WARPOLICY_PREFILL_READ_DONE", "SGLANG_ENABLE_PREFILL_WAR_READ_DONE"),
            ),
        },
        spec_algorithms={
            "none": SpecAlgorithm(
                "none", capabilities={"prefill_read_done": True, "target_verify_read_done": False}
            ),
            "eagle": SpecAlgorithm(
                "eagle",
                family="eagle",
                capabilities={"prefill_read_done": False, "target_verify_read_done": False},
            ),
            "dflash": SpecAlgorithm(
                "dflash",
                family="dflash",
                capabilities={"prefill_read_done": True, "target_verify_read_done": True},
            ),
        },
        backends=backends,
        gates=gates
        or (
            Gate(
                "force-coarse",
                Conditions(flags={"force_coarse": True}),
                P.NONE,
                "forced",
                Origin("caps.yaml", 40, 5),
            ),
            Gate(
                "verify-needs-read-done",
                Conditions(
                    mode=frozenset({M.TARGET_VERIFY}),
                    spec_lacks=frozenset({"target_verify_read_done"}),
                ),
                P.NONE,
                "no verify read-done",
            ),
            Gate(
                "prefill-opt-in",
                Conditions(mode=frozenset({M.EXTEND}), flags={"prefill_read_done": False}),
                P.NONE,
                "prefill is opt-in",
            ),
        ),
    )


@pytest.fixture
def engine() -> PolicyEngine:
    return PolicyEngine(make_registry(), environ={})


def test_decode_inherits_in_graph(engine):
    d = engine.decision(Context("fa3", M.DECODE))
    assert d.policy is P.IN_GRAPH
    assert d.reasons[0].id == "declared"
    assert "inherited from base" in d.reasons[0].message
    assert d.reasons[0].origin == "caps.yaml:10:3"


def test_undeclared_mode_is_none(engine):
    d = engine.decision(Context("fa3", M.MIXED))
    assert d.policy is P.NONE
    assert "not audited" in d.reasons[0].message


def test_verify_needs_capability(engine):
    assert engine.decide(Context("fa3", "verify", "eagle")) is P.NONE
    assert engine.decide(Context("fa3", "target_verify", "dflash")) is P.IN_GRAPH
    assert engine.decide(Context("dsv4", "target_verify", "dflash")) is P.POST_REPLAY


def test_prefill_flag_by_override_and_env():
    reg = make_registry()
    assert PolicyEngine(reg, environ={}).decide(Context("trtllm_mha", "prefill")) is P.NONE
    on = Context("trtllm_mha", "extend", flags={"prefill_read_done": True})
    assert PolicyEngine(reg, environ={}).decide(on) is P.PRE_REPLAY
    env_engine = PolicyEngine(reg, environ={"WARPOLICY_PREFILL_READ_DONE": "1"})
    assert env_engine.decide(Context("trtllm_mha", "extend")) is P.PRE_REPLAY


def test_force_coarse_alias_env_and_reason_origin():
    engine = PolicyEngine(make_registry(), environ={"SGLANG_FORCE_COARSE_WAR_BARRIER": "true"})
    d = engine.decision(Context("fa3", M.DECODE))
    assert d.policy is P.NONE
    assert [r.id for r in d.reasons] == ["declared", "force-coarse"]
    assert d.reasons[1].origin == "caps.yaml:40:5"


def test_primary_env_name_wins_over_alias_and_empty_does_not_shadow():
    ctx = Context("trtllm_mha", M.EXTEND)
    reg = make_registry()
    both = {"WARPOLICY_PREFILL_READ_DONE": "0", "SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "1"}
    assert PolicyEngine(reg, environ=both).decide(ctx) is P.NONE
    empty = {"WARPOLICY_PREFILL_READ_DONE": " ", "SGLANG_ENABLE_PREFILL_WAR_READ_DONE": "1"}
    engine = PolicyEngine(reg, environ=empty)
    assert engine.decide(ctx) is P.PRE_REPLAY
    assert {f.name: f.source for f in engine.flag_values()}[
        "prefill_read_done"
    ] == "env SGLANG_ENABLE_PREFILL_WAR_READ_DONE"


def test_bad_env_value_is_input_error():
    with pytest.raises(InputError, match="WARPOLICY_PREFILL_READ_DONE='maybe'"):
        PolicyEngine(make_registry(), environ={"WARPOLICY_PREFILL_READ_DONE": "maybe"})


def bare_registry(**kw) -> Registry:
    """No flags, no gates: the kill switch must work without the registry's help."""
    return Registry(backends={"fa3": Backend("fa3", {M.DECODE: P.IN_GRAPH})}, **kw)


@pytest.mark.parametrize(
    "environ",
    [
        {"WARPOLICY_FORCE_COARSE": "1"},
        {"SGLANG_FORCE_COARSE_WAR_BARRIER": "yes"},
        {"WARPOLICY_FORCE_COARSE": "", "SGLANG_FORCE_COARSE_WAR_BARRIER": "1"},  # empty: unset
        {"WARPOLICY_FORCE_COARSE": "0", "SGLANG_FORCE_COARSE_WAR_BARRIER": "1"},  # any name wins
        {"WARPOLICY_FORCE_COARSE": "maybe"},  # unparsable: fail closed
    ],
)
def test_force_coarse_is_built_in(environ):
    engine = PolicyEngine(bare_registry(), environ=environ)
    d = engine.decision(Context("fa3", M.DECODE))
    assert d.policy is P.NONE
    assert [r.id for r in d.reasons] == ["declared", FORCE_COARSE_ID]
    assert engine.compile("fa3").lookup(M.DECODE) is P.NONE
    assert PolicyEngine(bare_registry(), environ={}).decide(Context("fa3", M.DECODE)) is P.IN_GRAPH


def test_force_coarse_cannot_be_narrowed_or_renamed_by_a_registry():
    """A layer that redeclares the flag with other env names, or an override that says off."""
    renamed = {"force_coarse": Flag("force_coarse", False, ("MY_COARSE",))}
    engine = PolicyEngine(
        bare_registry(flags=renamed), environ={"SGLANG_FORCE_COARSE_WAR_BARRIER": "1"}
    )
    assert engine.decide(Context("fa3", M.DECODE)) is P.NONE
    assert engine.decide(Context("fa3", M.DECODE, flags={"force_coarse": False})) is P.NONE
    engine = PolicyEngine(bare_registry(flags=renamed), environ={"MY_COARSE": "1"})
    assert engine.decide(Context("fa3", M.DECODE)) is P.NONE  # a layer may add names
    engine = PolicyEngine(bare_registry(), environ={})
    assert engine.decide(Context("fa3", M.DECODE, flags={"force_coarse": "1"})) is P.NONE
    assert engine.decide(Context("fa3", M.DECODE, flags={"force_coarse": "0"})) is P.IN_GRAPH


def test_a_layer_cannot_invert_the_kill_switchs_built_in_names():
    """Issue 26 finding 6: ``force_coarse: {override: true, env: [{not:
    WARPOLICY_FORCE_COARSE}]}`` made WARPOLICY_FORCE_COARSE=1 give in_graph (0.3.0). The engine
    ignores the inversion of a built-in name (a registry built without the loader), and the
    loader refuses it with a located line."""
    from warpolicy.registry.loader import Fragment, load_registry

    for var in ("WARPOLICY_FORCE_COARSE", "SGLANG_FORCE_COARSE_WAR_BARRIER"):
        inverted = {"force_coarse": Flag("force_coarse", False, (var,), inverted=frozenset({var}))}
        engine = PolicyEngine(bare_registry(flags=inverted), environ={var: "1"})
        assert engine.decide(Context("fa3", M.DECODE)) is P.NONE
        assert engine.compile("fa3").lookup(M.DECODE) is P.NONE
        engine = PolicyEngine(bare_registry(flags=inverted), environ={var: "0"})
        assert engine.decide(Context("fa3", M.DECODE)) is P.IN_GRAPH  # 0 is off, not on
    layer = Fragment(
        "layer",
        "version: 1\nflags:\n  force_coarse:\n    override: true\n"
        "    env: [{not: WARPOLICY_FORCE_COARSE}]\n    doc: inverted\n",
    )
    with pytest.raises(RegistryError) as caught:
        load_registry(["default", layer])
    (line,) = [m for m in str(caught.value).splitlines() if "kill switch" in m]
    assert line.startswith("layer:5:") and "cannot be inverted" in line


def test_nothing_is_the_bottom_and_any_matching_gate_makes_it_a_reader():
    """``nothing`` may release at pre_replay; a gate makes it a reader at the gate's at_least;
    an undeclared mode stays none (unknown)."""
    from warpolicy.registry.loader import Fragment, load_registry

    text = (
        "version: 1\nflags: {f: {default: false, env: [T_F], doc: x}}\n"
        "backends:\n  b: {reads_end: {draft_extend: nothing, decode: nothing}, doc: x}\n"
        "gates:\n  - {id: g, when: {mode: decode, flags: {f: true}}, at_least: in_graph, "
        "because: x}\n"
    )
    engine = PolicyEngine(load_registry([Fragment("r", text)]), environ={})
    assert engine.decide(Context("b", M.DRAFT_EXTEND)) is P.NOTHING
    assert engine.decide(Context("b", M.DECODE)) is P.NOTHING
    assert engine.decide(Context("b", M.DECODE, flags={"f": True})) is P.IN_GRAPH
    assert engine.decide(Context("b", M.DECODE, flags={"f": True}, planted=False)) is (
        P.POST_REPLAY
    )
    assert engine.decide(Context("b", M.TARGET_VERIFY)) is P.NONE  # undeclared: unknown
    assert engine.compile("b").lookup(M.DRAFT_EXTEND) is P.NOTHING
    table = engine.table(["b"], ["none"], ["draft_extend"])
    assert [d.policy.label for d in table] == ["nothing"]
    assert engine.explain(Context("b", M.DRAFT_EXTEND)).to_json()["policy"] == "nothing"


@pytest.mark.parametrize(
    "facts, why",
    [
        (dict(planted=False), "not planted"),
        (dict(external_events=False), "no external events"),
        (dict(eager=True), "eagerly"),
    ],
)
def test_sound_demotion_is_post_replay(engine, facts, why):
    d = engine.decision(Context("fa3", M.DECODE, **facts))
    assert d.policy is P.POST_REPLAY
    assert d.reasons[-1].id == SOUND_DEMOTION_ID
    assert why in d.reasons[-1].message


def test_demotion_does_not_touch_pre_replay(engine):
    ctx = Context("trtllm_mha", M.EXTEND, flags={"prefill_read_done": True}, planted=False)
    assert engine.decide(ctx) is P.PRE_REPLAY


def test_composite_takes_latest_child():
    reg = make_registry([Backend("tbo", latest_of=("fa3", "dsv4"))])
    engine = PolicyEngine(reg, environ={})
    assert engine.decide(Context("tbo", M.DECODE)) is P.IN_GRAPH
    d = engine.decision(Context("tbo", M.TARGET_VERIFY, "dflash"))
    assert d.policy is P.POST_REPLAY
    assert "latest of its children" in d.reasons[0].message


def test_per_mode_delegates():
    reg = make_registry([Backend("hybrid", per_mode={M.EXTEND: "trtllm_mha", M.DECODE: "fa3"})])
    engine = PolicyEngine(reg, environ={})
    flags = {"prefill_read_done": True}
    assert engine.decide(Context("hybrid", M.EXTEND, flags=flags)) is P.PRE_REPLAY
    assert engine.decide(Context("hybrid", M.DECODE)) is P.IN_GRAPH
    assert engine.decide(Context("hybrid", M.TARGET_VERIFY, "dflash")) is P.NONE


def test_scoped_gate_applies_to_heirs_only():
    gate = Gate(
        "fa3-no-verify",
        Conditions(mode=frozenset({M.TARGET_VERIFY})),
        P.POST_REPLAY,
        "scoped",
        scope="fa3",
    )
    reg = make_registry(
        [Backend("fa3", inherits="base", gates=(gate,)), Backend("fa3_child", inherits="fa3")]
    )
    engine = PolicyEngine(reg, environ={})
    assert engine.decide(Context("fa3", M.TARGET_VERIFY, "dflash")) is P.POST_REPLAY
    assert engine.decide(Context("fa3_child", M.TARGET_VERIFY, "dflash")) is P.POST_REPLAY
    assert engine.decide(Context("trtllm_mha", M.TARGET_VERIFY, "dflash")) is P.IN_GRAPH


def test_unknown_names_raise_with_suggestions(engine):
    with pytest.raises(UnknownNameError, match="did you mean 'fa3'"):
        engine.decision(Context("fa33", M.DECODE))
    with pytest.raises(UnknownNameError, match="spec algorithm"):
        engine.decision(Context("fa3", M.DECODE, "eagel"))
    with pytest.raises(UnknownNameError, match="flag"):
        engine.decision(Context("fa3", M.DECODE, flags={"force_coarsee": True}))
    with pytest.raises(UnknownNameError, match="mode"):
        Context("fa3", "decod")


def test_decide_fails_closed_with_one_warning(engine):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert engine.decide(Context("nope", M.DECODE)) is P.NONE
        assert engine.decide(Context("nope", M.DECODE)) is P.NONE
    assert len(caught) == 1
    assert "coarse" in str(caught[0].message)


def test_compile_matches_decision_everywhere(engine):
    compiled = engine.compile("fa3", "dflash")
    for mode in M:
        for eager in (False, True):
            for planted in (False, True):
                ctx = Context("fa3", mode, "dflash", eager=eager, planted=planted)
                assert compiled.lookup(mode, eager, planted) is engine.decide(ctx)
    assert compiled.per_step()(M.DECODE) is P.IN_GRAPH
    assert compiled.per_step(planted=False)(M.DECODE) is P.POST_REPLAY
    assert compiled.per_step()("no-such-mode") is P.NONE


def test_compile_unknown_fails_closed_or_raises(engine):
    with pytest.warns(RuntimeWarning):
        compiled = engine.compile("nope")
    assert all(compiled.lookup(m) is P.NONE for m in M)
    with pytest.raises(UnknownNameError):
        engine.compile("nope", strict=True)


def test_compiled_lookup_of_unknown_mode_is_none():
    compiled = CompiledPolicy("x", "none", {})
    assert compiled.lookup(M.DECODE) is P.NONE


def test_explain_lists_every_gate(engine):
    exp = engine.explain(Context("trtllm_mha", M.EXTEND))
    ids = {c.gate.id: c for c in exp.gates}
    assert set(ids) == {"force-coarse", "verify-needs-read-done", "prefill-opt-in"}
    assert ids["prefill-opt-in"].matched and ids["prefill-opt-in"].raised
    assert not ids["force-coarse"].matched
    assert "flag force_coarse is false" in ids["force-coarse"].why
    assert "mode is extend" in ids["verify-needs-read-done"].why
    js = exp.to_json()
    assert js["policy"] == "none" and js["flags"]["force_coarse"]["source"] == "default"


def test_table_covers_every_combination(engine):
    rows = engine.table()
    assert {r.context.backend for r in rows} == {"fa3", "trtllm_mha", "dsv4"}  # base is abstract
    assert len(rows) == 3 * len(TABLE_MODES) * 3  # backends x modes (draft extend too) x specs
    assert {r.context.mode for r in rows} == set(TABLE_MODES)


@pytest.mark.parametrize(
    "text, value", [("1", True), ("On", True), (" no ", False), ("off", False)]
)
def test_parse_bool(text, value):
    assert parse_bool(text, "X") is value


@pytest.mark.parametrize("text", ["", " ", "maybe", "2"])
def test_parse_bool_rejects_empty_and_junk(text):
    with pytest.raises(InputError, match="not a boolean"):
        parse_bool(text, "X")


@pytest.mark.parametrize(
    "wrapper",
    [
        Backend("w", latest_of=("early", "fa3")),
        Backend("w", per_mode={M.DECODE: "fa3"}),
    ],
)
def test_gate_on_a_child_never_makes_a_wrapper_earlier(wrapper):
    """``declared:`` tests the declaration, which no gate changes: a gate that delays a child
    must not stop the wrapper's ``declared: in_graph`` gate from matching (NONE -> POST_REPLAY)."""
    early = Backend("early", {M.DECODE: P.PRE_REPLAY})
    wrapper_gate = Gate(
        "w-in-graph-coarse",
        Conditions(backend=frozenset({"w"}), declared=frozenset({P.IN_GRAPH})),
        P.NONE,
        "wrapper",
    )
    child_gate = Gate(
        "delay-children", Conditions(backend=frozenset({"early", "fa3"})), P.POST_REPLAY, "children"
    )
    ctx = Context("w", M.DECODE)
    before = PolicyEngine(make_registry([early, wrapper], gates=(wrapper_gate,)), environ={})
    after = PolicyEngine(
        make_registry([early, wrapper], gates=(wrapper_gate, child_gate)), environ={}
    )
    assert before.decide(ctx) is P.NONE
    assert after.decide(ctx) is P.NONE
    assert after.explain(ctx).declared is P.IN_GRAPH


def test_wrapper_reasons_name_what_moved_a_child():
    reg = make_registry(
        [Backend("tbo", latest_of=("fa3",)), Backend("hybrid", per_mode={M.DECODE: "fa3"})]
    )
    engine = PolicyEngine(reg, environ={})
    d = engine.decision(Context("tbo", M.TARGET_VERIFY, "eagle"))
    assert d.policy is P.NONE
    assert [r.id for r in d.reasons] == ["declared", "verify-needs-read-done"]
    d = engine.decision(Context("hybrid", M.DECODE, planted=False))
    assert d.policy is P.POST_REPLAY
    assert [r.id for r in d.reasons] == ["declared", SOUND_DEMOTION_ID]


@pytest.mark.parametrize("text, policy", [("0", P.NONE), ("false", P.NONE), ("1", P.PRE_REPLAY)])
def test_string_flag_overrides_are_parsed_not_truthy(engine, text, policy):
    ctx = Context("trtllm_mha", M.EXTEND, flags={"prefill_read_done": text})
    assert engine.decide(ctx) is policy
    with pytest.raises(InputError):
        engine.decision(Context("trtllm_mha", M.EXTEND, flags={"prefill_read_done": "maybe"}))


def test_inherits_plus_per_mode_is_refused():
    """``inherits: slow_base`` (post_replay decode) plus ``per_mode: {decode: fa3}`` answered
    in_graph in 0.1.0 without naming slow_base. The registry model refuses the shape (the
    delegated child would hide the inherited read ends), for Python-built registries too."""
    with pytest.raises(RegistryError, match="per-mode wrapper cannot inherit"):
        Backend("w", inherits="slow_base", per_mode={M.DECODE: "fa3"})


@pytest.mark.parametrize(
    "child_extra",
    [
        dict(reads_end={M.DECODE: P.IN_GRAPH}),  # a child cannot make its base earlier
        dict(latest_of=("trtllm_mha",)),  # nor can running another backend
    ],
)
def test_inheritance_never_makes_a_mode_earlier(child_extra):
    slow = Backend("slow_base", {M.DECODE: P.POST_REPLAY})
    child = Backend("c", inherits="slow_base", **child_extra)
    engine = PolicyEngine(make_registry([slow, child]), environ={})
    assert engine.decide(Context("c", M.DECODE)) is P.POST_REPLAY


def test_inheriting_from_a_composite_is_refused():
    """A composite's children would not be run by an heir that declares earlier read ends;
    the registry refuses the shape instead of answering from the heir alone."""
    parent = Backend("tbo", latest_of=("dsv4",))
    child = Backend("tbo2", inherits="tbo", reads_end={M.TARGET_VERIFY: P.IN_GRAPH})
    with pytest.raises(RegistryError, match="inherit from a plain backend"):
        make_registry([parent, child])


def test_long_chains_and_shared_dags_visit_each_backend_once(monkeypatch):
    """4,000 nested composites (deeper than Python's recursion limit) and a wide diamond DAG
    whose naive expansion has 2**30 paths: one visit per backend."""
    from warpolicy.registry import evaluation as evaluation_mod

    chain = [Backend("c0", {M.DECODE: P.IN_GRAPH})]
    chain += [Backend(f"c{i}", latest_of=(f"c{i - 1}",)) for i in range(1, 4000)]
    chain += [Backend(f"h{i}", inherits=f"h{i - 1}" if i else "c0") for i in range(4000)]
    diamond = [Backend("d0", {M.DECODE: P.PRE_REPLAY})]
    for i in range(1, 31):
        diamond += [
            Backend(f"l{i}", latest_of=(f"d{i - 1}",)),
            Backend(f"r{i}", per_mode={M.DECODE: f"d{i - 1}"}),
            Backend(f"d{i}", latest_of=(f"l{i}", f"r{i}")),
        ]
    engine = PolicyEngine(make_registry(chain + diamond), environ={})
    visits = []
    original = evaluation_mod.Evaluation._explain_node
    monkeypatch.setattr(
        evaluation_mod.Evaluation,
        "_explain_node",
        lambda self, name: visits.append(name) or original(self, name),
    )
    assert engine.decide(Context("c3999", M.DECODE)) is P.IN_GRAPH
    assert len(visits) == 4000
    visits.clear()
    assert engine.decide(Context("d30", M.DECODE)) is P.PRE_REPLAY
    assert len(visits) == len(set(visits)) == 1 + 3 * 30
    visits.clear()
    assert engine.decide(Context("h3999", M.DECODE, planted=False)) is P.POST_REPLAY
    assert visits == ["h3999"]  # its 4,000-deep lineage (h3998..h0, c0) is walked in one node
    exp = engine.explain(Context("d30", M.DECODE))
    assert len(str(exp.to_json())) < 200_000  # a shared child is expanded once


def test_compile_warns_once_naming_a_layer_that_makes_a_cell_earlier(tmp_path):
    from warpolicy.registry.loader import Fragment, load_registry

    base = tmp_path / "base.yaml"
    base.write_text(
        "version: 1\nbackends:\n  fa3:\n    reads_end: {decode: post_replay}\n"
        "    doc: audited late\n"
    )
    plugin = Fragment(
        "plugin:speedy",
        "version: 1\nbackends:\n  fa3:\n    override: true\n"
        "    reads_end: {decode: in_graph}\n    doc: claims earlier\n",
    )
    later = Fragment(
        "plugin:careful",
        "version: 1\nbackends:\n  x:\n    reads_end: {decode: none}\n    doc: harmless\n",
    )
    layers = [base, plugin, later]
    engine = PolicyEngine(load_registry(layers), environ={}, layers=layers)
    with pytest.warns(
        RuntimeWarning,
        match=r"layer plugin:speedy .*fa3 decode.*"
        r"post_replay -> in_graph",
    ) as caught:
        assert engine.compile("fa3").lookup(M.DECODE) is P.IN_GRAPH
        engine.compile("fa3")
    assert len([w for w in caught if "layer" in str(w.message)]) == 1
    assert not any("careful" in str(w.message) for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PolicyEngine(load_registry([base]), environ={}, layers=[base]).compile("fa3")


def test_the_layer_warning_sees_a_cell_made_earlier_only_for_some_batches(tmp_path):
    """A layer whose declaration is earlier only when a per-batch action succeeds leaves the
    batch that reports nothing as it was; the warning still names it, with the batch."""
    from warpolicy.registry.loader import Fragment, load_registry

    def declared(policy: str) -> str:
        return f"{{policy: {policy}, after: snap, otherwise: none}}"

    base = tmp_path / "base.yaml"
    base.write_text(
        "version: 1\nfacts:\n  snap: {type: action, doc: a snapshot}\n"
        f"backends:\n  fa3:\n    reads_end: {{extend: {declared('post_replay')}}}\n"
        "    doc: staged prefill\n"
    )

    def layer(policy: str) -> Fragment:
        return Fragment(
            "plugin:staged",
            "version: 1\nbackends:\n  fa3:\n    override: true\n"
            f"    reads_end: {{extend: {declared(policy)}}}\n    doc: snapshots\n",
        )

    layers = [base, layer("pre_replay")]
    engine = PolicyEngine(load_registry(layers), environ={}, layers=layers)
    with pytest.warns(
        RuntimeWarning,
        match=r"layer plugin:staged .*fa3 extend \(spec none, captured, not planted; "
        r"batch: snap succeeded\): post_replay -> pre_replay",
    ):
        compiled = engine.compile("fa3")
    assert compiled.lookup(M.EXTEND) is P.NONE  # a batch that reports nothing: as below
    # the same layer declaring what the base does makes nothing earlier: no warning
    layers = [base, layer("post_replay")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PolicyEngine(load_registry(layers), environ={}, layers=layers).compile("fa3")


def test_past_the_case_limit_the_layer_warning_compares_the_earliest_of_each(monkeypatch):
    """A cell with more classes of batch than `MAX_FACT_CASES` is compared by the earliest
    policy each side can publish (the label says so), not skipped."""
    from warpolicy.registry import engine as engine_module
    from warpolicy.registry.loader import Fragment, load_registry

    text = (
        "version: 1\nfacts:\n  snap: {type: action, doc: a snapshot}\n"
        "  n: {type: int, doc: tokens}\nbackends:\n  fa3:\n    reads_end:\n"
        "      extend: {policy: %s, after: snap, otherwise: none}\n    doc: x\n"
        "gates:\n  - {id: big, when: {mode: extend, facts: {n: {ge: 9}}}, at_least: none, "
        "because: large prefills}\n"
    )
    old, new = (
        PolicyEngine(load_registry([Fragment(p, text % p)]), environ={})
        for p in ("post_replay", "pre_replay")
    )
    cells = [e._compiled("fa3", "none", None, "cuda", True) for e in (old, new)]
    assert engine_module._earlier_cell(*cells, "none") is not None
    monkeypatch.setattr(engine_module, "MAX_FACT_CASES", 2)
    found = engine_module._earlier_cell(*cells, "none")
    assert found is not None and "the earliest of each" in found
    assert "post_replay -> pre_replay" in found
    assert engine_module._earlier_cell(cells[1], cells[0], "none") is None  # later only


def test_a_gates_platform_is_case_folded_like_the_clis():
    """Issue 26 finding 9: ``platform: CUDA`` validated but never matched (the CLI folds
    ``--platform``, 0.3.0's registry did not)."""
    from warpolicy.registry.loader import Fragment, load_registry

    text = (
        "version: 1\nbackends:\n  b: {reads_end: {decode: in_graph}, doc: x}\n"
        "gates:\n  - {id: g, when: {platform: CUDA}, at_least: none, because: x}\n"
    )
    engine = PolicyEngine(load_registry([Fragment("r", text)]), environ={})
    assert engine.decide(Context("b", M.DECODE)) is P.NONE  # the runtime says "cuda"
    assert engine.decide(Context("b", M.DECODE, platform="Cuda")) is P.NONE
    assert engine.decide(Context("b", M.DECODE, platform="hip")) is P.IN_GRAPH
