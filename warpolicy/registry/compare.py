"""Registries compared cell by cell: `diff`, the layer report and the pre-commit diff.

The review gates rely on one promise: **every change that can make a release earlier shows as
an ``earlier`` (or ``moved``) cell** (or a `FlagChange`). How each field of the registry model
reaches a comparison is declared in `FIELD_COVERAGE`, and a test fails for a field that is not
listed there. What is enumerated per cell is `warpolicy.registry.cells`.

Cost is proportional to what changed: only backends whose own entry, or an entry they reach
through ``inherits`` / ``latest_of`` / ``per_mode``, differs are evaluated (every backend when a
global gate, a flag or a per-batch fact's declaration changes; every backend of a spec column
when that algorithm changes).
Backends and spec algorithms present on one side only are ``added`` / ``removed``; their cells
are evaluated only as far as a report lists them (``expand``).

Every cell is compared for every class of batch: each per-batch fact a column's decisions may
read is enumerated by class in the union of both registries, *not reported* included
(`warpolicy.registry.cells`), so a raised threshold, an added action test or a router's pinned
child shows as an ``earlier`` cell whose ``when`` names the batches (``6 <= n <= 10``). A column
with more combinations of classes than `warpolicy.registry.cells.MAX_BATCH_SETTINGS` is not
compared: `Diff.uncompared` names it and the diff needs an audit (fails closed).

Besides the mode cells: every speculative algorithm gets a ``step`` cell per compared backend
(the phase whose event a speculative step of target verify then draft extend hands the
scheduler, and its policy, as `warpolicy.runtime.runners.SpecStep` releases), compared for every
setting and class of batch whenever anything that can move either phase changed (its
``last_reader``, either phase's decision, whether a later phase reads ``nothing``, whether
verify's cell reads the staging action); an
``in_graph`` cell whose node placement (``plant``) changed is ``moved``; a flag whose
environment names changed while a gate tests it is a `FlagChange`. Engines are built without
the environment, so an operator's variables never mask a change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from warpolicy.errors import WarpolicyError
from warpolicy.registry.cells import (
    MAX_SETTINGS,
    CellSpace,
    Column,
    Setting,
    all_gates,
    cell_space,
    live_in,
    reach,
    summarize,
)
from warpolicy.registry.decision import FORCE_COARSE, IMPLICIT_SPEC, Context, Decision
from warpolicy.registry.engine import PolicyEngine, layer_label
from warpolicy.registry.facts import ABSENT as NOT_REPORTED
from warpolicy.registry.loader import Source, load_registry
from warpolicy.registry.model import Flag, Gate, Registry, SpecAlgorithm
from warpolicy.registry.vocabulary import (
    DRAFT_EXTEND_STAGED,
    IN_GRAPH,
    NONE,
    NOTHING,
    PRE_REPLAY,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)

ABSENT = "absent"
#: The pseudo-mode of a speculative step's release (see `step cells` in the module docstring).
STEP = "step"

#: Change kinds, in report order; `NEEDS_AUDIT` fail ``--fail-on earlier`` and the hooks.
CHANGES = ("earlier", "moved", "later", "removed", "added")
NEEDS_AUDIT = frozenset({"earlier", "moved"})

# -- what a comparison sees of each field of the registry model ------------------------------

IDENTITY = "identity: a name on one side only is added or removed"
CELLS = "cells: compared through every decision it feeds"
DEFAULTS = "cells: enumerated both ways, and at each side's own default where the defaults differ"
ENV = "flag changes: new, dropped or reordered environment names of a flag a gate tests"
STEP_CELLS = (
    "step cells: the phase whose event a speculative step hands the scheduler, compared with "
    "every decision it feeds"
)
PLACEMENT = "moved cells: where an in_graph node is planted"
LISTING = "listing only: every backend is compared, abstract ones included"
CONTAINER = "entries compared by name, each through its own fields (missing: added or removed)"
COSMETIC = "no effect on any release: documentation or provenance"
PER_BATCH = (
    "per-batch cells: every cell compared for every class of batch (each class of each "
    "per-batch fact in either registry, and not reported)"
)
FACT_TYPE = (
    "per-batch cells: a fact's type decides its classes; a type change that still validates "
    "(bool <-> action, tested only for false) keeps every test's meaning, so no release moves "
    "by it alone"
)

#: How a comparison sees every field of every model class (``Class.field``). A field missing
#: here fails ``tests/registry/test_compare_fields.py``; until it is listed it counts as
#: semantic (a change to it marks the entry changed), so a new field errs on the safe side.
FIELD_COVERAGE: Mapping[str, str] = {
    "Origin.file": COSMETIC,
    "Origin.line": COSMETIC,
    "Origin.col": COSMETIC,
    "Flag.name": IDENTITY,
    "Flag.default": DEFAULTS,
    "Flag.env": ENV,
    "Flag.inverted": ENV,
    "Flag.doc": COSMETIC,
    "Flag.origin": COSMETIC,
    "SpecAlgorithm.name": IDENTITY,
    "SpecAlgorithm.family": CELLS,
    "SpecAlgorithm.capabilities": CELLS,
    "SpecAlgorithm.doc": COSMETIC,
    "SpecAlgorithm.origin": COSMETIC,
    "SpecAlgorithm.last_reader": STEP_CELLS,
    # spec_has holds for a capability after an action whatever the batch reports
    "SpecAlgorithm.capabilities_after": CELLS,
    "Fact.name": IDENTITY,
    "Fact.type": FACT_TYPE,
    "Fact.doc": COSMETIC,
    "Fact.values": PER_BATCH,
    "Fact.origin": COSMETIC,
    "FactTest.equals": PER_BATCH,
    "FactTest.compare": PER_BATCH,
    "FactTest.names": PER_BATCH,
    "Conditions.mode": CELLS,
    "Conditions.backend": CELLS,
    "Conditions.spec": CELLS,
    "Conditions.spec_family": CELLS,
    "Conditions.spec_has": CELLS,
    "Conditions.spec_lacks": CELLS,
    "Conditions.flags": CELLS,
    "Conditions.declared": CELLS,
    "Conditions.platform": CELLS,
    "Conditions.eager": CELLS,
    "Conditions.planted": CELLS,
    "Conditions.external_events": CELLS,
    "Conditions.facts": PER_BATCH,
    "Gate.id": COSMETIC,  # a reason's name; the gate itself is compared by what it does
    "Gate.when": CELLS,
    "Gate.at_least": CELLS,
    "Gate.because": COSMETIC,
    "Gate.origin": COSMETIC,
    "Gate.scope": CELLS,
    "Gate.doc": COSMETIC,
    "Backend.name": IDENTITY,
    "Backend.reads_end": CELLS,
    "Backend.inherits": CELLS,
    "Backend.latest_of": CELLS,
    "Backend.per_mode": CELLS,
    "Backend.gates": CELLS,
    "Backend.abstract": LISTING,
    "Backend.doc": COSMETIC,
    "Backend.origin": COSMETIC,
    "Backend.reads_end_origins": COSMETIC,
    "Backend.plant": PLACEMENT,
    "Backend.reads_end_after": CELLS,
    "Backend.routes": CELLS,
    # per class: where each class's reads end is compared for every backend naming a class
    "Backend.reads_end_classes": CELLS,
    # a registry that loads declares every class it lists (`class_problems`): the list itself
    # moves no release (the declarations it forces are compared as reads_end_classes)
    "Backend.reads_classes": COSMETIC,
    "After.action": PER_BATCH,
    "After.otherwise": CELLS,
    "Route.fact": PER_BATCH,
    "Route.children": CELLS,
    "Route.modes": CELLS,
    "Route.default": CELLS,
    "Route.pinned": PER_BATCH,  # a pinned router narrows for a batch naming its route
    "Registry.flags": CONTAINER,
    "Registry.spec_algorithms": CONTAINER,
    "Registry.backends": CONTAINER,
    "Registry.gates": CELLS,
    "Registry.sources": COSMETIC,
    "Registry.facts": CONTAINER,
    "Registry.buffer_classes": CONTAINER,
    "BufferClass.name": IDENTITY,
    "BufferClass.doc": COSMETIC,
    "BufferClass.origin": COSMETIC,
    "BufferClass.built_in": COSMETIC,
    "Registry._lineages": COSMETIC,  # a cache of inheritance walks
    "Registry._folded": COSMETIC,  # a cache of case-folded names
}


def semantic_key(value: object) -> object:
    """A hashable key of ``value`` without the fields `FIELD_COVERAGE` calls cosmetic: two
    entries with the same key decide every cell alike."""
    kind = type(value)
    if attrs.has(kind):
        name = kind.__name__
        fields = attrs.fields(kind)
        return (
            name,
            tuple(
                (f.name, semantic_key(getattr(value, f.name)))
                for f in fields
                if FIELD_COVERAGE.get(f"{name}.{f.name}") != COSMETIC
            ),
        )
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), semantic_key(v)) for k, v in value.items()))
    if isinstance(value, (tuple, list)):
        return tuple(semantic_key(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(str(semantic_key(v)) for v in value))
    return value


# -- the result --------------------------------------------------------------------------------


@attrs.frozen
class DiffCell:
    """One (backend, mode, spec) whose value differs, and the settings where it does.

    ``mode`` is a mode's label, or ``step`` for a speculative step's release. ``old`` / ``new``
    are policy labels (``in_graph (derived)`` for a derived node; ``none at target_verify``
    style for step cells), or ``absent``.
    """

    backend: str
    mode: str
    spec: str
    old: str
    new: str
    when: str  # "any" or the assignments that select the differing settings
    change: str  # one of CHANGES
    settings: tuple[Setting, ...] = ()
    plugins: str | None = None  # "off" / "on" when a diff compares both
    batches: int = 1  # combinations of per-batch classes per setting in the cell's column

    def settings_json(self) -> dict[str, object]:
        """``settings`` for JSON, in two parts: ``settings``, the flags and runner facts under
        which the cell differs for some class of batch; ``batches``, the combinations of
        per-batch classes (fact -> class label) under which it differs for each of those
        (empty: for every class of batch); None when the classes depend on the setting
        (``when`` then says which pairs)."""
        bases: dict[tuple, set] = {}
        for setting in self.settings:
            bases.setdefault((setting.flags, setting.facts), set()).add(setting.batch)
        every = all(len(b) >= self.batches for b in bases.values())
        batches: dict[tuple, None] = {}
        if not every:
            for setting in self.settings:
                batches.setdefault(setting.batch)
        product = every or len({frozenset(b) for b in bases.values()}) == 1
        return {
            "settings": [{**dict(flags), **dict(facts)} for flags, facts in bases],
            "batches": [{k: v.label for k, v in b} for b in batches] if product else None,
        }

    @property
    def needs_audit(self) -> bool:
        """The fence may now release sooner (``earlier``) or elsewhere (``moved``)."""
        return self.change in NEEDS_AUDIT


@attrs.frozen
class FlagChange:
    """A flag whose environment names changed while some gate tests it: a deployment that sets
    one of them may now resolve the flag differently."""

    name: str
    old_env: tuple[str, ...]
    new_env: tuple[str, ...]
    change: str  # "earlier" (may resolve to the value that releases sooner) or "later"
    plugins: str | None = None

    @property
    def needs_audit(self) -> bool:
        return self.change in NEEDS_AUDIT


@attrs.frozen
class Diff:
    """The outcome of comparing two engines over a `CellSpace`."""

    cells: tuple[DiffCell, ...] = ()
    flags: tuple[FlagChange, ...] = ()
    added_backends: tuple[str, ...] = ()
    removed_backends: tuple[str, ...] = ()
    added_specs: tuple[str, ...] = ()
    removed_specs: tuple[str, ...] = ()
    #: change kind -> cells of one-sided backends or specs that were not evaluated (``expand``)
    unlisted: Mapping[str, int] = attrs.field(factory=dict)
    evaluated_backends: int = 0  # how many backends the comparison had to evaluate
    #: ``"MODE spec SPEC: why"`` per column that could not be compared (fails closed)
    uncompared: tuple[str, ...] = ()

    @property
    def needs_audit(self) -> bool:
        """Some cell or flag needs an audit, or some column could not be compared."""
        return (
            bool(self.uncompared)
            or any(c.needs_audit for c in self.cells)
            or any(f.needs_audit for f in self.flags)
        )

    def __add__(self, other: Diff) -> Diff:
        unlisted = dict(self.unlisted)
        for kind, count in other.unlisted.items():
            unlisted[kind] = unlisted.get(kind, 0) + count
        return Diff(
            self.cells + other.cells,
            self.flags + other.flags,
            tuple(dict.fromkeys(self.added_backends + other.added_backends)),
            tuple(dict.fromkeys(self.removed_backends + other.removed_backends)),
            tuple(dict.fromkeys(self.added_specs + other.added_specs)),
            tuple(dict.fromkeys(self.removed_specs + other.removed_specs)),
            unlisted,
            self.evaluated_backends + other.evaluated_backends,
            tuple(dict.fromkeys(self.uncompared + other.uncompared)),
        )

    def counts(self) -> dict[str, int]:
        """Changed (backend, mode, spec) cells per change kind, unlisted ones included."""
        seen: dict[str, set] = {kind: set() for kind in CHANGES}
        for cell in self.cells:
            seen[cell.change].add((cell.backend, cell.mode, cell.spec, cell.plugins))
        return {kind: len(seen[kind]) + self.unlisted.get(kind, 0) for kind in CHANGES}


# -- comparing ---------------------------------------------------------------------------------

_PHASES = (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)  # in step order


class _Side:
    """One engine's values, cached per comparison."""

    def __init__(self, engine: PolicyEngine, buffer_class: str | None = None) -> None:
        self.engine = engine
        self.registry = engine.registry
        #: compare where this buffer class's reads end instead of the cell (None)
        self.buffer_class = buffer_class
        self._placement: dict[tuple[str, ForwardMode], Placement] = {}
        self.classes = engine.facts()
        self._labels: dict[tuple, frozenset[str]] = {}
        self._resolved: dict[Setting, tuple] = {}
        self._staged: dict[tuple, bool] = {}
        #: set by `diff_engines`: both sides have the same rules but for flag defaults and env
        self.same_rules = False

    def resolved(self, setting: Setting) -> tuple:
        """The value of every flag under ``setting`` (overrides, else this side's own)."""
        if setting not in self._resolved:
            overrides = {
                k: v
                for k, v in setting.overrides().items()
                if k in self.registry.flags or k == FORCE_COARSE.name
            }
            values = self.engine.flag_values(overrides)
            self._resolved[setting] = tuple((f.name, f.value) for f in values)
        return self._resolved[setting]

    def placement(self, backend: str, mode: ForwardMode) -> Placement:
        key = (backend, mode)
        if key not in self._placement:
            self._placement[key] = self.engine.placement(backend, mode)
        return self._placement[key]

    def decisions(
        self,
        backends: Sequence[str],
        mode: ForwardMode,
        spec: str,
        setting: Setting,
        cases: bool = False,
    ) -> dict[str, Decision]:
        flags = {
            k: v
            for k, v in setting.overrides().items()
            if k in self.registry.flags or k == FORCE_COARSE.name
        }
        decisions = self.engine.table(
            backends,
            [spec],
            [mode],
            flags,
            batch_facts=setting.batch_values(self.registry.facts),
            cases=cases,
            buffer_class=self.buffer_class,
            **setting.fact_values(),  # type: ignore[arg-type]
        )
        return {d.context.backend: d for d in decisions}

    def policies(
        self, backends: Sequence[str], mode: ForwardMode, spec: str, setting: Setting
    ) -> dict[str, WarReadDonePolicy]:
        found = self.decisions(backends, mode, spec, setting)
        return {name: d.policy for name, d in found.items()}

    def values(
        self, backends: Sequence[str], mode: ForwardMode, column: Column, spec: str, base: Setting
    ) -> dict[str, str | dict[Setting, str]]:
        """Per backend, its label for every setting of ``column`` that shares ``base``'s flags
        and runner facts: one label where no per-batch fact matters (`Decision.cases` empty:
        the engine's enumeration of the cell's fact classes found one policy), else a label per
        combination of per-batch classes (``column.expand(base)``), read from the cases: each
        class of the union falls in one class of this side's (`FactClasses.classify`), and
        exactly one case's conditions hold for a combination of this side's classes."""
        found = self.decisions(backends, mode, spec, base, cases=len(column.batches) > 1)
        out: dict[str, str | dict[Setting, str]] = {}
        for name in backends:
            decision = found[name]
            if not decision.cases:
                out[name] = self.label(name, mode, decision.policy)
                continue
            per: dict[Setting, str] = {}
            for setting in column.expand(base):
                labels = self._class_labels(setting)
                policy = next(c.policy for c in decision.cases if labels.issuperset(c.when))
                per[setting] = self.label(name, mode, policy)
            out[name] = per
        return out

    def _class_labels(self, setting: Setting) -> frozenset[str]:
        """The labels of this side's classes that the batch of ``setting`` falls in, one per
        fact this side declares (a fact the setting does not enumerate: not reported)."""
        key = setting.batch
        if key not in self._labels:
            given = setting.batch_values(self.registry.facts)
            self._labels[key] = frozenset(
                classes.labels[classes.classify(given.get(name, NOT_REPORTED))]
                for name, classes in self.classes.items()
            )
        return self._labels[key]

    def _flags(self, setting: Setting) -> dict[str, bool]:
        return {
            k: v
            for k, v in setting.overrides().items()
            if k in self.registry.flags or k == FORCE_COARSE.name
        }

    def reads_staged(self, backend: str, spec: str, setting: Setting) -> bool:
        """Whether verify's cell under ``setting`` reads the staging action: its runner then
        reports it per batch, and a staged batch's step releases at verify."""
        key = (backend, spec, setting.flags, setting.facts)
        if key not in self._staged:
            ctx = Context(
                backend,
                ForwardMode.TARGET_VERIFY,
                spec,
                self._flags(setting),
                **setting.fact_values(),  # type: ignore[arg-type]
            )
            self._staged[key] = DRAFT_EXTEND_STAGED in self.engine.rule_facts(ctx)
        return self._staged[key]

    def reads_nothing(
        self, backends: Sequence[str], mode: ForwardMode, spec: str, setting: Setting
    ) -> set[str]:
        """Of ``backends``, those whose ``mode`` reads nothing as a runner resolves it
        (`warpolicy.runtime.release.resolve_policies`): ``nothing`` in each of its three cells
        (captured and planted, captured, eager) for a batch that reports no fact."""
        out = set(backends)
        for eager, planted in ((False, True), (False, False), (True, False)):
            if not out:
                break
            cell = {"eager": eager, "planted": planted}
            runner = Setting(setting.flags, tuple((k, cell.get(k, v)) for k, v in setting.facts))
            found = self.policies(sorted(out), mode, spec, runner)
            out = {n for n in out if found[n] is NOTHING}
        return out

    def label(self, backend: str, mode: ForwardMode, policy: WarReadDonePolicy) -> str:
        if policy == IN_GRAPH and self.placement(backend, mode) is Placement.DERIVED:
            return f"{policy.label} ({Placement.DERIVED.label})"
        return policy.label


