"""One evaluation of the rules: a (mode, spec, flags, platform facts, per-batch facts) context
evaluated over any backends of one registry, children first and iteratively, each backend
visited once (`Evaluation`), plus the gate matcher and the built-in sound demotion.
`warpolicy.registry.engine` drives it; this module knows the registry, never the engine.

Per-batch facts enter in four places, each failing closed (`warpolicy.registry.facts`): a
gate's ``when.facts`` (an unknown fact's test holds), a declaration that holds only ``after``
an action (an action that did not succeed gives its ``otherwise``), a capability that holds only
after an action (``spec_lacks`` holds, ``spec_has`` always holds), and a router's route (a
pinned router whose route is reported runs that child; otherwise the latest of every child).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from warpolicy.errors import InputError
from warpolicy.registry.decision import (
    AFTER_PREFIX,
    BUILT_IN,
    DECLARED_ID,
    FORCE_COARSE,
    FORCE_COARSE_ID,
    SOUND_DEMOTION_ID,
    Context,
    Decision,
    Declaration,
    Declared,
    Explanation,
    FactValue,
    FlagValue,
    GateCheck,
    Reason,
)
from warpolicy.registry.facts import BatchFacts, passes
from warpolicy.registry.model import Backend, Conditions, Registry, SpecAlgorithm
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, WarReadDonePolicy


class Evaluation:
    """One context evaluated over any backends of ``registry``, each visited once."""

    def __init__(
        self,
        registry: Registry,
        ctx: Context,
        spec: SpecAlgorithm,
        flags: tuple[FlagValue, ...],
        *,
        record_checks: bool = True,
        buffer_class: str | None = None,
    ) -> None:
        # record_checks=False (tables, diffs, compiled tables): the same decisions and reasons,
        # but gates that cannot raise the decision are skipped and no per-gate check is kept
        self.record_checks = record_checks
        # buffer_class: decide where the reads of that class end (None: the cell, the latest
        # of every class); a backend whose tree never names it is none for it ("silent")
        self.buffer_class = buffer_class
        self.silent: set[str] = set()
        self.registry = registry
        self.ctx = ctx
        self.spec = spec
        self.flags = flags
        self.flag_map = {f.name: f.value for f in flags}
        self.facts = BatchFacts(registry.facts, ctx.facts)
        self.memo: dict[str, Explanation] = {}
        #: per backend: the per-batch facts its decision read (its children's included)
        self.facts_read: dict[str, frozenset[str]] = {}
        #: per backend: every value its declaration may take for the unknown facts
        self.possible: dict[str, frozenset[WarReadDonePolicy]] = {}

    def explain(self, name: str) -> Explanation:
        """The explanation of ``name``; children first, iteratively (no recursion limit)."""
        if name in self.memo:
            return self.memo[name]
        stack: list[tuple[str, bool]] = [(name, False)]
        open_nodes: set[str] = set()
        while stack:
            node, children_done = stack.pop()
            if node in self.memo:
                continue
            if children_done:
                open_nodes.discard(node)
                self.memo[node] = self._explain_node(node)
                continue
            if node in open_nodes:  # the loader rejects cycles; never loop at runtime
                raise InputError(f"cycle through backend {node!r}")
            open_nodes.add(node)
            stack.append((node, True))
            for child, _via in self._children(self.registry.lineage(node)):
                if child not in self.memo:
                    if child in open_nodes:
                        raise InputError(f"cycle through backend {child!r}")
                    stack.append((child, False))
        return self.memo[name]

    def _children(self, lineage: Sequence[Backend]) -> list[tuple[str, str]]:
        """``(child, how)`` for every backend this one runs in the mode, inherited ones included
        (a router: the child its batch routes to, or every child it may route to)."""
        mode = self.ctx.mode
        out: dict[str, str] = {}
        for entry in lineage:
            for child in entry.latest_of:
                out.setdefault(child, f"latest_of of {entry.name}")
            delegate = entry.per_mode.get(mode)
            if delegate is not None:
                out.setdefault(delegate, f"per_mode {mode.label} of {entry.name}")
            route = entry.routes
            if route is None:
                continue
            if not route.routed(mode):
                if route.default is not None:
                    out.setdefault(route.children[route.default], f"routes default of {entry.name}")
                continue
            chosen = self._route(entry)[0]
            for label, child in route.children.items():
                if chosen is None or label == chosen:
                    out.setdefault(
                        child, f"routes {mode.label} per batch ({label}) of {entry.name}"
                    )
        return list(out.items())

    def _route(self, entry: Backend) -> tuple[str | None, str]:
        """The label a router's batch runs, or None (every child may run), and why."""
        route = entry.routes
        assert route is not None
        names = ", ".join(route.children.values())
        if not route.pinned:
            return None, (
                f"{entry.name} is not pinned (its choice may change inside one forward), so "
                f"{route.fact} is not used: the latest of every child it may route to ({names})"
            )
        known, value = self.facts.value(route.fact)
        if known and value in route.children:
            return str(value), (
                f"{entry.name} routes this batch by {route.fact}: {value} -> "
                f"{route.children[str(value)]}"
            )
        if known:
            why = f"{route.fact}={value!r} names no child of {entry.name}, so it counts as unknown"
        else:
            why = self.facts.describe(route.fact)
        return None, f"{why}: the latest of every child {entry.name} may route to ({names})"

    def _explain_node(self, name: str) -> Explanation:
        lineage = self.registry.lineage(name)
        self.facts.read = set()
        record = self._declared(lineage)
        ctx = attrs.evolve(self.ctx, backend=name)
        policy = record.floor
        reasons = [Reason(DECLARED_ID, record.chain[-1], record.floor, record.origin)]
        seen = {DECLARED_ID}
        for child in record.children:  # what moved a child past the declaration moved this too
            for reason in child.decision.reasons:
                if reason.id not in seen and reason.policy > record.policy:
                    seen.add(reason.id)
                    reasons.append(reason)
        for reason in record.batch_reasons:  # actions that did not succeed for this batch
            if reason.policy > policy:
                policy = reason.policy
            if reason.id not in seen and reason.policy > record.policy:
                seen.add(reason.id)
                reasons.append(reason)
        names = frozenset(b.name for b in lineage)
        checks = []
        scoped = tuple(g for b in lineage for g in b.gates)
        for gate in self.registry.gates + scoped:
            if not self.record_checks and gate.at_least <= policy and not gate.when.facts:
                continue  # cannot move the decision; only an explanation lists it
            matched, why = _gate_matches(
                gate.when, ctx, self.spec, self.flag_map, record.possible, names, self.facts
            )
            raised = matched and gate.at_least > record.floor
            if self.record_checks:
                checks.append(GateCheck(gate, matched, why, raised))
            if matched and gate.at_least > policy:
                policy = gate.at_least
            if raised and gate.id not in seen:
                seen.add(gate.id)
                reasons.append(Reason(gate.id, gate.because, gate.at_least, str(gate.origin)))
        forced = self._force_coarse()
        if forced is not None and policy < NONE:
            policy = NONE
            if FORCE_COARSE_ID not in seen:
                seen.add(FORCE_COARSE_ID)
                reasons.append(forced)
        demotion = _sound_demotion(policy, ctx)
        if demotion is not None:
            policy = max(policy, demotion.policy)
            reasons.append(demotion)
        self.possible[name] = record.possible
        read = set(self.facts.read)
        for child in record.children:
            read |= self.facts_read.get(child.backend, frozenset())
        self.facts_read[name] = frozenset(read)
        declared_facts = self.registry.facts
        facts = (
            tuple(
                FactValue(n, declared_facts[n].type, self.facts.describe(n))
                for n in sorted(read)
                if n in declared_facts
            )
            if self.record_checks
            else ()
        )
        decision = Decision(policy, ctx, tuple(reasons))
        return Explanation(
            decision,
            self.flags,
            self.spec,
            record.policy,
            record.chain,
            tuple(checks),
            record.children,
            demotion,
            record.declarations,
            forced,
            facts=facts,
        )

    def _force_coarse(self) -> Reason | None:
        for flag in self.flags:
            if flag.name == FORCE_COARSE.name and flag.value:
                return Reason(
                    FORCE_COARSE_ID,
                    f"the operator forced the coarse barrier (force_coarse from {flag.source})",
                    NONE,
                    BUILT_IN,
                )
        return None

    def _declared(self, lineage: Sequence[Backend]) -> Declared:
        """The latest of every declaration the backend reaches, and its children's decisions;
        the per-batch requirements of its declarations become ``batch_reasons``."""
        mode = self.ctx.mode
        name = lineage[0].name
        cls = self.buffer_class
        declarations = []
        batch_reasons = []
        chain: list[str] = []
        covered: set[str] = set()
        for entry in lineage:
            classes = entry.declared_classes(mode)
            if not classes or (cls is not None and cls not in classes):
                continue
            covered |= set(classes)
            policy = entry.reads_end[mode] if cls is None else classes[cls]
            origin = str(entry.reads_end_origins.get(mode, entry.origin))
            via = "own" if entry.name == name else f"inherited from {entry.name}"
            after = entry.reads_end_after.get(mode)
            declarations.append(
                Declaration(
                    entry.name,
                    policy,
                    origin,
                    via,
                    after.action if after else None,
                    after.otherwise if after else None,
                )
            )
            line = f"{name} declares {mode.label}: {policy.label}"
            if cls is not None:
                line = f"{name} declares {mode.label} {cls}: {policy.label}"
            elif mode in entry.reads_end_classes:
                line += f" ({_classes_text(classes)})"
            if after is not None:
                line += f" after {after.action} (else {after.otherwise.label})"
                done = self.facts.succeeded(after.action)
                if not done:
                    batch_reasons.append(
                        Reason(
                            AFTER_PREFIX + after.action,
                            f"{entry.name} declares {mode.label} {policy.label} only after the "
                            f"per-batch action {after.action} succeeds, and it did not for this "
                            f"batch (false, no report or an exception): {after.otherwise.label}",
                            after.otherwise,
                            origin,
                        )
                    )
                line += f"; {self.facts.describe(after.action)}"
            chain.append(line + ("" if via == "own" else f" ({via})"))
        reads = frozenset().union(*(entry.reads_classes for entry in lineage))
        unsaid = sorted(reads - covered) if cls is None else sorted({cls} & reads - covered)
        if unsaid:  # read, but no declaration says where those reads end: unknown
            origin = str(lineage[0].origin)
            declarations.append(Declaration(name, NONE, origin, "reads_classes", None, None))
            chain.append(
                f"{name} reads {', '.join(unsaid)} but declares no read end for it in "
                f"{mode.label}: none"
            )
        for entry in lineage:
            if entry.routes is not None and entry.routes.routed(mode):
                chain.append(self._route(entry)[1])
        children = []
        parts = [f"{d.backend}={d.policy.label}" for d in declarations]
        for child_name, how in self._children(lineage):
            if child_name in self.silent:  # never names the class: it does not read it
                chain.append(f"{name} runs {child_name}, which declares no {cls} reads")
                continue
            child = self.memo[child_name]
            children.append(child)
            parts.append(f"{child_name}={child.declared.label}")
            chain.append(
                f"{name} runs {child_name} for {mode.label} ({how}): declared "
                f"{child.declared.label}, decided {child.decision.policy.label}"
            )
        if not declarations and not children:
            if cls is not None:
                self.silent.add(name)
                chain.append(f"{name} declares no {cls} reads in {mode.label}: unknown, none")
            else:
                chain.append(f"{name} does not declare {mode.label}: not audited, none")
            return Declared(
                NONE, NONE, str(lineage[0].origin), tuple(chain), (), (), frozenset({NONE})
            )
        candidates = [(d.policy, d.origin) for d in declarations]
        candidates += [(c.declared, str(self.registry.backends[name].origin)) for c in children]
        declared, origin = max(candidates, key=lambda item: item[0])
        floor = max([declared] + [c.decision.policy for c in children])
        if len(candidates) > 1 or children:
            kind = "the latest of its children" if children else "the latest of its declarations"
            chain.append(
                f"{name} is {kind}: declared {declared.label} ({', '.join(parts)}), "
                f"decided at least {floor.label}"
            )
        possible = self._possible(lineage, declarations, children)
        return Declared(
            declared,
            floor,
            origin,
            tuple(chain),
            tuple(declarations),
            tuple(children),
            possible,
            tuple(batch_reasons),
        )

    def _possible(
        self,
        lineage: Sequence[Backend],
        declarations: Sequence[Declaration],
        children: Sequence[Explanation],
    ) -> frozenset[WarReadDonePolicy]:
        """Every value the declaration may take for some value of the unknown facts: a router
        whose route is unknown declares like any one of its children."""
        own = max((d.policy for d in declarations), default=None)
        start = frozenset({own}) if own is not None else frozenset()
        routed = any(e.routes is not None and e.routes.routed(self.ctx.mode) for e in lineage)
        if routed and len(children) > 1:  # the route is unknown: any one child runs
            return frozenset(
                max([p] + ([own] if own is not None else []))
                for child in children
                for p in self.possible[child.backend]
            )
        acc = start
        for child in children:
            options = self.possible[child.backend]
            acc = frozenset(max(a, p) for a in acc for p in options) if acc else options
        return acc or frozenset({NONE})


