"""The rule engine: ``policy = max(declared, matching gates)``, with sound demotion built in.

Every rule is a ``max`` over `WarReadDonePolicy` (ordered by lateness), so a decision does not
depend on the order of gates or plugins, and adding a gate can never make it earlier.

Three ways in, one evaluator:

* `PolicyEngine.explain` returns everything that was considered (the explaining API);
* `PolicyEngine.decision` is that minus the explanation: the policy and the reasons that moved it;
* `PolicyEngine.decide` is the runtime call: a bare policy, and ``NONE`` (coarse) plus one warning
  on any error, never an earlier point.

The per-step hot path is `CompiledPolicy.lookup`: a runner resolves backend, spec algorithm, flags
and platform once with `PolicyEngine.compile`, and each step is a tuple index.
"""

from __future__ import annotations

import os
import warnings
from typing import Iterable, Mapping, Optional, Sequence

import attrs

from warpolicy.errors import InputError
from warpolicy.loader import Blame, Fragment, assemble_registry
from warpolicy.policy import TABLE_MODES, ForwardMode, Placement, WarReadDonePolicy
from warpolicy.registry import (Backend, Conditions, Flag, Gate, Origin, Registry,
                                SpecAlgorithm)

NONE = WarReadDonePolicy.NONE
IN_GRAPH = WarReadDonePolicy.IN_GRAPH
POST_REPLAY = WarReadDonePolicy.POST_REPLAY

#: Used when a registry declares no ``none`` algorithm: no capabilities, so gates stay coarse.
IMPLICIT_SPEC = SpecAlgorithm("none", doc="implicit: no speculative decoding, no capabilities "
                              "declared", origin=Origin("built-in (warpolicy.engine)"))

