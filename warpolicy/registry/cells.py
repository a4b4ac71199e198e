"""What a comparison of registries enumerates: cells, their axes and settings.

A *cell* is (backend, mode, spec algorithm) under a *setting*: values for the flags and the
runner facts (platform, external events, eager, planted). Per (mode, spec) *column*
(`CellSpace.column`) a comparison enumerates:

* the flags that a gate *live* in that column tests (a gate is live unless its mode, spec, spec
  family or capability conditions rule the column out), each both ways; a flag whose declared
  default differs between the sides is also compared *left at each side's own default*
  (`DEFAULT`), so a layer that flips a default is seen;
* the runner facts (`FACT_AXES`) that a live gate tests. Facts no gate tests change a decision
  only through sound demotion, the same monotone map on both sides, so they are held at the
  fast path (cuda, external events, captured, planted), where no difference is hidden;
* the per-batch facts (`batch_axes`) that a live gate tests, a declaration holds ``after``, a
  router routes by, or a ``spec_lacks`` capability needs: one value per *class* of the fact in
  either registry (an ``int`` fact: an interval between the union of both sides' cuts; a
  ``name`` fact: each name either side tests or routes by, and a name neither tests; a ``bool``
  fact: true and false; an ``action``: succeeded and not), plus *not reported* for every fact
  that can be unknown. A decision reads a fact only through its class on each side, and the
  union's classes refine both sides', so every kind of batch is compared. Past
  `MAX_BATCH_SETTINGS` combinations in one column nothing is held: the column cannot be
  compared (`Column.uncompared`) and the comparison fails closed;
* ``force_coarse`` is never enumerated: each side takes its own default (with the environment
  left out), and switched on it makes every cell ``none`` on both sides.

A column where both sides have a global gate that makes every cell ``none`` whatever the setting
needs no evaluation (`Column.all_none`). Past ``max_settings`` combinations of flags and runner
facts in one column nothing is held either: the column cannot be compared (`Column.uncompared`)
and the comparison fails closed (give flags with ``--flag NAME=VALUE``).

Adding a runner fact: add the field to `Context` and `Conditions`, then declare it in
`FACT_AXES` (name, fast-path value, the values to enumerate given those gates test);
``tests/registry/test_compare.py`` names any condition that has no axis.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

import attrs

from warpolicy.registry.decision import FORCE_COARSE, IMPLICIT_SPEC
from warpolicy.registry.facts import (
    ABSENT,
    FactClasses,
    joint_classes,
    registry_fact_classes,
)
from warpolicy.registry.model import Conditions, Fact, Gate, Registry, SpecAlgorithm
from warpolicy.registry.vocabulary import NONE, ForwardMode

MAX_SETTINGS = 256
#: The most combinations of per-batch fact classes one column enumerates. A column past it is
#: not compared at all (`Column.uncompared`), which fails every review gate: give the facts with
#: ``--fact NAME=VALUE`` to compare one class of batch at a time.
MAX_BATCH_SETTINGS = 256
#: Stands for every platform name no gate tests.
OTHER_PLATFORM = "other"
#: A flag left at each side's own declared default (compared where the defaults differ).
DEFAULT = "default"
#: Conditions decided by the (mode, spec) column alone: a gate failing one is not live there.
STATIC_CONDITIONS = ("mode", "spec", "spec_family", "spec_has", "spec_lacks")
#: Conditions evaluated per backend (never enumerated: every backend is its own cell).
BACKEND_CONDITIONS = ("backend", "declared")
#: Per-batch fact conditions: enumerated per class of the fact (`batch_axes`).
PER_BATCH_CONDITIONS = ("facts",)

# -- the axes of a cell ------------------------------------------------------------------------


def _both_ways(fast: object) -> Callable[[frozenset], tuple[object, ...]]:
    return lambda _tested: (fast, not fast)


def _platforms(tested: frozenset) -> tuple[object, ...]:
    return tuple(dict.fromkeys(["cuda", *sorted(str(p) for p in tested), OTHER_PLATFORM]))


@attrs.frozen
class FactAxis:
    """A runner fact of `Context` that gates test through the `Conditions` field of the same
    name: enumerated (``values(tested)``) in a column where a live gate tests it, else held at
    ``fast``, the fast path."""

    name: str
    fast: object
    values: Callable[[frozenset], tuple[object, ...]] = attrs.field(eq=False)

    def tested(self, when: Conditions) -> frozenset | None:
        """The values a gate's condition names, or None when it does not test this fact."""
        value = getattr(when, self.name)
        if value is None:
            return None
        return frozenset(value) if isinstance(value, (set, frozenset)) else frozenset([value])