def _mode_change(old: str, new: str) -> str | None:
    if old == new:
        return None
    old_policy = WarReadDonePolicy.parse(old.split(" ", 1)[0])
    new_policy = WarReadDonePolicy.parse(new.split(" ", 1)[0])
    if new_policy < old_policy:
        return "earlier"
    if new_policy > old_policy:
        return "later"
    return "moved"  # in_graph both ways, the node planted elsewhere


def _step_value(phase: ForwardMode, policy: WarReadDonePolicy) -> tuple[str, tuple[int, int]]:
    """A step's release as a report shows it and its rank (later phases after earlier ones,
    coarse last). ``policy`` is what the phase publishes (``nothing`` publishes at
    pre_replay)."""
    published = PRE_REPLAY if policy is NOTHING else policy
    if published == NONE:
        return "none", (len(_PHASES), 0)
    return f"{published.label} at {phase.label}", (_PHASES.index(phase), int(published))


def _step_change(old: tuple, new: tuple) -> str:
    return "earlier" if new < old else "later"


def _reverse_deps(registries: Iterable[Registry]) -> dict[str, set[str]]:
    rdeps: dict[str, set[str]] = {}
    for registry in registries:
        for backend in registry.backends.values():
            for child in backend.children():
                rdeps.setdefault(child, set()).add(backend.name)
    return rdeps


