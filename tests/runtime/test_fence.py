"""ReadDoneFence and SchedulerBarrier on the simulated platform: call sequences per policy, the
ring, the step counter, the consume-once mailbox, publishes tied to their own graph, observers
that cannot change anything, and fail-closed on injected platform failures."""

from __future__ import annotations

import inspect
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.registry.vocabulary import WarReadDonePolicy as P
from warpolicy.runtime.fence import ReadDone, ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.platform import sim_platform

sim_platform = sim_platform


@pytest.fixture
def platform():
    return sim_platform()


def captured_fence(platform, ring_size=4):
    """A prepared fence with one captured graph that planted the node; (fence, graph, event)."""
    fence = ReadDoneFence(platform, ring_size=ring_size, name="decode")
    fence.prepare()
    graph = platform.new_graph()
    with platform.capture(graph):
        event = fence.plant()
    assert event is fence.event is not None
    return fence, graph, event


def step(platform, fence, graph, policy, barrier=None, schedule=None, planted=None):
    """One runner step plus the scheduler's take and barrier; returns (read_done, kind)."""
    fence.before_replay(policy)
    platform.replay(graph)
    fence.after_replay(policy, planted if planted is not None else fence.event)
    read_done = fence.take()
    kind = None
    if barrier is not None:
        kind = barrier.apply(schedule, platform.current_stream(), read_done)
    return read_done, kind


@pytest.fixture
def register(platform):
    """Register inline plugins on the platform's manager; always unregistered afterwards."""
    added = []

    def add(plugin, name=None):
        platform.pm.register(plugin, name=name)
        added.append(plugin)
        return plugin

    yield add
    for plugin in added:
        platform.pm.unregister(plugin)


# -- capture time ----------------------------------------------------------------------------------


def test_prepare_seeds_persistent_external_event_then_plant_records_in_capture(platform):
    fence = ReadDoneFence(platform, ring_size=2)
    assert fence.prepare() is True
    ev = fence.event
    graph = platform.new_graph()
    with platform.capture(graph):
        assert fence.plant() is ev
    assert fence.planted
    assert platform.log == [
        ("create_event", 1, False),
        ("create_event", 2, False),  # the ring
        ("create_event", ev.id, True),
        ("record", ev.id, 0, False),  # the eager seed, on the current stream
        ("capture_begin", graph.id),
        ("record", ev.id, graph.stream.id, True),  # the plant, on the capture stream
        ("capture_end", graph.id),
    ]


def test_plant_outside_capture_records_nothing(platform):
    fence = ReadDoneFence(platform)
    fence.prepare()
    n = len(platform.log)
    assert fence.plant() is None
    assert not fence.planted
    assert platform.log[n:] == []


def test_prepare_is_idempotent(platform):
    fence = ReadDoneFence(platform)
    fence.prepare()
    ev = fence.event
    fence.prepare()
    assert fence.event is ev
    assert len(platform.log.of("create_event")) == 4 + 1


def test_without_external_events_nothing_is_planted():
    platform = sim_platform(external_events=False)
    fence = ReadDoneFence(platform)
    assert fence.prepare() is False
    with platform.capture(platform.new_graph()):
        assert fence.plant() is None
    assert fence.event is None and not fence.planted


def test_ring_size_must_cover_two_steps(platform):
    with pytest.raises(ValueError):
        ReadDoneFence(platform, ring_size=1)


# -- per-step call sequences -------------------------------------------------------------------------


def test_pre_replay_records_before_replay(platform):
    fence, graph, _ = captured_fence(platform)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    n = len(platform.log)
    rd, kind = step(platform, fence, graph, P.PRE_REPLAY, barrier, sched)
    ring_ev = rd.event
    assert not ring_ev.external
    assert platform.log[n:] == [
        ("record", ring_ev.id, 0, False),
        ("replay", graph.id),
        ("record", fence.event.id, 0, "in_graph"),
        ("wait_event", sched.id, ring_ev.id),
    ]
    assert kind == "event" and rd.policy is P.PRE_REPLAY and rd.step == 1


def test_in_graph_hands_out_planted_event_without_new_record(platform):
    fence, graph, _ = captured_fence(platform)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    n = len(platform.log)
    rd, kind = step(platform, fence, graph, P.IN_GRAPH, barrier, sched)
    assert rd.event is fence.event
    assert platform.log[n:] == [
        ("replay", graph.id),
        ("record", fence.event.id, 0, "in_graph"),
        ("wait_event", sched.id, fence.event.id),
    ]
    assert kind == "event"


