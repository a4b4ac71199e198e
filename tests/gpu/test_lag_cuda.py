"""A lagging scheduler on a real GPU (issue 17 class 6): the scheduler takes each step's
read-done right after the launch but waits on it ``LAG`` launches later, then overwrites the
input that step read. Each step reads its own input slot, so a write that lands before that
step's read shows up as a corrupted output of exactly that step.

(a) Host-recorded ring events (``post_replay``), eager steps on three unordered forward streams,
    ``LAG >= ring_size``: 0.2.0's ring re-records an event the scheduler still holds, its late
    wait binds to a record on another stream, and outputs are corrupted (positive control);
    the enforced ring refuses instead (that step publishes nothing) and none are.
(b) In-graph events (one bucket, two forward streams, any lag): a later launch of the same
    graph re-records the event, but launches of one graph exec are serialized across streams,
    so the wait only over-waits: 0 corrupted; without any barrier (control) outputs are.

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_lag_cuda.py``.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch
from gpu_support import NEEDS_CUDA

pytestmark = [*NEEDS_CUDA]

from warpolicy.runtime.fence import SchedulerBarrier  # noqa: E402
from warpolicy.runtime.manager import new_plugin_manager, open_platform  # noqa: E402
from warpolicy.runtime.policy import fixed_policy  # noqa: E402
from warpolicy.runtime.ring import EventRing, RingSlot  # noqa: E402
from warpolicy.runtime.runners import DecodeRunner  # noqa: E402

ROWS = 4096
WIDTH = 64
STEPS = 24
RING = 4
LONG_SPIN = 4_000_000  # ~2 ms on an H200: the read of a slow step comes late
SHORT_SPIN = 50_000


@pytest.fixture
def platform():
    p = open_platform(new_plugin_manager(load_entry_points=False, environ={}), "cuda")
    if not p.external_events_supported():
        pytest.skip("this torch has no external events")
    return p


class SlotModel:
    """Step ``k`` (``batch == [k]``) gathers ``table`` rows by its own slot ``slots[k]`` into
    ``outs[k]``. Eagerly the step index comes from the host; in a graph from a device counter
    that every replay advances (launches of one graph are serialized, so in step order)."""

    shared_buffers: dict = {}

    def __init__(self, buckets=(), slow_every=3) -> None:
        dev = torch.device("cuda")
        g = torch.Generator(device="cpu").manual_seed(0)
        self.perms = torch.stack([torch.randperm(ROWS, generator=g) for _ in range(STEPS)]).to(dev)
        self.slots = self.perms.clone()
        self.table = torch.randn(ROWS, WIDTH, device=dev)
        self.outs = torch.zeros(STEPS, ROWS, WIDTH, device=dev)
        self.counter = torch.zeros(1, dtype=torch.int64, device=dev)
        self.buckets = tuple(buckets)
        self.slow_every = slow_every
        self.k = 0

    def bucket_sizes(self, mode):
        return self.buckets

    def prepare_bucket(self, bucket):
        pass

    def batch_size(self, batch):
        return 1

    def host_prep(self, batch, bucket):
        self.k = batch[0]

    def graph_prep(self, bucket):
        if self.buckets:  # in a graph: the device counter says which step this launch is
            torch.cuda._sleep(LONG_SPIN)
            slot = self.slots.index_select(0, self.counter).view(-1)
            rows = self.table.index_select(0, slot).unsqueeze(0)
            self.outs.index_copy_(0, self.counter, rows)
            self.counter.add_(1)
        else:
            slow = self.k % self.slow_every == 0
            torch.cuda._sleep(LONG_SPIN if slow else SHORT_SPIN)
            torch.index_select(self.table, 0, self.slots[self.k], out=self.outs[self.k])

    def forward(self, bucket):
        return self.outs

    def corrupted(self) -> list[int]:
        torch.cuda.synchronize()
        return [
            k
            for k in range(STEPS)
            if not torch.equal(self.outs[k], self.table.index_select(0, self.perms[k]))
        ]


def lagging(platform, runner, model, *, lag, streams, barrier=True):
    """Launch STEPS steps round robin on ``streams`` forward streams; the scheduler waits
    ``lag`` launches late (or, without ``barrier``, not at all), then zeroes that step's slot."""
    forward = [platform.new_stream() for _ in range(streams)]
    sched = platform.new_stream()
    scheduler = SchedulerBarrier(platform)
    held: deque = deque()
    platform.synchronize()

    def release(k, read_done):
        if barrier:
            scheduler.apply(sched, forward[k % streams], read_done)
        elif read_done is not None:
            read_done.discard()
        with platform.stream(sched):
            model.slots[k].zero_()  # the slot is free: the next batch's write

    for k in range(STEPS):
        with platform.stream(forward[k % streams]):
            runner.run([k])
        held.append((k, runner.fence.take()))
        while len(held) > lag:
            release(*held.popleft())
    while held:
        release(*held.popleft())
    return model.corrupted()


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


# -- (a) host-recorded ring events -------------------------------------------------------------


@pytest.mark.parametrize("lag", [RING, RING + 2])
def test_a_lagging_scheduler_on_host_recorded_events(platform, monkeypatch, lag):
    model = SlotModel()  # no buckets: every step eager, post_replay
    runner = DecodeRunner(model, fixed_policy("post_replay"), platform, ring_size=RING)
    with pytest.warns(RuntimeWarning, match="still awaited by a barrier"):
        enforced = lagging(platform, runner, model, lag=lag, streams=3)
    refused = runner.fence.reporter.counts["fallback:ring"]
    with monkeypatch.context() as patch:
        ring_without_enforcement(patch)
        control_model = SlotModel()
        control = DecodeRunner(control_model, fixed_policy("post_replay"), platform, ring_size=RING)
        early = lagging(platform, control, control_model, lag=lag, streams=3)
    print(
        f"\n[lag cuda] post_replay, lag {lag}, ring {RING}, 3 streams: enforced ring "
        f"{len(enforced)}/{STEPS} corrupted ({refused} steps refused, coarse); 0.2.0 ring "
        f"(control) {len(early)}/{STEPS} corrupted (steps {early})"
    )
    assert early, "the positive control must corrupt: the scenario can fail"
    assert enforced == []


# -- (b) in-graph events ------------------------------------------------------------------------


@pytest.mark.parametrize("lag", [1, 2, 5])
def test_a_lagging_scheduler_only_over_waits_on_in_graph_events(platform, lag):
    model = SlotModel(buckets=(1,))
    runner = DecodeRunner(model, fixed_policy("in_graph"), platform, self_check="off")
    runner.capture()
    assert runner.policy_for(1).label == "in_graph"
    model.counter.zero_()
    corrupted = lagging(platform, runner, model, lag=lag, streams=2)

    control_model = SlotModel(buckets=(1,))
    control = DecodeRunner(control_model, fixed_policy("in_graph"), platform, self_check="off")
    control.capture()
    control_model.counter.zero_()
    unordered = lagging(platform, control, control_model, lag=lag, streams=2, barrier=False)
    print(
        f"\n[lag cuda] in_graph, lag {lag}, 2 streams: {len(corrupted)}/{STEPS} corrupted; "
        f"no barrier (control) {len(unordered)}/{STEPS}"
    )
    assert unordered, "the positive control must corrupt: the scenario can fail"
    assert corrupted == []
