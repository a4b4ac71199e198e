"""A lagging scheduler (issue 17 class 6), on the simulated platform's happens-before model.

The scheduler takes each step's read-done right after the launch but waits on it ``lag``
launches later, then overwrites what that step read. A wait binds to the latest record of its
event, so:

* host-recorded events (``post_replay``) re-recorded while a wait is pending would bind that
  wait to a record on another, unordered forward stream: the fence refuses (coarse) instead;
* an in-graph event is recorded again only by a later launch of the same graph, and launches of
  one graph are serialized across streams (as on CUDA), so the wait only over-waits; each bucket
  records its own event, so no other graph's launch can re-record it.

Every scenario has a positive control that makes the same check fail (0.2.0's behaviour).
"""

from __future__ import annotations

import warnings
from collections import deque

import pytest

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.platforms.sim import SimPlatform
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.ring import EventRing, RingExhaustedError, RingSlot
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing import FaultySimPlatform, sim_impl, sim_platform


class SlotModel:
    """Step ``k`` (``batch == [k]``) reads its own input slot in the in-graph prep; a graph
    re-runs its body at replay on the simulated platform, reading the slot of the step that
    launched it."""

    def __init__(self, platform, buckets=()):
        self.impl = sim_impl(platform)
        self.buckets = tuple(buckets)
        self.shared_buffers = {}
        self.current = None
        self.reads = {}

    def bucket_sizes(self, mode: ForwardMode):
        return self.buckets

    def prepare_bucket(self, bucket):
        pass

    def host_prep(self, batch, bucket):
        self.current = batch[0]

    def graph_prep(self, bucket):
        mark = self.impl.mark(f"read slot {self.current}")
        if mark.executed and self.current is not None:
            self.reads[self.current] = mark

    def forward(self, bucket):
        return bucket

    def batch_size(self, batch):
        return batch[1]


def lagging_run(platform, runner, model, *, lag, streams, steps=24, size=lambda k: 1):
    """Steps on ``streams`` forward streams round robin; the scheduler waits ``lag`` launches
    late, then writes step ``k``'s slot. Returns how many writes were not ordered after the read
    they overwrite (early releases)."""
    impl = sim_impl(platform)
    forward = [platform.new_stream() for _ in range(streams)]
    sched = platform.new_stream()
    barrier = SchedulerBarrier(platform)
    held: deque = deque()
    early = 0

    def release(k, read_done):
        nonlocal early
        barrier.apply(sched, forward[k % streams], read_done)
        with platform.stream(sched):
            write = impl.mark(f"write slot {k}")
        early += not impl.happens_before(model.reads[k], write)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the ring's refusal, counted elsewhere
        for k in range(steps):
            with platform.stream(forward[k % streams]):
                runner.run([k, size(k)])
            held.append((k, runner.fence.take()))
            while len(held) > lag:
                release(*held.popleft())
        while held:
            release(*held.popleft())
    return early


def ring_without_enforcement(monkeypatch):
    """0.2.0's ring: plain round robin, re-recording an event a barrier may still wait on."""

    def free_slot(self):
        if len(self._slots) < self.size:
            self._slots.append(RingSlot(self._platform.create_event(False), self.source))
            return self._slots[-1]
        slot = self._slots[self._next]
        self._next = (self._next + 1) % self.size
        return slot

    monkeypatch.setattr(EventRing, "_free_slot", free_slot)


# -- host-recorded events -----------------------------------------------------------------------------


@pytest.mark.parametrize("lag", [4, 5, 8])
def test_a_lagging_scheduler_never_releases_early_on_host_recorded_events(lag):
    platform = sim_platform()
    model = SlotModel(platform)  # no buckets: every step eager, post_replay
    runner = DecodeRunner(model, fixed_policy("post_replay"), platform, ring_size=4)
    assert lagging_run(platform, runner, model, lag=lag, streams=3) == 0
    assert runner.fence.reporter.counts["fallback:ring"] > 0  # it refused, publishing nothing


@pytest.mark.parametrize("lag", [4, 8])
def test_control_a_ring_that_re_records_awaited_events_releases_early(monkeypatch, lag):
    ring_without_enforcement(monkeypatch)
    platform = sim_platform()
    model = SlotModel(platform)
    runner = DecodeRunner(model, fixed_policy("post_replay"), platform, ring_size=4)
    assert lagging_run(platform, runner, model, lag=lag, streams=3) > 0


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_a_lag_below_the_ring_size_publishes_every_step(lag):
    platform = sim_platform()
    model = SlotModel(platform)
    runner = DecodeRunner(model, fixed_policy("post_replay"), platform, ring_size=4)
    assert lagging_run(platform, runner, model, lag=lag, streams=3) == 0
    assert runner.fence.reporter.counts["fallback:ring"] == 0


def test_the_ring_refuses_rather_than_re_recording():
    platform = sim_platform()
    fence = ReadDoneFence(platform, ring_size=2)
    ring = fence.ring
    for _ in range(2):
        ring.record().taken = True
    records = [slot.event.records for slot in ring.slots]
    with pytest.raises(RingExhaustedError, match="still awaited by a barrier"):
        ring.record()
    assert [slot.event.records for slot in ring.slots] == records


# -- in-graph events ------------------------------------------------------------------------------------


@pytest.mark.parametrize("lag", [1, 2, 5])
@pytest.mark.parametrize("buckets", [(1,), (1, 2)])
def test_a_lagging_scheduler_only_over_waits_on_in_graph_events(lag, buckets):
    platform = sim_platform()
    model = SlotModel(platform, buckets)
    runner = DecodeRunner(model, fixed_policy("in_graph"), platform)
    runner.capture()
    size = lambda k: buckets[k % len(buckets)]  # noqa: E731 - alternate buckets too
    assert lagging_run(platform, runner, model, lag=lag, streams=2, size=size) == 0
    assert runner.last_step.policy.label == "in_graph"


def test_control_without_graph_launch_serialization_the_in_graph_wait_is_early(monkeypatch):
    """What the simulated platform reported before it modelled CUDA's serialization (and what
    it would report for graphs that are not one graph exec)."""

    def unserialized(self, graph):
        graph.done_clock = None
        SimPlatform.replay(self, graph)

    monkeypatch.setattr(FaultySimPlatform, "replay", unserialized)
    platform = sim_platform()
    model = SlotModel(platform, (1,))
    runner = DecodeRunner(model, fixed_policy("in_graph"), platform)
    runner.capture()
    assert lagging_run(platform, runner, model, lag=1, streams=2) > 0


def test_control_one_event_shared_by_every_bucket_releases_early(monkeypatch):
    """0.2.0's fence-wide persistent event: another bucket's graph re-records it on another
    stream, and launches of different graphs are not serialized."""
    shared = {}
    original = ReadDoneFence.prepare

    def one_event(self):
        if "event" not in shared:
            shared["event"] = original(self)
        self._event = shared["event"]
        return shared["event"]

    monkeypatch.setattr(ReadDoneFence, "prepare", one_event)
    platform = sim_platform()
    model = SlotModel(platform, (1, 2))
    runner = DecodeRunner(model, fixed_policy("in_graph"), platform)
    runner.capture()
    size = lambda k: (1, 2)[k % 2]  # noqa: E731
    assert lagging_run(platform, runner, model, lag=1, streams=2, size=size) > 0
