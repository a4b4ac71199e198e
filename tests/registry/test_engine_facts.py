"""Engine semantics of per-batch facts on hand-built registries: gate tests, declarations and
capabilities after an action, per-batch routers, explanations and per-batch cases."""

from __future__ import annotations

import warnings

import pytest

from warpolicy.errors import InputError, RegistryError, UnknownNameError
from warpolicy.registry.decision import AFTER_PREFIX, BatchCase, Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.model import (
    After,
    Backend,
    Conditions,
    Fact,
    FactTest,
    Flag,
    Gate,
    Registry,
    Route,
    SpecAlgorithm,
    registry_warnings,
)
from warpolicy.registry.vocabulary import FactType, Placement
from warpolicy.registry.vocabulary import ForwardMode as M
from warpolicy.registry.vocabulary import WarReadDonePolicy as P

FACTS = {
    "tokens": Fact("tokens", FactType.INT),
    "snapshot": Fact("snapshot", FactType.ACTION),
    "staged": Fact("staged", FactType.ACTION),
    "images": Fact("images", FactType.BOOL),
    "route": Fact("route", FactType.NAME, values=frozenset({"text", "image", "video"})),
}


def make(*backends: Backend, gates=(), specs=None, flags=None) -> Registry:
    base = {
        "base": Backend("base", {M.DECODE: P.IN_GRAPH, M.TARGET_VERIFY: P.IN_GRAPH}, abstract=True),
        "fa3": Backend("fa3", inherits="base"),
        "trt": Backend("trt", {M.EXTEND: P.PRE_REPLAY}, inherits="base"),
        "triton": Backend("triton", {M.EXTEND: P.POST_REPLAY}, inherits="base"),
    }
    base.update({b.name: b for b in backends})
    return Registry(
        flags=flags or {},
        spec_algorithms=specs
        or {
            "none": SpecAlgorithm("none", capabilities={"prefill_read_done": True}),
            "eagle": SpecAlgorithm("eagle", capabilities_after={"prefill_read_done": "staged"}),
        },
        backends=base,
        gates=gates
        or (
            Gate(
                "prefill-needs-capability",
                Conditions(mode=frozenset({M.EXTEND}), spec_lacks=frozenset({"prefill_read_done"})),
                P.NONE,
                "no capability",
            ),
        ),
        facts=FACTS,
    )


def decide(engine, backend, mode, spec="none", **facts):
    return engine.decide(Context(backend, mode, spec, facts=facts))


SPARSE = Gate(
    "sparse-needs-snapshot",
    Conditions(
        mode=frozenset({M.EXTEND}),
        facts={"tokens": FactTest(compare=(("gt", 100),)), "snapshot": FactTest(equals=False)},
    ),
    P.NONE,
    "sparse prefill reads late without its snapshot",
    scope="sparse",
)


