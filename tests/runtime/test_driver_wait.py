"""The barrier's wait through the CUDA driver (`DriverEventWait`), against a fake driver: every
wait reaches the driver with exactly the raw handles of its own stream and event, or torch's
wait where the driver call cannot take them; failures raise, and the barrier goes coarse."""

from __future__ import annotations

import enum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.registry.vocabulary import WarReadDonePolicy as P
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.graphwalk.errors import CudaCallError
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.platforms import driver_wait as driver_wait_mod
from warpolicy.runtime.platforms.driver_wait import (
    THREAD_RELATIVE_STREAMS,
    DriverEventWait,
    driver_event_wait,
)
from warpolicy.runtime.platforms.sim import SimPlatform
from warpolicy.runtime.release import BucketRelease


class FakeResult(enum.Enum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_HANDLE = 400


class FakeDriver:
    """``cuda.bindings.driver`` as far as the wait uses it: wrappers that count how often they
    are made, and a wait that logs the raw handles it got (and, given ``on_wait``, does it)."""

    CUresult = FakeResult

    def __init__(self, on_wait=None) -> None:
        self.log: list[tuple[str, object, object]] = []
        self.made = {"stream": 0, "event": 0}
        self.result = FakeResult.CUDA_SUCCESS
        self.on_wait = on_wait

    def CUstream(self, handle):
        self.made["stream"] += 1
        return ("CUstream", handle)

    def CUevent(self, handle):
        self.made["event"] += 1
        return ("CUevent", handle)

    def cuStreamWaitEvent(self, cu_stream, cu_event, flags):
        assert flags == 0
        self.log.append(("driver", cu_stream[1], cu_event[1]))
        if self.result is FakeResult.CUDA_SUCCESS and self.on_wait is not None:
            self.on_wait(cu_stream[1], cu_event[1])
        return (self.result,)

    def cuGetErrorString(self, err):
        return (FakeResult.CUDA_SUCCESS, b"invalid resource handle")


class Event:
    def __init__(self, handle: int) -> None:
        self.cuda_event = handle


class Stream:
    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


def make_wait(driver: FakeDriver, max_events: int = 4096) -> DriverEventWait:
    def fallback(event, stream):
        driver.log.append(("torch", stream, event))

    return DriverEventWait(driver, fallback, max_events)


EVENTS = [Event(0x100), Event(0x200), Event(0x300), object()]
STREAMS = [Stream(0x10), Stream(0x20), Stream(0), Stream(1), Stream(2), object()]


def expected_route(event: object, stream: object) -> tuple[str, object, object]:
    """The oracle, from the objects alone: the driver with the raw handles, or torch's wait."""
    stream_handle = getattr(stream, "cuda_stream", None)
    event_handle = getattr(event, "cuda_event", None)
    if stream_handle is None or stream_handle in (0, 1, 2) or event_handle is None:
        return ("torch", stream, event)
    return ("driver", stream_handle, event_handle)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=40),
    st.integers(1, 4),
)
def test_every_wait_gets_its_own_streams_and_events_handles(calls, max_events):
    driver = FakeDriver()
    wait = make_wait(driver, max_events)
    for event_index, stream_index in calls:
        wait.wait(EVENTS[event_index], STREAMS[stream_index])
    expected = [expected_route(EVENTS[e], STREAMS[s]) for e, s in calls]
    assert driver.log == expected
    assert len(wait._events) <= max_events


def test_a_stream_and_an_event_are_wrapped_once():
    driver = FakeDriver()
    wait = make_wait(driver)
    stream, events = Stream(0x10), [Event(0x100), Event(0x200)]
    for _ in range(5):
        for event in events:
            wait.wait(event, stream)
    assert driver.made == {"stream": 1, "event": 2}
    assert len(driver.log) == 10


def test_thread_relative_streams_are_torchs_to_wait_on():
    assert frozenset({0, 1, 2}) == THREAD_RELATIVE_STREAMS
    driver = FakeDriver()
    wait = make_wait(driver)
    event = Event(0x100)
    for handle in (0, 1, 2):
        stream = Stream(handle)
        wait.wait(event, stream)
        assert driver.log[-1] == ("torch", stream, event)
    assert driver.made["stream"] == 0


