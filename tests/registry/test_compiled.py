"""warpolicy.registry.compiled: the per-step lookup with per-batch facts (`CompiledPolicy`,
`BatchRule`), on the packaged registry and on hand-built ones."""

from __future__ import annotations

import pytest

from warpolicy.registry import engine as engine_mod
from warpolicy.registry.compiled import CompiledPolicy
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.model import Backend, Conditions, Fact, FactTest, Gate, Registry
from warpolicy.registry.vocabulary import FactType
from warpolicy.registry.vocabulary import ForwardMode as M
from warpolicy.registry.vocabulary import WarReadDonePolicy as P

ON = {"prefill_read_done": True}


@pytest.fixture(scope="module")
def engine() -> PolicyEngine:
    return PolicyEngine.load(environ={})


@pytest.fixture(scope="module")
def dsv4(engine) -> CompiledPolicy:
    return engine.compile("dsv4", "none", ON, strict=True)


class TestDefaultRegistry:
    @pytest.mark.parametrize(
        "facts,expected",
        [
            (None, P.NONE),
            ({}, P.NONE),
            ({"num_qo_tokens": 4096}, P.PRE_REPLAY),
            ({"num_qo_tokens": 20000}, P.NONE),
            ({"num_qo_tokens": 20000, "sparse_prefill_snapshot": True}, P.PRE_REPLAY),
            ({"num_qo_tokens": 20000, "sparse_prefill_snapshot": 1}, P.NONE),  # not True
            ({"num_qo_tokens": "4096"}, P.NONE),  # not an int: unknown
            ({"num_qo_tokens": True}, P.NONE),  # a bool is no count
            ({"num_qo_tokns": 4096}, P.NONE),  # a misspelt fact is not reported
        ],
    )
    def test_every_form_reads_the_batch_and_fails_closed(self, engine, dsv4, facts, expected):
        assert dsv4.lookup(M.EXTEND, False, True, facts) is expected
        assert dsv4.per_batch()(M.EXTEND, facts) is expected
        assert dsv4.rule(M.EXTEND)(facts) is expected
        known = {
            k: v
            for k, v in (facts or {}).items()
            if k in engine.registry.facts and engine.registry.facts[k].valid(v)
        }
        assert engine.decide(Context("dsv4", M.EXTEND, "none", ON, facts=known)) is expected

    def test_modes_without_facts_are_plain_indexes(self, dsv4):
        step = dsv4.per_batch()
        assert step(M.DECODE) is step(M.DECODE, {"num_qo_tokens": 1}) is P.IN_GRAPH
        assert step("not a mode") is P.NONE
        assert dsv4.rule(M.DECODE) is None and dsv4.actions(M.DECODE) == ()
        assert dsv4.per_step()(M.EXTEND) is P.NONE  # no facts: the batch reports none
        assert dsv4.lookup(M.EXTEND) is P.NONE

    def test_the_runner_facts_still_apply(self, dsv4):
        eager = dsv4.per_batch(eager=True, planted=False)
        assert eager(M.DECODE) is P.POST_REPLAY
        assert eager(M.EXTEND, {"num_qo_tokens": 4}) is P.PRE_REPLAY  # eager prefill publishes

    def test_actions_name_what_the_runner_must_perform(self, engine, dsv4):
        assert dsv4.actions(M.EXTEND) == ("sparse_prefill_snapshot",)
        assert dsv4.rule(M.EXTEND).facts == ("num_qo_tokens", "sparse_prefill_snapshot")
        eagle = engine.compile("trtllm_mha", "eagle", ON, strict=True)
        assert eagle.actions(M.EXTEND) == ("prefill_staged",)
        assert eagle.actions(M.TARGET_VERIFY) == ("draft_extend_staged",)
        assert eagle.per_batch()(M.TARGET_VERIFY, {"draft_extend_staged": True}) is P.IN_GRAPH
        plain = engine.compile("trtllm_mha", "none", ON, strict=True)
        assert plain.actions(M.EXTEND) == () and plain.lookup(M.EXTEND) is P.PRE_REPLAY
        off = engine.compile("trtllm_mha", "eagle", strict=True)  # prefill not opted in
        assert off.actions(M.EXTEND) == ()  # staging could not make it earlier: not performed

    def test_decision_explains_a_batch(self, dsv4):
        decision = dsv4.decision(M.EXTEND, facts={"num_qo_tokens": 20000})
        assert decision.policy is P.NONE
        assert "dsv4-sparse-prefill-needs-snapshot" in [r.id for r in decision.reasons]
        assert decision.context.facts == {"num_qo_tokens": 20000}
        bad = dsv4.decision(M.EXTEND, facts={"num_qo_tokens": "x", "nope": 1})
        assert bad.policy is P.NONE and bad.context.facts == {}  # read as the lookup reads them

    def test_the_router_narrows_per_batch(self, engine):
        router = engine.compile("image_prefill_trtllm_mha", "none", ON, strict=True)
        step = router.per_batch()
        assert step(M.EXTEND) is P.NONE
        assert step(M.EXTEND, {"image_prefill_route": "text"}) is P.PRE_REPLAY
        assert step(M.EXTEND, {"image_prefill_route": "image"}) is P.NONE
        assert step(M.EXTEND, {"image_prefill_route": "audio"}) is P.NONE
        assert router.actions(M.EXTEND) == ()


