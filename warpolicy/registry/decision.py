"""The values a decision is made of and reported as: `Context` (what is decided for),
`Reason` and `Decision` (the policy and what moved it), `Explanation` (everything that was
considered), and the ids of the built-in reasons. Plain frozen records; the engine fills them.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Union

import attrs

from warpolicy.registry.model import Flag, Gate, Origin, SpecAlgorithm
from warpolicy.registry.vocabulary import ForwardMode, Placement, WarReadDonePolicy

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

#: The operator's kill switch. Built in: it works with any registry, and a registry or plugin can
#: add environment names to it (by declaring the flag) but never remove these.
FORCE_COARSE = Flag(
    "force_coarse",
    False,
    ("WARPOLICY_FORCE_COARSE", "SGLANG_FORCE_COARSE_WAR_BARRIER"),
    doc="Always use the coarse barrier; built into the engine.",
    origin=Origin(BUILT_IN),
)


def _mode(value: Union[str, ForwardMode]) -> ForwardMode:
    return ForwardMode.parse(value)


def _flag_dict(flags: Optional[Mapping[str, Union[bool, str]]]) -> dict[str, Union[bool, str]]:
    return dict(flags or {})


@attrs.frozen
class Context:
    """Everything a decision depends on besides the registry.

    ``flags`` holds overrides only; the engine fills the rest from declared defaults and the
    environment. Platform facts default to the fast path: CUDA with external events, a captured
    graph with the node planted.
    """

    backend: str
    mode: ForwardMode = attrs.field(converter=_mode)
    spec: str = "none"
    flags: Mapping[str, Union[bool, str]] = attrs.field(factory=dict, converter=_flag_dict)
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
        return {
            "id": self.id,
            "message": self.message,
            "policy": self.policy.label,
            "origin": self.origin,
        }


@attrs.frozen
class Decision:
    """A policy and the reasons that moved it (the declared read end always comes first)."""

    policy: WarReadDonePolicy
    context: Context
    reasons: tuple[Reason, ...] = ()

    def to_json(self) -> dict:
        return {
            "policy": self.policy.label,
            "backend": self.context.backend,
            "mode": self.context.mode.label,
            "spec": self.context.spec,
            "reasons": [r.to_json() for r in self.reasons],
        }


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
class Declaration:
    """One ``reads_end`` entry that took part in a decision."""

    backend: str  # the backend whose reads_end holds it
    policy: WarReadDonePolicy
    origin: str
    via: str  # how the evaluated backend reaches it: "own" or "inherited from NAME"


@attrs.frozen
class Declared:
    """What a backend declares for one mode, with everything that went into it.

    ``policy`` is the declaration alone (what a gate's ``declared:`` tests; no gate changes it).
    ``floor`` is where the decision starts: ``policy`` and the full decisions of the children the
    backend runs, so a wrapper is never earlier than a child.
    """

    policy: WarReadDonePolicy
    floor: WarReadDonePolicy
    origin: Optional[str]
    chain: tuple[str, ...]
    declarations: tuple[Declaration, ...]
    children: tuple[Explanation, ...]


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
    demotion: Optional[Reason] = None
    declarations: tuple[Declaration, ...] = ()
    force_coarse: Optional[Reason] = None
    placement: Placement = Placement.MARKER  # where a runner puts the node (top level only)

    @property
    def backend(self) -> str:
        return self.decision.context.backend

    @property
    def placement_text(self) -> str:
        """One line saying where the read-done node goes and, for derived, what that means."""
        if self.placement is Placement.DERIVED:
            return (
                "derived (the node is planted after the last shared reader found in the "
                "captured graph; see docs/derived-placement.md for what the walk cannot see)"
            )
        return "marker (the runner records the event right after graph_prep)"

    def to_json(self) -> dict:
        """A JSON-ready dict; a child seen earlier in the walk is ``{"backend", "see_above"}``."""
        out = self._json(set())
        out["placement"] = self.placement.value  # the runner's placement for this cell
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
                    }
                    for d in self.declarations
                ],
                "flags": {f.name: {"value": f.value, "source": f.source} for f in self.flags},
                "spec_family": self.spec.family,
                "spec_capabilities": dict(self.spec.capabilities),
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
