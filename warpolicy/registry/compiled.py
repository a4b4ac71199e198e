"""The per-step lookup: `CompiledPolicy`, resolved once per (backend, spec, flags, platform) by
`warpolicy.registry.engine.PolicyEngine.compile`, so a step is a dict or tuple index.

A cell whose decision depends on per-batch facts carries a `BatchRule`: the facts it reads, the
class of each (`warpolicy.registry.facts.FactClasses`) and the policy per combination of
classes, computed at compile time by the same engine. A batch then costs one classification per
fact it reads and one dict index; a fact that is not reported, or not valid, is unknown, and an
action that was not reported as succeeded did not succeed: both give the later policy.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

from warpolicy.registry.decision import BatchCase, Context, Decision, Reason
from warpolicy.registry.facts import ABSENT, FactClasses
from warpolicy.registry.vocabulary import NONE, FactType, ForwardMode, Placement, WarReadDonePolicy

#: ``explain(mode, eager, planted, facts) -> Decision``: the full decision behind a lookup.
Explain = Callable[[ForwardMode, bool, bool, Optional[Mapping[str, object]]], Decision]


class BatchRule:
    """How one cell's policy (one mode, eager, planted) depends on the batch's facts.

    ``facts``: the facts it reads, in key order; ``actions``: the ``action`` facts among them,
    the per-batch actions whose success can make this cell earlier (the runner performs exactly
    these, once per batch, before publishing); ``unknown``: the policy when nothing is reported;
    ``cases``: the policy per combination of fact classes, merged where a fact does not matter.
    Call it with the batch's facts (a mapping, or None) for the policy.
    """

    __slots__ = (
        "_by_class",
        "_classify",
        "_name",
        "_pairs",
        "actions",
        "cases",
        "classes",
        "facts",
        "table",
        "unknown",
    )

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
        self.cases = tuple(cases)
        self._pairs = tuple((c.fact.name, c.classify) for c in self.classes)
        single = len(self.classes) == 1
        self._name = self.facts[0] if single else ""
        self._classify = self.classes[0].classify if single else None
        self._by_class = (
            tuple(self.table[(i,)] for i in range(len(self.classes[0].labels))) if single else ()
        )

    def __call__(self, facts: Optional[Mapping[str, object]] = None) -> WarReadDonePolicy:
        if not facts:
            return self.unknown
        if self._classify is not None:
            return self._by_class[self._classify(facts.get(self._name, ABSENT))]
        return self.table[
            tuple(classify(facts.get(name, ABSENT)) for name, classify in self._pairs)
        ]

    def __repr__(self) -> str:
        return f"BatchRule(facts={self.facts}, unknown={self.unknown.label})"


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
        explain: Optional[Explain] = None,
        placement: Optional[Mapping[ForwardMode, Placement]] = None,
        rules: Optional[Mapping[ForwardMode, tuple[Optional[BatchRule], ...]]] = None,
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
        facts: Optional[Mapping[str, object]] = None,
    ) -> WarReadDonePolicy:
        """The policy for ``mode`` given the runner's facts and the batch's per-batch
        ``facts``; ``NONE`` for anything unknown."""
        row = self._table.get(mode)
        if row is None:
            return NONE
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
        return _ModeTable(
            {m: row[eager * 2 + planted] for m, row in self._table.items()}
        ).__getitem__

    def per_batch(
        self, eager: bool = False, planted: bool = True
    ) -> Callable[..., WarReadDonePolicy]:
        """The hot-path callable for a runner that reports per-batch facts:
        ``fn(mode, facts=None) -> policy``; modes that read no fact cost one dict index."""
        index = eager * 2 + planted
        constant = _ModeTable({m: row[index] for m, row in self._table.items()})
        rules = {m: r[index] for m, r in self._rules.items() if r[index] is not None}
        get_constant = constant.__getitem__
        if not rules:

            def step_without_facts(
                mode: ForwardMode, facts: Optional[Mapping[str, object]] = None
            ) -> WarReadDonePolicy:
                return get_constant(mode)

            return step_without_facts
        get_rule = rules.get

        def step(
            mode: ForwardMode, facts: Optional[Mapping[str, object]] = None
        ) -> WarReadDonePolicy:
            rule = get_rule(mode)
            if rule is None:
                return get_constant(mode)
            return rule(facts)

        return step

    def rule(
        self, mode: ForwardMode, eager: bool = False, planted: bool = True
    ) -> Optional[BatchRule]:
        """The batch rule of a cell, or None when its policy reads no per-batch fact."""
        rules = self._rules.get(ForwardMode.parse(mode))
        return None if rules is None else rules[eager * 2 + planted]

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
        facts: Optional[Mapping[str, object]] = None,
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


class _ModeTable(dict):
    """mode -> policy; a missing mode is NONE, so the lookup fails closed."""

    __slots__ = ()

    def __missing__(self, key: object) -> WarReadDonePolicy:
        return NONE
