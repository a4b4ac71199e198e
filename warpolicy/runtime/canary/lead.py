"""The release lead, measured live: how long before the end of the forward the scheduler was
released, from sampled GPU timestamps.

On a sampled step the overlap loop records one timing event on the **forward** stream right
after the step is launched (it completes when the forward does) and one on the **schedule**
stream right after the barrier (it completes when the scheduler is released). The lead is
``forward end - release``, clamped at 0: the GPU time the scheduler's next writes could overlap
the forward. A coarse barrier releases at the forward's end (lead 0); an ``in_graph`` release
leads by the forward's time after its last shared read.

Nothing is read on the step path: recorded pairs wait in a bounded queue and are read only
once both events completed (a non-blocking query), at the end of a later sampled step (after the
barrier and the scheduler's writes are enqueued) or at ``drain``. Each reading reaches
``warpolicy_on_release_lead`` (metrics) and the canary's per-cell summary (`LeadSummary`, for
``bench`` output). The two marks never call an observer (a failing clock is reported at the next
`ReleaseLeadProbe.poll`), so nothing an observer raises can come between a launch and its
barrier.

Clocks: `CudaLeadClock` (timing events) on CUDA; `HostLeadClock` on the simulated platform (host
time at enqueue: it exercises the path, its numbers mean nothing); any `LeadClock` can be given.
"""

from __future__ import annotations

import collections
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.canary.sampling import Countdown
from warpolicy.runtime.observers import Reporter
from warpolicy.runtime.platforms import StreamHandle

#: Recorded pairs waiting to be read; a sampled step finding the queue full is not measured.
MAX_PENDING = 64
#: Readings each summary keeps for its median.
SUMMARY_WINDOW = 1024


class LeadClock(Protocol):
    """Timestamps recorded on a stream and read later."""

    def stamp(self, stream: StreamHandle) -> Any:
        """Record a timestamp on ``stream`` (enqueued: it is taken when the stream gets there)."""
        ...

    def ready(self, stamp: Any) -> bool:
        """Whether ``stamp`` has been taken (non-blocking)."""
        ...

    def elapsed_us(self, start: Any, end: Any) -> float:
        """Microseconds from ``start`` to ``end`` (both ready)."""
        ...

    def recycle(self, stamp: Any) -> None:
        """``stamp`` has been read and will not be used again."""
        ...


class CudaLeadClock:
    """CUDA timing events (``torch.cuda.Event(enable_timing=True)``), reused once read."""

    def __init__(self) -> None:
        import torch  # noqa: PLC0415 - deferred: only a CUDA process measures leads this way

        self._event = lambda: torch.cuda.Event(enable_timing=True)
        self._free: list[Any] = []

    def stamp(self, stream: StreamHandle) -> Any:
        event = self._free.pop() if self._free else self._event()
        event.record(stream)
        return event

    def ready(self, stamp: Any) -> bool:
        return bool(stamp.query())

    def elapsed_us(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) * 1000.0

    def recycle(self, stamp: Any) -> None:
        if len(self._free) < 2 * MAX_PENDING:
            self._free.append(stamp)


class HostLeadClock:
    """Host time at enqueue (the simulated platform runs everything at enqueue)."""

    def stamp(self, stream: StreamHandle) -> Any:
        return time.perf_counter()

    def ready(self, stamp: Any) -> bool:
        return True

    def elapsed_us(self, start: Any, end: Any) -> float:
        return (float(end) - float(start)) * 1e6

    def recycle(self, stamp: Any) -> None:
        pass


@attrs.frozen
class LeadKey:
    """Whose lead: a runner, its mode and the bucket (None: an eager step)."""

    runner: str
    mode: ForwardMode
    bucket: int | None

    def label(self) -> str:
        where = "eager" if self.bucket is None else f"bucket {self.bucket}"
        return f"{self.runner} {self.mode.label} {where}"


class LeadSummary:
    """Readings of one `LeadKey`: count, mean, min, max and the median of the latest
    `SUMMARY_WINDOW`."""

    __slots__ = ("count", "max_us", "min_us", "recent", "total_us")

    def __init__(self) -> None:
        self.count = 0
        self.total_us = 0.0
        self.min_us = float("inf")
        self.max_us = 0.0
        self.recent: collections.deque[float] = collections.deque(maxlen=SUMMARY_WINDOW)

    def add(self, lead_us: float) -> None:
        self.count += 1
        self.total_us += lead_us
        self.min_us = min(self.min_us, lead_us)
        self.max_us = max(self.max_us, lead_us)
        self.recent.append(lead_us)

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count if self.count else float("nan")

    @property
    def median_us(self) -> float:
        return float(statistics.median(self.recent)) if self.recent else float("nan")

    def to_json(self) -> dict:
        return {
            "count": self.count,
            "median_us": self.median_us,
            "mean_us": self.mean_us,
            "min_us": self.min_us if self.count else None,
            "max_us": self.max_us if self.count else None,
        }


