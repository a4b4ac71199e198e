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

Over 400 lines: `PolicyEngine` (load, flags, decide/explain/table/compile, the layer
report, placement) is one public class; its records live in `warpolicy.registry.decision` and the
evaluation in `warpolicy.registry.evaluation`.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, Sequence, Union

import attrs

from warpolicy.errors import InputError
from warpolicy.registry.decision import (  # noqa: F401 - the records are re-exported
    BUILT_IN,
    DECLARED_ID,
    FORCE_COARSE,
    FORCE_COARSE_ID,
    IMPLICIT_SPEC,
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
from warpolicy.registry.evaluation import Evaluation
from warpolicy.registry.inputs import parse_bool
from warpolicy.registry.loader import Blame, Fragment, assemble_registry
from warpolicy.registry.model import Backend, Flag, Registry, SpecAlgorithm
from warpolicy.registry.vocabulary import (
    NONE,
    TABLE_MODES,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)

if TYPE_CHECKING:
    from warpolicy.registry.loader import Source

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
                "fragments=warpolicy.runtime.manager.collect_fragments(pm)"
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

    def _evaluation(self, ctx: Context, *, record_checks: bool = True) -> Evaluation:
        flags = self.flag_values(ctx.flags)
        return Evaluation(self, ctx, self.spec(ctx.spec), flags, record_checks=record_checks)

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
            from warpolicy.registry.loader import load_registry  # the loader sits below the engine

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
        """The policy for ``mode`` given the runner's facts; ``NONE`` for anything unknown.
        ``eager`` and ``planted`` must be real booleans (`InputError` otherwise)."""
        row = self._table.get(mode)
        if row is None:
            return NONE
        return row[_fact_index(eager, planted)]

    def per_step(
        self, eager: bool = False, planted: bool = True
    ) -> Callable[[ForwardMode], WarReadDonePolicy]:
        """The hot-path callable for a runner whose facts are known: ``fn(mode) -> policy``.

        It is a bound ``dict.__getitem__`` (no Python frame per call); unknown keys give ``NONE``.
        """
        index = _fact_index(eager, planted)
        return _ModeTable({m: row[index] for m, row in self._table.items()}).__getitem__

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


def _fact_index(eager: object, planted: object) -> int:
    """The table column of the runner's facts; anything but two booleans (``-1``, ``"yes"``,
    ``None``) is refused rather than used as an index."""
    if type(eager) is not bool or type(planted) is not bool:
        raise InputError(f"eager and planted must be booleans, not {eager!r} and {planted!r}")
    return eager * 2 + planted


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
