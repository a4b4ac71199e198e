"""The barrier's wait through the CUDA driver, on a real GPU: the CUDA platform binds it when
cuda-bindings is there; it orders a stream after an event exactly as torch's wait does (the
default stream through torch's own); a never-recorded event fails, and the barrier goes coarse.
The WAR trials of test_fence_cuda.py run over both routes.

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -m cuda tests/gpu/test_driver_wait_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
from gpu_support import NEEDS_BINDINGS, NEEDS_CUDA

pytestmark = [*NEEDS_CUDA, NEEDS_BINDINGS]

from warpolicy.registry.vocabulary import WarReadDonePolicy as P  # noqa: E402
from warpolicy.runtime.fence import SchedulerBarrier  # noqa: E402
from warpolicy.runtime.graphwalk.errors import CudaCallError  # noqa: E402
from warpolicy.runtime.platforms import Platform  # noqa: E402
from warpolicy.runtime.platforms.cuda import CudaPlatform  # noqa: E402
from warpolicy.runtime.platforms.driver_wait import DriverEventWait  # noqa: E402
from warpolicy.runtime.release import EventSlot, ReadDone  # noqa: E402

SPIN_CYCLES = 20_000_000  # ~10 ms: the copy after a missing wait runs long before the fill


def test_the_cuda_platform_binds_the_driver_wait_or_torchs():
    driver = CudaPlatform()
    assert isinstance(driver.event_wait.__self__, DriverEventWait)
    assert CudaPlatform(driver_wait=False).event_wait is torch.cuda.Event.wait


def ordered_copy(wait, schedule: torch.cuda.Stream) -> float:
    """The forward stream spins, then fills ``x`` and records an event; ``schedule`` waits on
    it through ``wait`` (None: no wait) and copies ``x``: the copy's value (1.0 when ordered)."""
    forward = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda")
    y = torch.empty_like(x)
    event = torch.cuda.Event()
    torch.cuda.synchronize()
    with torch.cuda.stream(forward):
        torch.cuda._sleep(SPIN_CYCLES)
        x.fill_(1.0)
        event.record(forward)
    if wait is not None:
        wait(event, schedule)
    with torch.cuda.stream(schedule):
        y.copy_(x)
    torch.cuda.synchronize()
    return float(y.min())


@pytest.mark.parametrize("route", ["driver", "torch"])
@pytest.mark.parametrize("stream", ["new", "default"])
def test_the_wait_orders_the_stream_after_the_event(route, stream):
    platform = CudaPlatform(driver_wait=route == "driver")
    schedule = torch.cuda.Stream() if stream == "new" else torch.cuda.default_stream()
    assert ordered_copy(platform.event_wait, schedule) == 1.0
    if route == "driver":  # twice: the remembered handles
        assert ordered_copy(platform.event_wait, schedule) == 1.0


def test_the_trial_can_fail_without_the_wait():
    assert ordered_copy(None, torch.cuda.Stream()) == 0.0  # the positive control


def test_a_never_recorded_event_fails_and_the_barrier_goes_coarse():
    impl = CudaPlatform()
    event, schedule = torch.cuda.Event(), torch.cuda.Stream()
    with pytest.raises(CudaCallError, match="event never recorded"):
        impl.event_wait(event, schedule)
    platform = Platform(impl)
    read_done = ReadDone(event, P.POST_REPLAY, "test", EventSlot(event))
    with pytest.warns(RuntimeWarning, match="event never recorded"):
        kind = SchedulerBarrier(platform).apply(schedule, torch.cuda.current_stream(), read_done)
    assert kind == "coarse"
