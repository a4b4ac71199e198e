"""The scheduler side of the fence: an overlap loop that owns the schedule stream.

Where an engine calls it: in the scheduler's event loop, at the point where it launches the
forward of batch N and then prepares batch N+1 while N runs. Replace::

    out = runner.run(batch_n)                 # launch N on the forward stream
    write_next_batch_device_state()           # req_to_token rows, SWA map, page tables, ...

with::

    out = loop.step(batch_n, write_next=write_next_batch_device_state)

`OverlapLoop.step` then, in this order:

1. makes the forward stream wait for the previous step's schedule-stream writes (an event:
   read-after-write, so batch N reads what the scheduler wrote for it; the whole schedule
   stream when recording that event failed);
2. launches N through the runner (which publishes its read-done event per policy);
3. takes the event from the runner's mailbox (consume-once) *right after the launch*, and
   applies the barrier on the schedule stream: wait on the event, or on the whole forward
   stream when there is none (coarse). Nothing is written before this point;
4. runs ``write_next()`` with the schedule stream current, then, when the runner's WAR canary
   sampled this step, its check (behind a full barrier, on the schedule stream: it can never
   race the scheduler's next writes, which come after it on the same stream), and records an
   event after both.

With a canary whose ``lead_rate`` is above 0 (the loop's ``canary=``, else its runner's), sampled
steps also measure the release lead: a timing event on the forward stream after the launch and
one on the schedule stream after the barrier, read later (never on the step path) and reported
to ``warpolicy_on_release_lead`` at the end of a later sampled step (once everything of that
step is ordered: an observer that raises cannot come between a launch and its barrier).

Failures stay ordered: a failed barrier falls back to the coarse one (then to a host
synchronize; if even that fails the step raises before anything is written), a failed
record after the writes makes the next forward wait for the whole schedule stream, and a launch
that raises leaves the schedule stream waiting for everything it enqueued and the next forward
waiting for every write.

A loop belongs to one thread (the first that steps it; `WrongThreadError` from any other).

Every device write the scheduler makes to state a forward reads must go through
``write_next`` (a writer path that bypasses the barrier is the peers' largest bug class,
docs/background.md §2). Host-only scheduling work can happen anywhere. Tensors that ``write_next``
allocates and a later forward reads belong to the schedule stream; keep them alive (or
``record_stream`` them) until that forward has run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from warpolicy.runtime.canary import Canary, LeadMark, ReleaseLeadProbe
from warpolicy.runtime.fence import SchedulerBarrier
from warpolicy.runtime.observers import NO_OBSERVERS, Observers, Reporter
from warpolicy.runtime.ordering import order_after
from warpolicy.runtime.ownership import ThreadOwner, get_ident
from warpolicy.runtime.platforms import Platform, StreamHandle
from warpolicy.runtime.release import ReadDone
from warpolicy.runtime.ring import EventRing, RingSlot
from warpolicy.runtime.runners.protocols import CanaryHost, ClassMailbox, Runner


class StepProbe(Protocol):
    """Optional instrumentation (benchmarks, traces, audits): ``mark`` is called at four points
    of each step with the stream the point belongs to; it may record timing events there.

    Points: ``"launch"`` (forward stream, after the wait on the previous writes, before the
    runner), ``"launched"`` (forward stream, after the runner), ``"released"`` (schedule
    stream, after the barrier), ``"written"`` (schedule stream, after ``write_next``).
    """

    def mark(self, point: str, stream: Any) -> None: ...


class _WholeStream:
    """The next forward waits for the whole schedule stream (recording after the writes failed)."""


_WHOLE_STREAM = _WholeStream()


class OverlapLoop:
    """Scheduler-side helper: barrier right after each launch, next-batch writes on the
    schedule stream, forward waits for those writes before the next launch.

    ``runner`` (or a ``platform`` for a loop that gets its runner per step) supplies the
    platform and, unless ``observers`` is given, the observers. ``unsafe_skip_barrier`` removes
    step 3's barrier entirely: only for benchmarks' upper bound and audits' controls; it races
    by construction. ``canary`` measures release leads (default: the runner's canary); the
    canary's checks are each runner's own (`CanaryHost.check_canary`).
    """

    def __init__(
        self,
        runner: Runner | None = None,
        platform: Platform | None = None,
        force_coarse: bool = False,
        *,
        observers: Observers | None = None,
        forward_stream: StreamHandle | None = None,
        schedule_stream: StreamHandle | None = None,
        probe: StepProbe | None = None,
        unsafe_skip_barrier: bool = False,
        ring_size: int = 4,
        canary: Canary | None = None,
    ) -> None:
        if platform is None:
            if runner is None:
                raise TypeError("OverlapLoop needs a runner or a platform")
            platform = runner.platform
        if observers is None:
            observers = runner.observers if runner is not None else NO_OBSERVERS
        self.runner = runner
        self.platform = platform
        self.forward_stream = forward_stream
        self.schedule_stream = (
            schedule_stream if schedule_stream is not None else platform.new_stream()
        )
        self.barrier = SchedulerBarrier(platform, force_coarse=force_coarse, observers=observers)
        # the loop's failures are reported as its current runner's ("overlap loop 'decode'"),
        # so the metrics label them with the runner; one reporter per runner, made once
        self._observers = observers
        self._reporters: dict[int, tuple[Runner | None, Reporter]] = {}
        self._reporting = runner
        self.reporter = self._reporter_of(runner)
        self.probe = probe
        self.unsafe_skip_barrier = bool(unsafe_skip_barrier)
        # a ring, not one re-recorded event: several steps can be in flight (docs/background.md §2)
        self._ring = EventRing(platform, ring_size, "overlap loop")
        self._owner = ThreadOwner("overlap loop")
        self._pending: RingSlot | None = None  # the event after the last step's writes
        self._whole_stream = False  # the last record failed: wait for the whole stream
        self.last_read_done: ReadDone | None = None
        self.last_barrier: str | None = None  # "event", "coarse" or "skipped" (unsafe)
        #: per class of the last step's ``class_writes``: its barrier ("event", "coarse",
        #: "skipped"), in order
        self.last_class_barriers: tuple[tuple[str, str], ...] = ()
        self.steps = 0
        # the WAR canary: each runner's check (resolved once per runner), the loop's lead probe
        self._checks: dict[int, tuple[Runner, Callable[[], None] | None]] = {}
        self._check = self._check_of(runner) if runner is not None else None
        if canary is None and isinstance(runner, CanaryHost):
            canary = runner.canary
        self.canary = canary
        self._lead: ReleaseLeadProbe | None = (
            canary.lead_probe(self.reporter) if canary is not None else None
        )

    def _reporter_of(self, runner: Runner | None) -> Reporter:
        """The reporter of the loop's failures while ``runner`` steps (made once per runner)."""
        cached = self._reporters.get(id(runner))
        if cached is not None and cached[0] is runner:
            return cached[1]
        who = "overlap loop" if runner is None else f"overlap loop {runner.name!r}"
        reporter = Reporter(self._observers, who)
        self._reporters[id(runner)] = (runner, reporter)
        return reporter

    def _check_of(self, runner: Runner) -> Callable[[], None] | None:
        """The runner's canary check, or None (no canary): resolved once per runner."""
        cached = self._checks.get(id(runner))
        if cached is not None and cached[0] is runner:
            return cached[1]
        check = None
        if isinstance(runner, CanaryHost) and runner.canary is not None:
            check = runner.check_canary
        self._checks[id(runner)] = (runner, check)
        return check

    def release_thread(self) -> None:
        """Hand the loop to another thread: the next thread that steps it owns it."""
        self._owner.release()

    def step(
        self,
        batch: Any,
        write_next: Callable[[], Any] | None = None,
        runner: Runner | None = None,
        class_writes: Sequence[tuple[str, Callable[[], Any]]] = (),
    ) -> Any:
        """Launch ``batch`` (on ``runner``, default the loop's), barrier, then ``write_next()``
        on the schedule stream. Returns the runner's output.

        ``class_writes``: the scheduler's writes per buffer class, ``(class, write)``, earliest
        read end first: each runs after a barrier on its class's read-done
        (`ReadDoneFence.take_class`; a class the step does not publish is the coarse
        barrier), then ``write_next`` after the barrier on the step's latest read-done."""
        if self._owner.ident != get_ident():
            self._owner.claim()
        if runner is None or runner is self.runner:
            runner, check = self.runner, self._check
        else:
            check = self._check_of(runner)
        if runner is None:
            raise TypeError("OverlapLoop.step needs a runner (none given to the loop)")
        if runner is not self._reporting:  # another runner steps: its failures are its own
            self._reporting = runner
            self.reporter = self._reporter_of(runner)
        p = self.platform
        lead = self._lead
        mark: LeadMark | None = None
        fwd = self.forward_stream if self.forward_stream is not None else p.current_stream()
        with p.stream(fwd):
            if self._pending is not None or self._whole_stream:
                self._wait_for_writes(fwd)
            # until this step's writes are recorded, whatever raises on the way (the launch,
            # the barrier, an observer, KeyboardInterrupt), the next forward, on any stream,
            # waits for the whole schedule stream
            self._whole_stream = True
            self._mark("launch", fwd)
            try:
                out = runner.run(batch)
            except BaseException:
                self._launch_failed(runner, fwd)
                raise
            self._mark("launched", fwd)
            if lead is not None:  # a sampled step: a timestamp when the forward ends
                mark = lead.mark_forward(fwd)
        self.last_read_done = runner.fence.take()  # consume-once, right after the launch
        if class_writes:
            return self._class_step(runner, fwd, out, class_writes, write_next, check, mark)
        if self.unsafe_skip_barrier:
            if self.last_read_done is not None:
                self.last_read_done.slot.taken = False  # nothing will wait on it
            self.last_barrier = "skipped"
        else:
            self.last_barrier = self._apply_barrier(fwd, self.last_read_done)
        if mark is not None and lead is not None:  # a timestamp when the scheduler is released
            self._lead_released(lead, mark, runner)
        self._mark("released", self.schedule_stream)
        with p.stream(self.schedule_stream):
            try:
                if write_next is not None:
                    write_next()
                if check is not None:  # the canary's check: after the writes, before the record
                    check()
            finally:  # even if write_next raised: the next forward waits for what it wrote
                self._record_writes()
        self._mark("written", self.schedule_stream)
        self.steps += 1
        if lead is not None and lead.wants_poll:  # everything of this step is ordered: report
            lead.poll()
        return out

    def _class_step(
        self,
        runner: Runner,
        fwd: StreamHandle,
        out: Any,
        class_writes: Sequence[tuple[str, Callable[[], Any]]],
        write_next: Callable[[], Any] | None,
        check: Callable[[], None] | None,
        mark: LeadMark | None,
    ) -> Any:
        """Steps 3-4 with one barrier per class: every class's read-done is taken right after
        the launch; on the schedule stream each class's writes follow its own barrier, and
        ``write_next`` (and the canary's check) the barrier on the step's latest read-done."""
        fence = runner.fence
        taken = [
            (fence.take_class(name) if isinstance(fence, ClassMailbox) else None, write)
            for name, write in class_writes
        ]
        latest = self.last_read_done
        p = self.platform
        barriers: list[str] = []
        if self.unsafe_skip_barrier:
            for read_done in [latest] + [rd for rd, _ in taken]:
                if read_done is not None:
                    read_done.slot.taken = False  # nothing will wait on it
            self.last_barrier = "skipped"
            barriers = ["skipped"] * len(taken)
        else:
            self.last_barrier = self._apply_barrier(fwd, taken[0][0])
            barriers.append(self.last_barrier)
        if mark is not None and self._lead is not None:
            self._lead_released(self._lead, mark, runner)
        self._mark("released", self.schedule_stream)
        with p.stream(self.schedule_stream):
            try:
                for i, (read_done, write) in enumerate(taken):
                    if i and not self.unsafe_skip_barrier:
                        barriers.append(self._apply_barrier(fwd, read_done))
                    write()
                if not self.unsafe_skip_barrier:
                    self._apply_barrier(fwd, latest)
                if write_next is not None:
                    write_next()
                if check is not None:
                    check()
            finally:
                self._record_writes()
                self.last_class_barriers = tuple(
                    (name, barrier) for (name, _), barrier in zip(class_writes, barriers)
                )
        self._mark("written", self.schedule_stream)
        self.steps += 1
        if self._lead is not None and self._lead.wants_poll:
            self._lead.poll()
        return out

    def _launch_failed(self, runner: Runner, fwd: StreamHandle) -> None:
        """The launch raised (``KeyboardInterrupt`` too) after enqueuing some of its reads on
        ``fwd``, and it consumed the wait for the last writes there: order the schedule stream
        after everything on ``fwd`` (the coarse barrier, else a host synchronize), hand nothing
        to a barrier, and make the next forward, on whatever stream, wait for every write."""
        self._whole_stream = True
        self._pending = None
        # order first (a second interrupt here still leaves the host waiting), then clean up
        order_after(self.platform, self.schedule_stream, (fwd,))
        try:
            read_done = runner.fence.take()
            if read_done is not None:
                read_done.discard()
        except Exception:  # noqa: BLE001 - nothing to hand out either way
            pass

    def _record_writes(self) -> None:
        """Record a ring event after the writes; on failure the next forward waits for the
        whole schedule stream instead (never for an older step's event)."""
        self._pending = None
        self._whole_stream = True
        try:
            slot = self._ring.record(self.schedule_stream)
        except Exception as exc:  # noqa: BLE001 - ordered anyway, through the whole stream
            self.reporter.fallback(
                "record",
                exc,
                f"recording the writes failed ({exc!r}); the next forward waits for the "
                "whole schedule stream",
            )
            return
        slot.taken = True  # the next forward waits on it
        self._pending = slot
        self._whole_stream = False

    def _wait_for_writes(self, fwd: StreamHandle) -> None:
        """The forward stream waits for the last writes: their event, else the whole schedule
        stream, else the host waits for everything. Raises (before the launch) if all fail."""
        p = self.platform
        pending, self._pending = self._pending, None
        self._whole_stream = True  # until a wait succeeds
        error: Exception | None = None
        if pending is not None:
            try:
                p.wait_event(fwd, pending.event)
            except Exception as exc:  # noqa: BLE001 - fall back to the whole stream
                error = exc
            else:
                pending.taken = False
                self._whole_stream = False
                return
            pending.taken = False
        order_after(p, fwd, (self.schedule_stream,))  # else the host waits for everything
        self._whole_stream = False
        if error is not None:
            self.reporter.fallback(
                "wait",
                error,
                f"waiting for the last writes failed ({error!r}); waited for the whole "
                "schedule stream",
            )

    def _apply_barrier(self, fwd: StreamHandle, read_done: ReadDone | None) -> str:
        """The barrier; if it fails, the coarse one (never an earlier release), then a host
        synchronize; if that fails too the step raises before anything is written."""
        try:
            return str(self.barrier.apply(self.schedule_stream, fwd, read_done))
        except Exception as exc:  # noqa: BLE001 - fail closed
            order_after(self.platform, self.schedule_stream, (fwd,))  # else the host waits
            if read_done is not None:
                read_done.slot.taken = False
            self.reporter.fallback(
                "barrier", exc, f"barrier failed ({exc!r}); using the coarse barrier"
            )
            return "coarse"

    def _mark(self, point: str, stream: Any) -> None:
        if self.probe is not None:
            self.probe.mark(point, stream)

    def _lead_released(self, lead: ReleaseLeadProbe, mark: LeadMark, runner: Runner) -> None:
        info = runner.last_step
        lead.mark_released(
            mark,
            self.schedule_stream,
            runner.name,
            runner.mode,
            info.bucket if info is not None else None,
            info.step if info is not None else 0,
        )

    def drain(self) -> None:
        """Wait for everything in flight (both streams); read the release leads measured."""
        self.platform.synchronize()
        if self._lead is not None:
            self._lead.poll()
