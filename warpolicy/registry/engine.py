"""The rule engine: ``policy = max(declarations, children, matching gates, built-ins)``.

Every rule is a ``max`` over `WarReadDonePolicy` (ordered by lateness), so a decision does not
depend on the order of gates, layers or plugins, and adding a gate or a declaration can never make
it earlier.

What a backend declares for a mode is the latest of everything it reaches:

* its own ``reads_end`` and that of every backend it ``inherits`` from (a child can make a mode
  later than its base, never earlier);
* the declarations of every backend it runs: its ``latest_of`` children, its ``per_mode``
  delegate for the mode, including those it inherits, and a router's children (the one its
  batch routes to, or all of them) (an undeclared child counts as ``none``).

The decision starts from that and from the full decisions of the children it runs, then takes
the per-batch requirements of its declarations (an ``after`` action that did not succeed), every
matching gate (global ones and those scoped to the backend or an ancestor) and two built-ins no
registry can remove: the operator's kill switch (``force_coarse``, `FORCE_COARSE_ID`) and sound
demotion (`SOUND_DEMOTION_ID`). One evaluation (`warpolicy.registry.evaluation`) memoises each
backend it visits, so a long chain or a wide shared DAG costs one visit per backend.

Three ways in, one evaluator:

* `PolicyEngine.explain` returns everything that was considered (the explaining API), with the
  per-batch cases of the cell (`BatchCase`) when per-batch facts matter;
* `PolicyEngine.decision` is that minus the explanation: the policy and the reasons that moved it;
* `PolicyEngine.decide` is the runtime call: a bare policy, and ``NONE`` (coarse) plus one warning
  on any error, never an earlier point.

The per-step hot path is `CompiledPolicy` (`warpolicy.registry.compiled`): a runner resolves
backend, spec algorithm, flags and platform once with `PolicyEngine.compile`; each step is a dict
or tuple index, plus one classification per per-batch fact the cell reads.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from warpolicy import environment
from warpolicy.errors import InputError, UnknownNameError, WarpolicyError
from warpolicy.registry.compiled import BatchRule, CompiledPolicy
from warpolicy.registry.decision import (
    FORCE_COARSE,
    IMPLICIT_SPEC,
    BatchCase,
    Context,
    Decision,
    Explanation,
    FlagValue,
)
from warpolicy.registry.evaluation import Evaluation
from warpolicy.registry.facts import (
    ABSENT,
    FactClasses,
    check_facts,
    joint_classes,
    registry_fact_classes,
    simplify,
)
from warpolicy.registry.inputs import parse_bool
from warpolicy.registry.loader import (
    Blame,
    Fragment,
    Source,
    assemble_registry,
    load_registry,
)
from warpolicy.registry.model import (
    METADATA,
    Flag,
    Registry,
    SpecAlgorithm,
    declared_tree,
    names_a_class,
)
from warpolicy.registry.vocabulary import (
    NONE,
    TABLE_MODES,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)

__all__ = ["MAX_FACT_CASES", "PolicyEngine", "layer_label"]

#: The most combinations of fact classes one cell enumerates; a cell that reads more facts than
#: that ignores them (its policy for a batch that reports none, the later one) plus a warning.
MAX_FACT_CASES = 4096

#: One cell's enumeration: the classes of the facts it reads, the policy per combination.
_Cells = tuple[list[FactClasses], dict[tuple[int, ...], WarReadDonePolicy]]

#: What `PolicyEngine._compiled` returns: per mode, the policy per ``eager * 2 + planted`` for a
#: batch that reports no facts, and each such cell's batch rule (None: it reads no fact).
_CompiledCells = tuple[
    dict[ForwardMode, tuple[WarReadDonePolicy, ...]],
    dict[ForwardMode, tuple[BatchRule | None, ...]],
]

#: How a report names the cell at index ``eager * 2 + planted`` of a row.
_RUNNER_CELLS = ("captured, not planted", "captured, planted", "eager", "eager")


class PolicyEngine:
    """Decides `WarReadDonePolicy` for contexts against one registry.

    Flags are resolved from declared defaults and the environment once, at construction.
    ``layers`` (optional) are the sources the registry was built from, in order; with more than
    one, `compile` warns once when a layer makes a compiled cell earlier than the layers below it.
    """

    def __init__(
        self,
        registry: Registry,
        environ: Mapping[str, str] | None = None,
        *,
        layers: Sequence[Source] | None = None,
    ) -> None:
        self.registry = registry
        env = environment.PROCESS if environ is None else environ
        self._environ: Mapping[str, str] = dict(env)
        self._flag_values = _resolve_flags(registry, env)
        self._fact_classes = registry_fact_classes(registry)
        self._layers = tuple(layers or ())
        self._layer_engines: list[tuple[str, PolicyEngine | None]] | None = None
        self._warned: set[str] = set()

    # -- construction helpers -------------------------------------------------------------

    @classmethod
    def load(
        cls,
        files: Sequence[str] | None = None,
        *,
        fragments: Sequence[Fragment] = (),
        blame: Blame | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> PolicyEngine:
        """Build an engine from registry files (``files``, else ``WARPOLICY_CAPABILITIES``, else
        the packaged default) plus plugin ``fragments`` the caller collected, e.g.::

            pm = get_plugin_manager()
            PolicyEngine.load(files, fragments=collect_fragments(pm),
                              blame=functools.partial(blame_plugins, pm))

        Raises `RegistryError` (every problem) or `UnreadableSourceError`. The engine never
        reaches for a plugin manager itself: plugins' fragments come from the caller.
        """
        env = environment.PROCESS if environ is None else environ
        assembly = assemble_registry(files, fragments, blame=blame, environ=env)
        return cls(assembly.checked(), environ=env, layers=list(assembly.layers))

    # -- flags --------------------------------------------------------------------------

    def flag_values(
        self, overrides: Mapping[str, bool | str] | None = None
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
        implicit = IMPLICIT_SPEC.name not in self.registry.spec_algorithms
        if implicit and self._spec_name(name) == IMPLICIT_SPEC.name:
            return IMPLICIT_SPEC
        return self.registry.spec(name)

    def _spec_name(self, name: str) -> str:
        """The registry's spelling of a spec algorithm, matched ignoring case; the implicit
        ``none`` where the registry omits it; ``name`` itself when unknown (`spec` raises)."""
        try:
            return self.registry.spec_name(name)
        except UnknownNameError:
            folded = str(name).strip().casefold()
            return IMPLICIT_SPEC.name if folded == IMPLICIT_SPEC.name else name

    def _named(self, ctx: Context) -> Context:
        """``ctx`` with the registry's spelling of its backend and spec algorithm (names are
        matched ignoring case, as ``--platform`` is); unknown names raise `UnknownNameError`."""
        backend = self.registry.backend_name(ctx.backend)
        spec = self._spec_name(ctx.spec)
        if (backend, spec) == (ctx.backend, ctx.spec):
            return ctx
        return attrs.evolve(ctx, backend=backend, spec=spec)

    def spec_names(self) -> list[str]:
        """Every spec algorithm a table covers (the implicit ``none`` included)."""
        return sorted(set(self.registry.spec_algorithms) | {IMPLICIT_SPEC.name})

    # -- the three ways in ----------------------------------------------------------------

    def explain(self, ctx: Context) -> Explanation:
        """Evaluate ``ctx`` and keep everything considered, with the cell's per-batch cases
        (how the policy varies with the facts ``ctx`` leaves unreported). Raises on unknown
        names and on per-batch facts the registry does not declare or of the wrong type."""
        ctx = self._named(ctx)
        evaluation = self._evaluation(ctx)
        explanation = evaluation.explain(ctx.backend)
        cases = self._cases(ctx, evaluation.facts_read[ctx.backend], {})
        if cases:
            decision = attrs.evolve(explanation.decision, cases=cases)
            explanation = attrs.evolve(explanation, decision=decision)
        placement = self.placement(ctx.backend, ctx.mode)
        if placement is not explanation.placement:
            explanation = attrs.evolve(explanation, placement=placement)
        classes = self.class_decisions(ctx)
        if classes:
            explanation = attrs.evolve(explanation, classes=tuple(classes.items()))
        return explanation

    def decision(self, ctx: Context) -> Decision:
        """The policy and the reasons that moved it (no per-batch cases; `explain` and `table`
        add them). Raises on unknown names."""
        ctx = self._named(ctx)
        return self._evaluation(ctx).explain(ctx.backend).decision

    def decide(self, ctx: Context) -> WarReadDonePolicy:
        """Runtime decision: fails closed to ``NONE`` (coarse) with one warning on any error."""
        try:
            return self.decision(ctx).policy
        except Exception as exc:  # noqa: BLE001 - fail closed on anything
            self._warn_once(
                _failed(f"decide({ctx.backend!r}, {ctx.mode.label!r}, {ctx.spec!r})", exc)
            )
            return NONE

    def cases(self, ctx: Context) -> tuple[BatchCase, ...]:
        """How the policy of ``ctx``'s cell varies with the per-batch facts ``ctx`` leaves
        unreported: one `BatchCase` per combination of fact classes, merged where a fact does
        not matter; empty when the cell reads no such fact. Raises like `decision`."""
        ctx = self._named(ctx)
        evaluation = self._evaluation(ctx)
        evaluation.explain(ctx.backend)
        return self._cases(ctx, evaluation.facts_read[ctx.backend], {})

    # -- buffer classes ---------------------------------------------------------------------

    def classes(self, backend: str, mode: ForwardMode | None = None) -> tuple[str, ...]:
        """The buffer classes ``backend`` declares anything for (its own, inherited and its
        children's declarations; in ``mode``, or in any mode), ``metadata`` first; empty when
        none of them names a class (a one-policy registry: the cell is all there is)."""
        modes = [mode] if mode is not None else list(ForwardMode)
        memo: dict = {}
        named: set[str] = set()
        classed = False
        for m in modes:
            tree = declared_tree(self.registry, backend, m, memo)
            named |= set(tree)
            classed = classed or names_a_class(self.registry, backend, m)
        if not classed:
            return ()
        return tuple(sorted(named, key=lambda c: (c != METADATA, c)))

    def class_decisions(self, ctx: Context) -> dict[str, Decision]:
        """Per buffer class the cell's backend declares (`classes`), where that class's reads
        end: each no later than the cell, a class nobody in its tree declares none. Raises like
        `decision`."""
        return {
            name: self._evaluation(ctx, buffer_class=name).explain(ctx.backend).decision
            for name in self.classes(ctx.backend, ctx.mode)
        }

    def class_table(
        self,
        decisions: Sequence[Decision],
        flags: Mapping[str, bool | str] | None = None,
        *,
        batch_facts: Mapping[str, object] | None = None,
        **facts: str | bool,
    ) -> dict[tuple[str, ForwardMode, str], dict[str, WarReadDonePolicy]]:
        """For the rows of a `table` (same flags and facts) whose backend declares buffer
        classes, where each class's reads end (`classes`); other rows are left out."""
        out: dict[tuple[str, ForwardMode, str], dict[str, WarReadDonePolicy]] = {}
        rows = [
            (d.context.backend, d.context.mode, d.context.spec, self.classes(d.context.backend))
            for d in decisions
        ]
        for name in sorted({c for *_key, classes in rows for c in classes}):
            backends = sorted({b for b, _m, _s, classes in rows if name in classes})
            specs = sorted({s for _b, _m, s, classes in rows if name in classes})
            modes = sorted(
                {m for _b, m, _s, classes in rows if name in classes}, key=list(ForwardMode).index
            )
            found = self.table(
                backends,
                specs,
                modes,
                flags,
                batch_facts=batch_facts,
                cases=False,
                buffer_class=name,
                **facts,
            )
            for d in found:
                key = (d.context.backend, d.context.mode, d.context.spec)
                out.setdefault(key, {})[name] = d.policy
        return out

    def decide_class(self, ctx: Context, buffer_class: str) -> WarReadDonePolicy:
        """Runtime decision for one buffer class: fails closed to ``NONE`` (coarse) with one
        warning on any error, an unknown class included."""
        try:
            if buffer_class not in self.registry.buffer_classes:
                raise UnknownNameError("buffer class", buffer_class, self.registry.buffer_classes)
            return (
                self._evaluation(ctx, buffer_class=buffer_class)
                .explain(ctx.backend)
                .decision.policy
            )
        except Exception as exc:  # noqa: BLE001 - fail closed on anything
            self._warn_once(_failed(f"decide_class({ctx.backend!r}, {buffer_class!r})", exc))
            return NONE

    def compile_classes(
        self,
        backend: str,
        spec: str = "none",
        flags: Mapping[str, bool | str] | None = None,
        *,
        platform: str = "cuda",
        external_events: bool = True,
    ) -> dict[str, ClassPolicy]:
        """Per buffer class ``backend`` declares (`classes`), a ``(mode, eager, planted)``
        policy callable for a runner's ``class_policies``: resolved now for every mode, for a
        batch that reports no per-batch fact (fail closed: a class never releases earlier than
        such a batch's cell). Empty for a backend that names no class; any error: every class
        ``none`` (one warning)."""
        out: dict[str, ClassPolicy] = {}
        for name in self.classes(backend):
            table: dict[tuple[ForwardMode, bool, bool], WarReadDonePolicy] = {}
            for mode in ForwardMode:
                for eager, planted in ((False, True), (False, False), (True, False)):
                    ctx = Context(
                        backend, mode, spec, flags or {}, platform, external_events, eager, planted
                    )
                    table[(mode, eager, planted)] = self.decide_class(ctx, name)
            out[name] = _class_lookup(name, table)
        return out

    def rule_facts(self, ctx: Context) -> frozenset[str]:
        """The per-batch facts the compiled rule of ``ctx``'s cell reads (`compile`): what a
        runner measures, or asks the model or an action for, on every batch of that cell, as
        it does whether or not they change the policy; empty when the cell reads none, or more
        than `MAX_FACT_CASES` combinations of classes (then it has no rule). ``ctx.facts`` is
        ignored (a runner resolves the rule for a batch that reports nothing)."""
        bare = attrs.evolve(ctx, facts={})
        evaluation = self._evaluation(bare, record_checks=False)
        evaluation.explain(ctx.backend)
        read = evaluation.facts_read[ctx.backend]
        cells = self._enumerate(bare, read, {}) if read else None
        return frozenset() if cells is None else frozenset(c.fact.name for c in cells[0])

    def facts(self) -> Mapping[str, FactClasses]:
        """Every declared per-batch fact with the classes the registry's tests split it into."""
        return dict(self._fact_classes)

    def compile(
        self,
        backend: str,
        spec: str = "none",
        flags: Mapping[str, bool | str] | None = None,
        *,
        platform: str = "cuda",
        external_events: bool = True,
        strict: bool = False,
    ) -> CompiledPolicy:
        """Resolve everything but the mode, the runner facts and the per-batch facts once, for
        the per-step lookup; a cell whose decision reads per-batch facts gets a `BatchRule`.

        With ``strict=False`` (the runtime default) any error compiles to all-``NONE`` plus one
        warning; with ``strict=True`` it raises. With layers, a layer that makes one of the
        compiled cells earlier than the layers below it is named in one warning.
        """
        try:
            backend = self.registry.backend_name(backend)
            spec = self._spec_name(spec)
            table, rules = self._compiled(backend, spec, flags, platform, external_events)
            declared = self.registry.facts

            def explain_step(
                mode: ForwardMode,
                eager: bool,
                planted: bool,
                facts: Mapping[str, object] | None = None,
            ) -> Decision:
                known = {  # as the lookup reads them: anything else is unknown
                    k: v for k, v in (facts or {}).items() if k in declared and declared[k].valid(v)
                }
                ctx = Context(
                    backend, mode, spec, flags or {}, platform, external_events, eager, planted
                )
                return self.decision(attrs.evolve(ctx, facts=known))

            placement = {mode: self.placement(backend, mode) for mode in ForwardMode}
            compiled = CompiledPolicy(backend, spec, table, explain_step, placement, rules)
        except Exception as exc:
            if strict:
                raise
            self._warn_once(_failed(f"compile({backend!r}, {spec!r})", exc))
            return CompiledPolicy(backend, spec, {m: (NONE,) * 4 for m in ForwardMode})
        self._warn_earlier_layers(backend, spec, flags, platform, external_events)
        return compiled

    def table(
        self,
        backends: Iterable[str] | None = None,
        specs: Iterable[str] | None = None,
        modes: Iterable[str | ForwardMode] | None = None,
        flags: Mapping[str, bool | str] | None = None,
        *,
        batch_facts: Mapping[str, object] | None = None,
        cases: bool = True,
        buffer_class: str | None = None,
        **facts: str | bool,
    ) -> list[Decision]:
        """The decision for every (backend, mode, spec) combination, in a stable order.

        ``facts`` are runner facts (``platform``, ``external_events``, ``eager``,
        ``planted``); ``batch_facts`` the per-batch facts of one batch (name -> value, checked
        like `Context.facts`; a fact left out is not reported). A cell whose policy reads
        per-batch facts not given carries its `BatchCase` rows (``Decision.cases``: a
        condition on the cell; ``cases=False`` skips enumerating them); its ``policy`` is the
        one for the batch given, every other fact unreported. One evaluation (and its memo)
        serves every backend of a (mode, spec), and of each combination of fact classes, so a
        table over a registry of shared composites costs one visit per backend per column.
        ``buffer_class``: where that class's reads end instead of the cell's (`classes`).
        """
        backend_names = (
            [self.registry.backend_name(b) for b in backends]
            if backends
            else self.registry.concrete_backends()
        )
        spec_names = [self._spec_name(s) for s in specs] if specs else self.spec_names()
        mode_list = [ForwardMode.parse(m) for m in modes] if modes else list(TABLE_MODES)
        for name in spec_names:
            self.spec(name)
        found: dict[tuple[str, ForwardMode, str], Decision] = {}
        for m in mode_list:
            for s in spec_names:
                ctx = Context(
                    "",
                    m,
                    s,
                    flags or {},
                    **facts,  # type: ignore[arg-type]
                    facts=batch_facts or {},
                )
                evaluation = self._evaluation(  # decisions only
                    ctx, record_checks=False, buffer_class=buffer_class
                )
                shared: dict[tuple, Evaluation] = {}
                for b in backend_names:
                    decision = evaluation.explain(b).decision
                    read = evaluation.facts_read[b]
                    if read and cases:
                        rows = self._cases(attrs.evolve(ctx, backend=b), read, shared, buffer_class)
                        decision = attrs.evolve(decision, cases=rows)
                    found[(b, m, s)] = decision
        return [found[(b, m, s)] for b in backend_names for m in mode_list for s in spec_names]

    # -- evaluation ---------------------------------------------------------------------

    def _evaluation(
        self, ctx: Context, *, record_checks: bool = True, buffer_class: str | None = None
    ) -> Evaluation:
        check_facts(self.registry.facts, ctx.facts)
        flags = self.flag_values(ctx.flags)
        return Evaluation(
            self.registry,
            ctx,
            self.spec(ctx.spec),
            flags,
            record_checks=record_checks,
            buffer_class=buffer_class,
        )

    def _enumerate(
        self,
        ctx: Context,
        read: Iterable[str],
        shared: dict[tuple, Evaluation],
        buffer_class: str | None = None,
    ) -> _Cells | None:
        """The policy of ``ctx``'s cell for one value per class of every per-batch fact it
        reads (``ctx.facts`` held), until the facts read stop growing; None past
        `MAX_FACT_CASES`. ``shared`` caches evaluations per combination across the backends of
        a table column."""
        names = sorted(set(read) - set(ctx.facts))
        while True:
            classes = [self._fact_classes[n] for n in names]
            sizes = [len(c.labels) for c in classes]
            count = 1
            for size in sizes:
                count *= size
            if count > MAX_FACT_CASES:
                return None
            table: dict[tuple[int, ...], WarReadDonePolicy] = {}
            grown: set[str] = set()
            for key in itertools.product(*(range(size) for size in sizes)):
                given = dict(ctx.facts)
                for c, i in zip(classes, key):
                    if c.probes[i] is not ABSENT:
                        given[c.fact.name] = c.probes[i]
                cache_key = (tuple(sorted(given.items())),)
                evaluation = shared.get(cache_key)
                if evaluation is None:
                    probe = attrs.evolve(ctx, facts=given)
                    evaluation = shared[cache_key] = self._evaluation(
                        probe, record_checks=False, buffer_class=buffer_class
                    )
                table[key] = evaluation.explain(ctx.backend).decision.policy
                grown |= evaluation.facts_read[ctx.backend]
            more = sorted((set(names) | grown) - set(ctx.facts))
            if more == names:
                return classes, table
            names = more

    def _cases(
        self,
        ctx: Context,
        read: Iterable[str],
        shared: dict[tuple, Evaluation],
        buffer_class: str | None = None,
    ) -> tuple[BatchCase, ...]:
        cells = self._enumerate(ctx, read, shared, buffer_class) if read else None
        return () if cells is None else _batch_cases(*cells)

    def _compiled(
        self,
        backend: str,
        spec: str,
        flags: Mapping[str, bool | str] | None,
        platform: str,
        external_events: bool,
    ) -> _CompiledCells:
        """Per mode, the policy per ``eager * 2 + planted`` for a batch that reports no facts,
        and the batch rule of each such cell that reads per-batch facts (else None)."""
        table = {}
        rules = {}
        for mode in ForwardMode:
            row = []
            row_rules: list[BatchRule | None] = []
            for eager in (False, True):
                for planted in (False, True):
                    ctx = Context(
                        backend, mode, spec, flags or {}, platform, external_events, eager, planted
                    )
                    evaluation = self._evaluation(ctx, record_checks=False)
                    row.append(evaluation.explain(backend).decision.policy)
                    read = evaluation.facts_read[backend]
                    cells = self._enumerate(ctx, read, {}) if read else None
                    if read and cells is None:
                        self._warn_once(
                            _failed(
                                f"compile({backend!r}, {spec!r}) {mode.label}",
                                InputError(
                                    f"the cell reads more per-batch facts than {MAX_FACT_CASES} "
                                    "combinations of their classes; it ignores them"
                                ),
                            )
                        )
                    row_rules.append(
                        None if cells is None else BatchRule(*cells, _batch_cases(*cells))
                    )
            table[mode] = tuple(row)
            rules[mode] = tuple(row_rules)
        return table, rules

    # -- layers -------------------------------------------------------------------------

    def layer_engines(self) -> list[tuple[str, PolicyEngine | None]]:
        """``(label, engine of layers[0..k])`` per layer; None where that prefix does not load
        on its own (e.g. a fragment that refers to a later layer)."""
        if self._layer_engines is None:
            out: list[tuple[str, PolicyEngine | None]] = []
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
        flags: Mapping[str, bool | str] | None,
        platform: str,
        external_events: bool,
    ) -> None:
        """Warn once per layer that makes one of ``backend``'s cells earlier than the layers
        below it, for a batch of any class (`_earlier_cell`)."""
        if len(self._layers) < 2:
            return
        try:
            below: _CompiledCells | None = None
            for label, engine in self.layer_engines():
                here: _CompiledCells | None = None
                if engine is not None:
                    try:
                        here = engine._compiled(backend, spec, flags, platform, external_events)
                    except Exception:  # noqa: BLE001 - the backend may not exist yet below
                        here = None
                if below is not None and here is not None:
                    cell = _earlier_cell(below, here, spec)
                    if cell is not None:
                        self._warn_once(
                            f"layer {label}",
                            f"layer {label} makes a cell earlier than the layers below it: "
                            f"{backend} {cell}; audit it or disable the plugin",
                            stacklevel=4,
                        )
                below = here
        except Exception as exc:  # noqa: BLE001 - a report, never a reason to fail
            self._warn_once(_failed("layer report", exc))

    def placement(self, backend: str, mode: ForwardMode) -> Placement:
        """Where a runner plants the in-graph node for ``backend`` in ``mode``: the first
        ``plant`` declaration along ``inherits``; else a per-mode wrapper's child for that mode;
        else, for a composite (or a router, over the children it may run in the mode), derived
        only when every child is derived; else marker."""
        mode = ForwardMode.parse(mode)
        backend = self.registry.backend_name(backend)
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
            route = entry.routes
            if route is not None:  # a router is a composite of the children it may run
                if route.routed(mode):
                    children = tuple(route.children.values())
                elif route.default is not None:
                    children = (route.children[route.default],)
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

    def _warn_once(self, key: str, message: str | None = None, stacklevel: int = 3) -> None:
        """The engine's one warn-once helper: warn ``warpolicy: <message>`` (default: ``<key>;
        using the coarse barrier``) the first time ``key`` occurs."""
        if key in self._warned:
            return
        self._warned.add(key)
        text = message if message is not None else f"{key}; using the coarse barrier"
        warnings.warn(f"warpolicy: {text}", RuntimeWarning, stacklevel=stacklevel)