def test_post_replay_records_after_replay(platform):
    fence, graph, _ = captured_fence(platform)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    n = len(platform.log)
    rd, kind = step(platform, fence, graph, P.POST_REPLAY, barrier, sched)
    assert platform.log[n:] == [
        ("replay", graph.id),
        ("record", fence.event.id, 0, "in_graph"),
        ("record", rd.event.id, 0, False),
        ("wait_event", sched.id, rd.event.id),
    ]
    assert kind == "event"


def test_none_publishes_nothing_and_barrier_is_coarse(platform):
    fence, graph, _ = captured_fence(platform)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    n = len(platform.log)
    rd, kind = step(platform, fence, graph, P.NONE, barrier, sched)
    assert rd is None and kind == "coarse"
    assert platform.log[n:] == [
        ("replay", graph.id),
        ("record", fence.event.id, 0, "in_graph"),
        ("wait_stream", sched.id, 0),
    ]


def test_explicit_stream_is_used_for_host_records(platform):
    fence = ReadDoneFence(platform)
    fwd = platform.new_stream()
    fence.before_replay(P.PRE_REPLAY, stream=fwd)
    fence.after_replay(P.PRE_REPLAY, None, stream=fwd)
    assert platform.log.of("record")[-1][2] == fwd.id


def test_force_coarse_ignores_the_event(platform):
    fence, graph, _ = captured_fence(platform)
    sched = platform.new_stream()
    rd, kind = step(
        platform, fence, graph, P.IN_GRAPH, SchedulerBarrier(platform, force_coarse=True), sched
    )
    assert rd is not None and kind == "coarse"
    assert platform.log[-1] == ("wait_stream", sched.id, 0)
    assert not platform.log.of("wait_event")


# -- mailbox, step counter, ring ----------------------------------------------------------------------


def test_take_is_consume_once(platform):
    fence, graph, _ = captured_fence(platform)
    fence.before_replay(P.IN_GRAPH)
    platform.replay(graph)
    fence.after_replay(P.IN_GRAPH, fence.event)
    assert isinstance(fence.take(), ReadDone)
    assert fence.take() is None


def test_untaken_event_goes_stale_when_next_step_begins(platform):
    fence, graph, _ = captured_fence(platform)
    fence.before_replay(P.POST_REPLAY)
    platform.replay(graph)
    fence.after_replay(P.POST_REPLAY, fence.event)
    fence.before_replay(P.NONE)  # the next step launched; its scheduler must not see step 1's event
    assert fence.take() is None
    fence.after_replay(P.NONE, fence.event)
    assert fence.take() is None


def test_step_counter_is_monotonic_and_stamps_the_mailbox(platform):
    fence, graph, _ = captured_fence(platform)
    steps = []
    for policy in [P.IN_GRAPH, P.NONE, P.PRE_REPLAY, P.POST_REPLAY]:
        fence.before_replay(policy)
        platform.replay(graph)
        fence.after_replay(policy, fence.event)
        rd = fence.take()
        steps.append((fence.step, rd.step if rd else None))
    assert steps == [(1, 1), (2, None), (3, 3), (4, 4)]


def test_after_replay_without_before_replay_starts_a_step(platform):
    fence = ReadDoneFence(platform)
    fence.after_replay(P.POST_REPLAY, None)
    assert fence.step == 1 and fence.take().step == 1


@settings(max_examples=150, deadline=None)
@given(
    ring_size=st.integers(2, 6),
    policies=st.lists(st.sampled_from(list(P)), min_size=1, max_size=40),
)
def test_ring_never_rerecords_an_event_of_the_last_ring_size_minus_one_steps(ring_size, policies):
    platform = sim_platform()
    fence, graph, _ = captured_fence(platform, ring_size=ring_size)
    ring_owner = {}  # ring event id -> last step that recorded it
    for policy in policies:
        fence.before_replay(policy)
        platform.replay(graph)
        fence.after_replay(policy, fence.event)
        rd = fence.take()
        if rd is None or rd.event is fence.event:
            continue
        last = ring_owner.get(rd.event.id)
        if last is not None:
            recorded_since = sum(1 for s in ring_owner.values() if s > last)
            assert recorded_since >= ring_size - 1
        ring_owner[rd.event.id] = rd.step
    assert len(ring_owner) <= ring_size


# -- publishes tied to their own graph -----------------------------------------------------------------


