"""The values a decision is made of and reported as: `Context` (what is decided for, per-batch
facts included), `Reason` and `Decision` (the policy and what moved it), `BatchCase` (how a
decision varies with the batch's facts), `Explanation` (everything that was considered), and the
ids of the built-in reasons. Plain frozen records; the engine fills them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from warpolicy.registry.model import Flag, Gate, Origin, SpecAlgorithm
from warpolicy.registry.vocabulary import (
    FORCE_COARSE_ENV,
    FORCE_COARSE_NAME,
    FactType,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
    platform_key,
)

BUILT_IN = "built-in (warpolicy.registry.engine)"

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
#: Reason ids of per-batch requirements: ``after:ACTION`` (a declaration that holds only after
#: the action succeeded), ``route:FACT`` (how a router's per-batch choice was read).
AFTER_PREFIX = "after:"
ROUTE_PREFIX = "route:"

#: The operator's kill switch. Built in: it works with any registry, and a registry or plugin can
#: add environment names to it (by declaring the flag) but never remove these.
FORCE_COARSE = Flag(
    FORCE_COARSE_NAME,
    False,
    FORCE_COARSE_ENV,
    doc="Always use the coarse barrier; built into the engine.",
    origin=Origin(BUILT_IN),
)


def _mode(value: str | ForwardMode) -> ForwardMode:
    return ForwardMode.parse(value)


def _flag_dict(flags: Mapping[str, bool | str] | None) -> dict[str, bool | str]:
    return dict(flags or {})


def _fact_dict(facts: Mapping[str, object] | None) -> dict[str, object]:
    return dict(facts or {})


@attrs.frozen
class Context:
    """Everything a decision depends on besides the registry.

    ``flags`` holds overrides only; the engine fills the rest from declared defaults and the
    environment. Platform facts default to the fast path: CUDA with external events, a captured
    graph with the node planted. ``facts`` holds the batch's per-batch facts (name -> value);
    a fact left out is not reported, which fails closed (the later policy).
    """

    backend: str
    mode: ForwardMode = attrs.field(converter=_mode)
    spec: str = "none"
    flags: Mapping[str, bool | str] = attrs.field(factory=dict, converter=_flag_dict)
    platform: str = attrs.field(default="cuda", converter=platform_key)
    external_events: bool = True
    eager: bool = False
    planted: bool = True
    facts: Mapping[str, object] = attrs.field(factory=dict, converter=_fact_dict)


@attrs.frozen
class Reason:
    """One input that moved a decision (or, in an explanation, one that was considered)."""

    id: str
    message: str
    policy: WarReadDonePolicy
    origin: str | None = None

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "message": self.message,
            "policy": self.policy.label,
            "origin": self.origin,
        }


@attrs.frozen
class BatchCase:
    """The policy for the batches whose facts meet every condition of ``when`` (empty: any
    batch); one row of how a cell varies with per-batch facts."""

    policy: WarReadDonePolicy
    when: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return f"{self.policy.label} when {' and '.join(self.when) or 'any batch'}"

    def to_json(self) -> dict:
        return {"policy": self.policy.label, "when": list(self.when)}


@attrs.frozen
class Decision:
    """A policy and the reasons that moved it (the declared read end always comes first).

    ``cases`` (filled by `warpolicy.registry.engine.PolicyEngine.table` and ``explain``) says how
    the policy varies with the batch's per-batch facts; empty when none matters. ``policy`` is
    then the decision for the facts given, every other fact unknown.
    """

    policy: WarReadDonePolicy
    context: Context
    reasons: tuple[Reason, ...] = ()
    cases: tuple[BatchCase, ...] = ()

    def to_json(self) -> dict:
        out: dict[str, object] = {
            "policy": self.policy.label,
            "backend": self.context.backend,
            "mode": self.context.mode.label,
            "spec": self.context.spec,
            "reasons": [r.to_json() for r in self.reasons],
        }
        if self.context.facts:
            out["facts"] = {k: self.context.facts[k] for k in sorted(self.context.facts)}
        if self.cases:
            out["per_batch"] = [c.to_json() for c in self.cases]
        return out


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
class FactValue:
    """A per-batch fact a decision read, as the batch reported it."""

    name: str
    type: FactType
    text: str  # e.g. "num_qo_tokens is 20000", "prefill_staged did not succeed"


@attrs.frozen
class Declaration:
    """One ``reads_end`` entry that took part in a decision."""

    backend: str  # the backend whose reads_end holds it
    policy: WarReadDonePolicy
    origin: str
    via: str  # how the evaluated backend reaches it: "own" or "inherited from NAME"
    after: str | None = None  # the action it holds only after (None: unconditional)
    otherwise: WarReadDonePolicy | None = None  # its read end when the action did not succeed


@attrs.frozen
class Declared:
    """What a backend declares for one mode, with everything that went into it.

    ``policy`` is the declaration alone (what a gate's ``declared:`` tests; no gate changes it).
    ``floor`` is where the decision starts: ``policy`` and the full decisions of the children the
    backend runs, so a wrapper is never earlier than a child.
    """

    policy: WarReadDonePolicy
    floor: WarReadDonePolicy
    origin: str | None
    chain: tuple[str, ...]
    declarations: tuple[Declaration, ...]
    children: tuple[Explanation, ...]
    #: every value ``policy`` may take for some value of the facts left unknown (a router with
    #: no reported route may run any child); a gate's ``declared:`` holds if any does
    possible: frozenset[WarReadDonePolicy] = frozenset()
    #: reasons the batch's facts add (an action that did not succeed, a router's route)
    batch_reasons: tuple[Reason, ...] = ()


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
    demotion: Reason | None = None
    declarations: tuple[Declaration, ...] = ()
    force_coarse: Reason | None = None
    placement: Placement = Placement.MARKER  # where a runner puts the node (top level only)
    #: the per-batch facts this decision read (its children's included), as reported
    facts: tuple[FactValue, ...] = ()
    #: per buffer class the backend declares, where that class's reads end (top level only;
    #: empty when no declaration names a class: the cell is all there is)
    classes: tuple[tuple[str, Decision], ...] = ()

    @property
    def backend(self) -> str:
        return self.decision.context.backend

    @property
    def cases(self) -> tuple[BatchCase, ...]:
        return self.decision.cases

    def fact_lines(self) -> list[str]:
        """What a renderer shows about per-batch facts: each fact read, then each case."""
        lines = [f"fact {f.text}" for f in self.facts]
        lines += [f"per batch: {c.text}" for c in self.cases]
        return lines

    @property
    def placement_text(self) -> str:
        """One line saying where the read-done node goes and, for derived, what that means."""
        if self.placement is Placement.DERIVED:
            return (
                "derived (the node is planted after the last shared reader found in the "
                "captured graph; see docs/derived-placement.md for what the walk cannot see)"
            )
        return "marker (the runner records the event right after graph_prep)"

    def class_lines(self) -> list[str]:
        """One line per buffer class: where its reads end, and what moved it."""
        return [
            f"class {name}: {d.policy.label}"
            + (f" ({', '.join(r.id for r in d.reasons[1:])})" if len(d.reasons) > 1 else "")
            for name, d in self.classes
        ]

    def to_json(self) -> dict:
        """A JSON-ready dict; a child seen earlier in the walk is ``{"backend", "see_above"}``."""
        out = self._json(set())
        out["placement"] = self.placement.value  # the runner's placement for this cell
        if self.classes:
            out["classes"] = {name: d.to_json() for name, d in self.classes}
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
                        **(
                            {}
                            if d.after is None
                            else {
                                "after": d.after,
                                "otherwise": getattr(d.otherwise, "label", None),
                            }
                        ),
                    }
                    for d in self.declarations
                ],
                "flags": {f.name: {"value": f.value, "source": f.source} for f in self.flags},
                "spec_family": self.spec.family,
                "spec_capabilities": dict(self.spec.capabilities),
                "spec_capabilities_after": dict(self.spec.capabilities_after),
                "batch_facts": {f.name: {"type": f.type.label, "read": f.text} for f in self.facts},
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