def _failed(where: str, exc: BaseException) -> str:
    """The key (and message) of a failure absorbed by the coarse barrier."""
    return f"{where}: {type(exc).__name__}: {exc}"


def _batch_cases(
    classes: Sequence[FactClasses], table: Mapping[tuple[int, ...], WarReadDonePolicy]
) -> tuple[BatchCase, ...]:
    """The enumerated cell as `BatchCase` rows (`simplify`); none when no fact matters."""
    merged = simplify(list(table.items()), [len(c.labels) for c in classes])
    if len(merged) == 1:  # the facts were read but do not matter
        return ()
    return tuple(
        BatchCase(
            policy,
            tuple(classes[i].labels[k] for i, k in enumerate(key) if k is not None),
        )
        for key, policy in merged
    )


def _earlier_cell(below: _CompiledCells, here: _CompiledCells, spec: str) -> str | None:
    """The first cell ``here`` makes earlier than ``below`` for some batch, as a report names
    it, or None. Each cell is compared for one batch per class of the union of both sides'
    classes of the facts their rules read (`joint_classes`), so no class of batch is missed;
    past `MAX_FACT_CASES` combinations, by the earliest policy each side can publish."""
    (old_table, old_rules), (new_table, new_rules) = below, here
    for mode, row in new_table.items():
        for index, new_default in enumerate(row):
            old_rule, new_rule = old_rules[mode][index], new_rules[mode][index]
            old_default = old_table[mode][index]
            for batch, labels in _joint_batches([r for r in (old_rule, new_rule) if r is not None]):
                if batch is None:  # too many classes to enumerate
                    old = old_default if old_rule is None else old_rule.earliest
                    new = new_default if new_rule is None else new_rule.earliest
                else:
                    old = old_default if old_rule is None else old_rule(batch)
                    new = new_default if new_rule is None else new_rule(batch)
                if new < old:
                    batch_text = f"; batch: {', '.join(labels)}" if labels else ""
                    return (
                        f"{mode.label} (spec {spec}, {_RUNNER_CELLS[index]}{batch_text}): "
                        f"{old.label} -> {new.label}"
                    )
    return None


