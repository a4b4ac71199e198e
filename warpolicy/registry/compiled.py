"""The per-step lookup: `CompiledPolicy`, resolved once per (backend, spec, flags, platform) by
`warpolicy.registry.engine.PolicyEngine.compile`, so a step is a dict or tuple index.

A cell whose decision depends on per-batch facts carries a `BatchRule`: the facts it reads, the
class of each (`warpolicy.registry.facts.FactClasses`) and the policy per combination of
classes, computed at compile time by the same engine. A batch then costs one classification per
fact it reads and one dict index; a fact that is not reported, or not valid, is unknown, and an
action that was not reported as succeeded did not succeed: both give the later policy.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence

from warpolicy.errors import InputError
from warpolicy.registry.decision import BatchCase, Context, Decision, Reason
from warpolicy.registry.facts import ABSENT, FactClasses
from warpolicy.registry.vocabulary import NONE, FactType, ForwardMode, Placement, WarReadDonePolicy

#: ``explain(mode, eager, planted, facts) -> Decision``: the full decision behind a lookup.
Explain = Callable[[ForwardMode, bool, bool, Mapping[str, object] | None], Decision]


class BatchRule:
    """How one cell's policy (one mode, eager, planted) depends on the batch's facts.

    ``facts``: the facts it reads, in key order; ``actions``: the ``action`` facts among them,
    the per-batch actions whose success can make this cell earlier (the runner performs exactly
    these, once per batch, before publishing); ``unknown``: the policy when nothing is reported;
    ``cases``: the policy per combination of fact classes, merged where a fact does not matter;
    ``earliest``: the earliest policy of any combination.
    Call it with the batch's facts (a mapping, or None) for the policy; ``fast`` is the same
    callable without this object's frame (what `CompiledPolicy.per_batch` hands out).
    """

    __slots__ = ("actions", "cases", "classes", "earliest", "facts", "fast", "table", "unknown")

    def __init__(
        self,
        classes: Sequence[FactClasses],
        table: Mapping[tuple[int, ...], WarReadDonePolicy],
        cases: Sequence[BatchCase] = (),
    ) -> None:
        self.classes = tuple(classes)
        self.facts = tuple(c.fact.name for c in self.classes)
        self.actions = tuple(c.fact.name for c in self.classes if c.fact.type is FactType.ACTION)
        self.table = dict(table)
        self.unknown = self.table[tuple(c.classify(ABSENT) for c in self.classes)]
        #: the earliest policy any batch can get (a runner captures for it, then publishes
        #: ``max(release, rule(facts))`` per batch)
        self.earliest = min(self.table.values())
        self.cases = tuple(cases)
        self.fast = _fast_rule(self.classes, self.table, self.unknown)

    def __call__(self, facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
        return self.fast(facts)

    def __repr__(self) -> str:
        return f"BatchRule(facts={self.facts}, unknown={self.unknown.label})"


_Rule = Callable[[Mapping[str, object] | None], WarReadDonePolicy]


def _classifier(classes: FactClasses) -> Callable[[object], int]:
    """`FactClasses.classify` as a closure specialised for the fact's type (no attribute
    reads per call)."""
    kind = classes.fact.type
    unknown = classes.unknown
    if kind is FactType.ACTION:

        def classify_action(value: object) -> int:
            return 0 if value is True else 1

        return classify_action
    if kind is FactType.BOOL:

        def classify_bool(value: object) -> int:
            return 0 if value is True else 1 if value is False else 2

        return classify_bool
    if kind is FactType.INT:
        cuts = classes.cuts
        find = bisect.bisect_right

        def classify_int(value: object) -> int:
            return find(cuts, value) if type(value) is int else unknown

        return classify_int
    index = {name: i for i, name in enumerate(classes.names)}
    other = len(classes.names)  # "another name", or unknown when every value is tested
    allowed = classes.fact.values
    get = index.get

    def classify_name(value: object) -> int:
        if type(value) is not str or (allowed is not None and value not in allowed):
            return unknown
        return get(value, other)

    return classify_name


def _fast_rule(
    classes: Sequence[FactClasses],
    table: Mapping[tuple[int, ...], WarReadDonePolicy],
    unknown: WarReadDonePolicy,
) -> _Rule:
    """The rule as one closure: one classification per fact, then nested tuple indexes. The
    shapes registries use (one fact; two facts of which one is an action) classify inline, with
    no further call; an action indexes a pair by ``reported is True``."""
    if len(classes) == 1:
        return _one_fact(classes[0], table)
    kinds = [c.fact.type for c in classes]
    if len(classes) == 2 and FactType.ACTION in kinds:
        if kinds[1] is not FactType.ACTION:  # the action second: transpose
            classes = [classes[1], classes[0]]
            table = {(j, i): p for (i, j), p in table.items()}
        return _fact_and_action(classes[0], classes[1].fact.name, table)
    names = [c.fact.name for c in classes]
    classify = [_classifier(c) for c in classes]
    if len(classes) == 2:
        (name0, name1), (first, second) = names, classify
        sizes = [len(c.labels) for c in classes]
        nested = tuple(tuple(table[(i, j)] for j in range(sizes[1])) for i in range(sizes[0]))

        def two_facts(facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
            if not facts:
                return unknown
            return nested[first(facts.get(name0, ABSENT))][second(facts.get(name1, ABSENT))]

        return two_facts
    pairs = tuple(zip(names, classify))

    def many_facts(facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
        if not facts:
            return unknown
        return table[tuple([c(facts.get(n, ABSENT)) for n, c in pairs])]

    return many_facts


def _one_fact(classes: FactClasses, table: Mapping[tuple[int, ...], WarReadDonePolicy]) -> _Rule:
    name = classes.fact.name
    by_class = tuple(table[(i,)] for i in range(len(classes.labels)))
    unknown = by_class[classes.unknown]
    kind = classes.fact.type
    if kind is FactType.ACTION:
        pair = (by_class[1], by_class[0])  # indexed by "succeeded"

        def one_action(
            facts: Mapping[str, object] | None = None, _pair: tuple = pair
        ) -> WarReadDonePolicy:
            if not facts:
                return unknown
            return _pair[facts.get(name) is True]

        return one_action
    if kind is FactType.INT:
        cuts = classes.cuts
        find = bisect.bisect_right

        def one_int(facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
            if not facts:
                return unknown
            value = facts.get(name)
            return by_class[find(cuts, value)] if type(value) is int else unknown

        return one_int
    classify = _classifier(classes)

    def one_fact(facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
        if not facts:
            return unknown
        return by_class[classify(facts.get(name, ABSENT))]

    return one_fact


def _fact_and_action(
    classes: FactClasses, action: str, table: Mapping[tuple[int, ...], WarReadDonePolicy]
) -> _Rule:
    """Two facts, the second an action: a pair per class of the first, indexed by whether the
    action succeeded."""
    name = classes.fact.name
    rows = tuple((table[(i, 1)], table[(i, 0)]) for i in range(len(classes.labels)))
    unknown_row = rows[classes.unknown]
    unknown = unknown_row[0]
    kind = classes.fact.type
    if kind is FactType.ACTION:
        by_first = (rows[1], rows[0])

        def two_actions(facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
            if not facts:
                return unknown
            return by_first[facts.get(name) is True][facts.get(action) is True]

        return two_actions
    if kind is FactType.INT:
        cuts = classes.cuts
        find = bisect.bisect_right

        def int_and_action(
            facts: Mapping[str, object] | None = None,
            _rows: tuple = rows,
            _find: Callable = find,
            _cuts: tuple[int, ...] = cuts,
        ) -> WarReadDonePolicy:
            if not facts:
                return unknown
            value = facts.get(name)
            row = _rows[_find(_cuts, value)] if type(value) is int else unknown_row
            return row[facts.get(action) is True]

        return int_and_action
    classify = _classifier(classes)

    def fact_and_action(facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
        if not facts:
            return unknown
        return rows[classify(facts.get(name, ABSENT))][facts.get(action) is True]

    return fact_and_action


class CompiledPolicy:
    """Per-step lookup for one (backend, spec, flags, platform).

    ``lookup(mode, eager, planted, facts=None)`` takes the runner's facts per call (a tuple
    index, plus the batch rule when per-batch facts are given); ``per_step(eager, planted)``
    resolves the runner's facts once and returns ``fn(mode)``; ``per_batch(eager, planted)``
    returns ``fn(mode, facts=None)`` for a runner that reports per-batch facts. Without facts
    every form gives the decision for a batch that reports none: the later policy.
    """

    __slots__ = ("_explain", "_placement", "_rules", "_table", "backend", "spec")

    def __init__(
        self,
        backend: str,
        spec: str,
        table: Mapping[ForwardMode, tuple[WarReadDonePolicy, ...]],
        explain: Explain | None = None,
        placement: Mapping[ForwardMode, Placement] | None = None,
        rules: Mapping[ForwardMode, tuple[BatchRule | None, ...]] | None = None,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self._table = dict(table)  # per mode: index ``eager * 2 + planted``
        self._explain = explain
        self._placement = dict(placement or {})
        self._rules = {m: r for m, r in (rules or {}).items() if any(x is not None for x in r)}

    def lookup(
        self,
        mode: ForwardMode,
        eager: bool = False,
        planted: bool = True,
        facts: Mapping[str, object] | None = None,
    ) -> WarReadDonePolicy:
        """The policy for ``mode`` given the runner's facts and the batch's per-batch
        ``facts``; ``NONE`` for anything unknown. ``eager`` and ``planted`` must be real
        booleans (`InputError` otherwise)."""
        row = self._table.get(mode)
        if row is None:
            return NONE
        if type(eager) is not bool or type(planted) is not bool:
            _refuse(eager, planted)
        index = eager * 2 + planted
        if facts:
            rules = self._rules.get(mode)
            if rules is not None:
                rule = rules[index]
                if rule is not None:
                    return rule(facts)
        return row[index]

    def per_step(
        self, eager: bool = False, planted: bool = True
    ) -> Callable[[ForwardMode], WarReadDonePolicy]:
        """The hot-path callable for a runner whose facts are known: ``fn(mode) -> policy``.

        It is a bound ``dict.__getitem__`` (no Python frame per call); unknown keys give
        ``NONE``; a cell that depends on per-batch facts gives its policy for a batch that
        reports none (use `per_batch` to pass them).
        """
        index = _fact_index(eager, planted)
        return _ModeTable({m: row[index] for m, row in self._table.items()}).__getitem__

    def per_batch(
        self, eager: bool = False, planted: bool = True
    ) -> Callable[..., WarReadDonePolicy]:
        """The hot-path callable for a runner that reports per-batch facts:
        ``fn(mode, facts=None) -> policy``; a mode that reads no fact costs one dict index, one
        that does a classification per fact it reads and a tuple index."""
        index = _fact_index(eager, planted)
        table: dict[object, WarReadDonePolicy] = {m: row[index] for m, row in self._table.items()}
        rules: dict[object, _Rule] = {}
        for mode, cell_rules in self._rules.items():
            rule = cell_rules[index]
            if rule is not None:
                rules[mode] = rule.fast

        # The lookups are bound as defaults (locals are read faster than closure cells), and a
        # mode is tested with ``in`` and read with ``[]`` (operators, no method call): together
        # most of this function's cost on the per-step path (`warpolicy bench decide`).
        def step(
            mode: ForwardMode,
            facts: Mapping[str, object] | None = None,
            _rules: dict[object, _Rule] = rules,
            _table: dict[object, WarReadDonePolicy] = table,
            _none: WarReadDonePolicy = NONE,
        ) -> WarReadDonePolicy:
            if mode in _rules:
                return _rules[mode](facts)
            try:
                return _table[mode]
            except KeyError:  # not a mode of the table: the coarse barrier
                return _none

        return step

    def rule(
        self, mode: ForwardMode, eager: bool = False, planted: bool = True
    ) -> BatchRule | None:
        """The batch rule of a cell, or None when its policy reads no per-batch fact."""
        index = _fact_index(eager, planted)
        rules = self._rules.get(ForwardMode.parse(mode))
        return None if rules is None else rules[index]

    def actions(
        self, mode: ForwardMode, eager: bool = False, planted: bool = True
    ) -> tuple[str, ...]:
        """The per-batch actions (``action`` facts) whose success can make this cell earlier:
        what a runner performs once per batch before it publishes (empty: none)."""
        rule = self.rule(mode, eager, planted)
        return () if rule is None else rule.actions

    def decision(
        self,
        mode: ForwardMode,
        eager: bool = False,
        planted: bool = True,
        facts: Mapping[str, object] | None = None,
    ) -> Decision:
        """The full `Decision` behind a lookup (for observers; not for the per-step path)."""
        mode = ForwardMode.parse(mode)
        if self._explain is not None:
            return self._explain(mode, eager, planted, facts)
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
        _refuse(eager, planted)
    return int(eager) * 2 + int(planted)  # type: ignore[call-overload]


def _refuse(eager: object, planted: object) -> None:
    raise InputError(f"eager and planted must be booleans, not {eager!r} and {planted!r}")


class _ModeTable(dict):
    """mode -> policy; a missing mode is NONE, so the lookup fails closed."""

    __slots__ = ()

    def __missing__(self, key: object) -> WarReadDonePolicy:
        return NONE