#: Every runner fact a gate may test. Add one here to make `diff` enumerate it.
FACT_AXES: tuple[FactAxis, ...] = (
    FactAxis("platform", "cuda", _platforms),
    FactAxis("external_events", True, _both_ways(True)),
    FactAxis("eager", False, _both_ways(False)),
    FactAxis("planted", True, _both_ways(True)),
)
FACT_NAMES = tuple(a.name for a in FACT_AXES)
FAST_PATH: Mapping[str, object] = {a.name: a.fast for a in FACT_AXES}

FlagSetting = bool | str  # True / False, or DEFAULT


@attrs.frozen
class BatchClass:
    """One class of a per-batch fact's values: how a report names it (``label``) and the value
    a batch of the class reports (``value``; `ABSENT`: not reported)."""

    fact: str
    label: str
    value: object

    def __str__(self) -> str:
        return self.label

    @property
    def reported(self) -> bool:
        return self.value is not ABSENT

    def given(self, fact: Fact | None) -> object | None:
        """The value one side's engine is given: None (not reported) when the side does not
        declare the fact or the value is not one of its values (unknown there, as at runtime)."""
        if fact is None or not self.reported or not fact.valid(self.value):
            return None
        return self.value


def _union_classes(name: str, sides: Sequence[FactClasses]) -> tuple[BatchClass, ...]:
    """One class per class of the union of ``sides`` (`joint_classes`)."""
    return tuple(BatchClass(name, label, value) for label, value in joint_classes(name, sides))


def _batch_facts_read(
    registries: Sequence[Registry],
    live: Sequence[Gate],
    modes: Sequence[ForwardMode],
    spec: str,
    scope: frozenset[str] | None = None,
) -> set[str]:
    """Per-batch facts a decision in the columns ``modes`` x ``spec`` may read: those a live
    gate tests, the actions of a ``spec_lacks`` capability it names and of declarations that
    hold ``after`` one in these modes, and the route of a router routed in these modes (of the
    backends in ``scope``; None: every backend)."""
    names: set[str] = set()
    for gate in live:
        names |= set(gate.when.facts)
    for registry in registries:
        algorithm = _spec_of(registry, spec)
        if algorithm is not None:
            lacks = {c for g in live for c in (g.when.spec_lacks or ())}
            names |= {a for c, a in algorithm.capabilities_after.items() if c in lacks}
        for backend in registry.backends.values():
            if scope is not None and backend.name not in scope:
                continue
            names |= {a.action for m, a in backend.reads_end_after.items() if m in modes}
            route = backend.routes
            if route is not None and any(route.routed(m) for m in modes):
                names.add(route.fact)
    return names


