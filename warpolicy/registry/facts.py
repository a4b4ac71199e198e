"""Per-batch facts: the values one batch reports, as the evaluation reads them, and the finite
classes a compiled lookup sorts any value into.

A fact that is not reported, or reported with a value that is not one of the fact's (an ``int``
fact given a bool, a ``name`` fact given a name outside its ``values``), is *unknown*, and every
test of an unknown fact holds: gates only make a decision later, so an unknown fact can only
make it later (fail closed). An ``action`` fact is never unknown: it succeeded only when the
runner reported ``True``; false, no report or an exception all mean it did not, and registries
may test an action only for ``false``, so success can only make a decision earlier.

Every test the registry makes of a fact splits its values into a few classes (an ``int`` fact
at its thresholds, a ``name`` fact at the names tested, a ``bool`` fact at true / false), plus
unknown. A decision depends on a fact only through its class, so the engine evaluates one
representative value per class (`FactClasses.probes`) and a compiled lookup classifies a
reported value with `FactClasses.classify` before one table index.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import attrs

from warpolicy.errors import InputError, UnknownNameError
from warpolicy.registry.inputs import parse_bool
from warpolicy.registry.model import Fact, FactTest, Registry, fact_value_ok
from warpolicy.registry.vocabulary import FactType

#: An outcome `simplify` groups by (a policy; anything hashable and ordered).
Outcome = TypeVar("Outcome", bound=int)


class _Absent:
    """The probe of the unknown class: a fact that is not reported."""

    def __repr__(self) -> str:
        return "<not reported>"


ABSENT = _Absent()
#: The label of the unknown class.
UNKNOWN_LABEL = "unknown"


class BatchFacts:
    """One batch's facts as an evaluation reads them; records which facts were read, so the
    engine knows which facts a decision depends on."""

    __slots__ = ("declared", "given", "read")

    def __init__(self, declared: Mapping[str, Fact], given: Mapping[str, object]) -> None:
        self.declared = declared
        self.given = given
        self.read: set[str] = set()

    def value(self, name: str) -> tuple[bool, object]:
        """``(True, value)`` for a valid reported value, else ``(False, None)``: unknown."""
        self.read.add(name)
        value = self.given.get(name, ABSENT)
        fact = self.declared.get(name)
        if value is ABSENT or fact is None or not fact_value_ok(fact, value):
            return False, None
        return True, value

    def succeeded(self, action: str) -> bool:
        """Whether the per-batch action reported success (``True``); anything else is not."""
        self.read.add(action)
        return self.given.get(action, ABSENT) is True

    def describe(self, name: str) -> str:
        """The fact as reported, for explanations."""
        value = self.given.get(name, ABSENT)
        fact = self.declared.get(name)
        if fact is not None and fact.type is FactType.ACTION:
            return f"{name} {'succeeded' if value is True else 'did not succeed'}"
        if value is ABSENT:
            return f"{name} is not reported"
        if fact is None or not fact_value_ok(fact, value):
            return f"{name}={value!r} is not a value of the fact, so unknown"
        return f"{name} is {_show(value)}"


def passes(facts: BatchFacts, name: str, test: FactTest) -> tuple[bool, str]:
    """Whether ``test`` of fact ``name`` holds for the batch, and why (fail closed)."""
    fact = facts.declared.get(name)
    if fact is not None and fact.type is FactType.ACTION:
        done = facts.succeeded(name)
        return (test.equals is done), facts.describe(name)
    known, value = facts.value(name)
    if not known:
        return True, f"{facts.describe(name)}: assumed to hold (fail closed)"
    return test.holds(value), facts.describe(name)


def check_facts(declared: Mapping[str, Fact], given: Mapping[str, object]) -> None:
    """Refuse a fact name the registry does not declare (close matches) or a value of the wrong
    type (`UnknownNameError`, `InputError`): what ``explain`` and ``query`` are given must be
    right; the compiled per-step lookup instead treats both as unknown."""
    for name, value in given.items():
        fact = declared.get(name)
        if fact is None:
            raise UnknownNameError("fact", name, declared)
        if fact.type is FactType.ACTION:
            if type(value) is not bool:
                raise InputError(f"fact {name}={value!r}: an action reports true or false")
        elif not fact_value_ok(fact, value):
            expected = {
                FactType.INT: "an integer",
                FactType.BOOL: "true or false",
                FactType.NAME: "a name"
                + (f" among {', '.join(sorted(fact.values))}" if fact.values else ""),
            }[fact.type]
            raise InputError(f"fact {name}={value!r}: expected {expected}")


def parse_fact_value(fact: Fact, text: str) -> object:
    """A fact value from command-line text (``--fact NAME=VALUE``): an integer for ``int``
    facts, a boolean word for ``bool`` and ``action`` facts, the text for ``name`` facts."""
    if fact.type is FactType.INT:
        try:
            return int(text.strip())
        except ValueError:
            raise InputError(f"fact {fact.name}={text!r}: expected an integer") from None
    if fact.type is FactType.NAME:
        return text.strip()
    return parse_bool(text, f"fact {fact.name}")


def _show(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# -- classes ------------------------------------------------------------------------------------


@attrs.frozen
class FactClasses:
    """The classes one fact's values fall into, given every test the registry makes of it.

    ``labels[i]`` and ``probes[i]`` describe class ``i``; the last class of a ``bool``, ``int``
    or ``name`` fact is unknown (probe `ABSENT`); an ``action`` fact has two classes,
    succeeded and not (probe `ABSENT`).
    """

    fact: Fact
    labels: tuple[str, ...]
    probes: tuple[object, ...]
    cuts: tuple[int, ...] = ()  # int facts: class i holds cuts[i-1] <= value < cuts[i]
    names: tuple[str, ...] = ()  # name facts: class i is names[i]; then "other"

    @property
    def unknown(self) -> int:
        """The class of a value that is not reported (or not a value of the fact)."""
        return len(self.labels) - 1

    def classify(self, value: object) -> int:
        """The class of ``value`` (anything that is not a valid value is unknown)."""
        kind = self.fact.type
        if kind is FactType.ACTION:
            return 0 if value is True else 1
        if kind is FactType.BOOL:
            return 0 if value is True else 1 if value is False else 2
        if kind is FactType.INT:
            if type(value) is not int:
                return self.unknown
            return bisect.bisect_right(self.cuts, value)
        if type(value) is not str or not fact_value_ok(self.fact, value):
            return self.unknown
        try:
            return self.names.index(value)
        except ValueError:
            return len(self.names)  # "other": valid, but tested nowhere


def fact_classes(fact: Fact, tests: Iterable[FactTest], labels: Iterable[str] = ()) -> FactClasses:
    """The classes of ``fact`` given ``tests`` of it and extra ``labels`` (route labels)."""
    name = fact.name
    kind = fact.type
    if kind is FactType.ACTION:
        return FactClasses(fact, (f"{name} succeeded", f"{name} did not succeed"), (True, ABSENT))
    if kind is FactType.BOOL:
        return FactClasses(
            fact, (f"{name} is true", f"{name} is false", f"{name} {UNKNOWN_LABEL}"),
            (True, False, ABSENT),
        )  # fmt: skip
    if kind is FactType.INT:
        cuts: set[int] = set()
        for test in tests:
            for op, n in test.compare:
                cuts.update({"gt": (n + 1,), "ge": (n,), "lt": (n,), "le": (n + 1,)}.get(op, ()))
                if op == "eq":
                    cuts.update((n, n + 1))
        ordered = tuple(sorted(cuts))
        texts, probes = _intervals(name, ordered)
        return FactClasses(
            fact, (*texts, f"{name} {UNKNOWN_LABEL}"), (*probes, ABSENT), cuts=ordered
        )
    names: set[str] = set(labels)
    for test in tests:
        names |= set(test.names or ())
    if fact.values is not None:
        names &= fact.values
    ordered_names = tuple(sorted(names))
    texts = [f"{name} is {n}" for n in ordered_names]
    probes_n: list[object] = list(ordered_names)
    others = None if fact.values is None else sorted(fact.values - names)
    if others is None or others:  # some valid value is tested nowhere
        texts.append(f"{name} is another name")
        probes_n.append(others[0] if others else _other_name(names))
    return FactClasses(
        fact,
        (*texts, f"{name} {UNKNOWN_LABEL}"),
        (*probes_n, ABSENT),
        names=ordered_names,
    )


def _other_name(taken: set[str]) -> str:
    candidate = "other"
    while candidate in taken:
        candidate += "_"
    return candidate


def _intervals(name: str, cuts: Sequence[int]) -> tuple[list[str], list[int]]:
    """Labels and a probe per interval between ``cuts`` (``value < cuts[0]``, ...)."""
    if not cuts:
        return [f"{name} is any integer"], [0]
    texts = [f"{name} <= {cuts[0] - 1}"]
    probes = [cuts[0] - 1]
    for low, high in itertools.pairwise(cuts):
        texts.append(f"{name} = {low}" if high == low + 1 else f"{low} <= {name} <= {high - 1}")
        probes.append(low)
    texts.append(f"{name} >= {cuts[-1]}")
    probes.append(cuts[-1])
    return texts, probes


def joint_classes(name: str, sides: Sequence[FactClasses]) -> tuple[tuple[str, object], ...]:
    """One ``(label, value)`` per class of the union of ``sides`` (each registry's, or each
    rule's, `FactClasses` of fact ``name``; `ABSENT`: not reported). The union refines every
    side's classes, so every value a batch may report falls in the class of exactly one of
    these on every side (a value outside a side's fact is unknown there)."""
    out: dict[tuple[type, object], tuple[str, object]] = {}

    def add(label: str, value: object) -> None:
        out.setdefault((type(value), value), (label, value))

    ints = [s for s in sides if s.fact.type is FactType.INT]
    if ints:  # the intervals between every side's cuts
        cuts = sorted({c for s in ints for c in s.cuts})
        merged = fact_classes(ints[0].fact, [FactTest(compare=(("ge", c),)) for c in cuts])
        for label, value in zip(merged.labels, merged.probes):
            if value is not ABSENT:
                add(label, value)
    names = [s for s in sides if s.fact.type is FactType.NAME]
    if names:  # each name some side tests, routes by or lists, and one no side knows
        known = {n for s in names for n in s.names}
        known |= {n for s in names if s.fact.values is not None for n in s.fact.values}
        for value in sorted(known):
            add(f"{name} is {value}", value)
        if any(s.fact.values is None for s in names):
            add(f"{name} is another name", _other_name(known))
    for classes in sides:  # bool and action facts: true and false
        if classes.fact.type in (FactType.BOOL, FactType.ACTION):
            for label, value in zip(classes.labels, classes.probes):
                if value is True:
                    add(label, value)
            if classes.fact.type is FactType.BOOL:
                add(f"{name} is false", False)
    if all(s.fact.type is FactType.ACTION for s in sides):
        add(f"{name} did not succeed", False)  # an action is never unknown
    else:
        add(f"{name} not reported", ABSENT)
    return tuple(out.values())


def registry_fact_classes(registry: Registry) -> dict[str, FactClasses]:
    """`FactClasses` for every declared fact, from every test the registry makes of it."""
    tests: dict[str, list[FactTest]] = {}
    labels: dict[str, set[str]] = {}
    scoped = [g for b in registry.backends.values() for g in b.gates]
    for gate in list(registry.gates) + scoped:
        for name, test in gate.when.facts.items():
            tests.setdefault(name, []).append(test)
    for backend in registry.backends.values():
        if backend.routes is not None:
            labels.setdefault(backend.routes.fact, set()).update(backend.routes.children)
    return {
        name: fact_classes(fact, tests.get(name, ()), labels.get(name, ()))
        for name, fact in registry.facts.items()
    }


# -- cases -------------------------------------------------------------------------------------


def simplify(
    rows: Sequence[tuple[tuple[int, ...], Outcome]], sizes: Sequence[int]
) -> list[tuple[tuple[int | None, ...], Outcome]]:
    """The assignments of classes (one class per fact, ``sizes[i]`` classes for fact ``i``) as
    few conditions per outcome as a greedy pass finds: each assignment is widened fact by fact
    (``None``: any class) while every assignment it then covers has the same outcome, then
    duplicates and conditions inside a wider one of the same outcome are dropped. Conditions
    of one outcome may overlap; conditions of different outcomes never do. Sorted by outcome,
    then by class."""
    table = dict(rows)
    cubes: set[tuple[tuple[int | None, ...], Outcome]] = set()
    for key, outcome in rows:
        cube: list[int | None] = list(key)
        for index in range(len(sizes)):
            trial = cube[:index] + [None] + cube[index + 1 :]
            if all(table.get(k) == outcome for k in _covered(trial, sizes)):
                cube = trial
        cubes.add((tuple(cube), outcome))
    kept = [
        (cube, outcome)
        for cube, outcome in cubes
        if not any(
            other != cube and same == outcome and _inside(cube, other) for other, same in cubes
        )
    ]
    return sorted(kept, key=lambda item: (item[1], tuple(-1 if c is None else c for c in item[0])))


def _covered(cube: Sequence[int | None], sizes: Sequence[int]) -> Iterable[tuple[int, ...]]:
    return itertools.product(*(range(size) if c is None else (c,) for c, size in zip(cube, sizes)))


def _inside(cube: Sequence[int | None], other: Sequence[int | None]) -> bool:
    """Whether every assignment of ``cube`` is one of ``other``'s."""
    return all(o is None or o == c for c, o in zip(cube, other))