def _closure(start: Iterable[str], rdeps: Mapping[str, set[str]]) -> set[str]:
    out = set(start)
    todo = list(out)
    while todo:
        for parent in rdeps.get(todo.pop(), ()):
            if parent not in out:
                out.add(parent)
                todo.append(parent)
    return out


def _keyed(items: Mapping[str, object]) -> dict[str, object]:
    return {name: semantic_key(item) for name, item in items.items()}


def _gates_key(registry: Registry) -> tuple:
    return tuple(sorted(str(semantic_key(g)) for g in registry.gates))


def _env_spelled(flag: Flag) -> tuple[str, ...]:
    """A flag's environment names in order, an inverted alias as ``not:NAME``."""
    return tuple(f"not:{var}" if var in flag.inverted else var for var in flag.env)


def _flag_changes(old: Registry, new: Registry, tested: set[str], plugins: str | None) -> list:
    out = []
    for name in sorted(set(old.flags) & set(new.flags)):
        before, after = _env_spelled(old.flags[name]), _env_spelled(new.flags[name])
        if before == after:
            continue
        if name == FORCE_COARSE.name:
            # on when any of its names says so: only a dropped name can switch it off
            change = "earlier" if set(before) - set(after) else "later"
        elif name in tested:
            change = "earlier"  # first set name wins: any change may resolve it differently
        else:
            continue  # no gate tests it: it cannot change a decision
        out.append(FlagChange(name, tuple(before), tuple(after), change, plugins))
    return out


