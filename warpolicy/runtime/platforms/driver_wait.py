"""The scheduler barrier's per-step wait as one CUDA driver call (``cuStreamWaitEvent``).

torch's event-first wait, ``torch.cuda.Event.wait(event, stream)``, is a Python method that
calls a pybind function, which unpacks the stream, selects the stream's device and calls
``cudaStreamWaitEvent``. `DriverEventWait` makes the same wait through cuda-bindings'
``cuStreamWaitEvent`` with the stream and event wrapped once (the last stream, and every event
it has seen, kept), so a step pays one Python frame over the driver call. On an H100 and an
H200 the raw driver call took 0.44-0.45 us where torch's ``Event.wait`` took 0.71-0.73 us, and
the fence's in_graph step with the barrier went from about 1.5x to about 1.3x the raw torch
wait (``warpolicy bench fence``; docs/measurements.md).

It is the same operation, or it fails closed:

* A stream whose handle is relative to the calling thread (``0``, the legacy default stream,
  ``cudaStreamLegacy`` or ``cudaStreamPerThread``: which stream they name depends on the
  thread's current device) and anything without a raw CUDA handle (``cuda_stream``,
  ``cuda_event``) goes to torch's own wait, which selects the device first.
* An event torch has not created yet (handle ``0``: never recorded) raises `CudaCallError`
  (torch's wait would silently do nothing; the barrier then applies the coarse barrier), and
  is not remembered, so its first record makes it waitable.
* Any result other than ``CUDA_SUCCESS`` raises `CudaCallError`; the barrier applies the coarse
  barrier and reports it.

Wrapping a handle is a function of its value alone, so a remembered wrapper stays right even
when torch frees an event and reuses its handle. The remembered events are bounded
(`MAX_EVENTS`; past it the memory starts over) and hold the events alive until then.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from warpolicy.runtime.graphwalk.cuda import checked, driver_module
from warpolicy.runtime.graphwalk.errors import BindingsMissingError, CudaCallError

#: The most events one `DriverEventWait` remembers before it starts over.
MAX_EVENTS = 4096

#: Stream handles whose meaning depends on the calling thread (its current device, its
#: per-thread default stream): ``0``, ``cudaStreamLegacy`` (1), ``cudaStreamPerThread`` (2).
THREAD_RELATIVE_STREAMS = frozenset({0, 1, 2})

_WAIT = "cuStreamWaitEvent"


class DriverEventWait:
    """``wait(event, stream)``: ``stream`` waits for the latest record of ``event``, through the
    driver (see the module docstring). ``driver`` is ``cuda.bindings.driver``; ``fallback`` is
    the same wait by another route (``torch.cuda.Event.wait``), for the streams and events the
    driver call cannot take as they are."""

    __slots__ = (
        "_cu_event",
        "_cu_stream",
        "_driver",
        "_events",
        "_fallback",
        "_last",
        "_ok",
        "_wait",
        "max_events",
    )

    def __init__(
        self,
        driver: Any,  # cuda.bindings.driver, or a stand-in with the names used here
        fallback: Callable[[Any, Any], None],
        max_events: int = MAX_EVENTS,
    ) -> None:
        self._driver = driver
        self._wait = driver.cuStreamWaitEvent
        self._ok = driver.CUresult.CUDA_SUCCESS
        self._cu_stream = driver.CUstream
        self._cu_event = driver.CUevent
        self._fallback = fallback
        self.max_events = max_events
        self._events: dict[Any, Any] = {}  # event -> its CUevent
        # (stream, its CUstream or None for the fallback): one tuple, so a second thread can
        # never pair one stream with another's handle
        self._last: tuple[Any, Any] = (None, None)

    def wait(self, event: Any, stream: Any) -> None:
        last, cu_stream = self._last
        if last is not stream:
            cu_stream = self._stream(stream)
        if cu_stream is None:
            self._fallback(event, stream)
            return
        cu_event = self._events.get(event)
        if cu_event is None:
            cu_event = self._event(event)
            if cu_event is None:
                self._fallback(event, stream)
                return
        result = self._wait(cu_stream, cu_event, 0)
        if result[0] is not self._ok:  # (an equal code that is not the same object passes)
            checked(self._driver, _WAIT, result)  # raises CudaCallError with the code's name

    def _stream(self, stream: Any) -> Any:
        """The stream's CUstream, or None where the fallback must wait; remembered."""
        try:
            handle = stream.cuda_stream
        except AttributeError:  # not a CUDA stream torch made: its own wait knows it
            handle = None
        if not isinstance(handle, int) or handle in THREAD_RELATIVE_STREAMS:
            cu_stream = None
        else:
            cu_stream = self._cu_stream(handle)
        self._last = (stream, cu_stream)
        return cu_stream

    def _event(self, event: Any) -> Any:
        """The event's CUevent (remembered), or None where the fallback must wait."""
        try:
            handle = event.cuda_event
        except AttributeError:
            return None  # not a CUDA event torch made: its own wait knows it
        if not isinstance(handle, int):
            return None
        if handle == 0:
            raise CudaCallError(_WAIT, "event never recorded", "no CUDA event behind it yet")
        if len(self._events) >= self.max_events:
            self._events.clear()
        cu_event = self._events[event] = self._cu_event(handle)
        return cu_event


def driver_event_wait(
    fallback: Callable[[Any, Any], None], driver: Any = None
) -> Callable[[Any, Any], None] | None:
    """`DriverEventWait.wait` over ``driver`` (None: ``cuda.bindings.driver``, when
    cuda-bindings is installed), or None when there is none or it lacks the call."""
    if driver is None:
        try:
            driver = driver_module()
        except BindingsMissingError:
            return None
    names = ("cuStreamWaitEvent", "CUresult", "CUstream", "CUevent")
    if not all(hasattr(driver, name) for name in names):
        return None
    return DriverEventWait(driver, fallback).wait
