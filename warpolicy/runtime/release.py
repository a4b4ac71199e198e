"""One release decision per bucket, made once at capture from verified facts.

The step path reads nothing else: a `BucketRelease` says what every step of one captured bucket
(or of the eager path) publishes, and the event its graph records. It is decided by
`decide_bucket` from

* `ModePolicies`: the runner's policy for its mode, asked **once** per capture for each set of
  facts a bucket can end with (a graph with a confirmed node, a graph without one, no graph),
  by `resolve_policies`; a lookup that fails makes every answer ``NONE``;
* `BucketFacts`: what the capture verifiably did: the event the graph records when the node was
  planted and (where it can be) checked and the graph instantiated; or a verified refutation
  (a late reader, no readers found, no external events): the unplanted answer; or a *doubt*
  (anything raised or could not be confirmed): the bucket publishes nothing (coarse).

`ReadDone` is what the scheduler takes from the fence: the event, the policy it marks, the
fence's name, and the `EventSlot` that tracks whether a barrier may still wait on that event.
Records are built once (per bucket for ``in_graph``, per ring slot for host-recorded events) and
handed out on every step; ``read_done.step`` is the step of the event's latest publish, which is
the record a wait binds to.

An engine that owns its capture uses the same functions the runners use: `resolve_policies`,
`decide_bucket`, then `ReadDoneFence.before_replay(release)` / ``after_replay(release)``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    NOTHING,
    PRE_REPLAY,
    ForwardMode,
    WarReadDonePolicy,
)
from warpolicy.runtime.platforms import EventHandle
from warpolicy.runtime.policy import PolicyFn, policy_answer, sound


class EventSlot:
    """An event the fence hands out: the step of its latest publish, and whether the scheduler
    took a read-done of it that no barrier has waited on yet (``taken``): such an event must not
    be recorded again from the host, or the pending wait would bind to the new record."""

    __slots__ = ("event", "step", "taken")

    def __init__(self, event: EventHandle) -> None:
        self.event = event
        self.step = 0
        self.taken = False

    def __repr__(self) -> str:
        return f"EventSlot({self.event!r}, step={self.step}, taken={self.taken})"


@attrs.frozen(eq=False)
class ReadDone:
    """What the scheduler takes for one step: wait on ``event`` (the release point ``policy``)."""

    event: EventHandle
    policy: WarReadDonePolicy
    #: the publishing fence's (runner's) name
    source: str
    slot: EventSlot = attrs.field(repr=False)

    @property
    def step(self) -> int:
        """The step of this event's latest publish (the record a wait binds to)."""
        return self.slot.step

    def discard(self) -> None:
        """The scheduler will not wait on this read-done (it synchronized the host, or drops
        the step): its event may be recorded again. A taken read-done must be waited on
        through a `SchedulerBarrier` or discarded; otherwise its ring event stays reserved,
        and once every ring event is, host-recorded steps publish nothing (coarse)."""
        self.slot.taken = False


@attrs.frozen
class ModePolicies:
    """A runner's policy for one mode, each fact set asked once (`resolve_policies`)."""

    mode: ForwardMode
    #: a captured graph whose node was planted and confirmed
    planted: WarReadDonePolicy
    #: a captured graph without a confirmed node
    unplanted: WarReadDonePolicy
    #: no graph (an eager step)
    eager: WarReadDonePolicy
    #: why every answer is ``NONE`` (the lookup failed), else None
    failure: str | None = None
    #: the exception the lookup raised (for the fallback observers), else None
    error: Exception | None = attrs.field(default=None, eq=False)
    #: every answer was ``NOTHING``: the policy declares that this mode reads no
    #: scheduler-shared state (the answers above are then ``PRE_REPLAY``, what it publishes)
    reads_nothing: bool = False

    def __attrs_post_init__(self) -> None:
        if NOTHING in (self.planted, self.unplanted, self.eager):
            raise ValueError("answers are release points: NOTHING publishes at PRE_REPLAY (sound)")
        if self.reads_nothing and self.failure is not None:
            raise ValueError("a failed lookup is unknown (a reader), never reads_nothing")

    @property
    def reads_shared_state(self) -> bool:
        """Whether this mode may read shared state: unless the policy explicitly answered
        ``NOTHING`` for every fact set, it does (``NONE`` is unknown, and a failed lookup too)."""
        return not self.reads_nothing

    @classmethod
    def coarse(
        cls, mode: ForwardMode, failure: str, error: Exception | None = None
    ) -> ModePolicies:
        """Every answer ``NONE``, saying why."""
        return cls(mode, NONE, NONE, NONE, failure, error)