@attrs.frozen(cache_hash=True)
class Setting:
    """Flag values (``DEFAULT``: each side's own default), runner facts and per-batch fact
    classes for one column."""

    flags: tuple[tuple[str, FlagSetting], ...]
    facts: tuple[tuple[str, object], ...]
    batch: tuple[tuple[str, BatchClass], ...] = ()  # per-batch facts, one class each
    _assigned: Mapping[str, object] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        assigned = {**dict(self.flags), **dict(self.facts), **dict(self.batch)}
        object.__setattr__(self, "_assigned", MappingProxyType(assigned))

    def overrides(self) -> dict[str, bool]:
        """The flags given explicitly (both sides get the same value)."""
        return {k: bool(v) for k, v in self.flags if v != DEFAULT}

    def fact_values(self) -> dict[str, object]:
        return dict(self.facts)

    def batch_values(self, declared: Mapping[str, Fact]) -> dict[str, object]:
        """The per-batch facts one side is given (see `BatchClass.given`)."""
        out = {}
        for name, chosen in self.batch:
            value = chosen.given(declared.get(name))
            if value is not None:
                out[name] = value
        return out

    def assignments(self) -> Mapping[str, object]:
        """Every value of the setting by name (read-only; built once: reports ask often)."""
        return self._assigned

    def with_batch(self, batch: tuple[tuple[str, BatchClass], ...]) -> Setting:
        return Setting(self.flags, self.facts, batch)


@attrs.frozen
class Column:
    """What one (mode, spec) column enumerates: its axes and their settings."""

    axes: tuple[tuple[str, tuple[object, ...]], ...]
    settings: tuple[Setting, ...]
    all_none: bool = False  # every cell is none on both sides whatever the setting
    #: why the column cannot be compared (too many per-batch classes); "" when it can
    uncompared: str = ""
    #: the settings of flags and runner facts, every per-batch fact not reported (an action:
    #: not succeeded) but those given; ``settings`` is each of them with each of ``batches``
    base: tuple[Setting, ...] = ()
    batches: tuple[tuple[tuple[str, BatchClass], ...], ...] = ((),)
    _expanded: Mapping[Setting, tuple[Setting, ...]] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        width = len(self.batches)  # settings are base-major: each base, then its batches
        expanded = {b: self.settings[i * width : (i + 1) * width] for i, b in enumerate(self.base)}
        object.__setattr__(self, "_expanded", expanded)

    def expand(self, base: Setting) -> tuple[Setting, ...]:
        """``base`` with every combination of per-batch classes (settings of the column)."""
        return self._expanded[base]


def _spec_of(registry: Registry, name: str) -> SpecAlgorithm | None:
    spec = registry.spec_algorithms.get(name)
    if spec is None and name == IMPLICIT_SPEC.name:
        return IMPLICIT_SPEC
    return spec


def reach(names: Iterable[str], registries: Sequence[Registry]) -> frozenset[str]:
    """``names`` and every backend they name, transitively (inherits, latest_of, per_mode,
    routes), in any of ``registries``: the entries their decisions can read."""
    out = set(names)
    todo = list(out)
    while todo:
        name = todo.pop()
        for registry in registries:
            backend = registry.backends.get(name)
            if backend is None:
                continue
            for child in backend.children():
                if child not in out:
                    out.add(child)
                    todo.append(child)
    return frozenset(out)


def all_gates(registry: Registry) -> list[Gate]:
    return list(registry.gates) + [g for b in registry.backends.values() for g in b.gates]


def _live(gate: Gate, modes: Sequence[ForwardMode], spec: SpecAlgorithm) -> bool:
    """Whether ``gate`` can match somewhere in the columns of ``modes`` x ``spec``."""
    when = gate.when
    if when.mode is not None and not any(m in when.mode for m in modes):
        return False
    if when.spec is not None and spec.name not in when.spec:
        return False
    if when.spec_family is not None and spec.family not in when.spec_family:
        return False
    if when.spec_has is not None and not any(
        spec.has(c) or c in spec.capabilities_after for c in when.spec_has
    ):  # a capability after an action counts for spec_has whatever the action did
        return False
    return not (when.spec_lacks is not None and all(spec.has(c) for c in when.spec_lacks))


def live_in(gate: Gate, modes: Sequence[ForwardMode], spec: SpecAlgorithm) -> bool:
    """Whether ``gate`` can match somewhere in the columns of ``modes`` x ``spec``."""
    return _live(gate, modes, spec)


