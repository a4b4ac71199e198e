"""The rule engine: ``policy = max(declarations, children, matching gates, built-ins)``.

Every rule is a ``max`` over `WarReadDonePolicy` (ordered by lateness), so a decision does not
depend on the order of gates, layers or plugins, and adding a gate or a declaration can never make
it earlier.

What a backend declares for a mode is the latest of everything it reaches:

* its own ``reads_end`` and that of every backend it ``inherits`` from (a child can make a mode
  later than its base, never earlier);
* the declarations of every backend it runs: its ``latest_of`` children and its ``per_mode``
  delegate for the mode, including those it inherits (an undeclared child counts as ``none``).

The decision starts from that and from the full decisions of the children it runs, then takes
every matching gate (global ones and those scoped to the backend or an ancestor) and two
built-ins no registry can remove: the operator's kill switch (``force_coarse``, `FORCE_COARSE_ID`)
and sound demotion (`SOUND_DEMOTION_ID`). One evaluation memoises each backend it visits, so a
long chain or a wide shared DAG costs one visit per backend.

Three ways in, one evaluator:

* `PolicyEngine.explain` returns everything that was considered (the explaining API);
* `PolicyEngine.decision` is that minus the explanation: the policy and the reasons that moved it;
* `PolicyEngine.decide` is the runtime call: a bare policy, and ``NONE`` (coarse) plus one warning
  on any error, never an earlier point.

The per-step hot path is `CompiledPolicy.per_step` (or `CompiledPolicy.lookup` when the runner's
facts vary): a runner resolves backend, spec algorithm, flags and platform once with
`PolicyEngine.compile`, and each step is a dict or tuple index.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, Sequence, Union

import attrs

from warpolicy.errors import InputError
from warpolicy.inputs import parse_bool
from warpolicy.loader import Blame, Fragment, assemble_registry
from warpolicy.policy import (
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    TABLE_MODES,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)
from warpolicy.registry import Backend, Conditions, Flag, Gate, Origin, Registry, SpecAlgorithm

if TYPE_CHECKING:
    from warpolicy.loader import Source

__all__ = [
    "Context",
    "CompiledPolicy",
    "Declaration",
    "Decision",
    "Explanation",
    "FlagValue",
    "GateCheck",
    "PolicyEngine",
    "Reason",
    "parse_bool",
]

BUILT_IN = "built-in (warpolicy.engine)"

#: Used when a registry declares no ``none`` algorithm: no capabilities, so gates stay coarse.
IMPLICIT_SPEC = SpecAlgorithm(
    "none",
    doc="implicit: no speculative decoding, no capabilities declared",
    origin=Origin(BUILT_IN),
)

#: Reason ids of the built-ins and of the declaration.
SOUND_DEMOTION_ID = "sound-demotion"
FORCE_COARSE_ID = "force-coarse"
DECLARED_ID = "declared"

#: The operator's kill switch. Built in: it works with any registry, and a registry or plugin can
#: add environment names to it (by declaring the flag) but never remove these.
FORCE_COARSE = Flag(
    "force_coarse",
    False,
    ("WARPOLICY_FORCE_COARSE", "SGLANG_FORCE_COARSE_WAR_BARRIER"),
    doc="Always use the coarse barrier; built into the engine.",
    origin=Origin(BUILT_IN),
)


def _mode(value: Union[str, ForwardMode]) -> ForwardMode:
    return ForwardMode.parse(value)


def _flag_dict(flags: Optional[Mapping[str, Union[bool, str]]]) -> dict[str, Union[bool, str]]:
    return dict(flags or {})


@attrs.frozen
class Context:
    """Everything a decision depends on besides the registry.

    ``flags`` holds overrides only; the engine fills the rest from declared defaults and the
    environment. Platform facts default to the fast path: CUDA with external events, a captured
    graph with the node planted.
    """

    backend: str
    mode: ForwardMode = attrs.field(converter=_mode)
    spec: str = "none"
    flags: Mapping[str, Union[bool, str]] = attrs.field(factory=dict, converter=_flag_dict)
    platform: str = "cuda"
    external_events: bool = True
    eager: bool = False
    planted: bool = True


@attrs.frozen
class Reason:
    """One input that moved a decision (or, in an explanation, one that was considered)."""

    id: str
    message: str
    policy: WarReadDonePolicy
    origin: Optional[str] = None

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "message": self.message,
            "policy": self.policy.label,
            "origin": self.origin,
        }


@attrs.frozen
class Decision:
    """A policy and the reasons that moved it (the declared read end always comes first)."""

    policy: WarReadDonePolicy
    context: Context
    reasons: tuple[Reason, ...] = ()

    def to_json(self) -> dict:
        return {
            "policy": self.policy.label,
            "backend": self.context.backend,
            "mode": self.context.mode.label,
            "spec": self.context.spec,
            "reasons": [r.to_json() for r in self.reasons],
        }


@attrs.frozen
class GateCheck:
    """How one gate fared against a context, for explanations."""

    gate: Gate
    matched: bool
    # The first condition that failed, or what held. Built only when read: a table or a diff
    # evaluates hundreds of thousands of gate checks and renders none of them.
    describe: Callable[[], str]
    raised: bool = False  # matched and later than the declared read end (and any child)

    @property
    def why(self) -> str:
        return self.describe()


@attrs.frozen
class FlagValue:
    name: str
    value: bool
    source: str  # "default", "env VAR", "override", "built-in ..."


@attrs.frozen
class Declaration:
    """One ``reads_end`` entry that took part in a decision."""

    backend: str  # the backend whose reads_end holds it
    policy: WarReadDonePolicy
    origin: str
    via: str  # how the evaluated backend reaches it: "own" or "inherited from NAME"


@attrs.frozen
class Declared:
    """What a backend declares for one mode, with everything that went into it.

    ``policy`` is the declaration alone (what a gate's ``declared:`` tests; no gate changes it).
    ``floor`` is where the decision starts: ``policy`` and the full decisions of the children the
    backend runs, so a wrapper is never earlier than a child.
    """

    policy: WarReadDonePolicy
    floor: WarReadDonePolicy
    origin: Optional[str]
    chain: tuple[str, ...]
    declarations: tuple[Declaration, ...]
    children: tuple[Explanation, ...]


@attrs.frozen
class Explanation:
    """Every input the engine considered, for `warpolicy explain`.

    ``children`` are the explanations of the backends this one runs (composite children and the
    per-mode delegate); in a shared DAG the same child object appears under several parents.
    """

    decision: Decision
    flags: tuple[FlagValue, ...]
    spec: SpecAlgorithm
    declared: WarReadDonePolicy
    chain: tuple[str, ...]  # how the declared read end was found
    gates: tuple[GateCheck, ...]
    children: tuple[Explanation, ...] = ()
    demotion: Optional[Reason] = None
    declarations: tuple[Declaration, ...] = ()
    force_coarse: Optional[Reason] = None
    placement: Placement = Placement.MARKER  # where a runner puts the node (top level only)

    @property
    def backend(self) -> str:
        return self.decision.context.backend

    @property
    def placement_text(self) -> str:
        """One line saying where the read-done node goes and, for derived, what that means."""
        if self.placement is Placement.DERIVED:
            return (
                "derived (the node is planted after the last shared reader found in the "
                "captured graph; see docs/derived-placement.md for what the walk cannot see)"
            )
        return "marker (the runner records the event right after graph_prep)"

    def to_json(self) -> dict:
        """A JSON-ready dict; a child seen earlier in the walk is ``{"backend", "see_above"}``."""
        out = self._json(set())
        out["placement"] = self.placement.value  # the runner's placement for this cell
        return out

    def _json(self, seen: set[str]) -> dict:
        seen.add(self.backend)
        out = self.decision.to_json()
        ctx = self.decision.context
        out.update(
            {
                "declared": self.declared.label,
                "chain": list(self.chain),
                "declarations": [
                    {
                        "backend": d.backend,
                        "policy": d.policy.label,
                        "origin": d.origin,
                        "via": d.via,
                    }
                    for d in self.declarations
                ],
                "flags": {f.name: {"value": f.value, "source": f.source} for f in self.flags},
                "spec_family": self.spec.family,
                "spec_capabilities": dict(self.spec.capabilities),
                "platform": {
                    "name": ctx.platform,
                    "external_events": ctx.external_events,
                    "eager": ctx.eager,
                    "planted": ctx.planted,
                },
                "gates": [
                    {
                        "id": c.gate.id,
                        "matched": c.matched,
                        "raised": c.raised,
                        "at_least": c.gate.at_least.label,
                        "why": c.why,
                        "origin": str(c.gate.origin),
                    }
                    for c in self.gates
                ],
                "children": [
                    {"backend": c.backend, "see_above": True}
                    if c.backend in seen
                    else c._json(seen)
                    for c in self.children
                ],
            }
        )
        return out


class PolicyEngine:
    """Decides `WarReadDonePolicy` for contexts against one registry.

    Flags are resolved from declared defaults and the environment once, at construction.
    ``layers`` (optional) are the sources the registry was built from, in order; with more than
    one, `compile` warns once when a layer makes a compiled cell earlier than the layers below it.
    """

    def __init__(
        self,
        registry: Registry,
        environ: Optional[Mapping[str, str]] = None,
        *,
        layers: Optional[Sequence[Source]] = None,
    ) -> None:
        self.registry = registry
        env = os.environ if environ is None else environ
        self._environ: Mapping[str, str] = dict(env)
        self._flag_values = _resolve_flags(registry, env)
        self._global_gates = tuple(registry.gates)
        self._lineages: dict[str, tuple[Backend, ...]] = {}  # per backend, filled on first use
        self._layers = tuple(layers or ())
        self._layer_engines: Optional[list[tuple[str, Optional[PolicyEngine]]]] = None
        self._warned: set[str] = set()

    # -- construction helpers -------------------------------------------------------------

    @classmethod
    def load(
        cls,
        files: Optional[Sequence[str]] = None,
        *,
        fragments: Sequence[Fragment] = (),
        blame: Optional[Blame] = None,
        environ: Optional[Mapping[str, str]] = None,
        plugins: bool = False,
    ) -> PolicyEngine:
        """Build an engine from registry files (``files``, else ``WARPOLICY_CAPABILITIES``, else
        the packaged default) plus plugin ``fragments`` the caller collected, e.g.::

            pm = get_plugin_manager()
            PolicyEngine.load(files, fragments=collect_fragments(pm),
                              blame=functools.partial(blame_plugins, pm))

        Raises `RegistryError` (every problem) or `UnreadableSourceError`. ``plugins=True`` is
        refused: the engine does not reach for a plugin manager itself.
        """
        if plugins:
            raise InputError(
                "PolicyEngine.load takes plugin fragments from its caller: pass "
                "fragments=warpolicy.plugins.collect_fragments(pm)"
            )
        env = os.environ if environ is None else environ
        assembly = assemble_registry(files, fragments, blame=blame, environ=env)
        return cls(assembly.checked(), environ=env, layers=list(assembly.layers))

    # -- flags --------------------------------------------------------------------------

    def flag_values(
        self, overrides: Optional[Mapping[str, Union[bool, str]]] = None
    ) -> tuple[FlagValue, ...]:
        """Every flag's value: overrides beat the environment, which beats the default.

        The built-in ``force_coarse`` is always present; an override can switch it on but not
        off while the operator's environment has it on.
        """
        values = dict(self._flag_values)
        for name, value in (overrides or {}).items():
            if name != FORCE_COARSE.name:
                self.registry.flag(name)  # raises UnknownNameError with close matches
            on = parse_bool(value, name)  # bool("0") is True: would switch an opt-in flag on
            if name == FORCE_COARSE.name and values[name].value and not on:
                continue  # the kill switch cannot be narrowed
            values[name] = FlagValue(name, on, "override")
        return tuple(values[n] for n in sorted(values))

    # -- spec algorithms ------------------------------------------------------------------

    def spec(self, name: str) -> SpecAlgorithm:
        """A declared spec algorithm; ``none`` exists even where a registry omits it.

        A registry given with ``--capabilities`` may declare no algorithms at all; the CLI's
        default ``--spec none`` must still work. The implicit ``none`` declares no
        capabilities, so every capability gate treats it conservatively.
        """
        if name == IMPLICIT_SPEC.name and name not in self.registry.spec_algorithms:
            return IMPLICIT_SPEC
        return self.registry.spec(name)

    def spec_names(self) -> list[str]:
        """Every spec algorithm a table covers (the implicit ``none`` included)."""
        return sorted(set(self.registry.spec_algorithms) | {IMPLICIT_SPEC.name})

    # -- the three ways in ----------------------------------------------------------------

    def explain(self, ctx: Context) -> Explanation:
        """Evaluate ``ctx`` and keep everything considered. Raises on unknown names."""
        explanation = self._evaluation(ctx).explain(ctx.backend)
        placement = self.placement(ctx.backend, ctx.mode)
        if placement is not explanation.placement:
            explanation = attrs.evolve(explanation, placement=placement)
        return explanation

    def decision(self, ctx: Context) -> Decision:
        """The policy and the reasons that moved it. Raises on unknown names."""
        return self.explain(ctx).decision

    def decide(self, ctx: Context) -> WarReadDonePolicy:
        """Runtime decision: fails closed to ``NONE`` (coarse) with one warning on any error."""
        try:
            return self.explain(ctx).decision.policy
        except Exception as exc:  # noqa: BLE001 - fail closed on anything
            self._warn_once(f"decide({ctx.backend!r}, {ctx.mode.label!r}, {ctx.spec!r})", exc)
            return NONE

    def compile(
        self,
        backend: str,
        spec: str = "none",
        flags: Optional[Mapping[str, Union[bool, str]]] = None,
        *,
        platform: str = "cuda",
        external_events: bool = True,
        strict: bool = False,
    ) -> CompiledPolicy:
        """Resolve everything but the mode and the runner facts once, for the per-step lookup.

        With ``strict=False`` (the runtime default) any error compiles to all-``NONE`` plus one
        warning; with ``strict=True`` it raises. With layers, a layer that makes one of the
        compiled cells earlier than the layers below it is named in one warning.
        """
        try:
            table = self._compiled_table(backend, spec, flags, platform, external_events)

            def explain_step(mode: ForwardMode, eager: bool, planted: bool) -> Decision:
                return self.decision(
                    Context(
                        backend, mode, spec, flags or {}, platform, external_events, eager, planted
                    )
                )

            placement = {mode: self.placement(backend, mode) for mode in ForwardMode}
            compiled = CompiledPolicy(backend, spec, table, explain_step, placement)
        except Exception as exc:
            if strict:
                raise
            self._warn_once(f"compile({backend!r}, {spec!r})", exc)
            return CompiledPolicy(backend, spec, {m: (NONE,) * 4 for m in ForwardMode})
        self._warn_earlier_layers(backend, spec, flags, platform, external_events, table)
        return compiled

    def table(
        self,
        backends: Optional[Iterable[str]] = None,
        specs: Optional[Iterable[str]] = None,
        modes: Optional[Iterable[Union[str, ForwardMode]]] = None,
        flags: Optional[Mapping[str, Union[bool, str]]] = None,
        **facts: Union[str, bool],
    ) -> list[Decision]:
        """The decision for every (backend, mode, spec) combination, in a stable order.

        One evaluation (and its memo) serves every backend of a (mode, spec), so a table over a
        registry of shared composites costs one visit per backend per column.
        """
        backend_names = list(backends) if backends else self.registry.concrete_backends()
        spec_names = list(specs) if specs else self.spec_names()
        mode_list = [ForwardMode.parse(m) for m in modes] if modes else list(TABLE_MODES)
        for name in backend_names:
            self.registry.backend(name)
        for name in spec_names:
            self.spec(name)
        found: dict[tuple[str, ForwardMode, str], Decision] = {}
        for m in mode_list:
            for s in spec_names:
                evaluation = self._evaluation(  # decisions only: no per-gate checks kept
                    Context("", m, s, flags or {}, **facts),  # type: ignore[arg-type]
                    record_checks=False,
                )
                for b in backend_names:
                    found[(b, m, s)] = evaluation.explain(b).decision
        return [found[(b, m, s)] for b in backend_names for m in mode_list for s in spec_names]

    # -- evaluation ---------------------------------------------------------------------

    def _evaluation(self, ctx: Context, *, record_checks: bool = True) -> _Evaluation:
        flags = self.flag_values(ctx.flags)
        return _Evaluation(self, ctx, self.spec(ctx.spec), flags, record_checks=record_checks)

    def _compiled_table(
        self,
        backend: str,
        spec: str,
        flags: Optional[Mapping[str, Union[bool, str]]],
        platform: str,
        external_events: bool,
    ) -> dict[ForwardMode, tuple[WarReadDonePolicy, ...]]:
        table = {}
        for mode in ForwardMode:
            row = []
            for eager in (False, True):
                for planted in (False, True):
                    ctx = Context(
                        backend, mode, spec, flags or {}, platform, external_events, eager, planted
                    )
                    row.append(self.decision(ctx).policy)
            table[mode] = tuple(row)
        return table

    # -- layers -------------------------------------------------------------------------

    def layer_engines(self) -> list[tuple[str, Optional[PolicyEngine]]]:
        """``(label, engine of layers[0..k])`` per layer; None where that prefix does not load
        on its own (e.g. a fragment that refers to a later layer)."""
        if self._layer_engines is None:
            from warpolicy.errors import WarpolicyError
            from warpolicy.loader import load_registry  # the loader sits below the engine

            out: list[tuple[str, Optional[PolicyEngine]]] = []
            for k, source in enumerate(self._layers):
                try:
                    registry = load_registry(list(self._layers[: k + 1]))
                    out.append((layer_label(source), PolicyEngine(registry, self._environ)))
                except WarpolicyError:
                    out.append((layer_label(source), None))
            self._layer_engines = out
        return self._layer_engines

    def _warn_earlier_layers(
        self,
        backend: str,
        spec: str,
        flags: Optional[Mapping[str, Union[bool, str]]],
        platform: str,
        external_events: bool,
        table: Mapping[ForwardMode, tuple[WarReadDonePolicy, ...]],
    ) -> None:
        """Warn once per layer that makes one of ``table``'s cells earlier than those below."""
        if len(self._layers) < 2:
            return
        try:
            engines = self.layer_engines()
            below: Optional[dict] = None
            for label, engine in engines:
                if engine is None:
                    below = None
                    continue
                try:
                    here = engine._compiled_table(backend, spec, flags, platform, external_events)
                except Exception:  # noqa: BLE001 - the backend may not exist yet below
                    here = None
                if below is not None and here is not None:
                    for mode, row in here.items():
                        for index, (old, new) in enumerate(zip(below[mode], row)):
                            if new < old:
                                facts = (
                                    "captured, not planted",
                                    "captured, planted",
                                    "eager",
                                    "eager",
                                )[index]
                                self._warn_layer(
                                    label,
                                    f"{backend} {mode.label} (spec {spec}, "
                                    f"{facts}): {old.label} -> {new.label}",
                                )
                                break
                        else:
                            continue
                        break
                below = here
        except Exception as exc:  # noqa: BLE001 - a report, never a reason to fail
            self._warn_once("layer report", exc)

    def _warn_layer(self, label: str, cell: str) -> None:
        key = f"layer {label}"
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(
            f"warpolicy: layer {label} makes a cell earlier than the layers below it: "
            f"{cell}; audit it or disable the plugin",
            RuntimeWarning,
            stacklevel=4,
        )

    def placement(self, backend: str, mode: ForwardMode) -> Placement:
        """Where a runner plants the in-graph node for ``backend`` in ``mode``: the first
        ``plant`` declaration along ``inherits``; else a per-mode wrapper's child for that mode;
        else, for a composite, derived only when every child is derived; else marker."""
        mode = ForwardMode.parse(mode)
        memo: dict[str, Placement] = {}
        open_nodes: set[str] = set()
        stack: list[tuple[str, bool]] = [(backend, False)]
        while stack:  # children first, iteratively: composite chains can be thousands deep
            name, expanded = stack.pop()
            if name in memo:
                continue
            entry = self.registry.backend(name)
            declared = next(
                (a.plant[mode] for a in self.registry.lineage(name) if mode in a.plant), None
            )
            delegate = entry.per_mode.get(mode)
            children = (delegate,) if delegate is not None else entry.latest_of
            if declared is not None or not children:
                memo[name] = declared if declared is not None else Placement.MARKER
                continue
            if expanded:
                open_nodes.discard(name)
                every_derived = all(memo[c] is Placement.DERIVED for c in children)
                memo[name] = Placement.DERIVED if every_derived else Placement.MARKER
                continue
            if name in open_nodes:  # the loader rejects cycles; never loop at runtime
                raise InputError(f"cycle through backend {name!r}")
            open_nodes.add(name)
            stack.append((name, True))
            stack.extend((c, False) for c in children if c not in memo)
        return memo[backend]

    def _warn_once(self, where: str, exc: BaseException) -> None:
        key = f"{where}: {type(exc).__name__}: {exc}"
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(f"warpolicy: {key}; using the coarse barrier", RuntimeWarning, stacklevel=3)


class _Evaluation:
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


class CompiledPolicy:
    """Per-step lookup for one (backend, spec, flags, platform).

    ``lookup(mode, eager, planted)`` takes the runner's facts per call (a tuple index);
    ``per_step(eager, planted)`` resolves them once and returns the hot-path callable.
    """

    __slots__ = ("backend", "spec", "_table", "_explain", "_placement")

    def __init__(
        self,
        backend: str,
        spec: str,
        table: Mapping[ForwardMode, tuple[WarReadDonePolicy, ...]],
        explain: Optional[Callable[[ForwardMode, bool, bool], Decision]] = None,
        placement: Optional[Mapping[ForwardMode, Placement]] = None,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self._table = dict(table)  # per mode: index ``eager * 2 + planted``
        self._explain = explain
        self._placement = dict(placement or {})

    def lookup(
        self, mode: ForwardMode, eager: bool = False, planted: bool = True
    ) -> WarReadDonePolicy:
        """The policy for ``mode`` given the runner's facts; ``NONE`` for anything unknown."""
        row = self._table.get(mode)
        if row is None:
            return NONE
        return row[eager * 2 + planted]

    def per_step(
        self, eager: bool = False, planted: bool = True
    ) -> Callable[[ForwardMode], WarReadDonePolicy]:
        """The hot-path callable for a runner whose facts are known: ``fn(mode) -> policy``.

        It is a bound ``dict.__getitem__`` (no Python frame per call); unknown keys give ``NONE``.
        """
        return _ModeTable(
            {m: row[eager * 2 + planted] for m, row in self._table.items()}
        ).__getitem__

    def decision(self, mode: ForwardMode, eager: bool = False, planted: bool = True) -> Decision:
        """The full `Decision` behind a lookup (for observers; not for the per-step path)."""
        mode = ForwardMode.parse(mode)
        if self._explain is not None:
            return self._explain(mode, eager, planted)
        ctx = Context(self.backend, mode, self.spec, eager=eager, planted=planted)
        reason = Reason("compile-failed", "the policy could not be compiled; coarse barrier", NONE)
        return Decision(self.lookup(mode, eager, planted), ctx, (reason,))

    def placement(self, mode: ForwardMode) -> Placement:
        """Where the runner plants the in-graph node in ``mode`` (marker when unknown)."""
        return self._placement.get(ForwardMode.parse(mode), Placement.MARKER)


class _ModeTable(dict):
    """mode -> policy; a missing mode is NONE, so the lookup fails closed."""

    __slots__ = ()

    def __missing__(self, key: object) -> WarReadDonePolicy:
        return NONE


def layer_label(source: object) -> str:
    """How a layer is named in reports: a file's path or a plugin fragment's name."""
    return str(
        getattr(source, "name", None)
        if not isinstance(source, (str, os.PathLike))
        else os.fspath(source)
    )


# -- flags from the environment -----------------------------------------------------------------


def _resolve_flags(registry: Registry, environ: Mapping[str, str]) -> dict[str, FlagValue]:
    """Declared defaults and environment values, plus the built-in kill switch.

    An environment variable that is unset or empty (blanks only) does not count. Of the rest, the
    first name in the flag's ``env`` list wins. ``force_coarse`` is on when any of its names
    (built-in or declared) says so, when one cannot be parsed (fail closed), or when the registry's
    value is on: no variable, layer or plugin can switch it off.
    """
    values = {
        flag.name: _flag_from_env(flag, environ)
        for flag in registry.flags.values()
        if flag.name != FORCE_COARSE.name
    }
    declared = registry.flags.get(FORCE_COARSE.name)
    names = list(FORCE_COARSE.env) + [
        v for v in (declared.env if declared else ()) if v not in FORCE_COARSE.env
    ]
    value = FlagValue(FORCE_COARSE.name, False, "default")
    if declared is not None and declared.default:
        value = FlagValue(FORCE_COARSE.name, True, f"default at {declared.origin}")
    for var in names:
        raw = environ.get(var, "")
        if not raw.strip():
            continue
        try:
            on = parse_bool(raw, var)
        except InputError:
            value = FlagValue(
                FORCE_COARSE.name,
                True,
                f"env {var}={raw!r}, not a boolean: forced on (fail closed)",
            )
            break
        if on:
            value = FlagValue(FORCE_COARSE.name, True, f"env {var}")
            break
    values[FORCE_COARSE.name] = value
    return values


def _flag_from_env(flag: Flag, environ: Mapping[str, str]) -> FlagValue:
    for var in flag.env:  # the first set, non-empty name wins (WARPOLICY_* come first)
        raw = environ.get(var, "")
        if raw.strip():
            return FlagValue(flag.name, parse_bool(raw, var), f"env {var}")
    return FlagValue(flag.name, flag.default, "default")


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
