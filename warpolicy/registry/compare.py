"""Registries compared cell by cell: `diff` and the layer report.

A *cell* is (backend, mode, spec algorithm, setting), where a setting assigns the flags and the
platform facts. Comparing every mode and spec is cheap; settings multiply, so `cell_space`
enumerates only what can change a decision:

* a flag changes a decision only through a gate's ``when: {flags: ...}``, so the flags that some
  gate (of either registry) tests are enumerated, the rest held at their declared defaults;
* ``force_coarse`` is built into the engine and makes every cell ``none`` on both sides, so it is
  held off;
* a platform name or a runner fact (``eager``, ``planted``, ``external_events``) changes a
  decision through a gate that tests it, or through sound demotion. Demotion is the same monotone
  map on both sides, so it can hide a difference but never create one: facts no gate tests are
  held at the fast path (cuda, external events, captured, planted), where nothing is hidden.

Past `MAX_SETTINGS` combinations the last enumerated flags are held at their defaults too, and
the comparison says so (`CellSpace.held`). Engines are built without the environment, so an
operator's variables never mask a change.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Sequence

import attrs

from warpolicy.registry.decision import FORCE_COARSE
from warpolicy.registry.engine import PolicyEngine, layer_label
from warpolicy.registry.model import Gate, Registry
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy

if TYPE_CHECKING:
    from warpolicy.registry.loader import Source

MAX_SETTINGS = 256
FACTS = ("external_events", "eager", "planted")
FAST_PATH: Mapping[str, object] = {
    "platform": "cuda",
    "external_events": True,
    "eager": False,
    "planted": True,
}
#: Stands for every platform name no gate tests.
OTHER_PLATFORM = "other"
ABSENT = "absent"


@attrs.frozen
class Setting:
    """Flag values and platform facts for one column of cells."""

    flags: tuple[tuple[str, bool], ...]
    platform: str
    external_events: bool
    eager: bool
    planted: bool

    def facts(self) -> dict[str, object]:
        return {
            "platform": self.platform,
            "external_events": self.external_events,
            "eager": self.eager,
            "planted": self.planted,
        }

    def assignments(self) -> dict[str, object]:
        return {**dict(self.flags), **self.facts()}


@attrs.frozen
class CellSpace:
    """What a comparison enumerates and what it holds fixed (and why)."""

    modes: tuple[ForwardMode, ...]
    flags: tuple[str, ...]  # enumerated flags
    platforms: tuple[str, ...]  # enumerated platform names (one: held)
    facts: tuple[str, ...]  # enumerated runner facts, among FACTS
    fixed: Mapping[str, object] = attrs.field(factory=dict)  # flag or fact -> held value
    held: tuple[tuple[str, str], ...] = ()  # (name, "value: why") for reports

    @property
    def axes(self) -> tuple[str, ...]:
        return self.flags + (("platform",) if len(self.platforms) > 1 else ()) + self.facts

    def settings(self) -> list[Setting]:
        fixed_flags = {k: bool(v) for k, v in self.fixed.items() if k not in FAST_PATH}
        facts = {k: self.fixed.get(k, v) for k, v in FAST_PATH.items()}
        out = []
        for flag_values in itertools.product((False, True), repeat=len(self.flags)):
            for platform in self.platforms:
                for fact_values in itertools.product((True, False), repeat=len(self.facts)):
                    chosen = dict(facts, platform=platform, **dict(zip(self.facts, fact_values)))
                    flags = dict(fixed_flags, **dict(zip(self.flags, flag_values)))
                    out.append(
                        Setting(
                            tuple(sorted(flags.items())),
                            str(chosen["platform"]),
                            bool(chosen["external_events"]),
                            bool(chosen["eager"]),
                            bool(chosen["planted"]),
                        )
                    )
        return out

    def to_json(self) -> dict:
        return {
            "modes": [m.label for m in self.modes],
            "flags": list(self.flags),
            "platforms": list(self.platforms),
            "facts": list(self.facts),
            "held": {name: why for name, why in self.held},
        }

    def describe(self) -> list[str]:
        """Lines for a text report: what was compared and what was held fixed."""
        compared = ", ".join(self.axes) or "nothing beyond backend, mode and spec"
        lines = [
            f"compared: every backend and spec over {len(self.modes)} mode(s), for every "
            f"combination of: {compared} ({len(self.settings())} setting(s))"
        ]
        lines += [f"held: {name} = {why}" for name, why in self.held]
        return lines


def _all_gates(registry: Registry) -> list[Gate]:
    return list(registry.gates) + [g for b in registry.backends.values() for g in b.gates]


def cell_space(
    registries: Sequence[Registry],
    *,
    modes: Optional[Iterable[str]] = None,
    fixed: Optional[Mapping[str, object]] = None,
    max_settings: int = MAX_SETTINGS,
) -> CellSpace:
    """The cells worth comparing across ``registries`` (see the module docstring).

    ``fixed`` holds flags (by name) or facts (``platform``, ``eager``, ``planted``,
    ``external_events``) at a value the caller chose.
    """
    fixed = dict(fixed or {})
    mode_list = tuple(ForwardMode.parse(m) for m in modes) if modes else tuple(ForwardMode)
    gates = [g for r in registries for g in _all_gates(r)]
    declared_flags = sorted({n for r in registries for n in r.flags} | {FORCE_COARSE.name})
    tested_flags = {n for g in gates for n in g.when.flags}
    held: list[tuple[str, str]] = []
    flags: list[str] = []
    for name in declared_flags:
        if name in fixed:
            held.append((name, f"{str(fixed[name]).lower()}: given"))
        elif name == FORCE_COARSE.name:
            held.append(
                (name, "false: the built-in kill switch makes every cell none on both sides")
            )
        elif name in tested_flags:
            flags.append(name)
        else:
            held.append((name, "default: no gate tests it, so it cannot change a decision"))
    platforms: tuple[str, ...] = (str(FAST_PATH["platform"]),)
    tested_platforms = {p for g in gates if g.when.platform for p in g.when.platform}
    if "platform" in fixed:
        platforms = (str(fixed["platform"]),)
        held.append(("platform", f"{fixed['platform']}: given"))
    elif tested_platforms:
        platforms = tuple(dict.fromkeys(["cuda", *sorted(tested_platforms), OTHER_PLATFORM]))
    else:
        held.append(("platform", "cuda: no gate tests the platform"))
    facts: list[str] = []
    for fact in FACTS:
        if fact in fixed:
            held.append((fact, f"{str(fixed[fact]).lower()}: given"))
        elif any(getattr(g.when, fact) is not None for g in gates):
            facts.append(fact)
        else:
            held.append(
                (
                    fact,
                    f"{str(FAST_PATH[fact]).lower()}: no gate tests it; sound "
                    "demotion applies alike to both sides",
                )
            )
    while flags and 2 ** len(flags) * len(platforms) * 2 ** len(facts) > max_settings:
        name = flags.pop()
        held.append(
            (
                name,
                f"default: more than {max_settings} combinations; give it with "
                f"--flag {name}=VALUE to compare the other value",
            )
        )
    return CellSpace(mode_list, tuple(flags), platforms, tuple(facts), fixed, tuple(held))


def cells(
    engine: PolicyEngine, backends: Sequence[str], specs: Sequence[str], space: CellSpace
) -> dict[tuple[str, ForwardMode, str, Setting], str]:
    """The policy label of every cell, ``absent`` where the backend or spec is not declared."""
    present_b = [b for b in backends if b in engine.registry.backends]
    present_s = [s for s in specs if s in set(engine.spec_names())]
    out: dict[tuple[str, ForwardMode, str, Setting], str] = {}
    for setting in space.settings():
        for b in backends:
            for m in space.modes:
                for s in specs:
                    out[(b, m, s, setting)] = ABSENT
        if not present_b or not present_s:
            continue
        flags = {k: v for k, v in setting.flags if k in engine.registry.flags}
        for d in engine.table(
            present_b,
            present_s,
            space.modes,
            flags,
            platform=setting.platform,
            external_events=setting.external_events,
            eager=setting.eager,
            planted=setting.planted,
        ):
            out[(d.context.backend, d.context.mode, d.context.spec, setting)] = d.policy.label
    return out


@attrs.frozen
class DiffCell:
    """One (backend, mode, spec) whose policy differs, and the settings where it does."""

    backend: str
    mode: ForwardMode
    spec: str
    old: str  # policy label, or "absent"
    new: str
    when: str  # "any" or the assignments that select the differing settings
    settings: tuple[Setting, ...] = ()
    plugins: Optional[str] = None  # "off" / "on" when a diff compares both

    @property
    def change(self) -> str:
        """``earlier`` is what a reviewer must audit: the fence now releases sooner."""
        if ABSENT in (self.old, self.new):
            return "added" if self.old == ABSENT else "removed"
        earlier = WarReadDonePolicy.parse(self.new) < WarReadDonePolicy.parse(self.old)
        return "earlier" if earlier else "later"


def diff_engines(
    old: PolicyEngine, new: PolicyEngine, space: CellSpace, plugins: Optional[str] = None
) -> list[DiffCell]:
    """Every cell of ``space`` whose policy differs between two engines."""
    backends = sorted(set(old.registry.concrete_backends()) | set(new.registry.concrete_backends()))
    specs = sorted(set(old.spec_names()) | set(new.spec_names()))
    a = cells(old, backends, specs, space)
    b = cells(new, backends, specs, space)
    groups: dict[tuple[str, ForwardMode, str, str, str], list[Setting]] = {}
    for key, was in a.items():
        if b[key] != was:
            groups.setdefault((key[0], key[1], key[2], was, b[key]), []).append(key[3])
    every = space.settings()
    return [
        DiffCell(
            k[0], k[1], k[2], k[3], k[4], summarize(found, every, space), tuple(found), plugins
        )
        for k, found in groups.items()
    ]


def summarize(found: Sequence[Setting], every: Sequence[Setting], space: CellSpace) -> str:
    """``any``, the assignments shared by exactly the settings ``found``, or each of them."""
    if len(found) == len(every):
        return "any"
    axes = space.axes
    values = [{a: s.assignments()[a] for a in axes} for s in found]
    common = {a: v for a, v in values[0].items() if all(x[a] == v for x in values)}
    matching = [s for s in every if all(s.assignments()[a] == v for a, v in common.items())]
    if len(matching) == len(found):
        return _assignments(common)
    return " | ".join(_assignments(v) for v in values)


def _assignments(values: Mapping[str, object]) -> str:
    return ", ".join(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()
    )


@attrs.frozen
class LayerChange:
    """A layer that makes some cells earlier than the layers below it."""

    layer: str  # a file path or a plugin fragment name (``plugin:NAME``...)
    cells: tuple[DiffCell, ...]  # the earlier cells (old = below, new = with the layer)
    note: str = ""  # why a layer could not be compared, if it could not


def earlier_layers(
    layers: Sequence[Source],
    *,
    modes: Optional[Iterable[str]] = None,
    max_settings: int = MAX_SETTINGS,
) -> list[LayerChange]:
    """For each layer k > 0: the cells where ``layers[0..k]`` is earlier than ``layers[0..k-1]``.

    A prefix that does not load on its own (a fragment that refers to a later layer) is skipped
    with a note; the comparison resumes at the next prefix that loads.
    """
    from warpolicy.errors import WarpolicyError
    from warpolicy.registry.loader import (
        load_registry,  # the loader sits below; imported where used
    )

    engines: list[tuple[str, Optional[PolicyEngine], str]] = []
    for k, source in enumerate(layers):
        try:
            engines.append(
                (
                    layer_label(source),
                    PolicyEngine(load_registry(list(layers[: k + 1])), environ={}),
                    "",
                )
            )
        except WarpolicyError as exc:
            engines.append((layer_label(source), None, str(exc).splitlines()[0]))
    out: list[LayerChange] = []
    below: Optional[PolicyEngine] = None
    for label, engine, problem in engines:
        if engine is None:
            out.append(
                LayerChange(label, (), f"cannot be loaded without the layers above it ({problem})")
            )
        elif below is not None:
            space = cell_space(
                [below.registry, engine.registry], modes=modes, max_settings=max_settings
            )
            earlier = tuple(c for c in diff_engines(below, engine, space) if c.change == "earlier")
            if earlier:
                out.append(LayerChange(label, earlier))
        below = engine
    return out
