"""`EventRing`: host-recorded events, never re-recorded while a wait may still bind to them.

A wait binds to the most recently enqueued record of an event. If the host records an event
again while the scheduler still holds a read-done of its previous record and has not waited on
it yet (a scheduler that lags behind the launches), the late wait binds to the new record: on
one forward stream that only over-waits, but with the steps spread over unordered streams the
new record says nothing about the old step's reads, and the scheduler is released early. So a
ring slot the scheduler has taken (`EventSlot.taken`) is skipped until a barrier has waited on
it, and when every slot is taken `record` refuses (`RingExhaustedError`): the caller then
publishes nothing for that step (the coarse barrier), never a re-record.

The fence records its ``pre_replay`` / ``post_replay`` events here, and the overlap loop the
events after the scheduler's writes. ``size`` is the steps that may be in flight, bounded by
`MAX_RING_SIZE` (one line on anything else).
"""

from __future__ import annotations

import operator

from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import POST_REPLAY, PRE_REPLAY
from warpolicy.runtime.platforms import EventHandle, Platform, StreamHandle
from warpolicy.runtime.release import EventSlot, ReadDone

#: The largest ring (events created lazily, one per step in flight).
MAX_RING_SIZE = 1024


def check_ring_size(value: object, what: str = "ring_size") -> int:
    """``value`` as a ring size (an integer from 2 to `MAX_RING_SIZE`), else `InputError`."""
    try:
        size = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InputError(
            f"{what} must be an integer from 2 to {MAX_RING_SIZE}, not {value!r}"
        ) from None
    if not 2 <= size <= MAX_RING_SIZE:
        raise InputError(f"{what} must be an integer from 2 to {MAX_RING_SIZE}, not {size}")
    return size


class RingExhaustedError(RuntimeError):
    """Every event of the ring is still awaited by a barrier; recording one would re-record it."""


class RingSlot(EventSlot):
    """A ring event with the two read-done records a fence hands out for it (built once)."""

    __slots__ = ("post_replay", "pre_replay")

    def __init__(self, event: EventHandle, source: str) -> None:
        super().__init__(event)
        self.pre_replay = ReadDone(event, PRE_REPLAY, source, self)
        self.post_replay = ReadDone(event, POST_REPLAY, source, self)


class EventRing:
    """``size`` host-recorded events of ``platform`` (created on first use), handed out round
    robin, skipping any a barrier may still wait on."""

    def __init__(self, platform: Platform, size: int, source: str) -> None:
        self.size = check_ring_size(size)
        self.source = source
        self._platform = platform
        self._record = platform.record
        self._slots: list[RingSlot] = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def slots(self) -> tuple[RingSlot, ...]:
        return tuple(self._slots)

    def fill(self) -> None:
        """Create every event now (before capture); raises what the platform raises."""
        while len(self._slots) < self.size:
            self._slots.append(RingSlot(self._platform.create_event(False), self.source))

    def record(self, stream: StreamHandle | None = None) -> RingSlot:
        """Record the next free event on ``stream`` (None: the current stream) and return its
        slot. Raises `RingExhaustedError` (recording nothing) when every event is taken and not
        yet waited on, and what the platform raises when creating or recording fails."""
        index = self._next
        slots = self._slots
        if len(slots) == self.size and not slots[index].taken:  # the common case, inline
            slot = slots[index]
            self._next = (index + 1) % self.size
        else:
            slot = self._free_slot()
        self._record(slot.event, stream)
        return slot

    def _free_slot(self) -> RingSlot:
        slots = self._slots
        if len(slots) < self.size:  # the first `size` records each get a fresh event
            slot = RingSlot(self._platform.create_event(False), self.source)
            slots.append(slot)
            return slot
        index = self._next
        for _ in range(self.size):
            slot = slots[index]
            index = (index + 1) % self.size
            if not slot.taken:
                self._next = index
                return slot
        raise RingExhaustedError(
            f"all {self.size} ring events are still awaited by a barrier (the scheduler lags "
            f"{self.size} or more steps behind the launches, or a taken read-done was never "
            "waited on); recording one again would let that wait bind to the new record"
        )
