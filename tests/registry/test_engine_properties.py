"""Hypothesis property tests for the engine's invariants (docs/ARCHITECTURE.md, "Engine API")."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.registry.engine import Context, PolicyEngine
from warpolicy.registry.model import Backend, Conditions, Flag, Gate, Registry, SpecAlgorithm
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy

MODES = list(ForwardMode)
POLICIES = list(WarReadDonePolicy)
SPECS = ["none", "eagle", "dflash"]
CAPS = ["prefill_read_done", "target_verify_read_done"]
FLAGS = ["force_coarse", "prefill_read_done"]

policies = st.sampled_from(POLICIES)
modes = st.sampled_from(MODES)


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
)


@st.composite
def gates(draw, prefix="g"):
    n = draw(st.integers(0, 5))
    return [Gate(f"{prefix}{i}", draw(conditions), draw(policies), "because") for i in range(n)]


@st.composite
def registries(draw):
    """Backends b0..b5 where later ones may inherit from / compose earlier ones (a DAG).

    Any combination of ``reads_end``, ``inherits``, ``latest_of``, ``per_mode`` and scoped
    gates on one backend, so every way to combine them is exercised.
    """
    backends = {}
    for i in range(6):
        name = f"b{i}"
        reads_end = draw(st.dictionaries(modes, policies, max_size=4))
        earlier = [f"b{j}" for j in range(i)]
        kw = {}
        # Every shape the loader accepts: per_mode stands alone (no inherits, no latest_of,
        # no declaration of a delegated mode); inherits names a plain backend; inherits and
        # latest_of combine freely.
        plain = [b for b in earlier if not backends[b].is_wrapper]
        if earlier and draw(st.booleans()):
            kw["per_mode"] = draw(
                st.dictionaries(modes, st.sampled_from(earlier), min_size=1, max_size=3)
            )
            reads_end = {m: p for m, p in reads_end.items() if m not in kw["per_mode"]}
        else:
            if plain and draw(st.booleans()):
                kw["inherits"] = draw(st.sampled_from(plain))
            if earlier and draw(st.booleans()):
                kw["latest_of"] = tuple(
                    draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3, unique=True))
                )
        scoped = tuple(attrs.evolve(g, scope=name) for g in draw(gates(prefix=f"{name}g")))
        backends[name] = Backend(name, reads_end, gates=scoped, **kw)
    specs = {
        s: SpecAlgorithm(s, capabilities={c: draw(st.booleans()) for c in CAPS}) for s in SPECS
    }
    flags = {f: Flag(f, draw(st.booleans())) for f in FLAGS}
    return Registry(
        flags=flags, spec_algorithms=specs, backends=backends, gates=tuple(draw(gates()))
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
)

SETTINGS = settings(max_examples=100, deadline=None)


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


def _runs(registry, name, mode):
    """Backends ``name`` runs in ``mode``: its and its ancestors' latest_of and per_mode."""
    out = []
    current = name
    while current is not None:
        backend = registry.backends[current]
        out.extend(backend.latest_of)
        if mode in backend.per_mode:
            out.append(backend.per_mode[mode])
        current = backend.inherits
    return out


def _reachable(registry, name, mode, edges):
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
    for child in _runs(registry, ctx.backend, ctx.mode):
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
    for name in _reachable(registry, ctx.backend, ctx.mode, {"inherits", "runs"}):
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
        for child in _runs(registry, todo.pop(), ctx.mode):
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


@SETTINGS
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
    assert compiled.lookup(ctx.mode, ctx.eager, ctx.planted) is engine.decide(ctx)