def diff_engines(
    old: PolicyEngine,
    new: PolicyEngine,
    space: CellSpace,
    plugins: str | None = None,
    *,
    earlier_only: bool = False,
    expand: int | None = None,
    prune_gates: bool = True,
) -> Diff:
    """Every cell of ``space`` whose value differs between two engines.

    ``earlier_only`` (layer reports, hooks) skips what can never need an audit: backends and
    spec algorithms on one side only. ``expand`` bounds how many rows of one-sided backends or
    specs are evaluated per kind (None: all); the rest are counted in `Diff.unlisted`.
    ``prune_gates``: when only global gates differ, evaluate only the columns and settings
    where a changed gate can match (the rest decide alike); False evaluates every one (the
    baseline ``python -m warpolicy.bench.diff_scale`` times it against).
    """
    a, b = _Side(old), _Side(new)
    ra, rb = old.registry, new.registry
    backends_a, backends_b = set(ra.backends), set(rb.backends)
    specs_a, specs_b = set(old.spec_names()), set(new.spec_names())
    common_b = sorted(backends_a & backends_b)
    common_s = sorted(specs_a & specs_b)
    keys_a, keys_b = _keyed(ra.backends), _keyed(rb.backends)
    global_changed = (
        _keyed(ra.flags) != _keyed(rb.flags)
        or _keyed(ra.facts) != _keyed(rb.facts)  # a fact's values or type: every reader
        or _gates_key(ra) != _gates_key(rb)
    )
    if global_changed:
        affected = set(common_b)
    else:
        changed = {n for n in common_b if keys_a[n] != keys_b[n]}
        changed |= backends_a ^ backends_b
        affected = _closure(changed, _reverse_deps([ra, rb])) & set(common_b)
    spec_a = {s: semantic_key(old.spec(s)) for s in common_s}
    spec_b = {s: semantic_key(new.spec(s)) for s in common_s}
    changed_specs = {s for s in common_s if spec_a[s] != spec_b[s]}
    tested = {n for r in (ra, rb) for g in all_gates(r) for n in g.when.flags}
    # the same rules but for flag defaults and environment names (a layer that flips a
    # default): a setting whose flags resolve alike on both sides decides alike
    a.same_rules = b.same_rules = (
        not changed_specs
        and keys_a == keys_b
        and set(ra.flags) == set(rb.flags)
        and _keyed(ra.facts) == _keyed(rb.facts)
        and _gates_key(ra) == _gates_key(rb)
        and set(specs_a) == set(specs_b)
    )

    # only global gates differ: a setting none of the changed gates can match decides alike
    # on both sides (every other rule is the same), so only the others are evaluated
    changed_gates: list[Gate] | None = None
    if (
        prune_gates
        and not changed_specs
        and keys_a == keys_b
        and _keyed(ra.flags) == _keyed(rb.flags)
        and _keyed(ra.facts) == _keyed(rb.facts)
        and set(specs_a) == set(specs_b)
    ):
        keys_old = {str(semantic_key(g)) for g in ra.gates}
        keys_new = {str(semantic_key(g)) for g in rb.gates}
        changed_gates = [g for g in ra.gates if str(semantic_key(g)) not in keys_new]
        changed_gates += [g for g in rb.gates if str(semantic_key(g)) not in keys_old]

    cells: list[DiffCell] = []
    evaluated: set[str] = set()
    uncompared: list[str] = []
    for spec in common_s:
        names = common_b if spec in changed_specs else sorted(affected)
        if not names:
            continue
        evaluated.update(names)
        scope = reach(names, [ra, rb])
        for mode in space.modes:
            why = space.column(mode, spec, scope).uncompared
            if why:
                uncompared.append(f"{mode.label} spec {spec}: {why}")
                continue
            relevant = _relevant(changed_gates, (mode,), old.spec(spec), new.spec(spec))
            if relevant is not None and not relevant.gates:
                continue  # no changed gate can match in this column
            cells += _compare_column(a, b, names, mode, spec, space, plugins, scope, relevant)
            cells += _compare_classes(old, new, names, mode, spec, space, plugins, scope)
        if spec == IMPLICIT_SPEC.name or not any(m in space.modes for m in _PHASES):
            continue  # no speculative step (or its phases are not compared)
        why = space.column(_PHASES, spec, scope).uncompared
        if why:
            uncompared.append(f"step spec {spec}: {why}")
            continue
        readers = (_step_reader(old.spec(spec)), _step_reader(new.spec(spec)))
        relevant = _relevant(changed_gates, _PHASES, old.spec(spec), new.spec(spec), True)
        if relevant is not None and any(g.when.facts for g in relevant.gates):
            relevant = None  # a fact test may change what verify's rule reads: every setting
        if relevant is not None and not relevant.gates:
            continue
        cells += _compare_steps(a, b, names, spec, readers, space, plugins, scope, relevant)

    result = Diff(
        tuple(c for c in cells if not earlier_only or c.needs_audit),
        tuple(_flag_changes(ra, rb, tested, plugins)),
        evaluated_backends=len(evaluated),
        uncompared=tuple(uncompared),
    )
    if earlier_only:
        return result
    one_sided = Diff(
        added_backends=tuple(sorted(backends_b - backends_a)),
        removed_backends=tuple(sorted(backends_a - backends_b)),
        added_specs=tuple(sorted(specs_b - specs_a)),
        removed_specs=tuple(sorted(specs_a - specs_b)),
    )
    for kind, side, others, own_specs, other_specs in (
        ("removed", a, backends_b, specs_a, specs_b),
        ("added", b, backends_a, specs_b, specs_a),
    ):
        pairs = [
            (backend, spec)
            for backend in sorted(side.registry.backends)
            for spec in sorted(own_specs)
            if backend not in others or spec not in other_specs
        ]
        rows, unlisted = _one_sided(side, pairs, kind, space, plugins, expand)
        one_sided = one_sided + Diff(tuple(rows), unlisted={kind: unlisted} if unlisted else {})
    return result + one_sided


