"""The policy a runner takes, as named protocols mypy checks.

A runner (and the cross-rank check) accepts either a `PolicyTable` (an object with
``lookup(mode, eager, planted)``: `warpolicy.registry.engine.CompiledPolicy`,
`warpolicy.runtime.distributed.CoarsePolicy`, or your own) or a plain `PolicyFn` callable
``(mode, eager, planted) -> WarReadDonePolicy``. Two optional capabilities a policy object may
have: `ExplainedPolicy` (``decision(...)`` gives the reasons to observers) and `PlacedPolicy`
(``placement(mode)`` says where the read-done node goes). `NamedPolicy` carries the backend and
speculative algorithm it was compiled for (the cross-rank fingerprint compares them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from warpolicy.errors import InputError
from warpolicy.registry.decision import Decision
from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NOTHING,
    POST_REPLAY,
    PRE_REPLAY,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)

#: ``policy(mode, eager, planted) -> WarReadDonePolicy``: the plain-callable form.
PolicyFn = Callable[[ForwardMode, bool, bool], WarReadDonePolicy]


@runtime_checkable
class PolicyTable(Protocol):
    """A policy answered by lookup (what ``engine.compile(...)`` returns)."""

    def lookup(
        self, mode: ForwardMode, eager: bool = False, planted: bool = True
    ) -> WarReadDonePolicy:
        """The policy for ``mode`` given the runner's facts."""
        ...


@runtime_checkable
class ExplainedPolicy(Protocol):
    """A policy that can explain a lookup (observers receive the `Decision`)."""

    def decision(self, mode: ForwardMode, eager: bool = False, planted: bool = True) -> Decision:
        """The full decision behind ``lookup(mode, eager, planted)``."""
        ...


@runtime_checkable
class PlacedPolicy(Protocol):
    """A policy that says where a mode's read-done node is planted."""

    def placement(self, mode: ForwardMode) -> Placement:
        """``marker`` or ``derived`` for ``mode``."""
        ...


@runtime_checkable
class NamedPolicy(Protocol):
    """A policy compiled for one backend and speculative algorithm."""

    backend: str
    spec: str


#: What a runner accepts as its policy.
RunnerPolicy = PolicyTable | PolicyFn


def policy_answer(answer: object) -> WarReadDonePolicy:
    """``answer`` if it is a `WarReadDonePolicy`, else `TypeError`: a policy callable that
    answers anything else (``True``, ``0.0``, ``1``, a string) fails closed at its caller, never
    reads as the release point its number happens to equal."""
    if isinstance(answer, WarReadDonePolicy):
        return answer
    raise TypeError(
        f"a policy answered {answer!r} ({type(answer).__name__}), not a WarReadDonePolicy"
    )


def sound(policy: WarReadDonePolicy, eager: bool, planted: bool) -> WarReadDonePolicy:
    """The runtime's own safety net: ``IN_GRAPH`` without a planted node, or in an eager step, is
    at least ``POST_REPLAY`` (never ``PRE_REPLAY``: that is only sound for snapshotting
    backends). The engine already does this; a hand-written policy callable might not.

    ``NOTHING`` (the forward reads no scheduler-shared state) publishes at ``PRE_REPLAY``: the
    fence only ever sees release points."""
    if policy is NOTHING:
        return PRE_REPLAY
    if policy == IN_GRAPH and (eager or not planted):
        return POST_REPLAY
    return policy


def fixed_policy(policy: WarReadDonePolicy | str) -> PolicyFn:
    """A `PolicyFn` that answers ``policy`` for every mode (soundly demoted: `sound`), for
    benchmarks, examples and tests that fix the policy instead of asking the registry."""
    if not isinstance(policy, WarReadDonePolicy):
        policy = WarReadDonePolicy.parse(policy)
    answer = policy

    def lookup(mode: ForwardMode, eager: bool = False, planted: bool = True) -> WarReadDonePolicy:
        # ``nothing`` is an answer the runtime must see as is (a phase that reads nothing)
        return answer if answer is NOTHING else sound(answer, eager, planted)

    lookup.__name__ = f"fixed_{answer.label}"
    return lookup


def policy_function(policy: RunnerPolicy) -> PolicyFn:
    """The ``(mode, eager, planted)`` callable of ``policy``: its ``lookup`` for a
    `PolicyTable`, else the callable itself. Anything else is an `InputError` (one line)."""
    if isinstance(policy, PolicyTable):
        return policy.lookup
    if callable(policy):
        return policy
    raise InputError(
        f"policy must be a CompiledPolicy (or another object with lookup(mode, eager, planted)) "
        f"or a callable (mode, eager, planted) -> policy, not {type(policy).__name__}"
    )


__all__ = [
    "ExplainedPolicy",
    "NamedPolicy",
    "PlacedPolicy",
    "PolicyFn",
    "PolicyTable",
    "RunnerPolicy",
    "fixed_policy",
    "policy_answer",
    "policy_function",
    "sound",
]
