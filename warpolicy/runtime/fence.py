"""The read-done fence (runner side: plant, publish, take) and the scheduler barrier.

Capture time, per bucket::

    event = fence.prepare()         # a fresh external event + one eager record (the seed)
    with platform.capture(graph):
        graph_prep(); planted = fence.plant(event); forward()
    release = decide_bucket(policies, BucketFacts(bucket, event=planted), fence.name)

Per step, on the forward stream, with the bucket's `BucketRelease` (the only thing read)::

    step = fence.before_replay(release)     # PRE_REPLAY records a ring event here
    platform.replay(graph)
    fence.after_replay(release, step=step)  # IN_GRAPH hands out the bucket's event,
                                            # POST_REPLAY records

or the three in one call, ``step = fence.launch(release, platform.replay, graph)`` (a replay
that raises publishes nothing).

Scheduler side, right after the launch::

    barrier.apply(schedule_stream, forward_stream, fence.take(step))

or the two in one call, ``barrier.apply_step(schedule_stream, forward_stream, fence, step)``
(the same barrier; the scheduler that does not need the `ReadDone` itself).

Failures never raise out of the fence: the step publishes nothing (the scheduler takes the
coarse barrier), every failure reaches ``warpolicy_on_fallback``, one warning per place
(`warpolicy.runtime.observers.Reporter`). Host-recorded events come from an `EventRing` that
never re-records an event a barrier may still wait on (a take marks the read-done's slot, the
barrier clears it once its wait is enqueued); when every ring event is still awaited, the
step publishes nothing.

The per-step path is attribute work and the platform's own bound calls: no plugin dispatch, no
allocation (each `ReadDone` is built once, per bucket or per ring slot), observers only when
registered, and one owner-thread check per step (`warpolicy.runtime.ownership`): `before_replay`
checks and returns the step's token; `after_replay`, `take` and
`SchedulerBarrier.apply_step` given it skip the check (each checks when called without it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from warpolicy import environment
from warpolicy.registry.inputs import env_switch
from warpolicy.registry.vocabulary import NONE, POST_REPLAY, PRE_REPLAY, WarReadDonePolicy
from warpolicy.runtime.observers import NO_OBSERVERS, Observers, Reporter
from warpolicy.runtime.ordering import order_after, synchronize_all
from warpolicy.runtime.ownership import ThreadOwner, get_ident
from warpolicy.runtime.platforms import EventHandle, Platform, StreamHandle
from warpolicy.runtime.release import BucketRelease, ReadDone
from warpolicy.runtime.ring import EventRing, RingExhaustedError, RingSlot

#: what `ReadDoneFence.launch` hands its ``replay`` (a graph, or an eager forward's batch)
_Graph = TypeVar("_Graph")


class ReadDoneSource(Protocol):
    """Anything the scheduler takes a step's read-done from once (a fence, a speculative
    step's mailbox); `SchedulerBarrier.apply_step` takes from it."""

    def take(self) -> ReadDone | None:
        """This step's read-done once, then None."""
        ...


class FenceError(RuntimeError):
    """A fence used against its contract at runtime (absorbed by failing closed)."""


class StepState(enum.Enum):
    """Where the fence's current step stands."""

    CLOSED = "closed"  # no step open (none begun, or this one already published)
    READY = "ready"  # open, nothing wrong: the fast path may publish
    RANGED = "ranged"  # open, nothing wrong, profiler ranges on: the slow path publishes
    FAILED = "failed"  # open, something failed (a record, a re-run plant): publish nothing


_CLOSED = StepState.CLOSED
_READY = StepState.READY
_FAILED = StepState.FAILED


def _profile_ranges(explicit: bool | None) -> bool:
    if explicit is not None:
        return bool(explicit)
    # WARPOLICY_PROFILE_RANGES: torch profiler ranges around publishes and barriers (costly)
    return env_switch(None, environment.PROFILE_RANGES)


def _record_function(name: str) -> Any:
    from torch.profiler import record_function  # noqa: PLC0415 - deferred: runs without torch

    return record_function(name)