def test_planted_is_required_where_it_decides():
    param = inspect.signature(ReadDoneFence.after_replay).parameters["planted"]
    assert param.default is inspect.Parameter.empty


def test_in_graph_without_a_planted_node_publishes_post_replay(platform):
    fence = ReadDoneFence(platform)
    fence.prepare()  # prepared but never planted
    for _ in range(3):
        fence.before_replay(P.IN_GRAPH)
        fence.after_replay(P.IN_GRAPH, None)
        rd = fence.take()
        assert rd.policy is P.POST_REPLAY and rd.event is not fence.event
        assert fence.published is P.POST_REPLAY
    assert platform.log[-1] == ("record", rd.event.id, 0, False)


def test_a_graph_without_the_node_never_gets_another_graphs_event(platform):
    fence, planted_graph, event = captured_fence(platform)
    bare = platform.new_graph()
    with platform.capture(bare):
        pass  # this bucket's capture planted nothing
    step(platform, fence, planted_graph, P.IN_GRAPH, planted=event)
    fence.before_replay(P.IN_GRAPH)
    platform.replay(bare)
    fence.after_replay(P.IN_GRAPH, None)  # what a runner passes for the bare bucket
    rd = fence.take()
    assert rd.event is not event and rd.policy is P.POST_REPLAY


def test_each_capture_hands_out_the_event_its_own_graph_records(platform):
    fence, first_graph, first = captured_fence(platform)
    platform.impl.inject("record", "raise")  # the next prepare's seed record fails: event dropped
    with pytest.warns(RuntimeWarning, match="prepare failed"):
        assert fence.prepare() is False
    platform.impl.clear_faults()
    assert fence.prepare() is True and fence.event is not first  # a partial re-capture's event
    second_graph = platform.new_graph()
    with platform.capture(second_graph):
        second = fence.plant()
    assert second is fence.event
    rd, _ = step(platform, fence, first_graph, P.IN_GRAPH, planted=first)
    assert rd.event is first  # never the fence's newer event, which first_graph does not record
    rd, _ = step(platform, fence, second_graph, P.IN_GRAPH, planted=second)
    assert rd.event is second


@pytest.mark.parametrize(
    "fault", [("record", "raise"), ("is_capturing", "raise"), ("is_capturing", "none")]
)
def test_a_failed_plant_during_a_rerun_replay_makes_that_step_post_replay(platform, fault):
    fence = ReadDoneFence(platform)
    fence.prepare()
    graph = platform.new_graph()
    planted = []
    platform.capture_callable(graph, lambda: planted.append(fence.plant()))
    event = planted[0]
    assert event is fence.event
    impl = platform.impl
    impl.inject(*fault, when=lambda: impl.replaying)
    with pytest.warns(RuntimeWarning, match="plant failed"):
        rd, _ = step(platform, fence, graph, P.IN_GRAPH, planted=event)
    assert rd.policy is P.POST_REPLAY and rd.event is not event
    impl.clear_faults()
    rd, _ = step(platform, fence, graph, P.IN_GRAPH, planted=event)
    assert rd.policy is P.IN_GRAPH and rd.event is event  # the next good step is in_graph again


@pytest.mark.parametrize("mode", ["raise", "none"])
def test_a_failed_capture_state_query_is_a_failed_plant(platform, mode):
    fence = ReadDoneFence(platform)
    fence.prepare()
    platform.impl.inject("is_capturing", mode)
    with pytest.warns(RuntimeWarning, match="plant failed"), platform.capture(platform.new_graph()):
        assert fence.plant() is None
    assert not fence.planted


# -- fail closed ---------------------------------------------------------------------------------------


def test_record_failure_before_replay_publishes_nothing(platform):
    fence, graph, _ = captured_fence(platform)
    platform.impl.inject("record", "raise", when=lambda: not platform.impl.replaying)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    with pytest.warns(RuntimeWarning, match="before_replay failed"):
        rd, kind = step(platform, fence, graph, P.PRE_REPLAY, barrier, sched)
    assert rd is None and kind == "coarse" and fence.published is P.NONE
    assert platform.log[-1] == ("wait_stream", sched.id, 0)


@pytest.mark.parametrize("mode", ["raise", "act_then_raise"])
def test_record_failure_after_replay_publishes_nothing(platform, mode):
    fence, graph, _ = captured_fence(platform)
    platform.impl.inject("record", mode)
    with pytest.warns(RuntimeWarning, match="after_replay failed"):
        rd, _ = step(platform, fence, graph, P.POST_REPLAY)
    assert rd is None


