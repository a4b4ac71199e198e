"""The release lead measured live (warpolicy.runtime.canary.lead): timestamps on the forward
stream after the launch and on the schedule stream after the barrier, read later, reported to
``warpolicy_on_release_lead`` and summarised per (runner, mode, bucket)."""

from __future__ import annotations

import pytest
from canary_support import NamedFixed, TableModel

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.canary import Canary, CanaryConfig, HostLeadClock, LeadKey
from warpolicy.runtime.canary.lead import MAX_PENDING
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.platforms.sim import SimPlatform
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop
from warpolicy.testing import sim_runtime


class FakeClock:
    """Stamps carry the stream they were recorded on; the forward stream's stamps read
    ``end_us``, the schedule stream's ``released_us``; ``ready`` is switchable."""

    def __init__(self, end_us: float, released_us: float) -> None:
        self.end_us, self.released_us = end_us, released_us
        self.ready_now = True
        self.schedule = None
        self.stamps = 0
        self.recycled = 0
        self.fail = False

    def stamp(self, stream):
        if self.fail:
            raise RuntimeError("clock broke")
        self.stamps += 1
        return self.released_us if stream is self.schedule else self.end_us

    def ready(self, stamp):
        return self.ready_now

    def elapsed_us(self, start, end):
        return end - start

    def recycle(self, stamp):
        self.recycled += 1


class Leads:
    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.fallbacks: list[str] = []

    @hookimpl
    def warpolicy_on_release_lead(self, runner, mode, bucket, step, lead_us):
        self.seen.append((runner, mode, bucket, step, lead_us))

    @hookimpl
    def warpolicy_on_fallback(self, where, error):
        self.fallbacks.append(where)


def setup(policy="in_graph", clock=None, lead_rate=1.0, rate=0.0):
    rt = sim_runtime()
    leads = Leads()
    rt.pm.register(leads)
    canary = Canary(
        rt.platform,
        CanaryConfig(rate=rate, lead_rate=lead_rate, seed=1),
        observers=rt.observers,
        lead_clock=clock,
    )
    model = TableModel()
    runner = DecodeRunner(
        model, NamedFixed(policy), rt.platform, observers=rt.observers, canary=canary
    )
    runner.capture()
    loop = OverlapLoop(runner)
    if clock is not None:
        clock.schedule = loop.schedule_stream
    return canary, loop, leads, model


def test_each_sampled_step_reports_its_lead_per_cell():
    clock = FakeClock(end_us=900.0, released_us=250.0)
    canary, loop, leads, _ = setup(clock=clock)
    for batch in ([1.0, 2.0], [1.0, 2.0, 3.0], [1.0]):
        loop.step(batch, None)
    loop.drain()
    assert leads.seen == [
        ("decode", ForwardMode.DECODE, 2, 0, 650.0),
        ("decode", ForwardMode.DECODE, 4, 1, 650.0),
        ("decode", ForwardMode.DECODE, 2, 2, 650.0),
    ]
    summary = canary.leads[LeadKey("decode", ForwardMode.DECODE, 2)]
    assert summary.count == 2 and summary.median_us == 650.0
    assert summary.to_json()["max_us"] == 650.0
    assert clock.recycled == 6  # every stamp handed back once read


def test_a_release_after_the_forward_end_is_a_lead_of_zero():
    clock = FakeClock(end_us=100.0, released_us=400.0)  # a coarse barrier: released at the end
    _, loop, leads, _ = setup("none", clock=clock)
    loop.step([1.0], None)
    loop.drain()
    assert [s[-1] for s in leads.seen] == [0.0]


def test_leads_are_read_later_never_waited_for():
    clock = FakeClock(end_us=10.0, released_us=5.0)
    clock.ready_now = False
    canary, loop, leads, _ = setup(clock=clock)
    for _ in range(3):
        loop.step([1.0], None)
    assert leads.seen == [] and not canary.leads  # nothing complete: nothing read, no wait
    clock.ready_now = True
    loop.step([1.0], None)  # the end of the next sampled step reads what completed
    assert len(leads.seen) == 4
    loop.drain()
    assert len(leads.seen) == 4


def test_the_queue_of_unread_leads_is_bounded():
    clock = FakeClock(end_us=10.0, released_us=5.0)
    clock.ready_now = False
    _, loop, _, _ = setup(clock=clock)
    for _ in range(MAX_PENDING + 5):
        loop.step([1.0], None)
    assert loop._lead.skipped == 5 and clock.stamps == 2 * MAX_PENDING


def test_a_failing_clock_is_reported_and_never_stops_a_step():
    clock = FakeClock(end_us=10.0, released_us=5.0)
    clock.fail = True
    _, loop, leads, _ = setup(clock=clock)
    with pytest.warns(RuntimeWarning, match="release leads are off"):
        for _ in range(3):
            loop.step([1.0], None)
    assert leads.fallbacks == ["overlap loop 'decode':release_lead"] and loop._lead.enabled is False


def test_off_without_a_lead_rate():
    _, loop, leads, _ = setup(lead_rate=0.0)
    loop.step([1.0], None)
    loop.drain()
    assert loop._lead is None and leads.seen == []


def test_the_simulated_platform_uses_host_time_and_the_path_runs():
    canary, loop, leads, _ = setup()
    assert isinstance(loop._lead.clock, HostLeadClock)
    for _ in range(4):
        loop.step([1.0, 2.0], None)
    loop.drain()
    assert len(leads.seen) == 4 and all(s[-1] >= 0.0 for s in leads.seen)


def test_a_platform_without_a_clock_says_so_once():
    class Hip(SimPlatform):
        name = "hip"

    canary = Canary(Platform(Hip()), CanaryConfig(lead_rate=1.0))
    with pytest.warns(RuntimeWarning, match="no release-lead clock"):
        assert canary.lead_probe() is None


def test_the_loop_takes_the_canary_it_is_given_over_the_runners():
    rt = sim_runtime()
    mine = Canary(rt.platform, CanaryConfig(lead_rate=1.0))
    runner = DecodeRunner(TableModel(), NamedFixed("in_graph"), rt.platform)
    runner.capture()
    loop = OverlapLoop(runner, canary=mine)
    for _ in range(2):
        loop.step([1.0], None)
    loop.drain()
    assert sum(s.count for s in mine.leads.values()) == 2
