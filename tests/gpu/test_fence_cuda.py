"""The fence on a real GPU: a graph reads a shared index buffer, the fence plants the read-done
node, long work follows; the scheduler waits through `SchedulerBarrier` on a schedule stream and
immediately overwrites the buffer. Correct planting never corrupts; a plant before the read is
caught as corruption (so this test can fail).

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_fence_cuda.py``.
"""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
from gpu_support import HAVE_BINDINGS, NEEDS_CUDA

pytestmark = [*NEEDS_CUDA]

from warpolicy.registry.vocabulary import ForwardMode  # noqa: E402
from warpolicy.registry.vocabulary import WarReadDonePolicy as P  # noqa: E402
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier  # noqa: E402
from warpolicy.runtime.manager import new_plugin_manager, open_platform  # noqa: E402
from warpolicy.runtime.platforms import Platform  # noqa: E402
from warpolicy.runtime.platforms.cuda import CudaPlatform  # noqa: E402
from warpolicy.runtime.platforms.driver_wait import DriverEventWait  # noqa: E402
from warpolicy.runtime.release import (  # noqa: E402
    BucketFacts,
    BucketRelease,
    ModePolicies,
    decide_bucket,
)

ROWS = 4096
SPIN_CYCLES = 2_000_000  # ~1 ms on an H200: a wide window for a too-early release to be caught
TAIL_MATMULS = 8
REPLAYS = 20
PERMS = 4


@pytest.fixture(params=["driver", "torch"])
def platform(request):
    """The CUDA platform, its barrier waiting through the driver (cuda-bindings) or torch."""
    if request.param == "driver" and not HAVE_BINDINGS:
        pytest.skip("the driver wait needs cuda-bindings")
    if request.param == "driver":  # the product's route: the platform the hook answers
        p = open_platform(new_plugin_manager(load_entry_points=False, environ={}), "cuda")
        assert isinstance(p.event_wait.__self__, DriverEventWait)
    else:
        p = Platform(CudaPlatform(driver_wait=False))
    if not p.external_events_supported():
        pytest.skip("this torch has no external events")
    return p


class SharedReadGraph:
    """A captured graph: [plant if early] spin, index_select(shared), [plant if correct], matmuls."""

    def __init__(self, platform: Platform, plant_early: bool) -> None:
        dev = torch.device("cuda")
        self.platform = platform
        self.shared = torch.arange(ROWS, device=dev)
        self.table = torch.randn(ROWS, 64, device=dev)
        self.a = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16) / 64
        self.fence = ReadDoneFence(
            platform, ring_size=4, name="early" if plant_early else "correct"
        )
        self.plant_early = plant_early
        self.out: Any = None
        self.planted = None  # the event this graph records (from plant() during the capture)
        self.event = None
        self._body()  # eager warm-up: cuBLAS and the allocator before capture (plant is a no-op)
        platform.synchronize()
        self.event = self.fence.prepare()
        self.graph = platform.new_graph()
        with platform.capture(self.graph):
            self._body()
        platform.synchronize()
        assert self.fence.planted

    def _body(self) -> None:
        if self.plant_early:
            self._plant()  # WRONG: before the shared read
        torch.cuda._sleep(SPIN_CYCLES)
        self.out = self.shared_read()
        if not self.plant_early:
            self._plant()  # right after the last shared read
        c = self.a
        for _ in range(TAIL_MATMULS):
            c = c @ self.a
        self.tail = c

    def _plant(self) -> None:
        event = self.fence.plant(self.event)  # None in the warm-up (no event, not capturing)
        if event is not None:
            self.planted = event

    def shared_read(self) -> torch.Tensor:
        return self.table.index_select(0, self.shared)