class ReadDoneFence:
    """The read-done fence a runner owns: the external events its graphs record, a ring of
    host-recorded events, a step counter and a consume-once mailbox.

    ``ring_size`` covers the steps a scheduler may hold before waiting (2 to
    `warpolicy.runtime.ring.MAX_RING_SIZE`). ``observers`` see every publish and fallback.
    ``profile_ranges`` wraps the publish in a torch profiler range (None: the
    ``WARPOLICY_PROFILE_RANGES`` variable). ``owner`` shares a runner's owner thread.
    """

    def __init__(
        self,
        platform: Platform,
        ring_size: int = 4,
        name: str = "decode",
        *,
        observers: Observers = NO_OBSERVERS,
        profile_ranges: bool | None = None,
        owner: ThreadOwner | None = None,
    ) -> None:
        self.platform = platform
        self.name = name
        self.ring = EventRing(platform, ring_size, name)
        self._ring_record = self.ring.record
        self.reporter = Reporter(observers, f"fence {name!r}")
        self._observers = observers
        self._owner = owner if owner is not None else ThreadOwner(f"fence {name!r}")
        self._record = platform.record  # the platform's own bound call
        self._event: EventHandle | None = None  # the latest prepared external event
        self._planted_any = False
        self._step = 0
        self._ranges = _profile_ranges(profile_ranges)
        self._open = StepState.RANGED if self._ranges else _READY  # a new step's state
        self._state = _CLOSED
        self._pending: RingSlot | None = None  # the PRE_REPLAY record (of slot.step's step)
        self._mailbox: ReadDone | None = None
        self._published: WarReadDonePolicy = NONE
        # per buffer class (only for a release with classes): this step's read-done per class
        self._classes: dict[str, ReadDone] = {}
        self._class_step = 0  # the step whose classes _classes holds

    # -- state ----------------------------------------------------------------------------------

    @property
    def ring_size(self) -> int:
        return self.ring.size

    @property
    def planted(self) -> bool:
        """Whether some capture confirmed a plant (informational: a publish hands out the event
        of its own bucket's `BucketRelease`)."""
        return self._planted_any

    @property
    def event(self) -> EventHandle | None:
        """The latest external event `prepare` made (None before, or without external events)."""
        return self._event

    @property
    def published(self) -> WarReadDonePolicy:
        """What the last step really published (``NONE``: nothing, the scheduler went coarse)."""
        return self._published

    @property
    def step(self) -> int:
        """The last step launched (0 before the first)."""
        return self._step

    def release_thread(self) -> None:
        """Hand the fence to another thread: the next thread that uses it owns it."""
        self._owner.release()

    # -- capture time ---------------------------------------------------------------------------

    def prepare(self) -> EventHandle | None:
        """Before a capture: a fresh external event, seeded with one eager record (a wait on a
        never-recorded event is a silent no-op). Each capture gets its own event, so no two
        graphs ever record the same one.

        Returns the event, or None: without external events (nothing reported), or when creating
        or seeding it failed (reported; the caller must treat the bucket as doubtful).
        """
        self._owner.check()
        self._event = None
        if not self.platform.external_events_supported():
            return None
        try:
            event = self.platform.create_event(external=True)
            self._record(event)
        except Exception as exc:  # noqa: BLE001 - fail closed: no event, nothing planted
            self.reporter.fallback("prepare", exc)
            return None
        self._event = event
        return event

    def plant(self, event: EventHandle | None = None) -> EventHandle | None:
        """In the capture body, right after the in-graph metadata prep: record ``event`` (None:
        the latest prepared) with the capture stream current, during a real capture only.

        Returns the event this graph now records, or None when nothing was planted: outside a
        capture (a warm-up or eager pass), or when the plant failed or cannot be confirmed (a
        failing or non-boolean capture-state query is a failure, reported). On a platform that
        re-runs the captured body at each replay (the simulated one) this runs inside a step,
        and a failure there makes that step publish nothing.
        """
        if self._owner.ident != get_ident():
            self._owner.claim()
        if event is None:
            event = self._event
            if event is None:
                return None
        in_step = self._state is not _CLOSED
        try:
            capturing = self.platform.is_capturing()
            if capturing is not True:
                if capturing is False and not in_step:
                    return None  # a warm-up or eager pass: nothing to plant
                raise FenceError(f"capture state unknown or lost (is_capturing() -> {capturing!r})")
            self._record(event)  # stream=None: the capture stream is current
        except Exception as exc:  # noqa: BLE001 - no confirmed node: the bucket/step is coarse
            if in_step:
                self._state = _FAILED
            self.reporter.fallback("plant", exc)
            return None
        if not in_step:
            self._planted_any = True
        return event

    # -- per step -------------------------------------------------------------------------------

    def before_replay(self, release: BucketRelease, stream: StreamHandle | None = None) -> int:
        """Begin a step and return its token (the step's number). A ``PRE_REPLAY`` release
        records a ring event on ``stream`` (None = the current, forward, stream) now, before the
        replay is enqueued.

        This call checks that the calling thread owns the fence; `after_replay` and `take`
        given the token (``step=``) skip that check for the step it began: one owner check per
        step. Without the token each checks again. `launch` does both in one call."""
        if self._owner.ident != get_ident():
            self._owner.claim()
        step = self._step = self._step + 1
        self._mailbox = None  # an untaken earlier publish is stale from now on
        self._state = self._open
        if release.records_pre_replay:
            self._record_pre_replay(stream)
        return step

    def launch(
        self,
        release: BucketRelease,
        replay: Callable[[_Graph], object],
        graph: _Graph,
        stream: StreamHandle | None = None,
    ) -> int:
        """One step in one call: `before_replay`, ``replay(graph)`` (which enqueues the step's
        forward on ``stream``, None = the current stream), then `after_replay` with the step's
        token; returns the token for `take`. It publishes exactly what those calls publish,
        with one owner check per step.

        When ``replay`` raises (any ``BaseException``, ``KeyboardInterrupt`` included) the step
        publishes nothing (`take` finds nothing: the coarse barrier; `published` is ``NONE``)
        and the exception propagates. ``replay`` is any callable of one argument: the
        platform's ``replay`` and a graph, ``torch.cuda.CUDAGraph.replay`` and a graph, an
        eager forward and its batch. The split calls stay for an engine that does other work
        between them."""
        step = self.before_replay(release, stream)
        try:
            replay(graph)
        except BaseException:
            self._abandon()
            raise
        self.after_replay(release, stream, step)
        return step

    def _abandon(self) -> None:
        """The step's forward raised: it publishes nothing (its mailbox stays empty). Plain
        stores only: this runs while an interrupt propagates."""
        self._state = _CLOSED
        self._mailbox = None
        self._published = NONE

    def _record_pre_replay(self, stream: StreamHandle | None) -> None:
        try:
            if self._ranges:
                with _record_function("warpolicy.publish.pre_replay"):
                    slot = self.ring.record(stream)
            else:
                slot = self.ring.record(stream)
        except Exception as exc:  # noqa: BLE001 - publish nothing this step
            self._state = _FAILED
            self.reporter.fallback("before_replay", exc)
            return
        slot.step = self._step
        self._pending = slot

    def after_replay(
        self,
        release: BucketRelease,
        stream: StreamHandle | None = None,
        step: int | None = None,
    ) -> None:
        """Publish this step's read-done into the mailbox, right after ``replay()`` is enqueued.

        ``IN_GRAPH`` hands out the event the bucket's graph records; ``POST_REPLAY`` records a
        ring event on ``stream`` now; ``PRE_REPLAY`` hands out the `before_replay` record;
        ``NONE`` (or any failure in this step) publishes nothing. ``step``: the token
        `before_replay` returned for this step (see there).
        """
        if step != self._step and self._owner.ident != get_ident():
            self._owner.claim()
        read_done = release.read_done  # in_graph: the bucket's own record, built once
        if self._state is _READY and not release.classes:  # the common cases, one tail:
            if read_done is None and release.policy is POST_REPLAY:  # post_replay records now
                try:
                    read_done = self._ring_record(stream).post_replay
                except Exception as exc:  # noqa: BLE001 - publish nothing this step
                    self._state = _FAILED
                    self._record_failed(exc)
            if read_done is not None:
                self._state = _CLOSED
                read_done.slot.step = self._step
                self._mailbox = read_done
                policy = self._published = read_done.policy
                if self._observers.on_publish:
                    self.reporter.publish(self.name, self._step, policy, read_done.event)
                return
        if release.classes:  # per-class read-dones: their own (slower) path
            self._after_replay_classes(release, stream)
            return
        self._publish_step(release, stream)

    def _after_replay_classes(self, release: BucketRelease, stream: StreamHandle | None) -> None:
        """`after_replay` of a release with buffer classes: the classes released earlier than
        the step's latest, the step's own publish, then the latest classes (which share it)."""
        self._publish_classes(release)
        failed = self._state is _FAILED
        self._publish_step(release, stream)
        if failed or (release.policy is not NONE and self._mailbox is None):
            self._classes = {}  # something in this step failed: no class either
        else:
            self._publish_latest_classes(release)

    def _publish_latest_classes(self, release: BucketRelease) -> None:
        """The classes whose reads end last share the step's own read-done (none if it
        published nothing)."""
        if self._mailbox is None:
            return
        for name, class_release in release.classes.items():
            if class_release.policy is release.policy:
                self._classes[name] = self._mailbox

    def _publish_classes(self, release: BucketRelease) -> None:
        """This step's read-done of every class released earlier than the step's latest (its
        own ``in_graph`` event, or the ``pre_replay`` record); the latest's come after."""
        self._classes = {}
        self._class_step = self._step
        if self._state is _FAILED or self._state is _CLOSED:
            return
        by_release: dict[int, ReadDone] = {}
        for early in release.early:
            if early.read_done is not None:  # in_graph: the event this graph records
                early.read_done.slot.step = self._step
                by_release[id(early)] = early.read_done
            elif early.policy is PRE_REPLAY:
                slot = self._pending
                if slot is not None and slot.step == self._step:
                    by_release[id(early)] = slot.pre_replay
        for name, class_release in release.classes.items():
            found = by_release.get(id(class_release))
            if found is not None:
                self._classes[name] = found

    def _publish_step(self, release: BucketRelease, stream: StreamHandle | None) -> None:
        if self._state is _CLOSED:  # a step must have a number even without before_replay
            self._owner.check()  # a token of a step already published proves nothing
            self._step += 1
            self._mailbox = None
            self._state = self._open
        state, self._state = self._state, _CLOSED
        read_done: ReadDone | None = None
        if state is not _FAILED and release.policy is not NONE:
            try:
                if self._ranges:
                    with _record_function("warpolicy.publish"):
                        read_done = self._publish(release, stream)
                else:
                    read_done = self._publish(release, stream)
            except Exception as exc:  # noqa: BLE001 - publish nothing this step
                self._record_failed(exc)
        if read_done is None:
            self._published = NONE
            event = None
        else:
            read_done.slot.step = self._step
            self._mailbox = read_done
            self._published = read_done.policy
            event = read_done.event
        if self._observers.on_publish:
            self.reporter.publish(self.name, self._step, self._published, event)

    def _record_failed(self, exc: Exception) -> None:
        """A publish failed (its state is already failed or closed): report it."""
        if isinstance(exc, RingExhaustedError):
            self.reporter.fallback(
                "ring", exc, f"{exc}; this step publishes nothing (the coarse barrier)"
            )
        else:
            self.reporter.fallback("after_replay", exc)

    def _publish(self, release: BucketRelease, stream: StreamHandle | None) -> ReadDone:
        policy = release.policy
        if release.read_done is not None:
            return release.read_done  # in_graph (this path: profiler ranges on)
        if policy is POST_REPLAY:
            return self._ring_record(stream).post_replay
        if policy is PRE_REPLAY:
            slot = self._pending
            if slot is None or slot.step != self._step:
                raise FenceError("pre_replay publish without a record in before_replay")
            self._pending = None
            return slot.pre_replay
        raise FenceError(f"cannot publish {policy!r} (an in_graph release carries its event)")

    def take_class(self, buffer_class: str) -> ReadDone | None:
        """The scheduler's read of one buffer class's read-done for this step, once, then None
        (also for a class the step's release does not name: unknown is the coarse barrier).

        Additive to `take` (which keeps its meaning: the step's latest read-done): a scheduler
        whose writes separate takes, right after the launch, the class it is about to write and
        applies its barrier before those writes. Apply every taken class's barrier before the
        next step launches (classes may share one event)."""
        if self._owner.ident != get_ident():
            self._owner.claim()
        if self._class_step != self._step:
            return None
        read_done = self._classes.pop(buffer_class, None)
        if read_done is not None:
            read_done.slot.taken = True
        return read_done

    def take(self, step: int | None = None) -> ReadDone | None:
        """The scheduler's read of the mailbox: this step's `ReadDone` once, then None.

        The mailbox is emptied when a step begins, so it never holds an older step's event. The
        taken event is marked awaited until a barrier waits on it (the ring skips it meanwhile).
        ``step``: the token `before_replay` returned for the latest step (no owner check then).
        """
        if step != self._step and self._owner.ident != get_ident():
            self._owner.claim()
        read_done = self._mailbox
        if read_done is not None:
            self._mailbox = None
            read_done.slot.taken = True
        return read_done