def _classes_text(classes: Mapping[str, WarReadDonePolicy]) -> str:
    return ", ".join(f"{n}: {p.label}" for n, p in sorted(classes.items()))


def _sound_demotion(policy: WarReadDonePolicy, ctx: Context) -> Reason | None:
    """In-graph is only sound when the node really exists; otherwise at least post-replay."""
    if policy != IN_GRAPH:
        return None
    if ctx.eager:
        why = "the forward ran eagerly (no captured graph), so no in-graph node exists"
    elif not ctx.external_events:
        why = "the platform has no external events, so no in-graph node can be planted"
    elif not ctx.planted:
        why = "the read-done node was not planted in this graph"
    else:
        return None
    return Reason(SOUND_DEMOTION_ID, f"{why}; demoted to post_replay", POST_REPLAY, BUILT_IN)


def _has(spec: SpecAlgorithm, capability: str, facts: BatchFacts) -> bool:
    """For ``spec_lacks``: a capability after an action counts only when the action succeeded."""
    if spec.has(capability):
        return True
    action = spec.capabilities_after.get(capability)
    return action is not None and facts.succeeded(action)


def _may_have(spec: SpecAlgorithm, capability: str) -> bool:
    """For ``spec_has``: a capability after an action counts whatever the action did (a gate
    only makes a decision later, so success must never be what triggers one)."""
    return spec.has(capability) or capability in spec.capabilities_after


