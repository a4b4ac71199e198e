"""Lifetimes on the event ring: freeing is a write like any other.

A KV page, a request slot or a recurrent state slot freed while a step that may read it is in
flight must not be handed to the next batch and written before that step's reads end; a host
staging slot must not be refilled by the host before the step that copies from it is done.
Both wait for the read-done of the last step that may read the resource, the same events the
fence publishes (`warpolicy.runtime.fence.ReadDoneFence.take_class` for the resource's class,
or `take` for the latest), never for more.

* `DeferredFrees`: device-ordered reuse. ``free(items, read_done)`` holds the items with the
  event of the last step that may read them; ``reclaim(stream)`` makes ``stream`` (where the
  scheduler writes the reused resources: its schedule stream) wait on each held group's
  event and hands the items back; writes enqueued on ``stream`` afterwards are ordered after
  those reads. Groups are reclaimed oldest first, so an allocator that asks for the groups of
  earlier steps (``before_step``) waits on events that have long fired: no stall.
* `StagingRing`: host-written slots (pinned staging, device-visible host rings). A slot read by
  step ``k`` is handed out again only once the host knows step ``k`` is done
  (`StagingRing.completed`, e.g. after it read that step's outputs back); with every slot
  still in use it returns None and the caller waits (the coarse point).

Failing closed, always: a resource whose read-done is unknown (``read_done=None``: the step
published nothing) or whose wait failed is held until a coarse point (`DeferredFrees.settle`
after the host waited for the forward stream); a failed event wait falls back to waiting for
the whole forward stream first (``forward_stream``); a ``BaseException`` during a reclaim keeps
every group not yet ordered held, then re-raises. What is held is reported (`LifetimeStats`):
it stays bounded by the steps in flight as long as the scheduler reclaims each step.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Generic, TypeVar

import attrs

from warpolicy.runtime.observers import NO_OBSERVERS, Observers, Reporter
from warpolicy.runtime.platforms import EventHandle, Platform, StreamHandle
from warpolicy.runtime.release import ReadDone

T = TypeVar("T")


@attrs.define
class LifetimeStats:
    """What a lifetime tracker holds and did: items and steps held now and at most, items
    handed back, waits enqueued, coarse fallbacks, and groups held to a coarse point."""

    held_items: int = 0
    held_steps: int = 0
    peak_items: int = 0
    peak_steps: int = 0
    released: int = 0
    waits: int = 0
    coarse: int = 0
    unknown: int = 0

    def describe(self) -> str:
        return (
            f"held {self.held_items} items of {self.held_steps} steps (peak {self.peak_items} "
            f"items, {self.peak_steps} steps), released {self.released}, {self.waits} event "
            f"waits, {self.coarse} coarse, {self.unknown} held to a coarse point"
        )


@attrs.define
class _Group(Generic[T]):
    step: int
    items: list[T]
    event: EventHandle | None  # None: unknown, held until settle() (unless ordered)
    ordered: bool = False  # the writer is already ordered after the readers


class DeferredFrees(Generic[T]):
    """Freed resources held until the read-done of the last step that may read them orders
    the writer (see the module docstring). One scheduler thread uses it."""

    def __init__(
        self,
        platform: Platform,
        name: str = "deferred frees",
        *,
        forward_stream: StreamHandle | None = None,
        observers: Observers = NO_OBSERVERS,
    ) -> None:
        self.platform = platform
        self.name = name
        self.forward_stream = forward_stream
        self.reporter = Reporter(observers, name)
        self.stats = LifetimeStats()
        self._groups: collections.deque[_Group[T]] = collections.deque()
        self._step = 0

    def free(
        self,
        items: Iterable[T],
        read_done: ReadDone | None,
        step: int | None = None,
        *,
        ordered: bool = False,
    ) -> None:
        """Free ``items``, which the step whose read-done is ``read_done`` (and no later step)
        may still read. ``read_done`` None: unknown (that step published nothing), so the items
        stay held until `settle`, unless ``ordered``: the scheduler frees them on the stream
        the readers ran on (or after a host wait), so any later write there is ordered.
        ``step`` numbers the group (default: one more than the last)."""
        group = list(items)
        self._step = self._step + 1 if step is None else int(step)
        if not group:
            return
        event = read_done.event if read_done is not None else None
        if event is None and not ordered:
            self.stats.unknown += 1
        self._groups.append(_Group(self._step, group, event, ordered and event is None))
        self._count()

    def reclaim(self, stream: StreamHandle, before_step: int | None = None) -> list[T]:
        """Make ``stream`` wait on every held group's read-done (those freed before step
        ``before_step`` only, when given) and hand their items back, oldest first. A group
        whose wait fails is ordered by a wait on the whole forward stream instead, else kept
        held until `settle`; unknown groups stay held."""
        out: list[T] = []
        kept: collections.deque[_Group[T]] = collections.deque()
        pending = self._groups
        self._groups = kept
        try:
            while pending:
                group = pending[0]
                late = before_step is not None and group.step >= before_step
                usable = not late and (group.ordered or group.event is not None)
                if usable and (group.ordered or self._order(stream, group)):
                    out.extend(group.items)
                else:
                    kept.append(group)
                pending.popleft()
        except BaseException:
            kept.extend(pending)  # the group being ordered too: never handed out unordered
            self._count()
            raise
        self.stats.released += len(out)
        self._count()
        return out

    def _order(self, stream: StreamHandle, group: _Group[T]) -> bool:
        assert group.event is not None
        try:
            self.platform.wait_event(stream, group.event)
        except Exception as exc:  # noqa: BLE001 - fail closed: the whole forward stream
            self.reporter.fallback("wait_event", exc)
        except BaseException:  # KeyboardInterrupt: order this group coarsely, then re-raise
            self._coarse(stream)  # if this raises too, the group is kept by reclaim
            raise
        else:
            self.stats.waits += 1
            return True
        return self._coarse(stream)

    def _coarse(self, stream: StreamHandle) -> bool:
        if self.forward_stream is None:
            return False
        try:
            self.platform.wait_stream(stream, self.forward_stream)
        except Exception as exc:  # noqa: BLE001 - kept until a coarse point
            self.reporter.fallback("wait_stream", exc)
            return False
        self.stats.coarse += 1
        return True

    def settle(self) -> list[T]:
        """At a coarse point (the host waited for everything the forwards enqueued): every
        held item, the unknown ones included."""
        out = [item for group in self._groups for item in group.items]
        self._groups.clear()
        self.stats.released += len(out)
        self._count()
        return out

    def _count(self) -> None:
        stats = self.stats
        stats.held_steps = len({g.step for g in self._groups})
        stats.held_items = sum(len(g.items) for g in self._groups)
        stats.peak_items = max(stats.peak_items, stats.held_items)
        stats.peak_steps = max(stats.peak_steps, stats.held_steps)


class StagingRing:
    """``size`` host-written staging slots (indices ``0..size-1``). ``acquire(step)`` hands
    out a slot for step ``step`` whose last reading step the host knows is done
    (`completed`), else None: every slot is still read by a step in flight, so the caller
    waits (a host synchronize, then ``completed(last step)``) or skips staging."""

    def __init__(self, size: int, name: str = "staging ring") -> None:
        if size < 1:
            raise ValueError(f"{name}: a ring holds at least one slot, not {size}")
        self.name = name
        self.size = size
        self._reader: list[int | None] = [None] * size  # the step that reads each slot
        self._done = 0  # every step up to this one is done (the host knows)
        self._next = 0
        self.stats = LifetimeStats()

    def acquire(self, step: int) -> int | None:
        """A slot for ``step`` to read (the host writes it now), or None (all in flight)."""
        for offset in range(self.size):
            slot = (self._next + offset) % self.size
            reader = self._reader[slot]
            if reader is None or reader <= self._done:
                self._reader[slot] = int(step)
                self._next = (slot + 1) % self.size
                self.stats.released += reader is not None
                self._count()
                return slot
        self.stats.coarse += 1
        return None

    def completed(self, step: int) -> None:
        """The host knows every step up to ``step`` is done (their reads of staging ended)."""
        self._done = max(self._done, int(step))
        self._count()

    def _count(self) -> None:
        busy = [r for r in self._reader if r is not None and r > self._done]
        stats = self.stats
        stats.held_items = len(busy)
        stats.held_steps = len(set(busy))
        stats.peak_items = max(stats.peak_items, stats.held_items)
        stats.peak_steps = max(stats.peak_steps, stats.held_steps)


__all__ = ["DeferredFrees", "LifetimeStats", "StagingRing"]