def test_plant_failure_returns_none(platform):
    fence = ReadDoneFence(platform)
    fence.prepare()
    platform.impl.inject("record", "raise")
    with pytest.warns(RuntimeWarning, match="plant failed"), platform.capture(platform.new_graph()):
        assert fence.plant() is None
    assert not fence.planted


@pytest.mark.parametrize("op", ["create_event", "record"])
def test_prepare_failure_leaves_no_event(platform, op):
    platform.impl.inject(op, "raise")
    fence = ReadDoneFence(platform)
    with pytest.warns(RuntimeWarning, match="(prepare|ring) failed"):
        assert fence.prepare() is False
    assert fence.event is None


@pytest.mark.parametrize("mode", ["raise", "act_then_raise"])
def test_wait_event_failure_falls_back_to_coarse(platform, mode):
    fence, graph, _ = captured_fence(platform)
    platform.impl.inject("wait_event", mode)
    sched = platform.new_stream()
    with pytest.warns(RuntimeWarning, match="wait_event failed"):
        rd, kind = step(platform, fence, graph, P.IN_GRAPH, SchedulerBarrier(platform), sched)
    assert rd is not None and kind == "coarse"
    assert platform.log[-1] == ("wait_stream", sched.id, 0)


def test_coarse_failure_falls_back_to_synchronize(platform):
    platform.impl.inject("wait_stream", "raise")
    with pytest.warns(RuntimeWarning, match="wait_stream failed"):
        kind = SchedulerBarrier(platform).apply(
            platform.new_stream(), platform.current_stream(), None
        )
    assert kind == "coarse"
    assert platform.log[-1] == ("synchronize",)


def test_warns_once_per_place_over_many_steps(platform):
    fence, graph, _ = captured_fence(platform)
    platform.impl.inject("record", "raise")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            step(platform, fence, graph, P.POST_REPLAY)
    assert len(caught) == 1


# -- observers -----------------------------------------------------------------------------------------


class Recorder:
    def __init__(self):
        self.calls = []

    @hookimpl
    def warpolicy_on_publish(self, runner, step, policy, event):
        self.calls.append(("publish", runner, step, policy, event is not None))

    @hookimpl
    def warpolicy_on_barrier(self, runner, step, kind, reason):
        self.calls.append(("barrier", runner, step, kind, reason))

    @hookimpl
    def warpolicy_on_fallback(self, where, error):
        self.calls.append(("fallback", where, type(error).__name__))


def test_observers_see_every_publish_and_barrier(platform, register):
    fence, graph, _ = captured_fence(platform)
    rec = register(Recorder())
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    for policy in (P.IN_GRAPH, P.NONE):
        step(platform, fence, graph, policy, barrier, sched)
    barrier.force_coarse = True
    step(platform, fence, graph, P.POST_REPLAY, barrier, sched)
    assert rec.calls == [
        ("publish", "decode", 1, P.IN_GRAPH, True),
        ("barrier", "decode", 1, "event", "in_graph"),
        ("publish", "decode", 2, P.NONE, False),
        ("barrier", "scheduler", None, "coarse", "no read-done event"),
        ("publish", "decode", 3, P.POST_REPLAY, True),
        ("barrier", "decode", 3, "coarse", "forced"),
    ]


def test_observers_see_fallbacks_and_the_policy_really_published(platform, register):
    fence, graph, _ = captured_fence(platform)
    rec = register(Recorder())
    platform.impl.inject("record", "raise")
    with pytest.warns(RuntimeWarning):
        step(platform, fence, graph, P.POST_REPLAY)
    assert rec.calls == [
        ("fallback", "fence 'decode':after_replay", "InjectedFault"),
        ("publish", "decode", 1, P.NONE, False),
    ]


class Bad:
    @hookimpl
    def warpolicy_on_publish(self, runner, step, policy, event):
        raise ValueError("observer bug")

    @hookimpl
    def warpolicy_on_barrier(self, runner, step, kind, reason):
        raise ValueError("observer bug")