class SchedulerBarrier:
    """The scheduler side: the schedule stream waits on the taken event, or on the whole
    forward stream (coarse) when there is none, when coarse is forced, or when the wait failed.
    Either way the taken event is no longer awaited afterwards.

    ``apply`` is chosen once, at construction: the barrier itself, or, with profiler ranges
    on, the same inside a ``warpolicy.barrier`` range. The event wait is the platform's
    ``event_wait`` (`warpolicy.runtime.platforms.base.EventFirstWait`): on CUDA torch's own
    ``Event.wait``.
    """

    def __init__(
        self,
        platform: Platform,
        force_coarse: bool = False,
        name: str = "scheduler",
        *,
        observers: Observers = NO_OBSERVERS,
        profile_ranges: bool | None = None,
    ) -> None:
        self.platform = platform
        self.name = name
        self.reporter = Reporter(observers, f"barrier {name!r}")
        self._observers = observers
        self._event_wait = platform.event_wait  # the platform's own bound calls
        self._wait_stream = platform.wait_stream
        self._ranges = _profile_ranges(profile_ranges)
        self.force_coarse = force_coarse
        #: ``apply(schedule_stream, forward_stream, read_done) -> "event" | "coarse"``
        self.apply: Callable[[StreamHandle, StreamHandle, ReadDone | None], str] = (
            self._ranged if self._ranges else self._barrier
        )

    @property
    def force_coarse(self) -> bool:
        """Always wait for the whole forward stream (the operator's kill switch)."""
        return self._force_coarse

    @force_coarse.setter
    def force_coarse(self, value: bool) -> None:
        self._force_coarse = bool(value)
        # apply_step takes inline only where apply is the plain barrier
        self._plain = not (self._force_coarse or self._ranges)

    def apply_step(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        fence: ReadDoneFence | ReadDoneSource,
        step: int | None = None,
    ) -> str:
        """``apply(schedule_stream, forward_stream, fence.take(step))`` in one call, right
        after a step's launch: the same wait, the same fallbacks, reports, slot marks and
        result, the take inlined (the wait is `apply`'s own). ``step``: the step's token, as
        `ReadDoneFence.take` takes it (without it, or with another step's, the owner check
        runs as there). ``fence`` may be any `ReadDoneSource` (its ``take()``); when taking
        raises (a foreign thread without the token), the coarse barrier is applied first, then
        it propagates."""
        if not isinstance(fence, ReadDoneFence) or step != fence._step or not self._plain:
            return self._take_then_apply(schedule_stream, forward_stream, fence, step)
        read_done = fence._mailbox  # take(step), inlined: its owner check is the token's
        if read_done is not None:
            fence._mailbox = None
            read_done.slot.taken = True  # awaited (the ring skips it) until the wait is enqueued
        return self._barrier(schedule_stream, forward_stream, read_done)  # plain: what apply is

    def _take_then_apply(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        fence: ReadDoneFence | ReadDoneSource,
        step: int | None,
    ) -> str:
        try:
            taken = fence.take(step) if isinstance(fence, ReadDoneFence) else fence.take()
        except BaseException:  # the schedule stream is ordered before anything propagates
            self._coarse(schedule_stream, forward_stream)
            raise
        return self.apply(schedule_stream, forward_stream, taken)

    def _barrier(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        read_done: ReadDone | None,
    ) -> str:
        """Order ``schedule_stream`` after the forward's shared reads; returns ``"event"`` or
        ``"coarse"``. Never raises while a safe barrier can still be applied."""
        if read_done is None or self._force_coarse:
            return self._coarse_barrier(schedule_stream, forward_stream, read_done)
        try:
            self._event_wait(read_done.event, schedule_stream)
        except Exception as exc:  # noqa: BLE001
            return self._wait_failed(schedule_stream, forward_stream, read_done, exc)
        except BaseException:  # KeyboardInterrupt: order the schedule stream, then raise
            self._interrupted(schedule_stream, forward_stream, read_done)
            raise
        read_done.slot.taken = False
        if self._observers.on_barrier:
            self.reporter.barrier(
                read_done.source, read_done.slot.step, "event", read_done.policy.label
            )
        return "event"

    def _ranged(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        read_done: ReadDone | None,
    ) -> str:
        with _record_function("warpolicy.barrier"):
            return self._barrier(schedule_stream, forward_stream, read_done)

    def _coarse_barrier(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        read_done: ReadDone | None,
    ) -> str:
        # Every failure applies the safe (coarse) barrier *before* it is reported, so a warning
        # turned into an exception (``-W error``) can never leave the schedule stream unordered.
        self._coarse(schedule_stream, forward_stream)
        if read_done is None:
            self.reporter.barrier(self.name, None, "coarse", "no read-done event")
        else:
            read_done.slot.taken = False
            self.reporter.barrier(read_done.source, read_done.slot.step, "coarse", "forced")
        return "coarse"

    def _wait_failed(
        self,
        schedule_stream: StreamHandle,
        forward_stream: StreamHandle,
        read_done: ReadDone,
        error: Exception,
    ) -> str:
        self._coarse(schedule_stream, forward_stream)
        read_done.slot.taken = False
        self.reporter.fallback("wait_event", error)
        self.reporter.barrier(read_done.source, read_done.slot.step, "coarse", "hook failed")
        return "coarse"

    def _interrupted(
        self, schedule_stream: StreamHandle, forward_stream: StreamHandle, read_done: ReadDone
    ) -> None:
        """The wait was interrupted (a ``BaseException``): whatever the caller does next, the
        schedule stream must already be ordered after the forward's reads."""
        try:
            self._wait_stream(schedule_stream, forward_stream)
        except BaseException:  # noqa: BLE001 - the interrupt being handled is re-raised by apply
            synchronize_all(self.platform)  # survives a second interrupt
        read_done.slot.taken = False

    def _coarse(self, schedule_stream: StreamHandle, forward_stream: StreamHandle) -> None:
        # else the host waits for everything, also through a second interrupt, then re-raise
        failed = order_after(self.platform, schedule_stream, (forward_stream,), self._wait_stream)
        if failed is not None:
            self.reporter.fallback("wait_stream", failed)
