"""One evaluation of the rules: a (mode, spec, flags, platform facts) context evaluated over
any backends, children first and iteratively, each backend visited once (`Evaluation`), plus
the gate matcher and the built-in sound demotion. `warpolicy.registry.engine` drives it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, Sequence

import attrs

from warpolicy.errors import InputError
from warpolicy.registry.decision import (
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
    FlagValue,
    GateCheck,
    Reason,
)
from warpolicy.registry.model import Backend, Conditions, SpecAlgorithm
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, WarReadDonePolicy

if TYPE_CHECKING:
    from warpolicy.registry.engine import PolicyEngine


class Evaluation:
    """One (mode, spec, flags, platform facts) evaluated over any backends, each visited once."""

    def __init__(
        self,
        engine: PolicyEngine,
        ctx: Context,
        spec: SpecAlgorithm,
        flags: tuple[FlagValue, ...],
        *,
        record_checks: bool = True,
    ) -> None:
        # record_checks=False (tables, diffs): the same decisions and reasons, but gates that
        # cannot raise the decision are skipped and no per-gate check is kept
        self.record_checks = record_checks
        self.registry = engine.registry
        self.lineages = engine._lineages  # the registry is immutable: one lineage per backend
        self.global_gates = engine._global_gates
        self.ctx = ctx
        self.spec = spec
        self.flags = flags
        self.flag_map = {f.name: f.value for f in flags}
        self.memo: dict[str, Explanation] = {}

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
            for child, _via in self._children(self._lineage(node)):
                if child not in self.memo:
                    if child in open_nodes:
                        raise InputError(f"cycle through backend {child!r}")
                    stack.append((child, False))
        return self.memo[name]

    def _lineage(self, name: str) -> tuple[Backend, ...]:
        """``name`` and every backend it inherits from, nearest first."""
        cached = self.lineages.get(name)
        if cached is not None:
            return cached
        chain: list[Backend] = []
        seen: set[str] = set()
        current: Optional[str] = name
        while current is not None:
            if current in seen:
                raise InputError(f"inheritance cycle through backend {current!r}")
            seen.add(current)
            backend = self.registry.backend(current)  # raises UnknownNameError
            chain.append(backend)
            current = backend.inherits
        lineage = self.lineages[name] = tuple(chain)
        return lineage

    def _children(self, lineage: Sequence[Backend]) -> list[tuple[str, str]]:
        """``(child, how)`` for every backend this one runs in the mode, inherited ones included."""
        mode = self.ctx.mode
        out: dict[str, str] = {}
        for entry in lineage:
            for child in entry.latest_of:
                out.setdefault(child, f"latest_of of {entry.name}")
            delegate = entry.per_mode.get(mode)
            if delegate is not None:
                out.setdefault(delegate, f"per_mode {mode.label} of {entry.name}")
        return list(out.items())

    def _explain_node(self, name: str) -> Explanation:
        lineage = self._lineage(name)
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
        names = frozenset(b.name for b in lineage)
        checks = []
        scoped = tuple(g for b in lineage for g in b.gates)
        for gate in self.global_gates + scoped:
            if not self.record_checks and gate.at_least <= record.floor:
                continue  # cannot move the decision; only an explanation lists it
            matched, why = _gate_matches(
                gate.when, ctx, self.spec, self.flag_map, record.policy, names
            )
            raised = matched and gate.at_least > record.floor
            if self.record_checks:
                checks.append(GateCheck(gate, matched, why, raised))
            if raised:
                policy = max(policy, gate.at_least)
                if gate.id not in seen:
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
        )

    def _force_coarse(self) -> Optional[Reason]:
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
        """The latest of every declaration the backend reaches, and its children's decisions."""
        mode = self.ctx.mode
        name = lineage[0].name
        declarations = []
        chain: list[str] = []
        for entry in lineage:
            if mode in entry.reads_end:
                policy = entry.reads_end[mode]
                origin = str(entry.reads_end_origins.get(mode, entry.origin))
                via = "own" if entry.name == name else f"inherited from {entry.name}"
                declarations.append(Declaration(entry.name, policy, origin, via))
                chain.append(
                    f"{name} declares {mode.label}: {policy.label}"
                    + ("" if via == "own" else f" ({via})")
                )
        children = []
        parts = [f"{d.backend}={d.policy.label}" for d in declarations]
        for child_name, how in self._children(lineage):
            child = self.memo[child_name]
            children.append(child)
            parts.append(f"{child_name}={child.declared.label}")
            chain.append(
                f"{name} runs {child_name} for {mode.label} ({how}): declared "
                f"{child.declared.label}, decided {child.decision.policy.label}"
            )
        if not declarations and not children:
            chain.append(f"{name} does not declare {mode.label}: not audited, none")
            return Declared(NONE, NONE, str(lineage[0].origin), tuple(chain), (), ())
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
        return Declared(declared, floor, origin, tuple(chain), tuple(declarations), tuple(children))


def _sound_demotion(policy: WarReadDonePolicy, ctx: Context) -> Optional[Reason]:
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


def _gate_matches(
    when: Conditions,
    ctx: Context,
    spec: SpecAlgorithm,
    flags: Mapping[str, bool],
    declared: WarReadDonePolicy,
    lineage: frozenset[str],
) -> tuple[bool, Callable[[], str]]:
    """Whether every condition of ``when`` holds, and a callable naming the first that does not
    (called only when an explanation is rendered)."""
    if when.mode is not None and ctx.mode not in when.mode:
        return False, lambda: f"mode is {ctx.mode.label}, not {_names(when.mode)}"
    if when.backend is not None and not (lineage & when.backend):
        return False, lambda: f"backend is {ctx.backend}, not {_names(when.backend)}"
    if when.spec is not None and ctx.spec not in when.spec:
        return False, lambda: f"spec is {ctx.spec}, not {_names(when.spec)}"
    if when.spec_family is not None and spec.family not in when.spec_family:
        return False, lambda: f"spec family is {spec.family}, not {_names(when.spec_family)}"
    if when.spec_has is not None and not any(spec.has(c) for c in when.spec_has):
        return False, lambda: f"{ctx.spec} has none of {_names(when.spec_has)}"
    if when.spec_lacks is not None and all(spec.has(c) for c in when.spec_lacks):
        return False, lambda: f"{ctx.spec} has {_names(when.spec_lacks)}"
    for name, want in when.flags.items():
        if flags.get(name) != want:
            have = flags.get(name)
            return (
                False,
                lambda n=name, h=have, w=want: (
                    f"flag {n} is {str(h).lower()}, not {str(w).lower()}"
                ),
            )
    if when.declared is not None and declared not in when.declared:
        return False, lambda: f"declared is {declared.label}, not {_names(when.declared)}"
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
    return True, _ALL_HOLD


def _all_hold() -> str:
    return "all conditions hold"


_ALL_HOLD = _all_hold


def _names(values: Iterable[object]) -> str:
    labels = sorted(str(getattr(v, "label", v)) for v in values)
    return labels[0] if len(labels) == 1 else "any of " + ", ".join(labels)
