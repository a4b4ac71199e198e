"""Hypothesis property tests for the engine's invariants (docs/ARCHITECTURE.md, "Engine API"),
over random registries that use per-batch facts everywhere they may appear: gate tests,
declarations and capabilities after an action, and per-batch routers."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.registry.decision import Context
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
)
from warpolicy.registry.vocabulary import FactType, ForwardMode, WarReadDonePolicy

MODES = list(ForwardMode)
POLICIES = list(WarReadDonePolicy)
SPECS = ["none", "eagle", "dflash"]
CAPS = ["prefill_read_done", "target_verify_read_done"]
FLAGS = ["force_coarse", "prefill_read_done"]
#: n: an int, a: an action, b: a bool, r: a name (a router's route)
FACTS = {
    "n": Fact("n", FactType.INT),
    "a": Fact("a", FactType.ACTION),
    "b": Fact("b", FactType.BOOL),
    "r": Fact("r", FactType.NAME, values=frozenset({"x", "y", "z"})),
}

policies = st.sampled_from(POLICIES)
modes = st.sampled_from(MODES)
fact_tests = st.fixed_dictionaries(
    {},
    optional={
        "n": st.builds(
            lambda ops: FactTest(compare=tuple(ops)),
            st.lists(
                st.tuples(st.sampled_from(["gt", "ge", "lt", "le", "eq"]), st.integers(0, 3)),
                min_size=1,
                max_size=2,
            ),
        ),
        "a": st.just(FactTest(equals=False)),  # an action is tested only for false
        "b": st.builds(lambda v: FactTest(equals=v), st.booleans()),
        "r": st.builds(
            lambda v: FactTest(names=frozenset(v)),
            st.lists(st.sampled_from(["x", "y", "z"]), min_size=1, max_size=2),
        ),
    },
)
#: what a batch may report: valid values only (invalid ones are unit-tested); an int may be negative
batch_facts = st.fixed_dictionaries(
    {},
    optional={
        "n": st.integers(-2, 5),  # past every drawn threshold (0-3) on both sides
        "a": st.booleans(),
        "b": st.booleans(),
        "r": st.sampled_from(["x", "y", "z"]),
    },
)


def optional_set(elements):
    return st.one_of(st.none(), st.frozensets(elements, min_size=1, max_size=3))


conditions = st.builds(
    Conditions,
    mode=optional_set(modes),
    backend=optional_set(st.sampled_from([f"b{i}" for i in range(6)])),
    spec=optional_set(st.sampled_from(SPECS)),
    spec_has=optional_set(st.sampled_from(CAPS)),
    spec_lacks=optional_set(st.sampled_from(CAPS)),
    flags=st.dictionaries(st.sampled_from(FLAGS), st.booleans(), max_size=2),
    declared=optional_set(policies),
    eager=st.one_of(st.none(), st.booleans()),
    planted=st.one_of(st.none(), st.booleans()),
    external_events=st.one_of(st.none(), st.booleans()),
    facts=fact_tests,
)


@st.composite
def gates(draw, prefix="g"):
    n = draw(st.integers(0, 5))
    return [Gate(f"{prefix}{i}", draw(conditions), draw(policies), "because") for i in range(n)]


@st.composite
def registries(draw):
    """Backends b0..b5 where later ones may inherit from / compose earlier ones (a DAG).

    Any combination of ``reads_end`` (some only after the action ``a``), ``inherits``,
    ``latest_of``, ``per_mode``, ``routes`` (by the fact ``r``) and scoped gates on one backend,
    so every way to combine them is exercised.
    """
    backends = {}
    for i in range(6):
        name = f"b{i}"
        reads_end = draw(st.dictionaries(modes, policies, max_size=4))
        earlier = [f"b{j}" for j in range(i)]
        kw = {}
        after_modes = draw(st.lists(modes, max_size=2))
        kw["reads_end_after"] = {
            m: After("a", draw(st.sampled_from([p for p in POLICIES if p > reads_end[m]])))
            for m in after_modes
            if m in reads_end and reads_end[m] is not WarReadDonePolicy.NONE
        }
        # Every shape the loader accepts: per_mode and routes stand alone (no inherits, no
        # latest_of, no declaration of a delegated mode); inherits names a plain backend;
        # inherits and latest_of combine freely.
        plain = [b for b in earlier if not backends[b].is_wrapper]
        shape = draw(st.sampled_from(["per_mode", "routes", "other"])) if earlier else "other"
        if shape == "per_mode":
            kw["per_mode"] = draw(
                st.dictionaries(modes, st.sampled_from(earlier), min_size=1, max_size=3)
            )
            reads_end = {m: p for m, p in reads_end.items() if m not in kw["per_mode"]}
            kw["reads_end_after"] = {
                m: a for m, a in kw["reads_end_after"].items() if m in reads_end
            }
        elif shape == "routes":
            children = draw(
                st.dictionaries(
                    st.sampled_from(["x", "y"]), st.sampled_from(earlier), min_size=1, max_size=2
                )
            )
            routed = draw(st.one_of(st.none(), st.frozensets(modes, min_size=1, max_size=3)))
            default = draw(st.sampled_from([None, *children])) if routed is not None else None
            kw["routes"] = Route("r", children, routed, default, draw(st.booleans()))
        else:
            if plain and draw(st.booleans()):
                kw["inherits"] = draw(st.sampled_from(plain))
            if earlier and draw(st.booleans()):
                kw["latest_of"] = tuple(
                    draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3, unique=True))
                )
        scoped = tuple(attrs.evolve(g, scope=name) for g in draw(gates(prefix=f"{name}g")))
        backends[name] = Backend(name, reads_end, gates=scoped, **kw)
    specs = {}
    for s in SPECS:
        values = {c: draw(st.sampled_from([True, False, "after"])) for c in CAPS}
        specs[s] = SpecAlgorithm(
            s,
            capabilities={c: v for c, v in values.items() if v != "after"},
            capabilities_after={c: "a" for c, v in values.items() if v == "after"},
        )
    flags = {f: Flag(f, draw(st.booleans())) for f in FLAGS}
    return Registry(
        flags=flags,
        spec_algorithms=specs,
        backends=backends,
        gates=tuple(draw(gates())),
        facts=FACTS,
    )


contexts = st.builds(
    Context,
    backend=st.sampled_from([f"b{i}" for i in range(6)]),
    mode=modes,
    spec=st.sampled_from(SPECS),
    flags=st.dictionaries(st.sampled_from(FLAGS), st.booleans(), max_size=2),
    external_events=st.booleans(),
    eager=st.booleans(),
    planted=st.booleans(),
    facts=batch_facts,
)

SETTINGS = settings(max_examples=100, deadline=None)
#: per-batch properties evaluate several batches per example
BATCH_SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(
    registries(),
    gates(prefix="extra"),
    gates(prefix="scoped"),
    st.sampled_from([f"b{i}" for i in range(6)]),
    contexts,
)
def test_adding_gates_never_makes_a_decision_earlier(registry, extra, scoped, owner, ctx):
    before = PolicyEngine(registry, environ={}).decide(ctx)
    backends = dict(registry.backends)
    backends[owner] = attrs.evolve(
        backends[owner],
        gates=backends[owner].gates + tuple(attrs.evolve(g, scope=owner) for g in scoped),
    )
    more = attrs.evolve(registry, gates=registry.gates + tuple(extra), backends=backends)
    after = PolicyEngine(more, environ={}).decide(ctx)
    assert after >= before


@SETTINGS
@given(registries(), contexts, st.randoms(use_true_random=False))
def test_result_does_not_depend_on_gate_order(registry, ctx, rnd):
    shuffled = list(registry.gates)
    rnd.shuffle(shuffled)
    backends = {
        n: attrs.evolve(b, gates=tuple(rnd.sample(b.gates, len(b.gates))))
        for n, b in registry.backends.items()
    }
    other = attrs.evolve(registry, gates=tuple(shuffled), backends=backends)
    a = PolicyEngine(registry, environ={}).decision(ctx)
    b = PolicyEngine(other, environ={}).decision(ctx)
    assert a.policy == b.policy
    assert {r.id for r in a.reasons} == {r.id for r in b.reasons}


def _routed(backend, mode, facts):
    """The children a router runs in ``mode`` for a batch reporting ``facts``."""
    route = backend.routes
    if not route.routed(mode):
        return [] if route.default is None else [route.children[route.default]]
    label = facts.get("r")
    if route.pinned and label in route.children:
        return [route.children[label]]
    return list(route.children.values())


def _runs(registry, name, mode, facts=None):
    """Backends ``name`` runs in ``mode``: its and its ancestors' latest_of and per_mode, and
    the children a router runs for the batch."""
    out = []
    current = name
    while current is not None:
        backend = registry.backends[current]
        out.extend(backend.latest_of)
        if mode in backend.per_mode:
            out.append(backend.per_mode[mode])
        if backend.routes is not None:
            out.extend(_routed(backend, mode, facts or {}))
        current = backend.inherits
    return out


def _reachable(registry, name, mode, edges, facts=None):
    """Every backend reachable from ``name`` over ``edges`` (a breadth-first walk)."""
    seen, todo = {name}, [name]
    while todo:
        backend = registry.backends[todo.pop()]
        nxt = []
        if "inherits" in edges and backend.inherits is not None:
            nxt.append(backend.inherits)
        if "runs" in edges:
            nxt.extend(backend.latest_of)
            if mode in backend.per_mode:
                nxt.append(backend.per_mode[mode])
            if backend.routes is not None:
                nxt.extend(_routed(backend, mode, facts or {}))
        for child in nxt:
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


@SETTINGS
@given(registries(), contexts)
def test_composite_is_never_earlier_than_any_child(registry, ctx):
    engine = PolicyEngine(registry, environ={})
    parent = engine.decide(ctx)
    for child in _runs(registry, ctx.backend, ctx.mode, ctx.facts):
        assert parent >= engine.decide(attrs.evolve(ctx, backend=child))


@SETTINGS
@given(registries(), contexts)
def test_never_earlier_than_any_reachable_declaration(registry, ctx):
    """Through inherits, latest_of and per_mode in any combination: the latest declaration
    reachable from the backend bounds the decision, and explain lists every one of them."""
    engine = PolicyEngine(registry, environ={})
    exp = engine.explain(ctx)
    listed = set()
    todo = [exp]
    while todo:
        node = todo.pop()
        listed |= {(d.backend, d.policy) for d in node.declarations}
        todo.extend(node.children)
    for name in _reachable(registry, ctx.backend, ctx.mode, {"inherits", "runs"}, ctx.facts):
        declared = registry.backends[name].reads_end.get(ctx.mode)
        if declared is not None:
            assert exp.decision.policy >= declared, name
            assert exp.declared >= declared, name
            assert (name, declared) in listed


@SETTINGS
@given(registries(), contexts)
def test_never_earlier_than_a_matching_gate_of_any_backend_it_runs(registry, ctx):
    """A gate that matches where it applies (the backend itself, or a backend it runs, with
    scoped gates of their ancestors) bounds the decision."""
    engine = PolicyEngine(registry, environ={})
    policy = engine.decide(ctx)
    running, todo = {ctx.backend}, [ctx.backend]
    while todo:
        for child in _runs(registry, todo.pop(), ctx.mode, ctx.facts):
            if child not in running:
                running.add(child)
                todo.append(child)
    for name in running:
        for check in engine.explain(attrs.evolve(ctx, backend=name)).gates:
            if check.matched:
                assert policy >= check.gate.at_least, (name, check.gate.id)


@SETTINGS
@given(registries(), contexts)
def test_in_graph_only_with_planted_node_and_external_events(registry, ctx):
    policy = PolicyEngine(registry, environ={}).decide(ctx)
    if policy is WarReadDonePolicy.IN_GRAPH:
        assert ctx.planted and ctx.external_events and not ctx.eager


@SETTINGS
@given(registries(), contexts)
def test_never_earlier_than_declared_or_a_matching_gate(registry, ctx):
    exp = PolicyEngine(registry, environ={}).explain(ctx)
    assert exp.decision.policy >= exp.declared
    for check in exp.gates:
        if check.matched:
            assert exp.decision.policy >= check.gate.at_least


@settings(max_examples=50, deadline=None)
@given(registries(), contexts)
def test_compiled_lookup_equals_decide(registry, ctx):
    engine = PolicyEngine(registry, environ={})
    compiled = engine.compile(
        ctx.backend,
        ctx.spec,
        ctx.flags,
        platform=ctx.platform,
        external_events=ctx.external_events,
        strict=True,
    )
    assert compiled.lookup(ctx.mode, ctx.eager, ctx.planted, ctx.facts) is engine.decide(ctx)
    step = compiled.per_batch(ctx.eager, ctx.planted)
    assert step(ctx.mode, ctx.facts) is engine.decide(ctx)
    unreported = engine.decide(attrs.evolve(ctx, facts={}))
    assert compiled.lookup(ctx.mode, ctx.eager, ctx.planted) is unreported
    assert compiled.per_step(ctx.eager, ctx.planted)(ctx.mode) is unreported


# -- per-batch facts ----------------------------------------------------------------------------


@BATCH_SETTINGS
@given(registries(), contexts, st.sampled_from(sorted(FACTS)))
def test_a_fact_the_batch_does_not_report_never_makes_a_decision_earlier(registry, ctx, name):
    engine = PolicyEngine(registry, environ={})
    reported = engine.decide(ctx)
    unreported = engine.decide(
        attrs.evolve(ctx, facts={k: v for k, v in ctx.facts.items() if k != name})
    )
    assert unreported >= reported
    assert engine.decide(attrs.evolve(ctx, facts={})) >= reported


@BATCH_SETTINGS
@given(registries(), contexts)
def test_an_action_that_did_not_succeed_is_never_earlier_than_one_that_did(registry, ctx):
    engine = PolicyEngine(registry, environ={})
    done = engine.decide(attrs.evolve(ctx, facts={**ctx.facts, "a": True}))
    failed = engine.decide(attrs.evolve(ctx, facts={**ctx.facts, "a": False}))
    missing = engine.decide(
        attrs.evolve(ctx, facts={k: v for k, v in ctx.facts.items() if k != "a"})
    )
    assert failed >= done and missing == failed


@BATCH_SETTINGS
@given(registries(), contexts)
def test_the_cases_cover_every_reported_batch(registry, ctx):
    """``explain``'s per-batch cases, read as a function of the facts, give the decision of
    every batch (the fail-closed headline for one that reports nothing)."""
    engine = PolicyEngine(registry, environ={})
    bare = attrs.evolve(ctx, facts={})
    exp = engine.explain(bare)
    assert exp.decision.policy is engine.decide(bare)
    if not exp.cases:
        assert engine.decide(ctx) is exp.decision.policy or not ctx.facts
        return
    assert max(c.policy for c in exp.cases) is exp.decision.policy
    assert engine.decide(ctx) in {c.policy for c in exp.cases}


@BATCH_SETTINGS
@given(registries(), contexts)
def test_a_pinned_router_is_never_earlier_than_the_child_its_batch_runs(registry, ctx):
    engine = PolicyEngine(registry, environ={})
    backend = registry.backends[ctx.backend]
    if backend.routes is None:
        return
    policy = engine.decide(ctx)
    for child in _routed(backend, ctx.mode, ctx.facts):
        assert policy >= engine.decide(attrs.evolve(ctx, backend=child))