def _compare_column(
    a: _Side,
    b: _Side,
    names: Sequence[str],
    mode: ForwardMode,
    spec: str,
    space: CellSpace,
    plugins: str | None,
    scope: frozenset[str] | None = None,
    relevant: _ChangedGates | None = None,
) -> list[DiffCell]:
    column = space.column(mode, spec, scope)
    if column.all_none:
        return []
    groups: dict[tuple[str, str, str, str], list[Setting]] = {}
    for base in column.base:
        if a.same_rules and a.resolved(base) == b.resolved(base):
            continue  # same rules, same flag values: the same decisions
        if relevant is not None and not relevant.may_match(base):
            continue  # no changed gate can match here: the same decisions
        before = a.values(names, mode, column, spec, base)
        after = b.values(names, mode, column, spec, base)
        for name in names:
            old_value, new_value = before[name], after[name]
            if isinstance(old_value, str) and isinstance(new_value, str):
                change = _mode_change(old_value, new_value)
                if change is not None:
                    key = (name, old_value, new_value, change)
                    groups.setdefault(key, []).extend(column.expand(base))
                continue
            for setting in column.expand(base):
                old = old_value if isinstance(old_value, str) else old_value[setting]
                new = new_value if isinstance(new_value, str) else new_value[setting]
                change = _mode_change(old, new)
                if change is not None:
                    groups.setdefault((name, old, new, change), []).append(setting)
    return _cells(groups, mode.label, spec, column, plugins)