class TestGates:
    @pytest.fixture
    def engine(self):
        sparse = Backend("sparse", {M.EXTEND: P.PRE_REPLAY}, gates=(SPARSE,))
        return PolicyEngine(make(sparse), environ={})

    @pytest.mark.parametrize(
        "facts,expected",
        [
            ({}, P.NONE),
            ({"tokens": 100}, P.PRE_REPLAY),
            ({"tokens": 101}, P.NONE),
            ({"tokens": 101, "snapshot": True}, P.PRE_REPLAY),
            ({"snapshot": True}, P.PRE_REPLAY),
            ({"tokens": 101, "snapshot": False}, P.NONE),
        ],
    )
    def test_a_fact_test_holds_when_the_fact_passes_or_is_unknown(self, engine, facts, expected):
        assert decide(engine, "sparse", M.EXTEND, **facts) is expected

    def test_the_reason_says_what_the_batch_reported(self, engine):
        exp = engine.explain(Context("sparse", M.EXTEND, facts={"tokens": 500}))
        (check,) = [c for c in exp.gates if c.gate.id == "sparse-needs-snapshot"]
        assert check.matched and "tokens is 500" in check.why
        assert "snapshot did not succeed" in check.why
        exp = engine.explain(Context("sparse", M.EXTEND, facts={"tokens": 5}))
        (check,) = [c for c in exp.gates if c.gate.id == "sparse-needs-snapshot"]
        assert not check.matched and check.why == "tokens is 5, not tokens > 100"
        assert [f.text for f in exp.facts] == ["tokens is 5"]  # the snapshot was never read

    def test_facts_are_validated_where_they_are_given(self, engine):
        with pytest.raises(UnknownNameError, match="did you mean 'tokens'"):
            engine.decision(Context("sparse", M.EXTEND, facts={"tokenz": 5}))
        with pytest.raises(InputError, match="expected an integer"):
            engine.decision(Context("sparse", M.EXTEND, facts={"tokens": "5"}))

    def test_decide_fails_closed_on_a_bad_fact_with_one_warning(self, engine):
        with pytest.warns(RuntimeWarning, match="unknown fact 'tokenz'") as caught:
            for _ in range(3):
                assert decide(engine, "sparse", M.EXTEND, tokenz=5) is P.NONE
        assert len(caught) == 1

    def test_gates_without_the_mode_never_read_facts(self, engine):
        exp = engine.explain(Context("sparse", M.DECODE))
        assert exp.facts == () and exp.cases == ()


class TestAfter:
    @pytest.fixture
    def engine(self):
        snap = Backend(
            "snap",
            {M.EXTEND: P.PRE_REPLAY, M.DECODE: P.IN_GRAPH},
            reads_end_after={M.EXTEND: After("snapshot", P.POST_REPLAY)},
        )
        heir = Backend("heir", {M.EXTEND: P.PRE_REPLAY}, inherits="snap")
        wrap = Backend("wrap", latest_of=("snap", "fa3"))
        return PolicyEngine(make(snap, heir, wrap), environ={})

    @pytest.mark.parametrize(
        "facts,expected",
        [
            ({}, P.POST_REPLAY),
            ({"snapshot": False}, P.POST_REPLAY),
            ({"snapshot": True}, P.PRE_REPLAY),
        ],
    )
    def test_a_declaration_holds_only_after_its_action(self, engine, facts, expected):
        assert decide(engine, "snap", M.EXTEND, **facts) is expected
        assert decide(engine, "heir", M.EXTEND, **facts) is expected  # inherited requirement

    def test_other_modes_are_untouched(self, engine):
        assert decide(engine, "snap", M.DECODE) is P.IN_GRAPH

    def test_the_reason_names_the_action_and_a_wrapper_carries_it(self, engine):
        decision = engine.decision(Context("snap", M.EXTEND))
        assert [r.id for r in decision.reasons] == ["declared", AFTER_PREFIX + "snapshot"]
        assert "only after the per-batch action snapshot succeeds" in decision.reasons[1].message
        wrapped = engine.decision(Context("wrap", M.EXTEND))
        assert wrapped.policy is P.NONE  # fa3 does not declare extend
        exp = engine.explain(Context("snap", M.EXTEND))
        (declaration,) = exp.declarations
        assert (declaration.after, declaration.otherwise) == ("snapshot", P.POST_REPLAY)
        assert exp.declared is P.PRE_REPLAY  # the declaration as written; the action is per batch
        assert exp.cases == (
            BatchCase(P.PRE_REPLAY, ("snapshot succeeded",)),
            BatchCase(P.POST_REPLAY, ("snapshot did not succeed",)),
        )
        assert exp.to_json()["declarations"][0]["after"] == "snapshot"

    def test_after_must_name_an_action(self):
        bad = Backend("bad", {M.EXTEND: P.PRE_REPLAY}, reads_end_after={M.EXTEND: After("images")})
        with pytest.raises(RegistryError, match="fact 'images' is bool; after names an action"):
            make(bad)

    def test_otherwise_must_be_later(self):
        with pytest.raises(RegistryError, match="otherwise .* must be later"):
            Backend(
                "x", {M.EXTEND: P.POST_REPLAY}, reads_end_after={M.EXTEND: After("s", P.PRE_REPLAY)}
            )