def test_a_cell_with_too_many_combinations_ignores_its_facts(monkeypatch):
    facts = {f"f{i}": Fact(f"f{i}", FactType.BOOL) for i in range(3)}
    gate = Gate(
        "g",
        Conditions(facts={n: FactTest(equals=True) for n in facts}),
        P.NONE,
        "all three",
    )
    registry = Registry(
        backends={"b": Backend("b", {M.DECODE: P.PRE_REPLAY})}, gates=(gate,), facts=facts
    )
    engine = PolicyEngine(registry, environ={})
    assert engine.compile("b", strict=True).per_batch()(M.DECODE, {"f0": False}) is P.PRE_REPLAY
    monkeypatch.setattr(engine_mod, "MAX_FACT_CASES", 26)  # 3 x 3 x 3 = 27 combinations
    with pytest.warns(RuntimeWarning, match="more per-batch facts than 26 combinations"):
        compiled = PolicyEngine(registry, environ={}).compile("b", strict=True)
    assert compiled.rule(M.DECODE) is None
    assert compiled.per_batch()(M.DECODE, {"f0": False}) is P.NONE  # the later policy


def test_a_failed_compile_has_no_rules(recwarn):
    compiled = PolicyEngine.load(environ={}).compile("no_such_backend")
    assert compiled.per_batch()(M.EXTEND, {"num_qo_tokens": 1}) is P.NONE
    assert compiled.actions(M.EXTEND) == ()


@pytest.mark.parametrize("runner", [(True, -1), (False, 1), (0, True), (None, False), ("y", True)])
def test_runner_facts_must_be_booleans(dsv4, runner):
    """Issue 17 class 13: ``lookup(mode, True, -1)`` indexed the table and answered in_graph."""
    from warpolicy.errors import InputError

    for call in (
        lambda: dsv4.lookup(M.DECODE, *runner),
        lambda: dsv4.lookup(M.EXTEND, *runner, {"num_qo_tokens": 1}),
        lambda: dsv4.per_step(*runner),
        lambda: dsv4.per_batch(*runner),
        lambda: dsv4.rule(M.EXTEND, *runner),
        lambda: dsv4.actions(M.EXTEND, *runner),
    ):
        with pytest.raises(InputError, match="must be booleans"):
            call()


def _values(kind):
    """Values a batch may report for a fact of ``kind``, junk and absence included."""
    junk = [None, "x", 1, 0, True, False, 2.0]
    return {
        FactType.ACTION: [True, False, *junk],
        FactType.BOOL: [True, False, *junk],
        FactType.INT: [-5, 0, 3, 4, 5, 99, *junk],
        FactType.NAME: ["text", "image", "video", "other", *junk],
    }[kind]


@pytest.mark.parametrize(
    "kinds",
    [
        (FactType.ACTION,),
        (FactType.INT,),
        (FactType.BOOL,),
        (FactType.NAME,),
        (FactType.INT, FactType.ACTION),
        (FactType.ACTION, FactType.INT),
        (FactType.ACTION, FactType.ACTION),
        (FactType.NAME, FactType.ACTION),
        (FactType.BOOL, FactType.INT),
        (FactType.INT, FactType.BOOL, FactType.ACTION),
    ],
)
def test_every_rule_shape_agrees_with_its_table(kinds):
    """The specialised closures (one fact; a fact and an action; two actions) and the generic
    ones classify every value exactly as `FactClasses.classify` does."""
    import itertools

    from warpolicy.registry.compiled import BatchRule
    from warpolicy.registry.facts import ABSENT, fact_classes

    classes = []
    for i, kind in enumerate(kinds):
        values = frozenset({"text", "image", "video"}) if kind is FactType.NAME else None
        fact = Fact(f"f{i}", kind, values=values)
        tests = {
            FactType.INT: [FactTest(compare=(("gt", 3), ("le", 5)))],
            FactType.NAME: [FactTest(names=frozenset({"image"}))],
        }.get(kind, [])
        classes.append(fact_classes(fact, tests, ["text"] if kind is FactType.NAME else []))
    sizes = [len(c.labels) for c in classes]
    keys = list(itertools.product(*(range(n) for n in sizes)))
    table = {key: list(P)[hash(key) % 4] for key in keys}
    rule = BatchRule(classes, table)
    for combo in itertools.product(*([*_values(k), ABSENT] for k in kinds)):
        facts = {c.fact.name: v for c, v in zip(classes, combo) if v is not ABSENT}
        want = table[tuple(c.classify(facts.get(c.fact.name, ABSENT)) for c in classes)]
        assert rule(facts) is want, (kinds, facts)
    assert rule(None) is rule({}) is rule.unknown