@attrs.define
class _Pending:
    key: LeadKey
    step: int
    forward_end: Any
    released: Any = None


class LeadMark:
    """A sampled step's forward-end stamp, until the barrier's stamp joins it."""

    __slots__ = ("pending",)

    def __init__(self, pending: _Pending) -> None:
        self.pending = pending


class ReleaseLeadProbe:
    """The lead of sampled steps of one overlap loop (`mark_forward` after the launch,
    `mark_released` after the barrier, `poll` to read completed pairs).

    ``record(key, step, lead_us)`` receives every reading (the canary's summaries); every
    reading also reaches ``warpolicy_on_release_lead`` through ``reporter``, in `poll` only (the
    loop polls at the end of a sampled step). A failing clock turns the probe off; the failure
    is reported (``warpolicy_on_fallback``) at the next `poll`. The marks never raise.
    """

    def __init__(
        self,
        clock: LeadClock,
        rate: float,
        reporter: Reporter,
        record: Callable[[LeadKey, int, float], None],
        seed: int | None = None,
    ) -> None:
        self.clock = clock
        self.reporter = reporter
        self._record = record
        self._countdown = Countdown(rate, seed)
        self._pending: collections.deque[_Pending] = collections.deque()
        self.enabled = rate > 0
        self.skipped = 0  # sampled steps not measured (the queue was full)
        self._error: Exception | None = None  # a failure of a mark, reported at `poll`
        #: a step was sampled (or a mark failed) since the last `poll`: the loop polls then
        self.wants_poll = False

    def mark_forward(self, stream: StreamHandle) -> LeadMark | None:
        """After the step's launch, with ``stream`` its forward stream: a mark when this step is
        sampled, else None."""
        if not self.enabled or not self._countdown.due():
            return None
        self.wants_poll = True
        if len(self._pending) >= MAX_PENDING:
            self.skipped += 1
            return None
        try:
            stamp = self.clock.stamp(stream)
        except Exception as exc:  # noqa: BLE001 - observability never changes a step
            self._off(exc)
            return None
        return LeadMark(_Pending(LeadKey("", ForwardMode.DECODE, None), 0, stamp))

    def mark_released(
        self,
        mark: LeadMark,
        stream: StreamHandle,
        runner: str,
        mode: ForwardMode,
        bucket: int | None,
        step: int,
    ) -> None:
        """After the barrier, with ``stream`` the schedule stream: queue the pair."""
        pending = mark.pending
        if not self.enabled:
            return
        try:
            pending.released = self.clock.stamp(stream)
        except Exception as exc:  # noqa: BLE001 - observability never changes a step
            self._off(exc)
            return
        pending.key = LeadKey(runner, mode, bucket)
        pending.step = step
        self._pending.append(pending)

    def poll(self) -> int:
        """Read every pair whose events completed (oldest first, non-blocking) and report
        them (and a failure of a mark since the last poll); returns how many were read."""
        read = 0
        clock = self.clock
        self.wants_poll = False
        if self._error is not None:
            error, self._error = self._error, None
            self._report_off(error)
        try:
            while self._pending:
                head = self._pending[0]
                if not (clock.ready(head.released) and clock.ready(head.forward_end)):
                    break
                self._pending.popleft()
                lead = max(0.0, clock.elapsed_us(head.released, head.forward_end))
                clock.recycle(head.released)
                clock.recycle(head.forward_end)
                read += 1
                self._record(head.key, head.step, lead)
                if self.reporter.observers.on_release_lead:
                    key = head.key
                    self.reporter.release_lead(key.runner, key.mode, key.bucket, head.step, lead)
        except Exception as exc:  # noqa: BLE001 - observability never changes a step
            self._off(exc)
            self._error = None
            self._report_off(exc)
        return read

    def _off(self, exc: Exception) -> None:
        """A clock failed: off from now on, reported at the next `poll`."""
        self.enabled = False
        self._pending.clear()
        self._error = exc

    def _report_off(self, exc: Exception) -> None:
        self.reporter.fallback(
            "release_lead",
            exc,
            f"measuring the release lead failed ({exc!r}); release leads are off for this loop",
        )


__all__ = [
    "MAX_PENDING",
    "CudaLeadClock",
    "HostLeadClock",
    "LeadClock",
    "LeadKey",
    "LeadMark",
    "LeadSummary",
    "ReleaseLeadProbe",
]
