"""ReadDoneFence and SchedulerBarrier on the fake platform: call sequences per policy, the ring,
the step counter, the consume-once mailbox and fail-closed on injected hook failures."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings, strategies as st

from warpolicy.fence import ReadDone, ReadDoneFence, SchedulerBarrier
from warpolicy.hookspecs import hookimpl
from warpolicy.policy import WarReadDonePolicy as P
from warpolicy.platform import sim_platform as fake_platform


@pytest.fixture
def platform():
    return fake_platform()


def captured_fence(platform, ring_size=4):
    """A prepared fence with one captured graph that planted the node."""
    fence = ReadDoneFence(platform, ring_size=ring_size, name="decode")
    fence.prepare()
    graph = platform.new_graph()
    with platform.capture(graph):
        assert fence.plant() is True
    return fence, graph


def step(platform, fence, graph, policy, barrier=None, schedule=None):
    """One runner step plus the scheduler's take and barrier; returns (read_done, kind)."""
    fence.before_replay(policy)
    platform.replay(graph)
    fence.after_replay(policy)
    read_done = fence.take()
    kind = None
    if barrier is not None:
        kind = barrier.apply(schedule, platform.current_stream(), read_done)
    return read_done, kind


class Raising:
    """An inline plugin whose chosen platform hook raises for the fake device."""

    def __init__(self, when=lambda **kw: True):
        self.when = when

    @hookimpl
    def warpolicy_record_event(self, device, event, stream):
        if self.when(event=event, stream=stream):
            raise RuntimeError("injected record failure")
        return None  # fall through to the built-in fake


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
        assert fence.plant() is True
    assert fence.planted
    assert platform.log == [
        ("create_event", 1, False), ("create_event", 2, False),  # the ring
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
    assert fence.plant() is False
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
    platform = fake_platform(external_events=False)
    fence = ReadDoneFence(platform)
    assert fence.prepare() is False
    with platform.capture(platform.new_graph()):
        assert fence.plant() is False
    assert fence.event is None and not fence.planted


def test_ring_size_must_cover_two_steps(platform):
    with pytest.raises(ValueError):
        ReadDoneFence(platform, ring_size=1)


# -- per-step call sequences -------------------------------------------------------------------------

def test_pre_replay_records_before_replay(platform):
    fence, graph = captured_fence(platform)
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
    fence, graph = captured_fence(platform)
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
    fence, graph = captured_fence(platform)
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
    fence, graph = captured_fence(platform)
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
    fence.after_replay(P.PRE_REPLAY, stream=fwd)
    assert platform.log.of("record")[-1][2] == fwd.id


def test_force_coarse_ignores_the_event(platform):
    fence, graph = captured_fence(platform)
    sched = platform.new_stream()
    rd, kind = step(platform, fence, graph, P.IN_GRAPH, SchedulerBarrier(platform, force_coarse=True), sched)
    assert rd is not None and kind == "coarse"
    assert platform.log[-1] == ("wait_stream", sched.id, 0)
    assert not platform.log.of("wait_event")


# -- mailbox, step counter, ring ----------------------------------------------------------------------

def test_take_is_consume_once(platform):
    fence, graph = captured_fence(platform)
    fence.before_replay(P.IN_GRAPH)
    platform.replay(graph)
    fence.after_replay(P.IN_GRAPH)
    assert isinstance(fence.take(), ReadDone)
    assert fence.take() is None


def test_untaken_event_goes_stale_when_next_step_begins(platform):
    fence, graph = captured_fence(platform)
    fence.before_replay(P.POST_REPLAY)
    platform.replay(graph)
    fence.after_replay(P.POST_REPLAY)
    fence.before_replay(P.NONE)  # the next step launched; its scheduler must not see step 1's event
    assert fence.take() is None
    fence.after_replay(P.NONE)
    assert fence.take() is None


def test_step_counter_is_monotonic_and_stamps_the_mailbox(platform):
    fence, graph = captured_fence(platform)
    steps = []
    for policy in [P.IN_GRAPH, P.NONE, P.PRE_REPLAY, P.POST_REPLAY]:
        fence.before_replay(policy)
        platform.replay(graph)
        fence.after_replay(policy)
        rd = fence.take()
        steps.append((fence.step, rd.step if rd else None))
    assert steps == [(1, 1), (2, None), (3, 3), (4, 4)]


def test_after_replay_without_before_replay_starts_a_step(platform):
    fence = ReadDoneFence(platform)
    fence.after_replay(P.POST_REPLAY)
    assert fence.step == 1 and fence.take().step == 1


@settings(max_examples=150, deadline=None)
@given(ring_size=st.integers(2, 6),
       policies=st.lists(st.sampled_from(list(P)), min_size=1, max_size=40))
def test_ring_never_rerecords_an_event_of_the_last_ring_size_minus_one_steps(ring_size, policies):
    platform = fake_platform()
    fence, graph = captured_fence(platform, ring_size=ring_size)
    ring_owner = {}  # ring event id -> last step that recorded it
    for policy in policies:
        fence.before_replay(policy)
        platform.replay(graph)
        fence.after_replay(policy)
        rd = fence.take()
        if rd is None or rd.event is fence.event:
            continue
        last = ring_owner.get(rd.event.id)
        if last is not None:
            recorded_since = sum(1 for s in ring_owner.values() if s > last)
            assert recorded_since >= ring_size - 1
        ring_owner[rd.event.id] = rd.step
    assert len(ring_owner) <= ring_size


# -- fail closed ---------------------------------------------------------------------------------------

def test_in_graph_without_plant_fails_closed_with_one_warning(platform):
    fence = ReadDoneFence(platform)
    fence.prepare()  # prepared but never planted
    with pytest.warns(RuntimeWarning, match="after_replay failed") as caught:
        for _ in range(3):
            fence.before_replay(P.IN_GRAPH)
            fence.after_replay(P.IN_GRAPH)
            assert fence.take() is None
    assert len(caught) == 1


def test_in_graph_for_a_bucket_that_did_not_plant(platform):
    fence, graph = captured_fence(platform)
    with pytest.warns(RuntimeWarning):
        fence.before_replay(P.IN_GRAPH)
        fence.after_replay(P.IN_GRAPH, planted=False)
    assert fence.take() is None


def test_record_failure_before_replay_publishes_nothing(platform, register):
    fence, graph = captured_fence(platform)
    register(Raising())
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    with pytest.warns(RuntimeWarning, match="before_replay failed"):
        rd, kind = step(platform, fence, graph, P.PRE_REPLAY, barrier, sched)
    assert rd is None and kind == "coarse"
    assert platform.log[-1] == ("wait_stream", sched.id, 0)


def test_record_failure_after_replay_publishes_nothing(platform, register):
    fence, graph = captured_fence(platform)
    register(Raising())
    with pytest.warns(RuntimeWarning, match="after_replay failed"):
        rd, _ = step(platform, fence, graph, P.POST_REPLAY)
    assert rd is None


def test_plant_failure_returns_false(platform, register):
    fence = ReadDoneFence(platform)
    fence.prepare()
    register(Raising())
    with pytest.warns(RuntimeWarning, match="plant failed"):
        with platform.capture(platform.new_graph()):
            assert fence.plant() is False
    assert not fence.planted


def test_prepare_failure_leaves_no_event(platform, register):
    register(Raising())
    fence = ReadDoneFence(platform)
    with pytest.warns(RuntimeWarning, match="prepare failed"):
        assert fence.prepare() is False
    assert fence.event is None


def test_wait_event_failure_falls_back_to_coarse(platform, register):
    class WaitRaises:
        @hookimpl
        def warpolicy_wait_event(self, device, stream, event):
            raise RuntimeError("injected wait failure")

    fence, graph = captured_fence(platform)
    register(WaitRaises())
    sched = platform.new_stream()
    with pytest.warns(RuntimeWarning, match="wait_event failed"):
        rd, kind = step(platform, fence, graph, P.IN_GRAPH, SchedulerBarrier(platform), sched)
    assert rd is not None and kind == "coarse"
    assert platform.log[-1] == ("wait_stream", sched.id, 0)


def test_coarse_failure_falls_back_to_synchronize(platform, register):
    class WaitStreamRaises:
        @hookimpl
        def warpolicy_wait_stream(self, device, stream, other):
            raise RuntimeError("injected wait_stream failure")

    register(WaitStreamRaises())
    with pytest.warns(RuntimeWarning, match="wait_stream failed"):
        kind = SchedulerBarrier(platform).apply(platform.new_stream(), platform.current_stream(), None)
    assert kind == "coarse"
    assert platform.log[-1] == ("synchronize",)


def test_warns_once_per_place_over_many_steps(platform, register):
    fence, graph = captured_fence(platform)
    register(Raising())
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
    fence, graph = captured_fence(platform)
    rec = register(Recorder())
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    for policy in (P.IN_GRAPH, P.NONE):
        step(platform, fence, graph, policy, barrier, sched)
    assert rec.calls == [
        ("publish", "decode", 1, P.IN_GRAPH, True),
        ("barrier", "decode", 1, "event", "in_graph"),
        ("publish", "decode", 2, P.NONE, False),
        ("barrier", "scheduler", None, "coarse", "no read-done event"),
    ]


def test_observers_see_fallbacks(platform, register):
    fence = ReadDoneFence(platform)
    fence.prepare()
    rec = register(Recorder())
    with pytest.warns(RuntimeWarning):
        fence.before_replay(P.IN_GRAPH)
        fence.after_replay(P.IN_GRAPH)
    assert rec.calls == [("fallback", "fence 'decode':after_replay", "FenceError"),
                         ("publish", "decode", 1, P.NONE, False)]


def test_raising_publish_observer_empties_the_mailbox(platform, register):
    class Bad:
        @hookimpl
        def warpolicy_on_publish(self, runner, step, policy, event):
            raise ValueError("observer bug")

    fence, graph = captured_fence(platform)
    register(Bad())
    with pytest.warns(RuntimeWarning, match="warpolicy_on_publish failed"):
        rd, _ = step(platform, fence, graph, P.IN_GRAPH)
    assert rd is None


def test_raising_barrier_observer_adds_the_coarse_wait(platform, register):
    class Bad:
        @hookimpl
        def warpolicy_on_barrier(self, runner, step, kind, reason):
            raise ValueError("observer bug")

    fence, graph = captured_fence(platform)
    register(Bad())
    sched = platform.new_stream()
    with pytest.warns(RuntimeWarning, match="warpolicy_on_barrier failed"):
        rd, kind = step(platform, fence, graph, P.IN_GRAPH, SchedulerBarrier(platform), sched)
    assert kind == "coarse"
    assert platform.log[-2:] == [("wait_event", sched.id, fence.event.id), ("wait_stream", sched.id, 0)]


# -- profiler ranges -----------------------------------------------------------------------------------

def test_publish_and_barrier_show_up_in_torch_profiler(platform):
    torch = pytest.importorskip("torch")
    fence, graph = captured_fence(platform)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for policy in (P.PRE_REPLAY, P.POST_REPLAY):
            step(platform, fence, graph, policy, barrier, sched)
    names = {e.key for e in prof.key_averages()}
    assert {"warpolicy.publish.pre_replay", "warpolicy.publish", "warpolicy.barrier"} <= names


# -- benchmark smoke (fake platform, few iterations) ---------------------------------------------------

def test_fence_bench_runs_on_the_fake_platform():
    from warpolicy.bench.fence import format_fence_bench, run_fence_bench

    result = run_fence_bench(iters=20, device="fake")
    for key in ("device", "iters", "release", "overhead"):
        assert key in result
    for key in ("hooks_us_median", "raw_us_median", "ratio"):
        assert key in result["overhead"]
    text = format_fence_bench(result, "text")
    assert "overhead" in text
    import json

    assert json.loads(format_fence_bench(result, "json"))["iters"] == 20


# -- fail closed when the capture-time queries themselves raise ----------------------------------------

def test_plant_fails_closed_when_is_capturing_raises(platform, register):
    class CapturingRaises:
        @hookimpl
        def warpolicy_is_capturing(self, device):
            raise RuntimeError("injected is_capturing failure")

    fence = ReadDoneFence(platform)
    fence.prepare()
    register(CapturingRaises())
    with pytest.warns(RuntimeWarning, match="plant failed"):
        with platform.capture(platform.new_graph()):
            assert fence.plant() is False  # was: the exception escaped the capture body
    assert not fence.planted


def test_prepare_fails_closed_when_the_external_events_query_raises():
    class QueryRaises:
        @hookimpl
        def warpolicy_external_events_supported(self, device):
            raise RuntimeError("injected query failure")

    platform = fake_platform()
    platform.pm.register(QueryRaises())
    platform._external = None  # forget the answer cached when the platform was built
    fence = ReadDoneFence(platform)
    with pytest.warns(RuntimeWarning, match="prepare failed"):
        assert fence.prepare() is False
    assert fence.event is None


@pytest.mark.parametrize("inject", ["wait_event", "wait_stream", "observer"])
def test_barrier_applies_the_safe_wait_before_a_warning_can_raise(platform, register, inject):
    """With warnings turned into errors, the warning may raise out of apply(); the coarse wait
    (or the host synchronize) must already be enqueued by then."""

    class Inject:
        if inject == "wait_event":
            @hookimpl
            def warpolicy_wait_event(self, device, stream, event):
                raise RuntimeError("injected")
        elif inject == "wait_stream":
            @hookimpl
            def warpolicy_wait_stream(self, device, stream, other):
                raise RuntimeError("injected")
        else:
            @hookimpl
            def warpolicy_on_barrier(self, runner, step, kind, reason):
                raise RuntimeError("injected")

    fence, graph = captured_fence(platform)
    register(Inject())
    sched = platform.new_stream()
    read_done, _ = step(platform, fence, graph, P.IN_GRAPH)
    n = len(platform.log)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            SchedulerBarrier(platform).apply(sched, platform.current_stream(),
                                             None if inject == "wait_stream" else read_done)
    expected = {"wait_event": ("wait_stream", sched.id, 0), "wait_stream": ("synchronize",),
                "observer": ("wait_stream", sched.id, 0)}[inject]
    assert platform.log[-1] == expected and len(platform.log) > n
