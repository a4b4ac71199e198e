"""The runtime read-done fence: plant, publish, take (runner side) and the scheduler barrier.

Runner side, per bucket at capture time::

    fence.prepare()                 # persistent external event + one eager record (seed)
    with platform.capture(graph):
        graph_prep(); fence.plant(); forward()

and per step::

    fence.before_replay(policy)     # PRE_REPLAY records a ring event here
    platform.replay(graph)
    fence.after_replay(policy)      # IN_GRAPH hands out the planted event, POST_REPLAY records

Scheduler side, right after the launch::

    barrier.apply(schedule_stream, forward_stream, fence.take())

Failures never raise out of the fence: the step publishes nothing (so the scheduler takes the
coarse barrier), one warning per failing place, and a ``warpolicy_on_fallback`` notification.
Host-recorded events come from a ring so an event is never re-recorded while one of the last
``ring_size - 1`` steps may still be waited on (one shared event deadlocked two peer engines).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple, Optional

from warpolicy.policy import WarReadDonePolicy

PRE_REPLAY = WarReadDonePolicy.PRE_REPLAY
IN_GRAPH = WarReadDonePolicy.IN_GRAPH
POST_REPLAY = WarReadDonePolicy.POST_REPLAY
NONE = WarReadDonePolicy.NONE

try:  # the profiler ranges are optional: the fake platform runs without torch
    import torch.autograd.profiler as _autograd_profiler
    from torch.profiler import record_function as _record_function
except ImportError:  # pragma: no cover - torch is installed wherever the runtime runs
    _autograd_profiler = None
    _record_function = None
if not hasattr(_autograd_profiler, "_is_profiler_enabled"):  # pragma: no cover - older/newer torch
    _autograd_profiler = None  # no cheap check: leave the ranges out rather than slow every step


def _profiling() -> bool:
    """True while a torch profiler is active (a module flag: cheap enough for every step)."""
    return _autograd_profiler is not None and _autograd_profiler._is_profiler_enabled


class ReadDone(NamedTuple):
    """What the mailbox holds for one step. A NamedTuple, not an attrs class: it is built
    on every step and a tuple is the cheapest immutable record."""

    step: int
    event: Any
    policy: WarReadDonePolicy
    source: str  # the fence (runner) name


class FenceError(RuntimeError):
    """A fence used against its contract at runtime (absorbed by failing closed)."""


class _Notifier:
    """Fail-closed bookkeeping shared by the fence and the barrier: one warning per place,
    every fallback reported to the observers."""

    def __init__(self, platform: Any, what: str) -> None:
        self._platform = platform
        self._what = what
        self._warned: set[str] = set()
        hook = platform.pm.hook
        self._on_fallback = hook.warpolicy_on_fallback

    def fail(self, where: str, error: BaseException) -> None:
        if where not in self._warned:
            self._warned.add(where)
            warnings.warn(f"warpolicy {self._what}: {where} failed ({error!r}); "
                          "falling back to the coarse barrier", RuntimeWarning, stacklevel=4)
        if self._on_fallback.get_hookimpls():
            try:
                self._on_fallback(where=f"{self._what}:{where}", error=error)
            except Exception:  # noqa: BLE001 - an observer failing here changes nothing
                pass


class ReadDoneFence:
    """The read-done fence a runner owns: one persistent external event, a ring of host-recorded
    events, a step counter and a consume-once mailbox.

    ``ring_size`` must cover the steps in flight (at least 2).
    """

    def __init__(self, platform: Any, ring_size: int = 4, name: str = "decode") -> None:
        if int(ring_size) < 2:
            raise ValueError(f"ring_size must be at least 2, got {ring_size}")
        self.platform = platform
        self.name = name
        self.ring_size = int(ring_size)
        self._event: Any = None  # persistent external event, planted in graphs
        self._planted = False
        self._ring: list[Any] = []
        self._next = 0
        self._step = 0
        self._open = False  # a step has begun (before_replay) and not yet published
        self._pending: Any = None  # PRE_REPLAY event recorded in before_replay
        self._failed = False  # this step failed: publish nothing
        self._mailbox: Optional[ReadDone] = None
        self._notifier = _Notifier(platform, f"fence {name!r}")
        self._on_publish = platform.pm.hook.warpolicy_on_publish

    # -- capture time ---------------------------------------------------------------------------

    @property
    def planted(self) -> bool:
        """Whether a plant really happened during a capture (some graph has the node)."""
        return self._planted

    @property
    def event(self) -> Any:
        """The persistent external event (None before `prepare` or without external events)."""
        return self._event

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
        try:
            if not self.platform.external_events_supported():
                return False
            if self._event is None:
                self._event = self.platform.create_event(external=True)
            self.platform.record(self._event)
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

    def plant(self) -> bool:
        """In the capture body, right after the in-graph metadata prep: record the persistent
        event with the capture stream current. Records only during a real capture.

        Returns True when it really planted (the runner keeps that per bucket).
        """
        if self._event is None:
            return False
        try:
            if not self.platform.is_capturing():
                return False
            self.platform.record(self._event)  # stream=None: the capture stream is current
        except Exception as exc:  # noqa: BLE001 - no node: the runner demotes this bucket
            self._notifier.fail("plant", exc)
            return False
        self._planted = True
        return True

    # -- per step -------------------------------------------------------------------------------

    def before_replay(self, policy: WarReadDonePolicy, stream: Any = None) -> None:
        """Begin a step. ``PRE_REPLAY`` records a ring event on ``stream`` (None = the current,
        forward, stream) now, before the replay is enqueued."""
        self._step += 1
        self._open = True
        self._mailbox = None  # an untaken earlier publish is stale from now on
        self._pending = None
        self._failed = False
        if policy == PRE_REPLAY:
            try:
                if _profiling():
                    with _record_function("warpolicy.publish.pre_replay"):
                        self._pending = self._record_ring(stream)
                else:
                    self._pending = self._record_ring(stream)
            except Exception as exc:  # noqa: BLE001
                self._failed = True
                self._notifier.fail("before_replay", exc)

    def after_replay(self, policy: WarReadDonePolicy, stream: Any = None,
                     planted: Optional[bool] = None) -> None:
        """Publish this step's read-done event into the mailbox, after ``replay()`` is enqueued.

        ``IN_GRAPH`` hands out the planted event (``planted=False`` says this bucket's graph has
        no node: fail closed); ``POST_REPLAY`` records a ring event now; ``PRE_REPLAY`` hands out
        the event recorded in `before_replay`; ``NONE`` publishes nothing.
        """
        if not self._open:
            self.before_replay(NONE)  # a step must have a number even without before_replay
        self._open = False
        event = None
        if not self._failed and policy != NONE:
            try:
                if _profiling():
                    with _record_function("warpolicy.publish"):
                        event = self._event_for(policy, stream, planted)
                else:
                    event = self._event_for(policy, stream, planted)
            except Exception as exc:  # noqa: BLE001
                event = None
                self._notifier.fail("after_replay", exc)
        if event is not None:
            self._mailbox = ReadDone(self._step, event, policy, self.name)
        if self._on_publish.get_hookimpls():
            self._notify_publish(policy if event is not None else NONE, event)

    def _event_for(self, policy: WarReadDonePolicy, stream: Any, planted: Optional[bool]) -> Any:
        if policy == IN_GRAPH:
            if planted is False or not self._planted or self._event is None:
                raise FenceError("in_graph publish without a planted read-done node")
            return self._event
        if policy == POST_REPLAY:
            return self._record_ring(stream)
        if policy == PRE_REPLAY:
            if self._pending is None:
                raise FenceError("pre_replay publish without a record in before_replay")
            return self._pending
        raise FenceError(f"unknown policy {policy!r}")

    def _record_ring(self, stream: Any) -> Any:
        """Record the next ring event; it was last recorded ``ring_size`` records ago."""
        if len(self._ring) < self.ring_size:
            self._ring.append(self.platform.create_event(external=False))
            event = self._ring[-1]
        else:
            event = self._ring[self._next]
            self._next = (self._next + 1) % self.ring_size
        self.platform.record(event, stream)
        return event

    def _notify_publish(self, policy: WarReadDonePolicy, event: Any) -> None:
        try:
            self._on_publish(runner=self.name, step=self._step, policy=policy, event=event)
        except Exception as exc:  # noqa: BLE001 - any hook raising means coarse for this step
            self._mailbox = None
            self._notifier.fail("warpolicy_on_publish", exc)

    def take(self) -> Optional[ReadDone]:
        """The scheduler's read of the mailbox: this step's `ReadDone` once, then None.

        Never returns an event of an older step than the last one launched.
        """
        read_done, self._mailbox = self._mailbox, None
        if read_done is None or read_done.step != self._step:
            return None
        return read_done


class SchedulerBarrier:
    """The scheduler side: the schedule stream waits on the taken event, or on the whole
    forward stream (coarse) when there is none, when coarse is forced, or when a hook failed."""

    def __init__(self, platform: Any, force_coarse: bool = False, name: str = "scheduler") -> None:
        self.platform = platform
        self.force_coarse = bool(force_coarse)
        self.name = name
        self._notifier = _Notifier(platform, f"barrier {name!r}")
        self._on_barrier = platform.pm.hook.warpolicy_on_barrier

    def apply(self, schedule_stream: Any, forward_stream: Any, read_done: Optional[ReadDone]) -> str:
        """Order ``schedule_stream`` after the forward's shared reads; returns ``"event"`` or
        ``"coarse"``. Never raises while a safe barrier can still be applied."""
        if _profiling():
            with _record_function("warpolicy.barrier"):
                return self._apply(schedule_stream, forward_stream, read_done)
        return self._apply(schedule_stream, forward_stream, read_done)

    def _apply(self, schedule_stream: Any, forward_stream: Any, read_done: Optional[ReadDone]) -> str:
        # Every failure applies the safe (coarse) barrier *before* it is reported, so a warning
        # turned into an exception (``-W error``) can never leave the schedule stream unordered.
        kind = "coarse"
        error: Optional[BaseException] = None
        if self.force_coarse:
            reason = "forced"
        elif read_done is None:
            reason = "no read-done event"
        else:
            reason = ""
            try:
                self.platform.wait_event(schedule_stream, read_done.event)
                kind = "event"
            except Exception as exc:  # noqa: BLE001
                reason, error = "hook failed", exc
        if kind == "coarse":
            self._coarse(schedule_stream, forward_stream)
        if error is not None:
            self._notifier.fail("wait_event", error)
        if self._on_barrier.get_hookimpls():
            if kind == "event":
                reason = getattr(read_done.policy, "label", str(read_done.policy))
            error = self._notify(read_done, kind, reason)
            if error is not None:
                if kind == "event":
                    kind = "coarse"
                    self._coarse(schedule_stream, forward_stream)
                self._notifier.fail("warpolicy_on_barrier", error)
        return kind

    def _coarse(self, schedule_stream: Any, forward_stream: Any) -> None:
        try:
            self.platform.wait_stream(schedule_stream, forward_stream)
        except Exception as exc:  # noqa: BLE001 - last resort: the host waits for everything
            self.platform.synchronize()
            self._notifier.fail("wait_stream", exc)

    def _notify(self, read_done: Optional[ReadDone], kind: str, reason: str) -> Optional[BaseException]:
        """Tell the observers; returns the exception one raised (then the step goes coarse)."""
        runner = read_done.source if read_done is not None else self.name
        step = read_done.step if read_done is not None else None
        try:
            self._on_barrier(runner=runner, step=step, kind=kind, reason=reason)
        except Exception as exc:  # noqa: BLE001 - any hook raising means coarse
            return exc
        return None