@attrs.frozen
class _ChangedGates:
    """The global gates on one side only (everything else alike), live in a column."""

    gates: tuple[Gate, ...]
    #: a step reads every runner cell of a phase (whether it reads nothing): eager and planted
    #: conditions may hold whatever the setting says
    any_cell: bool = False

    def may_match(self, setting: Setting) -> bool:
        """Whether some changed gate can match under ``setting`` for some backend and batch
        (its flag and runner-fact conditions; per backend and per batch ones may hold)."""
        flags = dict(setting.flags)
        facts = dict(setting.facts)
        for gate in self.gates:
            when = gate.when
            if any(
                isinstance(flags.get(name), bool) and flags[name] != want
                for name, want in when.flags.items()
            ):
                continue
            if when.platform is not None and facts.get("platform") not in when.platform:
                continue
            runner = ("external_events",) if self.any_cell else RUNNER_CELL_FACTS
            if any(
                getattr(when, name) is not None and facts.get(name) != getattr(when, name)
                for name in runner
            ):
                continue
            return True
        return False


#: The runner facts a setting fixes for one cell (a step reads every cell: not these).
RUNNER_CELL_FACTS = ("eager", "planted", "external_events")


def _relevant(
    changed: list[Gate] | None,
    modes: Sequence[ForwardMode],
    old_spec: SpecAlgorithm,
    new_spec: SpecAlgorithm,
    any_cell: bool = False,
) -> _ChangedGates | None:
    """None: compare every setting; else the changed gates live in the column(s)."""
    if changed is None:
        return None
    live = [g for g in changed if live_in(g, modes, old_spec) or live_in(g, modes, new_spec)]
    return _ChangedGates(tuple(live), any_cell)


