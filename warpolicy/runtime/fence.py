"""The runtime read-done fence: plant, publish, take (runner side) and the scheduler barrier.

Runner side, per bucket at capture time::

    fence.prepare()                 # persistent external event + one eager record (seed)
    with platform.capture(graph):
        graph_prep(); event = fence.plant(); forward()
    # keep ``event`` with the bucket: the event *this* graph records (None: not planted)

and per step::

    fence.before_replay(policy)     # PRE_REPLAY records a ring event here
    platform.replay(graph)
    fence.after_replay(policy, planted=event)   # IN_GRAPH hands out ``event``, POST_REPLAY records

Scheduler side, right after the launch::

    barrier.apply(schedule_stream, forward_stream, fence.take())

Failures never raise out of the fence: the step publishes nothing (so the scheduler takes the
coarse barrier), one warning per failing place, and a ``warpolicy_on_fallback`` notification.
An ``IN_GRAPH`` step whose graph has no confirmed node publishes as ``POST_REPLAY``.
Host-recorded events come from a ring so an event is never re-recorded while one of the last
``ring_size - 1`` steps may still be waited on (one shared event deadlocked two peer engines).

The per-step path is plain attribute work and the platform's own bound calls: no plugin
dispatch, no allocation beyond the one `ReadDone` tuple, observers only when registered.

Over 400 lines: the fence and the scheduler barrier share the `ReadDone` record and the
fail-closed rules; each slow path is spelled out next to its fast path.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, NamedTuple, Optional

from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, PRE_REPLAY, WarReadDonePolicy
from warpolicy.runtime.manager import ObserverCall, observers_of
from warpolicy.runtime.platform import Platform
from warpolicy.runtime.platforms import EventHandle, StreamHandle

#: Set to 1 to wrap publishes and barriers in torch profiler ranges (``warpolicy.publish``,
#: ``warpolicy.barrier``); off by default because the range costs more than the fence itself.
PROFILE_ENV = "WARPOLICY_PROFILE_RANGES"


# `ReadDoneFence._trouble` bits
_RANGES = 1  # profiler ranges are on
_PLANT_FAILED = 2  # a re-run of the captured body failed to plant in this step: demote
_FAILED = 4  # before_replay failed: publish nothing this step
_CLOSED = 8  # no step is open (none begun, or this one already published)


class ReadDone(NamedTuple):
    """What the mailbox holds for one step. A NamedTuple: it is built on every step and a
    tuple is the cheapest immutable record."""

    step: int
    event: EventHandle
    policy: WarReadDonePolicy
    source: str  # the fence (runner) name


_new_read_done = tuple.__new__  # ReadDone without the generated __new__ frame (hot path)


class FenceError(RuntimeError):
    """A fence used against its contract at runtime (absorbed by failing closed)."""


def _profile_ranges(explicit: Optional[bool]) -> bool:
    if explicit is not None:
        return bool(explicit)
    return os.environ.get(PROFILE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _record_function(name: str) -> Any:
    from torch.profiler import record_function  # deferred: the fence runs without torch

    return record_function(name)


class _Notifier:
    """Fail-closed bookkeeping shared by the fence and the barrier: one warning per place,
    every fallback reported to the observers, failing observers reported, never re-raised."""

    def __init__(self, platform: Platform, what: str) -> None:
        self._what = what
        self._warned: set[str] = set()
        self._observers = observers_of(platform.pm)

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def fail(self, where: str, error: BaseException) -> None:
        """A runtime failure absorbed by failing closed (call after the safe state is in place:
        under ``-W error`` the warning raises)."""
        self._warn(
            where,
            f"warpolicy {self._what}: {where} failed ({error!r}); "
            "falling back to the coarse barrier",
        )
        for call in self._observers.on_fallback:
            try:
                call(f"{self._what}:{where}", error)
            except Exception as exc:  # noqa: BLE001 - a failing observer changes nothing
                self.observer_failed("warpolicy_on_fallback", call, exc, report=False)

    def observer_failed(
        self, hook: str, call: ObserverCall, error: BaseException, report: bool = True
    ) -> None:
        """An observer raised: warn once per observer and tell the fallback observers; what
        was published and the barrier applied stay as they are."""
        plugin = self._observers.plugin_of.get(call, "?")
        self._warn(
            f"{hook}:{plugin}",
            f"warpolicy {self._what}: observer plugin {plugin!r} raised "
            f"in {hook} ({error!r}); ignored",
        )
        if report:
            for fallback in self._observers.on_fallback:
                try:
                    fallback(f"{self._what}:{hook}:{plugin}", error)
                except Exception:  # noqa: BLE001 - already warned about observers failing
                    pass


class ReadDoneFence:
    """The read-done fence a runner owns: one persistent external event, a ring of host-recorded
    events, a step counter and a consume-once mailbox.

    ``ring_size`` must cover the steps in flight (at least 2). ``profile_ranges`` wraps the
    publish in a torch profiler range (None: the ``WARPOLICY_PROFILE_RANGES`` variable).
    """

    def __init__(
        self,
        platform: Platform,
        ring_size: int = 4,
        name: str = "decode",
        *,
        profile_ranges: Optional[bool] = None,
    ) -> None:
        if int(ring_size) < 2:
            raise ValueError(f"ring_size must be at least 2, got {ring_size}")
        self.platform = platform
        self.name = name
        self.ring_size = int(ring_size)
        self._record = platform.record  # the platform's own bound call
        self._event: Optional[EventHandle] = None  # persistent external event, planted in graphs
        self._planted_any = False
        self._ring: list[EventHandle] = []
        self._next = 0
        self._step = 0
        # the PRE_REPLAY event recorded in before_replay, with its step: a publish uses it only
        # in that same step, so the IN_GRAPH hot path never has to clear it
        self._pending: Optional[tuple[int, EventHandle]] = None
        self._ranges = _profile_ranges(profile_ranges)
        # What stands between this step and the fast path, as bits: 0 = none (the common case)
        self._trouble_init = _RANGES if self._ranges else 0  # the per-step reset, precomputed
        # per-step state bits; _CLOSED clear while a step is open (one field on the hot path)
        self._trouble = self._trouble_init | _CLOSED
        self._mailbox: Optional[ReadDone] = None
        self._published: WarReadDonePolicy = NONE
        self._notifier = _Notifier(platform, f"fence {name!r}")
        self._observers = observers_of(platform.pm)

    # -- capture time ---------------------------------------------------------------------------

    @property
    def planted(self) -> bool:
        """Whether some capture confirmed a plant (informational: a publish uses the event its
        own bucket's capture returned from `plant`)."""
        return self._planted_any

    @property
    def event(self) -> Optional[EventHandle]:
        """The persistent external event (None before `prepare` or without external events)."""
        return self._event

    @property
    def published(self) -> WarReadDonePolicy:
        """The policy the last step really published (``NONE``: nothing, the scheduler went
        coarse); later than the asked policy when the fence demoted or failed closed."""
        return self._published

    @property
    def step(self) -> int:
        """The last step launched (0 before the first)."""
        return self._step

    def prepare(self) -> bool:
        """Before capture: create the persistent external event and seed it with one eager
        record (a wait on a never-recorded event is a silent no-op). Fills the ring.

        Returns whether an external event is available for planting. Idempotent.
        """
        self._fill_ring()
        if not self.platform.external_events_supported():
            return False
        try:
            if self._event is None:
                self._event = self.platform.create_event(external=True)
            self._record(self._event)
        except Exception as exc:  # noqa: BLE001 - fail closed: no event, nothing planted
            self._event = None
            self._notifier.fail("prepare", exc)
            return False
        return True

    def _fill_ring(self) -> None:
        try:
            while len(self._ring) < self.ring_size:
                self._ring.append(self.platform.create_event(external=False))
        except Exception as exc:  # noqa: BLE001 - retried lazily; a record then fails closed
            self._notifier.fail("ring", exc)

    def plant(self) -> Optional[EventHandle]:
        """In the capture body, right after the in-graph metadata prep: record the persistent
        event with the capture stream current, during a real capture only.

        Returns the event this graph now records (keep it with the bucket), or None when no
        node was planted or the plant cannot be confirmed: a failing capture-state query is a
        failed plant, never "not capturing". On a platform that re-runs the captured body at
        each replay (the simulated one) this runs inside a step; a plant that fails there makes
        that step publish as ``POST_REPLAY``.
        """
        event = self._event
        if event is None:
            return None
        in_step = not self._trouble & _CLOSED
        try:
            capturing = self.platform.is_capturing()
            if capturing is not True:
                if capturing is False and not in_step:
                    return None  # a warm-up or eager pass: nothing to plant
                raise FenceError(f"capture state unknown or lost (is_capturing() -> {capturing!r})")
            self._record(event)  # stream=None: the capture stream is current
        except Exception as exc:  # noqa: BLE001 - no confirmed node: the bucket/step demotes
            self._trouble |= _PLANT_FAILED
            self._notifier.fail("plant", exc)
            return None
        if not in_step:
            self._planted_any = True
        return event

    # -- per step -------------------------------------------------------------------------------

    def before_replay(
        self, policy: WarReadDonePolicy, stream: Optional[StreamHandle] = None
    ) -> None:
        """Begin a step. ``PRE_REPLAY`` records a ring event on ``stream`` (None = the current,
        forward, stream) now, before the replay is enqueued."""
        self._step += 1
        self._mailbox = None  # an untaken earlier publish is stale from now on
        self._trouble = self._trouble_init
        if policy == PRE_REPLAY:
            try:
                if self._ranges:
                    with _record_function("warpolicy.publish.pre_replay"):
                        self._pending = (self._step, self._record_ring(stream))
                else:
                    self._pending = (self._step, self._record_ring(stream))
            except Exception as exc:  # noqa: BLE001
                self._trouble |= _FAILED
                self._notifier.fail("before_replay", exc)

    def after_replay(
        self,
        policy: WarReadDonePolicy,
        planted: Optional[EventHandle],
        stream: Optional[StreamHandle] = None,
    ) -> None:
        """Publish this step's read-done event into the mailbox, after ``replay()`` is enqueued.

        ``planted`` is the event this step's graph records (what `plant` returned when the
        bucket was captured), or None (no graph, or no confirmed node). ``IN_GRAPH`` hands it
        out, or publishes as ``POST_REPLAY`` without it; ``POST_REPLAY`` records a ring event
        on ``stream`` now; ``PRE_REPLAY`` hands out the event recorded in `before_replay`;
        ``NONE`` publishes nothing.
        """
        if not self._trouble and policy is IN_GRAPH and planted is not None:
            # the common case, kept to plain attribute work
            self._trouble = _CLOSED
            self._mailbox = _new_read_done(ReadDone, (self._step, planted, IN_GRAPH, self.name))
            self._published = IN_GRAPH
            if self._observers.on_publish:
                self._notify_publish(IN_GRAPH, planted)
            return
        self._publish_step(policy, planted, stream)

    def _publish_step(
        self,
        policy: WarReadDonePolicy,
        planted: Optional[EventHandle],
        stream: Optional[StreamHandle],
    ) -> None:
        if self._trouble & _CLOSED:
            self.before_replay(NONE)  # a step must have a number even without before_replay
        self._trouble |= _CLOSED
        event: Optional[EventHandle] = None
        if not self._trouble & _FAILED and policy != NONE:
            try:
                if self._ranges:
                    with _record_function("warpolicy.publish"):
                        event, policy = self._publish(policy, planted, stream)
                else:
                    event, policy = self._publish(policy, planted, stream)
            except Exception as exc:  # noqa: BLE001
                event = None
                self._notifier.fail("after_replay", exc)
        if event is not None:
            self._mailbox = _new_read_done(ReadDone, (self._step, event, policy, self.name))
        else:
            policy = NONE
        self._published = policy
        if self._observers.on_publish:
            self._notify_publish(policy, event)

    def _publish(
        self,
        policy: WarReadDonePolicy,
        planted: Optional[EventHandle],
        stream: Optional[StreamHandle],
    ) -> tuple[EventHandle, WarReadDonePolicy]:
        if policy == IN_GRAPH:
            if planted is not None and not self._trouble & _PLANT_FAILED:
                return planted, IN_GRAPH
            policy = POST_REPLAY  # no confirmed node in this step's graph: sound demotion
        if policy == POST_REPLAY:
            return self._record_ring(stream), POST_REPLAY
        if policy == PRE_REPLAY:
            pending, self._pending = self._pending, None
            if pending is None or pending[0] != self._step:
                raise FenceError("pre_replay publish without a record in before_replay")
            return pending[1], PRE_REPLAY
        raise FenceError(f"unknown policy {policy!r}")

    def _record_ring(self, stream: Optional[StreamHandle]) -> EventHandle:
        """Record the next ring event; it was last recorded ``ring_size`` records ago."""
        ring = self._ring
        if len(ring) < self.ring_size:
            ring.append(self.platform.create_event(external=False))
            event = ring[-1]
        else:
            event = ring[self._next]
            self._next = (self._next + 1) % self.ring_size
        self._record(event, stream)
        return event

    def _notify_publish(self, policy: WarReadDonePolicy, event: Optional[EventHandle]) -> None:
        for call in self._observers.on_publish:
            try:
                call(self.name, self._step, policy, event)
            except Exception as exc:  # noqa: BLE001 - an observer never changes the publish
                self._notifier.observer_failed("warpolicy_on_publish", call, exc)

    def take(self) -> Optional[ReadDone]:
        """The scheduler's read of the mailbox: this step's `ReadDone` once, then None.

        The mailbox is emptied when a step begins, so it never holds an older step's event.
        """
        read_done = self._mailbox
        self._mailbox = None
        return read_done


class SchedulerBarrier:
    """The scheduler side: the schedule stream waits on the taken event, or on the whole
    forward stream (coarse) when there is none, when coarse is forced, or when the wait failed."""

    def __init__(
        self,
        platform: Platform,
        force_coarse: bool = False,
        name: str = "scheduler",
        *,
        profile_ranges: Optional[bool] = None,
    ) -> None:
        self.platform = platform
        self.name = name
        self._wait_event = platform.wait_event  # the platform's own bound calls
        self._wait_stream = platform.wait_stream
        self._ranges = _profile_ranges(profile_ranges)
        self.force_coarse = bool(
            force_coarse
        )  # also sets _slow (forced or ranged: off the fast path)
        self._notifier = _Notifier(platform, f"barrier {name!r}")
        self._observers = observers_of(platform.pm)

    @property
    def force_coarse(self) -> bool:
        """Always wait for the whole forward stream (the operator's kill switch)."""
        return self._force_coarse

    @force_coarse.setter
    def force_coarse(self, value: bool) -> None:
        self._force_coarse = bool(value)
        self._slow = self._force_coarse or self._ranges

    def apply(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        read_done: Optional[ReadDone],
    ) -> str:
        """Order ``schedule_stream`` after the forward's shared reads; returns ``"event"`` or
        ``"coarse"``. Never raises while a safe barrier can still be applied."""
        if read_done is not None and not self._slow:  # the common case
            try:
                self._wait_event(schedule_stream, read_done[1])
            except Exception as exc:  # noqa: BLE001
                return self._wait_failed(schedule_stream, forward_stream, read_done, exc)
            if self._observers.on_barrier:
                self._notify(read_done, "event", read_done[2].label)
            return "event"
        if self._ranges:
            with _record_function("warpolicy.barrier"):
                return self._order(schedule_stream, forward_stream, read_done)
        return self._order(schedule_stream, forward_stream, read_done)

    def _order(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        read_done: Optional[ReadDone],
    ) -> str:
        # Every failure applies the safe (coarse) barrier *before* it is reported, so a warning
        # turned into an exception (``-W error``) can never leave the schedule stream unordered.
        if read_done is not None and not self._force_coarse:
            try:
                self._wait_event(schedule_stream, read_done[1])
            except Exception as exc:  # noqa: BLE001
                return self._wait_failed(schedule_stream, forward_stream, read_done, exc)
            if self._observers.on_barrier:
                self._notify(read_done, "event", read_done[2].label)
            return "event"
        self._coarse(schedule_stream, forward_stream)
        if self._observers.on_barrier:
            self._notify(
                read_done, "coarse", "forced" if self._force_coarse else "no read-done event"
            )
        return "coarse"

    def _wait_failed(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        read_done: ReadDone,
        error: Exception,
    ) -> str:
        self._coarse(schedule_stream, forward_stream)
        self._notifier.fail("wait_event", error)
        if self._observers.on_barrier:
            self._notify(read_done, "coarse", "hook failed")
        return "coarse"

    def _coarse(self, schedule_stream: StreamHandle, forward_stream: StreamHandle) -> None:
        try:
            self._wait_stream(schedule_stream, forward_stream)
        except Exception as exc:  # noqa: BLE001 - last resort: the host waits for everything
            self.platform.synchronize()
            self._notifier.fail("wait_stream", exc)

    def _notify(self, read_done: Optional[ReadDone], kind: str, reason: str) -> None:
        runner = read_done[3] if read_done is not None else self.name
        step = read_done[0] if read_done is not None else None
        for call in self._observers.on_barrier:
            try:
                call(runner, step, kind, reason)
            except Exception as exc:  # noqa: BLE001 - an observer never changes the barrier
                self._notifier.observer_failed("warpolicy_on_barrier", call, exc)