class TestCapabilityAfter:
    @pytest.fixture
    def engine(self):
        gate = Gate(
            "raise-if-has",
            Conditions(mode=frozenset({M.DECODE}), spec_has=frozenset({"prefill_read_done"})),
            P.POST_REPLAY,
            "has",
        )
        lacks = Gate(
            "prefill-needs-capability",
            Conditions(mode=frozenset({M.EXTEND}), spec_lacks=frozenset({"prefill_read_done"})),
            P.NONE,
            "no capability",
        )
        return PolicyEngine(make(gates=(gate, lacks)), environ={})

    @pytest.mark.parametrize(
        "facts,expected",
        [({}, P.NONE), ({"staged": False}, P.NONE), ({"staged": True}, P.PRE_REPLAY)],
    )
    def test_spec_lacks_holds_until_the_action_succeeded(self, engine, facts, expected):
        assert decide(engine, "trt", M.EXTEND, "eagle", **facts) is expected

    @pytest.mark.parametrize("facts", [{}, {"staged": True}, {"staged": False}])
    def test_spec_has_holds_whatever_the_action_did(self, engine, facts):
        # success must never be what raises a decision
        assert decide(engine, "fa3", M.DECODE, "eagle", **facts) is P.POST_REPLAY

    def test_the_gate_says_the_action_succeeded(self, engine):
        exp = engine.explain(Context("trt", M.EXTEND, "eagle", facts={"staged": True}))
        (check,) = [c for c in exp.gates if c.gate.id == "prefill-needs-capability"]
        assert not check.matched and "staged succeeded" in check.why

    def test_an_action_tested_for_true_is_refused(self):
        gate = Gate("g", Conditions(facts={"staged": FactTest(equals=True)}), P.NONE, "x")
        with pytest.raises(RegistryError, match="is an action: test it only for false"):
            make(gates=(gate,))