def _compare_classes(
    old: PolicyEngine,
    new: PolicyEngine,
    names: Sequence[str],
    mode: ForwardMode,
    spec: str,
    space: CellSpace,
    plugins: str | None,
    scope: frozenset[str] | None = None,
) -> list[DiffCell]:
    """Per buffer class, where its reads end, for the backends whose declaration of ``mode``
    names a class on either side (a class one side does not declare is none there); the
    rows' mode reads ``MODE:CLASS``. A change that leaves the cell (the latest class) alone
    but makes one class earlier is ``earlier`` here."""
    per_backend = {n: set(old.classes(n, mode)) | set(new.classes(n, mode)) for n in names}
    out: list[DiffCell] = []
    for buffer_class in sorted({c for cs in per_backend.values() for c in cs}):
        classed = [n for n in names if buffer_class in per_backend[n]]
        a, b = _Side(old, buffer_class), _Side(new, buffer_class)
        for cell in _compare_column(a, b, classed, mode, spec, space, plugins, scope):
            out.append(attrs.evolve(cell, mode=f"{mode.label}:{buffer_class}"))
    return out


def _step_reader(spec: object) -> ForwardMode:
    """The declared last reader; undeclared: the last phase the step runs (draft extend)."""
    reader = getattr(spec, "last_reader", None)
    return _PHASES[-1] if reader is None else ForwardMode.parse(reader)


def _compare_steps(
    a: _Side,
    b: _Side,
    names: Sequence[str],
    spec: str,
    readers: tuple[ForwardMode, ForwardMode],
    space: CellSpace,
    plugins: str | None,
    scope: frozenset[str] | None = None,
    relevant: _ChangedGates | None = None,
) -> list[DiffCell]:
    """Step cells: the event a speculative step of target verify then draft extend hands the
    scheduler, for every setting and class of batch of both phases' columns.

    As `warpolicy.runtime.runners.SpecStep` releases: every phase up to the declared reader
    reads; a later phase reads unless it reads ``nothing`` in every runner cell; verify, once
    it published for a batch whose staging action succeeded and its cell reads that action,
    ends the step (the draft extend is skipped); the step hands out the last reading phase's
    event (coarse when that phase decided ``none``)."""
    column = space.column(_PHASES, spec, scope)
    groups: dict[tuple[str, str, str, str], list[Setting]] = {}
    for setting in column.settings:
        if a.same_rules and a.resolved(setting) == b.resolved(setting):
            continue  # same rules, same flag values: the same steps
        if relevant is not None and not relevant.may_match(setting):
            continue  # no changed gate can match here: the same steps
        values = [
            _step_values(side, names, spec, reader, setting)
            for side, reader in ((a, readers[0]), (b, readers[1]))
        ]
        for name in names:
            (old, old_rank), (new, new_rank) = values[0][name], values[1][name]
            if old_rank == new_rank:
                continue
            change = _step_change(old_rank, new_rank)
            groups.setdefault((name, old, new, change), []).append(setting)
    return _cells(groups, STEP, spec, column, plugins)


def _step_values(
    side: _Side, names: Sequence[str], spec: str, reader: ForwardMode, setting: Setting
) -> dict[str, tuple[str, tuple[int, int]]]:
    verify, extend = _PHASES
    policies = {m: side.policies(names, m, spec, setting) for m in _PHASES}
    later = _PHASES.index(reader) < _PHASES.index(extend)
    skipped = side.reads_nothing(names, extend, spec, setting) if later else set()
    staged_batch = setting.batch_values(side.registry.facts).get(DRAFT_EXTEND_STAGED) is True
    out: dict[str, tuple[str, tuple[int, int]]] = {}
    for name in names:
        phase = verify
        staged = (
            staged_batch
            and policies[verify][name] != NONE
            and side.reads_staged(name, spec, setting)
        )
        if not staged and name not in skipped:
            phase = extend
        out[name] = _step_value(phase, policies[phase][name])
    return out