def _makes_all_none(gate: Gate, spec: SpecAlgorithm) -> bool:
    """A global gate that, once live, makes every cell none whatever the setting, backend or
    batch (a ``spec_lacks`` capability ``spec`` has after an action depends on the batch)."""
    when = gate.when
    dynamic = (
        any(c in spec.capabilities_after for c in (when.spec_lacks or ()))
        or when.flags
        or any(getattr(when, c) is not None for c in BACKEND_CONDITIONS)
        or any(getattr(when, a.name) is not None for a in FACT_AXES)
        or when.facts
    )
    return gate.scope is None and gate.at_least == NONE and not dynamic


@attrs.frozen(eq=False)
class CellSpace:
    """What a comparison of ``registries`` enumerates, per column, and what it holds fixed."""

    modes: tuple[ForwardMode, ...]
    registries: tuple[Registry, ...]
    fixed: Mapping[str, object] = attrs.field(factory=dict)  # flag or fact -> given value
    max_settings: int = MAX_SETTINGS
    _columns: dict = attrs.field(factory=dict, init=False, repr=False)
    #: flag -> why, for flags of a column past ``max_settings`` (that column fails closed)
    _held: dict = attrs.field(factory=dict, init=False, repr=False)
    _classes: list = attrs.field(factory=list, init=False, repr=False)

    def fact_classes(self) -> list[Mapping[str, FactClasses]]:
        """Per registry, the classes of its per-batch facts (`registry_fact_classes`)."""
        if not self._classes:
            self._classes.extend(registry_fact_classes(r) for r in self.registries)
        return self._classes

    def batch_axis(self, name: str) -> tuple[BatchClass, ...]:
        """The classes of per-batch fact ``name`` in the union of the registries."""
        sides = [c[name] for c in self.fact_classes() if name in c]
        return _union_classes(name, sides)

    # -- columns --------------------------------------------------------------------------

    def column(
        self,
        modes: ForwardMode | Sequence[ForwardMode],
        spec: str,
        scope: frozenset[str] | None = None,
    ) -> Column:
        """The axes and settings of the column(s) of ``modes`` x ``spec`` (several modes: one
        setting list that serves each of them, for step cells). ``scope``: the backends whose
        entries the compared backends' decisions can read (`reach`; None: every backend); the
        gates scoped to, and the per-batch facts read only by, other backends are not
        enumerated (they cannot move these decisions)."""
        key_modes = (modes,) if isinstance(modes, ForwardMode) else tuple(modes)
        key = (key_modes, spec, scope)
        if key not in self._columns:
            self._columns[key] = self._build_column(key_modes, spec, scope)
        return self._columns[key]

    def _build_column(
        self, modes: tuple[ForwardMode, ...], spec: str, scope: frozenset[str] | None = None
    ) -> Column:
        live: list[Gate] = []
        all_none = True
        for registry in self.registries:
            algorithm = _spec_of(registry, spec)
            if algorithm is None:
                all_none = False  # one side lacks the spec: its cells are added or removed
                continue
            gates = [
                g
                for g in all_gates(registry)
                if (scope is None or g.scope is None or g.scope in scope)
                and _live(g, modes, algorithm)
            ]
            live += gates
            all_none = all_none and any(_makes_all_none(g, algorithm) for g in gates)
        if all_none:
            only = self._setting({})
            return Column((), (only,), all_none=True, base=(only,), batches=(only.batch,))
        declared = {n for r in self.registries for n in r.flags}
        tested = {n for g in live for n in g.when.flags} & declared
        flags: list[tuple[str, tuple[object, ...]]] = []
        for name in sorted(tested - {FORCE_COARSE.name} - set(self.fixed)):
            defaults = {r.flags[name].default for r in self.registries if name in r.flags}
            values: tuple[object, ...] = (False, True) + ((DEFAULT,) if len(defaults) > 1 else ())
            flags.append((name, values))
        facts: list[tuple[str, tuple[object, ...]]] = []
        for axis in FACT_AXES:
            if axis.name in self.fixed:
                continue
            seen = [t for g in live if (t := axis.tested(g.when)) is not None]
            if seen:
                facts.append((axis.name, axis.values(frozenset().union(*seen))))

        batch: list[tuple[str, tuple[BatchClass, ...]]] = []
        for name in sorted(_batch_facts_read(self.registries, live, modes, spec, scope)):
            if name in self.fixed:
                continue
            batch.append((name, self.batch_axis(name)))
        batch_count = 1
        for _name, values in batch:
            batch_count *= len(values)
        if batch_count > MAX_BATCH_SETTINGS:
            why = (
                f"{batch_count} combinations of per-batch fact classes "
                f"({', '.join(f'{n}: {len(v)}' for n, v in batch)}) exceed {MAX_BATCH_SETTINGS}; "
                "give some with --fact NAME=VALUE"
            )
            return Column((), (), uncompared=why)

        def size() -> int:
            count = 1
            for _name, values in flags + facts:
                count *= len(values)
            return count

        if size() > self.max_settings:
            # holding a flag at its default hides every change under its other value: fail
            # closed, as past MAX_BATCH_SETTINGS
            why = (
                f"{size()} combinations of flags and runner facts "
                f"({', '.join(f'{n}: {len(v)}' for n, v in flags + facts)}) exceed "
                f"{self.max_settings}; give some flags with --flag NAME=VALUE"
            )
            for name, _values in flags:
                self._held.setdefault(
                    name,
                    f"{DEFAULT}: a column past {self.max_settings} combinations tests it, so "
                    f"that column is not compared (fails closed); give it with --flag "
                    f"{name}=VALUE",
                )
            return Column((), (), uncompared=why)
        base_axes = flags + facts
        base = []
        for combo in itertools.product(*(values for _name, values in base_axes)):
            base.append(self._setting(dict(zip((name for name, _values in base_axes), combo))))
        held = dict(base[0].batch)  # per-batch facts the caller gave
        combos: list[tuple[tuple[str, BatchClass], ...]] = []
        for classes in itertools.product(*(values for _name, values in batch)):
            chosen = {**held, **dict(zip((name for name, _values in batch), classes))}
            combos.append(tuple(sorted(chosen.items())))
        settings = tuple(b.with_batch(c) for b in base for c in combos)
        axes: list[tuple[str, tuple[object, ...]]] = [*base_axes, *batch]
        return Column(tuple(axes), settings, base=tuple(base), batches=tuple(combos))

    def _setting(self, chosen: Mapping[str, object]) -> Setting:
        """A setting: the given values, ``chosen`` for enumerated axes, the rest held."""
        batch: dict[str, BatchClass] = {
            k: v for k, v in self.fixed.items() if isinstance(v, BatchClass)
        }
        flag_values: dict[str, FlagSetting] = {
            k: bool(v) for k, v in self.fixed.items() if k not in FAST_PATH and k not in batch
        }
        for name, value in chosen.items():
            if isinstance(value, BatchClass):
                batch[name] = value
            elif name not in FAST_PATH:
                flag_values[name] = DEFAULT if value == DEFAULT else bool(value)
        facts = {a.name: chosen.get(a.name, self.fixed.get(a.name, a.fast)) for a in FACT_AXES}
        return Setting(
            tuple(sorted(flag_values.items())),
            tuple((a.name, facts[a.name]) for a in FACT_AXES),
            tuple(sorted(batch.items())),
        )

    # -- what the comparison enumerated, for reports ---------------------------------------

    def specs(self) -> list[str]:
        names = {IMPLICIT_SPEC.name}
        for registry in self.registries:
            names |= set(registry.spec_algorithms)
        return sorted(names)

    def _all_columns(self) -> list[Column]:
        return [self.column(m, s) for m in self.modes for s in self.specs()]

    @property
    def flags(self) -> tuple[str, ...]:
        """Flags enumerated in some column."""
        names = {
            n
            for c in self._all_columns()
            for n, v in c.axes
            if n not in FAST_PATH and not _is_batch(v)
        }
        return tuple(sorted(names))

    @property
    def platforms(self) -> tuple[str, ...]:
        found: dict[str, None] = {}
        for column in self._all_columns():
            for name, values in column.axes:
                if name == "platform":
                    found.update(dict.fromkeys(str(v) for v in values))
        if not found:
            found[str(self.fixed.get("platform", FAST_PATH["platform"]))] = None
        return tuple(found)

    @property
    def facts(self) -> tuple[str, ...]:
        """Runner facts (platform excluded) enumerated in some column."""
        names = {n for c in self._all_columns() for n, _v in c.axes}
        return tuple(a.name for a in FACT_AXES if a.name != "platform" and a.name in names)

    @property
    def batch_facts(self) -> tuple[str, ...]:
        """Per-batch facts enumerated (by class) in some column."""
        names = {n for c in self._all_columns() for n, v in c.axes if _is_batch(v)}
        return tuple(sorted(names))

    @property
    def axes(self) -> tuple[str, ...]:
        return (
            self.flags
            + (("platform",) if len(self.platforms) > 1 else ())
            + self.facts
            + self.batch_facts
        )

    @property
    def uncompared(self) -> tuple[tuple[str, str, str], ...]:
        """``(mode, spec, why)`` of every column that cannot be compared (fails closed)."""
        out = []
        for mode in self.modes:
            for spec in self.specs():
                column = self.column(mode, spec)
                if column.uncompared:
                    out.append((mode.label, spec, column.uncompared))
        return tuple(out)

    @property
    def held(self) -> tuple[tuple[str, str], ...]:
        """(name, "value: why") for every flag or fact not enumerated everywhere."""
        self._all_columns()  # fills the flags of uncompared columns
        enumerated = set(self.flags)
        out: list[tuple[str, str]] = []
        declared = sorted({n for r in self.registries for n in r.flags} | {FORCE_COARSE.name})
        for name, value in sorted(self.fixed.items()):
            if isinstance(value, BatchClass):
                out.append((name, f"{_text(value.value)}: given"))
        for name in declared:
            if name in self.fixed:
                out.append((name, f"{str(self.fixed[name]).lower()}: given"))
            elif name == FORCE_COARSE.name:
                out.append(
                    (
                        name,
                        f"{DEFAULT}: each side's own; the built-in kill switch makes every "
                        "cell none on both sides",
                    )
                )
            elif name in self._held and name not in enumerated:
                out.append((name, self._held[name]))
            elif name not in enumerated:
                out.append((name, f"{DEFAULT}: no gate tests it, so it cannot change a decision"))
        names = set(self.axes)
        for axis in FACT_AXES:
            if axis.name in self.fixed:
                out.append((axis.name, f"{_text(self.fixed[axis.name])}: given"))
            elif axis.name not in names and not (
                axis.name == "platform" and len(self.platforms) > 1
            ):
                why = (
                    "no gate tests the platform"
                    if axis.name == "platform"
                    else "no gate tests it; sound demotion applies alike to both sides"
                )
                out.append((axis.name, f"{_text(axis.fast)}: {why}"))
        return tuple(out)

    def to_json(self) -> dict:
        return {
            "modes": [m.label for m in self.modes],
            "flags": list(self.flags),
            "platforms": list(self.platforms),
            "facts": list(self.facts),
            "batch_facts": list(self.batch_facts),
            "held": {name: why for name, why in self.held},
            "max_settings_per_column": max(
                (len(c.settings) for c in self._all_columns()), default=1
            ),
        }

    def describe(self) -> list[str]:
        """Lines for a text report: what was compared and what was held fixed."""
        batch = set(self.batch_facts)
        compared = ", ".join(a for a in self.axes if a not in batch)
        compared = compared or "nothing beyond backend, mode and spec"
        most = max((len(c.base) for c in self._all_columns() if not c.uncompared), default=1)
        texts = [
            f"compared: every backend and spec over {len(self.modes)} mode(s), for every "
            f"combination of what a gate tests in that mode and spec: {compared} (at most "
            f"{most} setting(s) per cell)"
        ]
        if self.batch_facts:
            classes = max((len(c.batches) for c in self._all_columns()), default=1)
            texts.append(
                "per batch: each setting for every class of "
                + ", ".join(self.batch_facts)
                + f" in either registry, not reported included (at most {classes} "
                "combination(s) per setting)"
            )
        lines = [
            line
            for text in texts
            for line in textwrap.wrap(
                text, width=100, subsequent_indent="  ", break_on_hyphens=False
            )
        ]
        lines += [f"held: {name} = {why}" for name, why in self.held]
        return lines


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _is_batch(values: object) -> bool:
    return isinstance(values, tuple) and any(isinstance(v, BatchClass) for v in values)