class TestRouters:
    def engine(self, pinned=True, **route):
        router = Backend(
            "router",
            routes=Route(
                "route",
                {"text": "trt", "image": "triton"},
                route.get("modes", frozenset({M.EXTEND})),
                route.get("default", "text"),
                pinned,
            ),
        )
        capped = Backend(
            "capped",
            routes=Route("route", {"text": "trt", "image": "triton"}, None, None, pinned),
            reads_end={M.EXTEND: P.IN_GRAPH},
        )
        return PolicyEngine(make(router, capped), environ={})

    @pytest.mark.parametrize(
        "facts,expected",
        [
            ({}, P.POST_REPLAY),  # unknown: the latest of every child
            ({"route": "text"}, P.PRE_REPLAY),
            ({"route": "image"}, P.POST_REPLAY),
            ({"route": "video"}, P.POST_REPLAY),  # names no child: counts as unknown
        ],
    )
    def test_a_pinned_router_runs_the_child_its_batch_names(self, facts, expected):
        assert decide(self.engine(), "router", M.EXTEND, **facts) is expected

    def test_never_earlier_than_the_router_itself_declares(self):
        assert decide(self.engine(), "capped", M.EXTEND, route="text") is P.IN_GRAPH

    def test_an_unpinned_router_ignores_the_route(self):
        engine = self.engine(pinned=False)
        assert decide(engine, "router", M.EXTEND, route="text") is P.POST_REPLAY
        exp = engine.explain(Context("router", M.EXTEND, facts={"route": "text"}))
        assert any("is not pinned" in line for line in exp.chain)
        assert exp.facts == ()  # the route was not read

    def test_other_modes_run_the_default_child(self):
        engine = self.engine()
        assert decide(engine, "router", M.DECODE, route="image") is P.IN_GRAPH
        assert decide(self.engine(default=None), "router", M.DECODE) is P.NONE

    def test_explain_names_the_route_and_the_cases(self):
        engine = self.engine()
        exp = engine.explain(Context("router", M.EXTEND, facts={"route": "image"}))
        assert exp.chain[0] == "router routes this batch by route: image -> triton"
        assert [c.backend for c in exp.children] == ["triton"]
        cases = engine.explain(Context("router", M.EXTEND)).cases
        assert BatchCase(P.PRE_REPLAY, ("route is text",)) in cases
        assert max(c.policy for c in cases) is P.POST_REPLAY

    def test_declared_of_an_unknown_route_is_any_childs(self):
        """A gate on ``declared:`` must match when any child the router may run declares it,
        or an unreported route would be earlier than a reported one."""
        gate = Gate(
            "pre-is-suspicious",
            Conditions(mode=frozenset({M.EXTEND}), declared=frozenset({P.PRE_REPLAY})),
            P.NONE,
            "x",
        )
        router = Backend(
            "router",
            routes=Route(
                "route", {"text": "trt", "image": "triton"}, frozenset({M.EXTEND}), None, True
            ),
        )
        engine = PolicyEngine(make(router, gates=(gate,)), environ={})
        assert decide(engine, "router", M.EXTEND, route="text") is P.NONE
        assert decide(engine, "router", M.EXTEND) is P.NONE
        assert decide(engine, "router", M.EXTEND, route="image") is P.POST_REPLAY

    def test_validate_warns_about_an_unpinned_router(self):
        assert registry_warnings(self.engine().registry) == []
        found = registry_warnings(self.engine(pinned=False).registry)
        assert sorted(w.message.split(":")[0] for w in found) == [
            "backends.capped.routes",
            "backends.router.routes",
        ]
        assert all("may change inside one forward" in w.message for w in found)

    def test_a_router_plants_like_a_composite_of_its_children(self):
        derived = {m: Placement.DERIVED for m in M}
        router = Backend(
            "router",
            routes=Route(
                "route", {"text": "d1", "image": "d2"}, frozenset({M.EXTEND}), "text", True
            ),
        )
        engine = PolicyEngine(
            make(
                router,
                Backend("d1", plant=derived),
                Backend("d2", plant={M.DECODE: Placement.DERIVED}),
            ),
            environ={},
        )
        assert engine.placement("router", M.EXTEND) is Placement.MARKER  # d2 is marker there
        assert engine.placement("router", M.DECODE) is Placement.DERIVED  # the default, d1

    def test_router_shapes_are_refused(self):
        route = Route("route", {"a": "fa3"})
        with pytest.raises(RegistryError, match="a router .* cannot have inherits"):
            Backend("x", routes=route, inherits="base")
        with pytest.raises(RegistryError, match="default needs modes"):
            Backend("x", routes=Route("route", {"a": "fa3"}, default="a"))
        with pytest.raises(RegistryError, match="'b' is not one of its children's labels"):
            make(Backend("x", routes=Route("route", {"a": "fa3"}, frozenset({M.EXTEND}), "b")))
        with pytest.raises(RegistryError, match="inherit from a plain backend"):
            make(Backend("x", routes=route), Backend("y", inherits="x"))