def resolve_policies(policy: PolicyFn, mode: ForwardMode) -> ModePolicies:
    """Ask ``policy`` once for each fact set a bucket of ``mode`` can end with, through `sound`.

    Any exception, or an answer that is not a `WarReadDonePolicy` (a bool, a float, an int:
    `policy_answer`), makes every answer ``NONE`` with the failure recorded: no answer is ever
    asked again, so a lookup that fails once cannot be read as a different answer later.
    ``BaseException`` propagates (the capture is abandoned). ``reads_nothing`` holds only when
    every answer is ``NOTHING``.
    """
    try:
        answers = (
            policy_answer(policy(mode, False, True)),
            policy_answer(policy(mode, False, False)),
            policy_answer(policy(mode, True, False)),
        )
    except Exception as exc:  # noqa: BLE001 - any failure means coarse, never earlier
        return ModePolicies.coarse(mode, f"policy lookup failed ({exc!r})", exc)
    planted, unplanted, eager = answers
    return ModePolicies(
        mode,
        sound(planted, False, True),
        sound(unplanted, False, False),
        sound(eager, True, False),
        reads_nothing=all(answer is NOTHING for answer in answers),
    )


@attrs.frozen(eq=False)
class BucketRelease:
    """What every step of one bucket publishes: decided once, immutable, read by the step path.

    ``bucket`` None is the eager path. ``event`` is the read-done event this bucket's graph
    records, present exactly when ``policy`` is ``IN_GRAPH``; ``read_done`` is the record an
    ``IN_GRAPH`` step hands out (built once). ``reason`` says in one line why this policy.
    """

    source: str
    bucket: int | None
    policy: WarReadDonePolicy
    event: EventHandle | None = None
    reason: str = ""
    read_done: ReadDone | None = attrs.field(init=False, default=None)
    #: per buffer class, the release of the scheduler's writes to it (`decide_classes`;
    #: classes whose reads end together share one release, so one event); empty: one event
    classes: Mapping[str, BucketRelease] = attrs.field(factory=dict, repr=False)
    #: the distinct class releases earlier than ``policy`` (what a step publishes besides it)
    early: tuple[BucketRelease, ...] = attrs.field(init=False, default=(), repr=False)
    #: whether a step records a ring event before its replay: the bucket's own ``pre_replay``,
    #: or an earlier class's (decided here once: `ReadDoneFence.before_replay` reads one field)
    records_pre_replay: bool = attrs.field(init=False, default=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if (self.policy is IN_GRAPH) != (self.event is not None):
            raise ValueError(
                f"{self.source} bucket {self.bucket}: an in_graph release needs the event its "
                f"graph records, and only an in_graph release has one (policy "
                f"{self.policy.label}, event {self.event!r})"
            )
        if self.policy is IN_GRAPH:
            record = ReadDone(self.event, IN_GRAPH, self.source, EventSlot(self.event))
            object.__setattr__(self, "read_done", record)
        if self.classes:
            late = [c for c in self.classes.values() if c.policy > self.policy]
            if late:
                raise ValueError(
                    f"{self.source} bucket {self.bucket}: a class release ({late[0].policy.label})"
                    f" is later than the bucket's ({self.policy.label}); the bucket's is their "
                    "latest"
                )
            early = {id(c): c for c in self.classes.values() if c.policy < self.policy}
            object.__setattr__(self, "early", tuple(early.values()))
        pre = self.policy is PRE_REPLAY or any(c.policy is PRE_REPLAY for c in self.early)
        object.__setattr__(self, "records_pre_replay", pre)

    @property
    def planted(self) -> bool:
        """Whether steps hand out the event this bucket's graph records (``IN_GRAPH``)."""
        return self.event is not None


@attrs.frozen
class BucketFacts:
    """What the capture of one bucket verifiably did.

    ``event``: the read-done event the graph records, when the node was planted, confirmed and
    (where it can be) checked, and the graph instantiated; else None. ``doubt``: one line when
    anything raised or could not be confirmed (the bucket is then coarse). ``refuted``: one line
    when a fact was verified false (a late reader, no reader found, no external events): the
    bucket gets the unplanted answer.
    """

    bucket: int | None
    event: EventHandle | None = None
    doubt: str | None = None
    refuted: str | None = None


def decide_bucket(policies: ModePolicies, facts: BucketFacts, source: str) -> BucketRelease:
    """The one release decision of a bucket (or, with ``facts.bucket`` None, of the eager path).

    Doubt is coarse (``NONE``); a failed policy lookup is coarse; otherwise the answer for the
    verified facts, and the event only when that answer is ``IN_GRAPH``.
    """
    if facts.doubt is not None:
        return BucketRelease(source, facts.bucket, NONE, reason=facts.doubt)
    if policies.failure is not None:
        return BucketRelease(source, facts.bucket, NONE, reason=policies.failure)
    if facts.bucket is None:
        return BucketRelease(source, None, policies.eager, reason="eager step (no graph)")
    if facts.event is None:
        why = facts.refuted or "no read-done node in the graph"
        return BucketRelease(source, facts.bucket, policies.unplanted, reason=why)
    policy = policies.planted
    if policy is IN_GRAPH:
        return BucketRelease(
            source, facts.bucket, IN_GRAPH, facts.event, reason="node planted and confirmed"
        )
    return BucketRelease(source, facts.bucket, policy, reason="the policy for a planted graph")


def decide_classes(
    policies: Mapping[str, ModePolicies], facts: BucketFacts, source: str
) -> dict[str, BucketRelease]:
    """Per buffer class, the release `decide_bucket` makes from the same verified facts;
    classes that decide the same policy share one `BucketRelease` (one event a step)."""
    shared: dict[WarReadDonePolicy, BucketRelease] = {}
    out: dict[str, BucketRelease] = {}
    for name, class_policies in policies.items():
        release = decide_bucket(class_policies, facts, source)
        out[name] = shared.setdefault(release.policy, release)
    return out


def with_classes(release: BucketRelease, classes: Mapping[str, BucketRelease]) -> BucketRelease:
    """``release`` publishing ``classes`` too; a class release later than the bucket's (the
    bucket's must be their latest) makes the bucket and every class coarse: never an earlier
    release."""
    if not classes:
        return release
    if any(c.policy > release.policy for c in classes.values()):
        why = "a buffer class decided later than its bucket: every class coarse"
        coarse = BucketRelease(release.source, release.bucket, NONE, reason=why)
        return attrs.evolve(coarse, classes={name: coarse for name in classes})
    return attrs.evolve(release, classes=dict(classes))


def class_policy_fns(
    classes: Mapping[str, WarReadDonePolicy],
) -> tuple[PolicyFn, dict[str, PolicyFn]]:
    """Fixed per-class policies (soundly demoted) and the cell's (their latest) as policy
    callables: for benchmarks, examples and tests."""

    def fixed(policy: WarReadDonePolicy) -> PolicyFn:
        def lookup(
            mode: ForwardMode, eager: bool = False, planted: bool = True
        ) -> WarReadDonePolicy:
            return sound(policy, eager, planted)

        lookup.__name__ = f"fixed_{policy.label}"
        return lookup

    cell = fixed(max(classes.values(), default=NONE))
    return cell, {name: fixed(policy) for name, policy in classes.items()}


def coarse_release(source: str, reason: str) -> BucketRelease:
    """A release that publishes nothing (the scheduler waits for the whole forward stream)."""
    return BucketRelease(source, None, NONE, reason=reason)


def demote_release(release: BucketRelease, reason: str) -> BucketRelease:
    """The coarse (``NONE``) release that replaces ``release`` once a bucket must publish
    nothing for the rest of the process (the WAR canary caught an early release there).

    A new record: ``release`` itself is never changed (steps already holding it are unaffected;
    the holder swaps its reference, e.g. `GraphRunner.demote`)."""
    return BucketRelease(release.source, release.bucket, NONE, reason=reason)


__all__ = [
    "BucketFacts",
    "BucketRelease",
    "EventSlot",
    "ModePolicies",
    "ReadDone",
    "class_policy_fns",
    "coarse_release",
    "decide_classes",
    "decide_bucket",
    "demote_release",
    "resolve_policies",
    "with_classes",
]