def test_a_raising_observer_changes_neither_the_publish_nor_the_barrier(platform, register):
    fence, graph, event = captured_fence(platform)
    register(Bad(), name="bad")
    rec = register(Recorder())
    sched = platform.new_stream()
    with pytest.warns(RuntimeWarning) as caught:
        rd, kind = step(platform, fence, graph, P.IN_GRAPH, SchedulerBarrier(platform), sched)
    assert sorted(str(w.message).split(": ", 1)[1] for w in caught) == [
        "observer plugin 'bad' raised in warpolicy_on_barrier (ValueError('observer bug')); ignored",
        "observer plugin 'bad' raised in warpolicy_on_publish (ValueError('observer bug')); ignored",
    ]
    assert rd.event is event and kind == "event"
    assert platform.log[-1] == ("wait_event", sched.id, event.id)
    assert ("fallback", "fence 'decode':warpolicy_on_publish:bad", "ValueError") in rec.calls
    assert ("publish", "decode", 1, P.IN_GRAPH, True) in rec.calls  # the others still called


def test_observers_cost_nothing_when_none_is_registered(platform, monkeypatch):
    fence, graph, _ = captured_fence(platform)
    barrier = SchedulerBarrier(platform)
    calls = []
    monkeypatch.setattr(type(fence), "_notify_publish", lambda *a: calls.append("publish"))
    monkeypatch.setattr(type(barrier), "_notify", lambda *a: calls.append("barrier"))
    step(platform, fence, graph, P.IN_GRAPH, barrier, platform.new_stream())
    assert calls == []
    platform.pm.register(Recorder(), name="rec")
    step(platform, fence, graph, P.IN_GRAPH, barrier, platform.new_stream())
    assert calls == ["publish", "barrier"]  # picked up without rebuilding the fence


# -- profiler ranges -----------------------------------------------------------------------------------


def test_publish_and_barrier_show_up_in_torch_profiler_when_asked(platform):
    torch = pytest.importorskip("torch")
    _, graph, event = captured_fence(platform)
    fence = ReadDoneFence(platform, profile_ranges=True)
    barrier, sched = SchedulerBarrier(platform, profile_ranges=True), platform.new_stream()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for policy in (P.PRE_REPLAY, P.POST_REPLAY, P.IN_GRAPH):
            step(platform, fence, graph, policy, barrier, sched, planted=event)
    names = {e.key for e in prof.key_averages()}
    assert {"warpolicy.publish.pre_replay", "warpolicy.publish", "warpolicy.barrier"} <= names


def test_profiler_ranges_follow_the_environment(platform, monkeypatch):
    monkeypatch.setenv("WARPOLICY_PROFILE_RANGES", "1")
    assert ReadDoneFence(platform)._ranges and SchedulerBarrier(platform)._ranges
    monkeypatch.setenv("WARPOLICY_PROFILE_RANGES", "0")
    assert not ReadDoneFence(platform)._ranges


# -- benchmark smoke (simulated platform, few iterations) ---------------------------------------------


def test_fence_bench_runs_on_the_simulated_platform():
    import json

    from warpolicy.bench.fence import format_fence_bench, run_fence_bench

    result = run_fence_bench(iters=20, device="sim")
    assert result["platform"] == "sim" and result["iters"] == 20
    assert "skipped" in result["release"]
    rows = result["overhead"]["per_policy"]
    assert set(rows) == {"post_replay", "in_graph"}
    for row in rows.values():
        assert row["hooks_us_median"] > 0 and row["raw_us_median"] > 0 and row["ratio"] > 0
    text = format_fence_bench(result, "text")
    assert "overhead per step (in_graph)" in text and "indicative only" in text
    assert json.loads(format_fence_bench(result, "json"))["iters"] == 20


def test_fence_bench_without_cuda_is_a_one_line_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the no-CUDA path")
    from warpolicy.bench.fence import run_fence_bench
    from warpolicy.errors import CudaUnavailableError

    with pytest.raises(CudaUnavailableError, match="--device sim"):
        run_fence_bench(iters=10)


# -- the safe wait comes before any warning can raise --------------------------------------------------


@pytest.mark.parametrize("inject", ["wait_event", "wait_stream"])
def test_barrier_applies_the_safe_wait_before_a_warning_can_raise(platform, inject):
    """With warnings turned into errors, the warning may raise out of apply(); the coarse wait
    (or the host synchronize) must already be enqueued by then."""
    fence, graph, _ = captured_fence(platform)
    sched = platform.new_stream()
    read_done, _ = step(platform, fence, graph, P.IN_GRAPH)
    platform.impl.inject(inject, "raise")
    n = len(platform.log)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            SchedulerBarrier(platform).apply(
                sched, platform.current_stream(), None if inject == "wait_stream" else read_done
            )
    expected = {"wait_event": ("wait_stream", sched.id, 0), "wait_stream": ("synchronize",)}[inject]
    assert platform.log[-1] == expected and len(platform.log) > n