class TestCases:
    def test_table_carries_cases_only_where_facts_matter(self):
        sparse = Backend("sparse", {M.EXTEND: P.PRE_REPLAY}, gates=(SPARSE,))
        engine = PolicyEngine(make(sparse), environ={})
        rows = {(d.context.backend, d.context.mode, d.context.spec): d for d in engine.table()}
        cell = rows[("sparse", M.EXTEND, "none")]
        assert cell.policy is P.NONE
        assert [c.text for c in cell.cases] == [
            "pre_replay when tokens <= 100",
            "pre_replay when snapshot succeeded",
            "none when snapshot did not succeed and tokens >= 101",
            "none when snapshot did not succeed and tokens unknown",
        ]
        assert rows[("sparse", M.DECODE, "none")].cases == ()
        assert rows[("trt", M.EXTEND, "eagle")].cases == (
            BatchCase(P.PRE_REPLAY, ("staged succeeded",)),
            BatchCase(P.NONE, ("staged did not succeed",)),
        )
        assert (
            "per_batch" in cell.to_json()
            and "per_batch" not in rows[("fa3", M.DECODE, "none")].to_json()
        )

    def test_cases_hold_the_given_facts(self):
        sparse = Backend("sparse", {M.EXTEND: P.PRE_REPLAY}, gates=(SPARSE,))
        engine = PolicyEngine(make(sparse), environ={})
        cases = engine.cases(Context("sparse", M.EXTEND, facts={"tokens": 500}))
        assert cases == (
            BatchCase(P.PRE_REPLAY, ("snapshot succeeded",)),
            BatchCase(P.NONE, ("snapshot did not succeed",)),
        )
        assert engine.cases(Context("sparse", M.EXTEND, facts={"tokens": 5})) == ()

    def test_fact_lines_for_renderers(self):
        sparse = Backend("sparse", {M.EXTEND: P.PRE_REPLAY}, gates=(SPARSE,))
        exp = PolicyEngine(make(sparse), environ={}).explain(Context("sparse", M.EXTEND))
        lines = exp.fact_lines()
        assert lines[0] == "fact snapshot did not succeed"
        assert "per batch: pre_replay when snapshot succeeded" in lines
        assert exp.to_json()["batch_facts"]["tokens"] == {
            "type": "int",
            "read": "tokens is not reported",
        }


class TestInvertedEnv:
    def engine(self, environ, default=False):
        flag = Flag(
            "fast", default, ("WARPOLICY_FAST", "SLOW", "FAST"), inverted=frozenset({"SLOW"})
        )
        gate = Gate("slow", Conditions(flags={"fast": False}), P.NONE, "opt in")
        return PolicyEngine(make(gates=(gate,), flags={"fast": flag}), environ=environ)

    @pytest.mark.parametrize(
        "environ,on",
        [
            ({}, False),
            ({"SLOW": "1"}, False),
            ({"SLOW": "0"}, True),
            ({"SLOW": " "}, False),  # blank = unset
            ({"SLOW": "1", "FAST": "1"}, False),  # first set wins
            ({"FAST": "1"}, True),
            ({"WARPOLICY_FAST": "0", "SLOW": "0"}, False),
        ],
    )
    def test_an_inverted_alias_sets_the_opposite(self, environ, on):
        (value,) = [f for f in self.engine(environ).flag_values() if f.name == "fast"]
        assert value.value is on
        if "SLOW" in environ and environ["SLOW"].strip() and "WARPOLICY_FAST" not in environ:
            assert "inverted" in value.source

    def test_an_inverted_alias_can_switch_on_the_kill_switch(self):
        flag = Flag("force_coarse", False, ("ALLOW_FAST",), inverted=frozenset({"ALLOW_FAST"}))
        reg = make(flags={"force_coarse": flag})
        assert decide(PolicyEngine(reg, environ={"ALLOW_FAST": "0"}), "fa3", M.DECODE) is P.NONE
        assert decide(PolicyEngine(reg, environ={"ALLOW_FAST": "1"}), "fa3", M.DECODE) is P.IN_GRAPH

    def test_inverted_names_must_be_env_names(self):
        with pytest.raises(RegistryError, match="inverted names not in env"):
            Flag("f", env=("A",), inverted=frozenset({"B"}))


def test_no_warning_for_a_registry_without_facts():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = PolicyEngine(make(), environ={})
        assert engine.compile("trt", "none", strict=True).rule(M.EXTEND) is None