def _gate_matches(
    when: Conditions,
    ctx: Context,
    spec: SpecAlgorithm,
    flags: Mapping[str, bool],
    declared: frozenset[WarReadDonePolicy],
    lineage: frozenset[str],
    facts: BatchFacts,
) -> tuple[bool, Callable[[], str]]:
    """Whether every condition of ``when`` holds, and a callable naming the first that does not
    (called only when an explanation is rendered). Per-batch facts are tested last."""
    if when.mode is not None and ctx.mode not in when.mode:
        return False, lambda: f"mode is {ctx.mode.label}, not {_names(when.mode)}"
    if when.backend is not None and not (lineage & when.backend):
        return False, lambda: f"backend is {ctx.backend}, not {_names(when.backend)}"
    if when.spec is not None and ctx.spec not in when.spec:
        return False, lambda: f"spec is {ctx.spec}, not {_names(when.spec)}"
    if when.spec_family is not None and spec.family not in when.spec_family:
        return False, lambda: f"spec family is {spec.family}, not {_names(when.spec_family)}"
    if when.spec_has is not None and not any(_may_have(spec, c) for c in when.spec_has):
        return False, lambda: f"{ctx.spec} has none of {_names(when.spec_has)}"
    if when.spec_lacks is not None and all(_has(spec, c, facts) for c in when.spec_lacks):
        after = [spec.capabilities_after[c] for c in when.spec_lacks if not spec.has(c)]
        staged = f" ({', '.join(a + ' succeeded' for a in after)})" if after else ""
        return False, lambda: f"{ctx.spec} has {_names(when.spec_lacks)}{staged}"
    for name, want in when.flags.items():
        if flags.get(name) != want:
            have = flags.get(name)
            return (
                False,
                lambda n=name, h=have, w=want: (
                    f"flag {n} is {str(h).lower()}, not {str(w).lower()}"
                ),
            )
    if when.declared is not None and not (declared & when.declared):
        return False, lambda: f"declared is {_names(declared)}, not {_names(when.declared)}"
    if when.platform is not None and ctx.platform not in when.platform:
        return False, lambda: f"platform is {ctx.platform}, not {_names(when.platform)}"
    for fact in ("eager", "planted", "external_events"):
        want = getattr(when, fact)
        if want is not None and getattr(ctx, fact) != want:
            have = getattr(ctx, fact)
            return (
                False,
                lambda f=fact, h=have, w=want: f"{f} is {str(h).lower()}, not {str(w).lower()}",
            )
    held = []
    for name, test in when.facts.items():
        holds, seen = passes(facts, name, test)
        if not holds:
            wanted = test.text(name)
            return False, lambda t=wanted, s=seen: f"{s}, not {t}"
        held.append(seen)
    if held:
        return True, lambda: "all conditions hold (" + "; ".join(held) + ")"
    return True, _ALL_HOLD


def _all_hold() -> str:
    return "all conditions hold"


_ALL_HOLD = _all_hold


def _names(values: Iterable[object]) -> str:
    labels = sorted(str(getattr(v, "label", v)) for v in values)
    return labels[0] if len(labels) == 1 else "any of " + ", ".join(labels)