#: The id under which the engine's built-in sound demotion shows in reasons.
SOUND_DEMOTION_ID = "sound-demotion"
DECLARED_ID = "declared"

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_bool(text: str, what: str) -> bool:
    """Parse an operator-supplied boolean (env var or ``--flag NAME=VALUE``)."""
    key = str(text).strip().lower()
    if key in _TRUE:
        return True
    if key in _FALSE:
        return False
    raise InputError(f"{what}={text!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


@attrs.frozen
class Context:
    """Everything a decision depends on besides the registry.

    ``flags`` holds overrides only; the engine fills the rest from declared defaults and the
    environment. Platform facts default to the fast path: CUDA with external events, a captured
    graph with the node planted.
    """

    backend: str
    mode: ForwardMode = attrs.field(converter=ForwardMode.parse)
    spec: str = "none"
    flags: Mapping[str, bool] = attrs.field(factory=dict, converter=lambda m: dict(m or {}))
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
        return {"id": self.id, "message": self.message, "policy": self.policy.label,
                "origin": self.origin}


@attrs.frozen
class Decision:
    """A policy and the reasons that moved it (the declared read end always comes first)."""

    policy: WarReadDonePolicy
    context: Context
    reasons: tuple[Reason, ...] = ()

    def to_json(self) -> dict:
        return {"policy": self.policy.label, "backend": self.context.backend,
                "mode": self.context.mode.label, "spec": self.context.spec,
                "reasons": [r.to_json() for r in self.reasons]}


@attrs.frozen
class GateCheck:
    """How one gate fared against a context, for explanations."""

    gate: Gate
    matched: bool
    why: str  # the first condition that failed, or what held
    raised: bool = False  # matched and later than the declared read end (and any child)


@attrs.frozen
class FlagValue:
    name: str
    value: bool
    source: str  # "default", "env VAR", "override"


@attrs.frozen
class Explanation:
    """Every input the engine considered, for `warpolicy explain`."""

    decision: Decision
    flags: tuple[FlagValue, ...]
    spec: SpecAlgorithm
    declared: WarReadDonePolicy
    chain: tuple[str, ...]  # how the declared read end was found (inheritance / composite)
    gates: tuple[GateCheck, ...]
    children: tuple["Explanation", ...] = ()  # composite / per-mode children, fully explained
    demotion: Optional[Reason] = None

    def to_json(self) -> dict:
        out = self.decision.to_json()
        out.update({
            "declared": self.declared.label,
            "chain": list(self.chain),
            "flags": {f.name: {"value": f.value, "source": f.source} for f in self.flags},
            "spec_family": self.spec.family,
            "spec_capabilities": dict(self.spec.capabilities),
            "platform": {"name": self.decision.context.platform,
                         "external_events": self.decision.context.external_events,
                         "eager": self.decision.context.eager,
                         "planted": self.decision.context.planted},
            "gates": [{"id": c.gate.id, "matched": c.matched, "raised": c.raised,
                       "at_least": c.gate.at_least.label, "why": c.why,
                       "origin": str(c.gate.origin)} for c in self.gates],
            "children": [c.to_json() for c in self.children],
        })
        return out


class PolicyEngine:
    """Decides `WarReadDonePolicy` for contexts against one registry.

    Flags are resolved from declared defaults and the environment once, at construction.
    """

    def __init__(self, registry: Registry, environ: Optional[Mapping[str, str]] = None) -> None:
        self.registry = registry
        self._flag_values = self._resolve_env_flags(
            registry, os.environ if environ is None else environ)
        self._global_gates = tuple(registry.gates)
        self._scoped_gates = self._collect_scoped_gates(registry)
        self._warned: set[str] = set()

    # -- construction helpers -------------------------------------------------------------

    @classmethod
    def load(cls, files: Optional[Sequence[str]] = None, *,
             fragments: Sequence[Fragment] = (), blame: Optional[Blame] = None,
             environ: Optional[Mapping[str, str]] = None,
             plugins: bool = False) -> "PolicyEngine":
        """Build an engine from registry files (``files``, else ``WARPOLICY_CAPABILITIES``, else
        the packaged default) plus plugin ``fragments`` the caller collected, e.g.::

            pm = get_plugin_manager()
            PolicyEngine.load(files, fragments=collect_fragments(pm),
                              blame=functools.partial(blame_plugins, pm))

        Raises `RegistryError` (every problem) or `UnreadableSourceError`. ``plugins=True`` is
        refused: the engine does not reach for a plugin manager itself.
        """
        if plugins:
            raise InputError("PolicyEngine.load takes plugin fragments from its caller: pass "
                             "fragments=warpolicy.plugins.collect_fragments(pm)")
        env = os.environ if environ is None else environ
        assembly = assemble_registry(files, fragments, blame=blame, environ=env)
        return cls(assembly.checked(), environ=env)

    @staticmethod
    def _resolve_env_flags(registry: Registry,
                           environ: Mapping[str, str]) -> dict[str, FlagValue]:
        values: dict[str, FlagValue] = {}
        for flag in registry.flags.values():
            values[flag.name] = _flag_from_env(flag, environ)
        return values

    @staticmethod
    def _collect_scoped_gates(registry: Registry) -> dict[str, tuple[Gate, ...]]:
        """Gates scoped to a backend also apply to backends that inherit from it."""
        scoped: dict[str, tuple[Gate, ...]] = {}
        for name in registry.backends:
            gates: list[Gate] = []
            for ancestor in _inheritance_chain(registry, name):
                gates.extend(registry.backends[ancestor].gates)
            scoped[name] = tuple(gates)
        return scoped

    # -- flags --------------------------------------------------------------------------

    def flag_values(self, overrides: Optional[Mapping[str, bool]] = None) -> tuple[FlagValue, ...]:
        """Every declared flag's value: overrides beat the environment, which beats the default."""
        values = dict(self._flag_values)
        for name, value in (overrides or {}).items():
            self.registry.flag(name)  # raises UnknownNameError with close matches
            if isinstance(value, str):  # bool("0") is True: would switch an opt-in flag on
                value = parse_bool(value, name)
            values[name] = FlagValue(name, bool(value), "override")
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
        flags = self.flag_values(ctx.flags)
        flag_map = {f.name: f.value for f in flags}
        spec = self.spec(ctx.spec)
        return self._evaluate(ctx, spec, flag_map, flags, stack=())

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

    def compile(self, backend: str, spec: str = "none",
                flags: Optional[Mapping[str, bool]] = None, *, platform: str = "cuda",
                external_events: bool = True, strict: bool = False) -> "CompiledPolicy":
        """Resolve everything but the mode and the runner facts once, for the per-step lookup.

        With ``strict=False`` (the runtime default) any error compiles to all-``NONE`` plus one
        warning; with ``strict=True`` it raises.
        """
        try:
            table = {}
            for mode in ForwardMode:
                row = []
                for eager in (False, True):
                    for planted in (False, True):
                        ctx = Context(backend, mode, spec, flags or {}, platform,
                                      external_events, eager, planted)
                        row.append(self.decision(ctx).policy)
                table[mode] = tuple(row)
            def explain_step(mode: ForwardMode, eager: bool, planted: bool) -> Decision:
                return self.decision(Context(backend, mode, spec, flags or {}, platform,
                                             external_events, eager, planted))

            placement = {mode: self.placement(backend, mode) for mode in ForwardMode}
            return CompiledPolicy(backend, spec, table, explain_step, placement)
        except Exception as exc:  # noqa: BLE001
            if strict:
                raise
            self._warn_once(f"compile({backend!r}, {spec!r})", exc)
            return CompiledPolicy(backend, spec, {m: (NONE,) * 4 for m in ForwardMode})

    def table(self, backends: Optional[Iterable[str]] = None,
              specs: Optional[Iterable[str]] = None,
              modes: Optional[Iterable[ForwardMode]] = None,
              flags: Optional[Mapping[str, bool]] = None, **facts) -> list[Decision]:
        """The decision for every (backend, mode, spec) combination, in a stable order."""
        backend_names = list(backends) if backends else self.registry.concrete_backends()
        spec_names = list(specs) if specs else self.spec_names()
        mode_list = [ForwardMode.parse(m) for m in modes] if modes else list(TABLE_MODES)
        for name in backend_names:
            self.registry.backend(name)
        for name in spec_names:
            self.spec(name)
        return [self.decision(Context(b, m, s, flags or {}, **facts))
                for b in backend_names for m in mode_list for s in spec_names]

    # -- evaluation ---------------------------------------------------------------------

    def _evaluate(self, ctx: Context, spec: SpecAlgorithm, flag_map: Mapping[str, bool],
                  flags: tuple[FlagValue, ...], stack: tuple[str, ...]) -> Explanation:
        backend = self.registry.backend(ctx.backend)
        if ctx.backend in stack:  # the loader rejects cycles; never recurse forever at runtime
            raise InputError(f"cycle through backend {ctx.backend!r}")
        stack = stack + (ctx.backend,)
        declared, floor, origin, chain, children = self._declared(
            backend, ctx, spec, flag_map, flags, stack)
        policy = floor
        reasons = [Reason(DECLARED_ID, chain[-1], floor, origin)]
        seen = {DECLARED_ID}
        for child in children:  # what moved a child past the declaration moved this one too
            for reason in child.decision.reasons:
                if reason.id not in seen and reason.policy > declared:
                    seen.add(reason.id)
                    reasons.append(reason)
        checks = []
        lineage = self._lineage(backend.name)
        for gate in self._global_gates + self._scoped_gates[backend.name]:
            matched, why = _gate_matches(gate.when, ctx, spec, flag_map, declared, lineage)
            raised = matched and gate.at_least > floor
            checks.append(GateCheck(gate, matched, why, raised))
            if raised:
                policy = max(policy, gate.at_least)
                reasons.append(Reason(gate.id, gate.because, gate.at_least, str(gate.origin)))
        demotion = _sound_demotion(policy, ctx)
        if demotion is not None:
            policy = max(policy, demotion.policy)
            reasons.append(demotion)
        decision = Decision(policy, ctx, tuple(reasons))
        return Explanation(decision, flags, spec, declared, tuple(chain), tuple(checks),
                           tuple(children), demotion)

    def _declared(self, backend: Backend, ctx: Context, spec: SpecAlgorithm,
                  flag_map: Mapping[str, bool], flags: tuple[FlagValue, ...],
                  stack: tuple[str, ...]):
        """``(declared, floor, origin, chain, children)`` for ``ctx.mode``.

        ``declared`` is the declaration alone, followed through inheritance, composites and
        per-mode wrappers; it is what a gate's ``declared:`` condition tests, and no gate can
        change it (otherwise adding a gate to a child could stop a composite's gate from matching
        and make the composite earlier). ``floor`` is where the decision starts: the declaration
        for a plain backend, and for a wrapper also the latest of its children's full decisions,
        so a wrapper is never earlier than a child.
        """
        mode = ctx.mode
        delegate = backend.per_mode.get(mode)
        if delegate is not None:
            child = self._evaluate(attrs.evolve(ctx, backend=delegate), spec, flag_map, flags,
                                   stack)
            floor = child.decision.policy
            chain = [f"{backend.name} delegates {mode.label} to {delegate}: declared "
                     f"{child.declared.label}, decided {floor.label}"]
            return child.declared, floor, str(backend.origin), chain, [child]
        own, chain, origin = self._own_declaration(backend, mode)
        if not backend.latest_of:
            return own, own, origin, chain, []
        children = [self._evaluate(attrs.evolve(ctx, backend=c), spec, flag_map, flags, stack)
                    for c in backend.latest_of]
        declared = max(c.declared for c in children)
        floor = max(c.decision.policy for c in children)
        named = list(zip(backend.latest_of, children))
        declared_parts = ", ".join(f"{n}={c.declared.label}" for n, c in named)
        decided_parts = ", ".join(f"{n}={c.decision.policy.label}" for n, c in named)
        if origin is not None:  # a composite may also declare a read end of its own
            declared, floor = max(declared, own), max(floor, own)
            declared_parts += f", own={own.label}"
            decided_parts += f", own={own.label}"
        chain.append(f"{backend.name} is the latest of its children: declared {declared.label} "
                     f"({declared_parts}), decided {floor.label} ({decided_parts})")
        return declared, floor, str(backend.origin), chain, children

    def _own_declaration(self, backend: Backend, mode: ForwardMode):
        """Walk ``inherits`` for the first backend declaring ``mode``; undeclared means NONE."""
        chain: list[str] = []
        for name in _inheritance_chain(self.registry, backend.name):
            entry = self.registry.backends[name]
            if mode in entry.reads_end:
                policy = entry.reads_end[mode]
                where = entry.reads_end_origins.get(mode, entry.origin)
                via = "" if name == backend.name else f" (inherited from {name})"
                chain.append(f"{backend.name} declares {mode.label}: {policy.label}{via}")
                return policy, chain, str(where)
        if backend.latest_of:
            return NONE, chain, None
        chain.append(f"{backend.name} does not declare {mode.label}: not audited, none")
        return NONE, chain, str(backend.origin)

    def _lineage(self, name: str) -> frozenset[str]:
        return frozenset(_inheritance_chain(self.registry, name))

    def placement(self, backend: str, mode: ForwardMode) -> Placement:
        """Where a runner plants the in-graph node for ``backend`` in ``mode``: the first
        ``plant`` declaration along ``inherits``; else a per-mode wrapper's child for that mode;
        else, for a composite, derived only when every child is derived; else marker."""
        return self._placement(backend, ForwardMode.parse(mode), ())

    def _placement(self, name: str, mode: ForwardMode, stack: tuple[str, ...]) -> Placement:
        if name in stack:  # the loader rejects cycles; never recurse forever at runtime
            raise InputError(f"cycle through backend {name!r}")
        backend = self.registry.backend(name)
        for ancestor in _inheritance_chain(self.registry, name):
            declared = self.registry.backends[ancestor].plant.get(mode)
            if declared is not None:
                return declared
        stack = stack + (name,)
        delegate = backend.per_mode.get(mode)
        if delegate is not None:
            return self._placement(delegate, mode, stack)
        if backend.latest_of and all(self._placement(c, mode, stack) is Placement.DERIVED
                                     for c in backend.latest_of):
            return Placement.DERIVED
        return Placement.MARKER

    def _warn_once(self, where: str, exc: BaseException) -> None:
        key = f"{where}: {type(exc).__name__}: {exc}"
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(f"warpolicy: {key}; using the coarse barrier", RuntimeWarning,
                      stacklevel=3)


class CompiledPolicy:
    """Per-step lookup for one (backend, spec, flags, platform): a tuple index by mode.

    ``row`` layout per mode: index ``eager * 2 + planted``.
    """

    __slots__ = ("backend", "spec", "_table", "captured", "_explain", "_placement")

    def __init__(self, backend: str, spec: str,
                 table: Mapping[ForwardMode, tuple[WarReadDonePolicy, ...]],
                 explain=None,
                 placement: Optional[Mapping[ForwardMode, Placement]] = None) -> None:
        self.backend = backend
        self.spec = spec
        self._table = dict(table)
        self._explain = explain
        self._placement = dict(placement or {})
        #: the common case (captured graph, node planted), one dict lookup
        self.captured: dict[ForwardMode, WarReadDonePolicy] = {
            m: row[1] for m, row in self._table.items()}

    def lookup(self, mode: ForwardMode, eager: bool = False,
               planted: bool = True) -> WarReadDonePolicy:
        """The policy for ``mode`` given the runner's facts; ``NONE`` for anything unknown."""
        row = self._table.get(mode)
        if row is None:
            return NONE
        return row[eager * 2 + planted]

    __call__ = lookup

    def decision(self, mode: ForwardMode, eager: bool = False, planted: bool = True) -> Decision:
        """The full `Decision` behind a lookup (for observers; not for the per-step path)."""
        mode = ForwardMode.parse(mode)
        if self._explain is not None:
            return self._explain(mode, eager, planted)
        ctx = Context(self.backend, mode, self.spec, eager=eager, planted=planted)
        reason = Reason("compile-failed", "the policy could not be compiled; coarse barrier",
                        NONE)
        return Decision(self.lookup(mode, eager, planted), ctx, (reason,))

    def per_step(self, eager: bool = False, planted: bool = True):
        """The hot-path callable for a runner whose facts are known: ``fn(mode) -> policy``.

        It is a bound ``dict.__getitem__`` (no Python frame per call); unknown keys give ``NONE``.
        """
        return _ModeTable({m: row[eager * 2 + planted] for m, row in self._table.items()}
                          ).__getitem__


    def placement(self, mode: ForwardMode) -> Placement:
        """Where the runner plants the in-graph node in ``mode`` (marker when unknown)."""
        return self._placement.get(ForwardMode.parse(mode), Placement.MARKER)


class _ModeTable(dict):
    """mode -> policy; a missing mode is NONE, so the lookup fails closed."""

    __slots__ = ()

    def __missing__(self, key) -> WarReadDonePolicy:
        return NONE


def _inheritance_chain(registry: Registry, name: str) -> list[str]:
    chain = []
    seen = set()
    while name is not None and name not in seen and name in registry.backends:
        chain.append(name)
        seen.add(name)
        name = registry.backends[name].inherits
    return chain


def _flag_from_env(flag: Flag, environ: Mapping[str, str]) -> FlagValue:
    for var in flag.env:  # the WARPOLICY_* name comes first and wins over aliases
        if var in environ:
            return FlagValue(flag.name, parse_bool(environ[var], var), f"env {var}")
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
    return Reason(SOUND_DEMOTION_ID, f"{why}; demoted to post_replay", POST_REPLAY,
                  "built-in (warpolicy.engine)")


def _gate_matches(when: Conditions, ctx: Context, spec: SpecAlgorithm,
                  flags: Mapping[str, bool], declared: WarReadDonePolicy,
                  lineage: frozenset[str]) -> tuple[bool, str]:
    """Whether every condition of ``when`` holds; ``why`` names the first that does not."""
    if when.mode is not None and ctx.mode not in when.mode:
        return False, f"mode is {ctx.mode.label}, not {_names(when.mode)}"
    if when.backend is not None and not (lineage & when.backend):
        return False, f"backend is {ctx.backend}, not {_names(when.backend)}"
    if when.spec is not None and ctx.spec not in when.spec:
        return False, f"spec is {ctx.spec}, not {_names(when.spec)}"
    if when.spec_family is not None and spec.family not in when.spec_family:
        return False, f"spec family is {spec.family}, not {_names(when.spec_family)}"
    if when.spec_has is not None and not any(spec.has(c) for c in when.spec_has):
        return False, f"{ctx.spec} has none of {_names(when.spec_has)}"
    if when.spec_lacks is not None and all(spec.has(c) for c in when.spec_lacks):
        return False, f"{ctx.spec} has {_names(when.spec_lacks)}"
    for name, want in when.flags.items():
        if flags.get(name) != want:
            return False, f"flag {name} is {str(flags.get(name)).lower()}, not {str(want).lower()}"
    if when.declared is not None and declared not in when.declared:
        return False, f"declared is {declared.label}, not {_names(when.declared)}"
    if when.platform is not None and ctx.platform not in when.platform:
        return False, f"platform is {ctx.platform}, not {_names(when.platform)}"
    for fact in ("eager", "planted", "external_events"):
        want = getattr(when, fact)
        if want is not None and getattr(ctx, fact) != want:
            return False, f"{fact} is {str(getattr(ctx, fact)).lower()}, not {str(want).lower()}"
    return True, "all conditions hold"


def _names(values: Iterable) -> str:
    labels = sorted(getattr(v, "label", v) for v in values)
    return labels[0] if len(labels) == 1 else "any of " + ", ".join(labels)