def cell_space(
    registries: Sequence[Registry],
    *,
    modes: Iterable[str | ForwardMode] | None = None,
    fixed: Mapping[str, object] | None = None,
    max_settings: int = MAX_SETTINGS,
) -> CellSpace:
    """The cells worth comparing across ``registries`` (see the module docstring).

    ``fixed`` holds flags (by name), runner facts (``platform``, ``eager``, ``planted``,
    ``external_events``) or per-batch facts (a name some registry declares under ``facts``)
    at a value the caller chose.
    """
    mode_list = tuple(ForwardMode.parse(m) for m in modes) if modes else tuple(ForwardMode)
    declared = {n for r in registries for n in r.facts}
    held: dict[str, object] = {}
    for name, value in (fixed or {}).items():
        if name in declared and not isinstance(value, BatchClass):
            value = BatchClass(name, f"{name}={_text(value)}", value)
        held[name] = value
    return CellSpace(tuple(dict.fromkeys(mode_list)), tuple(registries), held, max_settings)


def summarize(found: Sequence[Setting], every: Sequence[Setting], column: Column) -> str:
    """``any``; the assignments shared by exactly the settings ``found``; ``not (...)`` those
    shared by exactly the others; else each setting of ``found``, joined by ``|``."""
    if len(found) == len(every):
        return "any"
    axes = [name for name, _values in column.axes]
    simple = _conjunction(found, every, axes)
    if simple is not None:
        return simple
    chosen = set(found)
    simple = _conjunction([s for s in every if s not in chosen], every, axes)
    if simple is not None:
        return f"not ({simple})"
    return " | ".join(_assignments({n: s.assignments()[n] for n in axes}) for s in found)


def _conjunction(
    found: Sequence[Setting], every: Sequence[Setting], axes: Sequence[str]
) -> str | None:
    """The assignments all of ``found`` share, if exactly those settings have them."""
    values = [{n: s.assignments()[n] for n in axes} for s in found]
    common = {n: v for n, v in values[0].items() if all(x[n] == v for x in values)}
    matching = [s for s in every if all(s.assignments()[n] == v for n, v in common.items())]
    return _assignments(common) if len(matching) == len(found) else None


def _assignments(values: Mapping[str, object]) -> str:
    """``name=value, ...``: flags left at their default or on first (what usually tells the
    story: ``prefill_read_done=true, hierarchical_cache=false``), then flags off, then runner
    facts, then the classes of per-batch facts (``num_qo_tokens <= 11673``)."""

    def rank(item: tuple[str, object]) -> int:
        name, value = item
        if isinstance(value, BatchClass):
            return 4
        if name in FAST_PATH:
            return 3
        return 0 if value == DEFAULT else 1 if value is True else 2

    ordered = sorted(values.items(), key=rank)  # stable: names stay sorted within a rank
    return ", ".join(
        v.label if isinstance(v, BatchClass) else f"{k}={_text(v)}" for k, v in ordered
    )