def _joint_batches(
    rules: Sequence[BatchRule],
) -> Iterable[tuple[dict[str, object] | None, tuple[str, ...]]]:
    """One batch (its facts, the labels of their classes) per combination of the joint classes
    of every fact ``rules`` read; a single None batch past `MAX_FACT_CASES` combinations."""
    names = sorted({name for rule in rules for name in rule.facts})
    joint = [
        joint_classes(name, [c for rule in rules for c in rule.classes if c.fact.name == name])
        for name in names
    ]
    count = 1
    for classes in joint:
        count *= len(classes)
    if count > MAX_FACT_CASES:
        yield None, (f"more than {MAX_FACT_CASES} classes of batch: the earliest of each",)
        return
    for combination in itertools.product(*joint):
        batch = {n: value for n, (_, value) in zip(names, combination) if value is not ABSENT}
        yield batch, tuple(label for label, _ in combination)


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
    # the built-in names are never inverted, whatever a layer or plugin declares (the loader
    # refuses that too; this holds for a registry built without it)
    inverted = (declared.inverted if declared is not None else frozenset()) - set(FORCE_COARSE.env)
    for var in names:
        raw = environment.lookup(var, environ)
        if not raw.strip():
            continue
        try:
            on = parse_bool(raw, var) != (var in inverted)
        except InputError:
            value = FlagValue(
                FORCE_COARSE.name,
                True,
                f"env {var}={raw!r}, not a boolean: forced on (fail closed)",
            )
            break
        if on:
            value = FlagValue(FORCE_COARSE.name, True, f"env {var}" + _inverted(var, inverted))
            break
    values[FORCE_COARSE.name] = value
    return values