def run_war_trial(g: SharedReadGraph, policy: P, replays: int = REPLAYS) -> int:
    """Replay with the scheduler overwriting the shared buffer right after the barrier; return how
    many replays produced a corrupted output."""
    p = g.platform
    dev = torch.device("cuda")
    perms = [torch.randperm(ROWS, device=dev) for _ in range(PERMS)]
    garbage = torch.zeros(ROWS, dtype=g.shared.dtype, device=dev)
    results = [torch.empty_like(g.out) for _ in range(replays)]
    fwd, sched = p.new_stream(), p.new_stream()
    barrier = SchedulerBarrier(p)
    writes_done = [p.create_event() for _ in range(4)]  # a ring: several steps may be in flight
    release = BucketRelease(g.fence.name, 1, policy, g.planted if policy is P.IN_GRAPH else None)
    p.synchronize()
    for i in range(replays):
        with p.stream(fwd):
            if i:
                p.wait_event(fwd, writes_done[(i - 1) % 4])  # RAW: the last scheduler write first
            g.shared.copy_(
                perms[i % PERMS]
            )  # this step's input, written in order on the forward stream
            if i % 2:  # the split calls, then take and apply
                g.fence.before_replay(release)
                p.replay(g.graph)
                g.fence.after_replay(release)
            else:  # the one-call step, then the one-call barrier
                token = g.fence.launch(release, p.replay, g.graph)
            results[i].copy_(g.out)
        if i % 2:
            kind = barrier.apply(sched, fwd, g.fence.take())
        else:
            kind = barrier.apply_step(sched, fwd, g.fence, token)
        assert kind == ("coarse" if policy is P.NONE else "event")
        with p.stream(sched):
            g.shared.copy_(garbage)  # the next batch's write, as early as the barrier allows
            p.record(writes_done[i % 4], sched)
    p.synchronize()
    expected = [g.table.index_select(0, perms[i % PERMS]) for i in range(replays)]
    return sum(not torch.equal(r, e) for r, e in zip(results, expected))


@pytest.mark.parametrize("policy", [P.IN_GRAPH, P.POST_REPLAY, P.NONE])
def test_correct_plant_never_corrupts(platform, policy):
    g = SharedReadGraph(platform, plant_early=False)
    corrupted = run_war_trial(g, policy)
    print(f"\n[fence cuda] plant after read, {policy.label}: corrupted {corrupted}/{REPLAYS}")
    assert corrupted == 0


def test_too_early_plant_is_caught_as_corruption(platform):
    g = SharedReadGraph(platform, plant_early=True)
    corrupted = run_war_trial(g, P.IN_GRAPH)
    print(f"\n[fence cuda] plant BEFORE read, in_graph: corrupted {corrupted}/{REPLAYS}")
    assert corrupted > 0  # proves the trial can fail


def test_fence_bench_reports_release_and_overhead():
    from warpolicy.bench.fence import format_fence_bench, run_fence_bench

    result = run_fence_bench(iters=600, replays=20)
    print("\n" + format_fence_bench(result))
    assert result["platform"] == "cuda"
    assert result["release"]["ratio"] is not None
    for section in ("overhead", "standin"):
        for row in result[section]["per_policy"].values():
            assert row["raw_us_median"] > 0 and row["ratio"] is not None


def test_cuda_platform_binds_torchs_own_calls(platform):
    assert platform.record is torch.cuda.Event.record
    assert platform.wait_event is torch.cuda.Stream.wait_event
    if isinstance(getattr(platform.event_wait, "__self__", None), DriverEventWait):
        assert HAVE_BINDINGS  # the barrier's wait: one driver call (test_driver_wait_cuda.py)
    else:
        assert platform.event_wait is torch.cuda.Event.wait  # torch's: one frame less
    # replay is graph.replay(), so a restored graph torch cannot hold replays the same way
    assert isinstance(platform.replay, operator.methodcaller)
    ev, s = platform.create_event(), platform.new_stream()
    platform.record(ev)  # None: the current stream
    platform.wait_event(s, ev)
    platform.event_wait(ev, s)
    platform.synchronize()
    assert ev.query()


def test_a_graph_without_the_node_publishes_a_fresh_post_replay_event(platform):
    g = SharedReadGraph(platform, plant_early=False)
    bare = platform.new_graph()
    with platform.capture(bare):
        g.shared_read()  # captured without a plant
    platform.synchronize()
    policies = ModePolicies(ForwardMode.DECODE, P.IN_GRAPH, P.POST_REPLAY, P.POST_REPLAY)
    release = decide_bucket(policies, BucketFacts(1), "bare")  # no node in this graph
    assert release.policy is P.POST_REPLAY
    g.fence.before_replay(release)
    platform.replay(bare)
    g.fence.after_replay(release)
    read_done = g.fence.take()
    assert read_done.policy is P.POST_REPLAY and read_done.event is not g.planted
    platform.synchronize()