def test_an_event_never_recorded_raises_and_is_not_remembered():
    driver = FakeDriver()
    wait = make_wait(driver)
    event, stream = Event(0), Stream(0x10)
    with pytest.raises(CudaCallError, match="cuStreamWaitEvent failed: event never recorded"):
        wait.wait(event, stream)
    assert driver.log == []  # no wait was made, and the fallback (a silent no-op) not taken
    event.cuda_event = 0x700  # its first record creates it
    wait.wait(event, stream)
    assert driver.log == [("driver", 0x10, 0x700)]


def test_an_error_code_raises_with_its_name():
    driver = FakeDriver()
    driver.result = FakeResult.CUDA_ERROR_INVALID_HANDLE
    wait = make_wait(driver)
    with pytest.raises(CudaCallError) as caught:
        wait.wait(Event(0x100), Stream(0x10))
    assert str(caught.value) == (
        "cuStreamWaitEvent failed: CUDA_ERROR_INVALID_HANDLE (invalid resource handle)"
    )
    assert isinstance(caught.value, Exception)  # what the barrier turns into the coarse barrier


def test_driver_event_wait_needs_the_driver_call(monkeypatch):
    fallback = lambda event, stream: None  # noqa: E731
    assert driver_event_wait(fallback, driver=object()) is None

    def missing():
        raise driver_wait_mod.BindingsMissingError("cuda-bindings is not installed")

    monkeypatch.setattr(driver_wait_mod, "driver_module", missing)
    assert driver_event_wait(fallback) is None
    wait = driver_event_wait(fallback, driver=FakeDriver())
    assert isinstance(wait.__self__, DriverEventWait)


# -- through the barrier, on the simulated platform ------------------------------------------------


class DriverRoutedSim(SimPlatform):
    """The simulated platform whose barrier wait goes through `DriverEventWait`: the fake
    driver resolves the raw handles back to the simulated stream and event and waits there, so
    the simulated platform's own log says which stream waited on which event."""

    def __init__(self) -> None:
        super().__init__()
        self._by_handle: dict[int, object] = {}
        self._proxies: dict[object, object] = {}
        self.driver = FakeDriver(on_wait=self._wait_by_handle)
        self.waiter = DriverEventWait(self.driver, self._torch_wait)

    def _proxy(self, obj, cls, handle):
        proxy = self._proxies.get(obj)
        if proxy is None:
            proxy = self._proxies[obj] = cls(handle)
            proxy.sim = obj
            self._by_handle[handle] = obj
        return proxy

    def event_wait(self, event, stream):
        self.waiter.wait(
            self._proxy(event, Event, 0x1000 + event.id),
            self._proxy(stream, Stream, 0x8000 + stream.id),
        )

    def _wait_by_handle(self, stream_handle, event_handle):
        self.wait_event(self._by_handle[stream_handle], self._by_handle[event_handle])

    def _torch_wait(self, event, stream):
        raise AssertionError("the driver route was expected")


def _published_step(platform: Platform):
    fence = ReadDoneFence(platform, ring_size=4, name="decode")
    release = BucketRelease("decode", 1, P.POST_REPLAY)
    forward = platform.current_stream()
    step = fence.before_replay(release)
    fence.after_replay(release, step=step)
    return fence, step, forward


def test_the_barrier_waits_through_the_driver_on_its_own_stream_and_event():
    platform = Platform(DriverRoutedSim())
    fence, step, forward = _published_step(platform)
    schedule = platform.new_stream()
    event = fence._mailbox.event
    assert SchedulerBarrier(platform).apply_step(schedule, forward, fence, step) == "event"
    assert platform.log[-1] == ("wait_event", schedule.id, event.id)
    assert platform.impl.driver.log == [("driver", 0x8000 + schedule.id, 0x1000 + event.id)]


def test_a_failed_driver_wait_gives_the_coarse_barrier():
    impl = DriverRoutedSim()
    impl.driver.result = FakeResult.CUDA_ERROR_INVALID_HANDLE
    platform = Platform(impl)
    fence, step, forward = _published_step(platform)
    schedule = platform.new_stream()
    with pytest.warns(RuntimeWarning, match="cuStreamWaitEvent failed"):
        kind = SchedulerBarrier(platform).apply_step(schedule, forward, fence, step)
    assert kind == "coarse"
    assert ("wait_stream", schedule.id, forward.id) in platform.log