def _cells(
    groups: Mapping[tuple[str, str, str, str], list[Setting]],
    mode: str,
    spec: str,
    column: Column,
    plugins: str | None,
) -> list[DiffCell]:
    """One `DiffCell` per (backend, old, new, change) with the settings where it holds."""
    return [
        DiffCell(
            name,
            mode,
            spec,
            old,
            new,
            summarize(found, column.settings, column),
            change,
            tuple(found),
            plugins,
            len(column.batches),
        )
        for (name, old, new, change), found in groups.items()
    ]


def _one_sided(
    side: _Side,
    pairs: Sequence[tuple[str, str]],
    kind: str,
    space: CellSpace,
    plugins: str | None,
    expand: int | None,
) -> tuple[list[DiffCell], int]:
    """Rows of backends or specs on one side only, evaluated in order until ``expand`` rows;
    returns the rows and how many cells were left unevaluated."""
    rows: list[DiffCell] = []
    index = 0
    chunk = 16
    while index < len(pairs) and (expand is None or len(rows) < expand):
        batch = pairs[index : index + (len(pairs) if expand is None else chunk)]
        index += len(batch)
        by_spec: dict[str, list[str]] = {}
        for backend, spec in batch:
            by_spec.setdefault(spec, []).append(backend)
        for spec, names in by_spec.items():
            scope = reach(names, [side.registry])
            for mode in space.modes:
                column = space.column(mode, spec, scope)
                if column.uncompared:
                    continue  # one side only: never earlier; `Diff.uncompared` names others
                groups: dict[tuple[str, str], list[Setting]] = {}
                for base in column.base:
                    values = side.values(names, mode, column, spec, base)
                    for name in names:
                        value = values[name]
                        if isinstance(value, str):
                            groups.setdefault((name, value), []).extend(column.expand(base))
                            continue
                        for setting, label in value.items():
                            groups.setdefault((name, label), []).append(setting)
                for (name, value), found in groups.items():
                    old, new = (value, ABSENT) if kind == "removed" else (ABSENT, value)
                    rows.append(
                        DiffCell(
                            name,
                            mode.label,
                            spec,
                            old,
                            new,
                            summarize(found, column.settings, column),
                            kind,
                            tuple(found),
                            plugins,
                            len(column.batches),
                        )
                    )
    unlisted = (len(pairs) - index) * len(space.modes)
    return rows, unlisted


# -- layers ------------------------------------------------------------------------------------


@attrs.frozen
class LayerChange:
    """A layer that makes some cells earlier than the layers below it."""

    layer: str  # a file path or a plugin fragment name (``plugin:NAME``...)
    cells: tuple[DiffCell, ...]  # the cells that need an audit (old = below, new = with it)
    note: str = ""  # why a layer could not be compared, if it could not
    flags: tuple[FlagChange, ...] = ()


def earlier_layers(
    layers: Sequence[Source],
    *,
    modes: Iterable[str] | None = None,
    max_settings: int = MAX_SETTINGS,
) -> list[LayerChange]:
    """For each layer k > 0: the cells where ``layers[0..k]`` is earlier than ``layers[0..k-1]``
    (each prefix under its own flag defaults).

    A prefix that does not load on its own (a fragment that refers to a later layer) is skipped
    with a note; the comparison resumes at the next prefix that loads.
    """
    engines: list[tuple[str, PolicyEngine | None, str]] = []
    for k, source in enumerate(layers):
        try:
            loaded = PolicyEngine(load_registry(list(layers[: k + 1])), environ={})
            engines.append((layer_label(source), loaded, ""))
        except WarpolicyError as exc:
            engines.append((layer_label(source), None, str(exc).splitlines()[0]))
    out: list[LayerChange] = []
    below: PolicyEngine | None = None
    for label, engine, problem in engines:
        if engine is None:
            out.append(
                LayerChange(label, (), f"cannot be loaded without the layers above it ({problem})")
            )
        elif below is not None:
            space = cell_space(
                [below.registry, engine.registry], modes=modes, max_settings=max_settings
            )
            found = diff_engines(below, engine, space, earlier_only=True)
            flags = tuple(f for f in found.flags if f.needs_audit)
            if found.cells or flags or found.uncompared:
                note = (
                    "cannot be compared with the layers below it (treated as earlier): "
                    + "; ".join(found.uncompared)
                    if found.uncompared
                    else ""
                )
                out.append(LayerChange(label, found.cells, note, flags))
        below = engine
    return out


__all__ = [
    "ABSENT",
    "CHANGES",
    "FIELD_COVERAGE",
    "NEEDS_AUDIT",
    "STEP",
    "Diff",
    "DiffCell",
    "FlagChange",
    "LayerChange",
    "diff_engines",
    "earlier_layers",
    "semantic_key",
]