def _flag_from_env(flag: Flag, environ: Mapping[str, str]) -> FlagValue:
    """The first set, non-empty name wins (WARPOLICY_* come first); an inverted alias sets the
    flag to the opposite of its value."""
    for var in flag.env:
        raw = environment.lookup(var, environ)
        if raw.strip():
            on = parse_bool(raw, var) != (var in flag.inverted)
            return FlagValue(flag.name, on, f"env {var}" + _inverted(var, flag.inverted))
    return FlagValue(flag.name, flag.default, "default")


def _inverted(var: str, inverted: frozenset[str]) -> str:
    return " (inverted: its true means false)" if var in inverted else ""


#: ``(mode, eager, planted) -> policy``: one buffer class's runner policy (`compile_classes`).
ClassPolicy = Callable[[ForwardMode, bool, bool], WarReadDonePolicy]


def _class_lookup(
    name: str, table: Mapping[tuple[ForwardMode, bool, bool], WarReadDonePolicy]
) -> ClassPolicy:
    """A class's resolved table as a policy callable (a fact set it was not resolved for:
    none)."""

    def lookup(mode: ForwardMode, eager: bool = False, planted: bool = True) -> WarReadDonePolicy:
        return table.get((mode, bool(eager), bool(planted)), NONE)

    lookup.__name__ = f"class_{name}"
    return lookup
