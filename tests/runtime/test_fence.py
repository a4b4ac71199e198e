"""ReadDoneFence and SchedulerBarrier on the simulated platform: call sequences per release,
the enforced ring, the step counter, the consume-once mailbox, publishes tied to their own
bucket, observers that cannot change anything, one owner thread, and fail-closed on injected
platform failures."""

from __future__ import annotations

import threading
import warnings

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from warpolicy.bench.command import render
from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import WarReadDonePolicy as P
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.ownership import WrongThreadError
from warpolicy.runtime.release import BucketRelease, ReadDone
from warpolicy.runtime.ring import MAX_RING_SIZE
from warpolicy.testing import sim_impl, sim_platform, sim_runtime


@pytest.fixture
def rt():
    return sim_runtime()


@pytest.fixture
def platform(rt):
    return rt.platform


def release(policy, event=None, bucket=1):
    """The release a runner would decide for one bucket (``event`` only for in_graph)."""
    return BucketRelease("decode", bucket, policy, event if policy is P.IN_GRAPH else None)


def captured_fence(platform, ring_size=4, **kw):
    """A fence with one captured graph that planted its node; (fence, graph, event)."""
    fence = ReadDoneFence(platform, ring_size=ring_size, name="decode", **kw)
    event = fence.prepare()
    graph = platform.new_graph()
    with platform.capture(graph):
        assert fence.plant(event) is event
    return fence, graph, event


def step(platform, fence, graph, policy, barrier=None, schedule=None, event=None):
    """One runner step plus the scheduler's take and barrier; returns (read_done, kind)."""
    rel = release(policy, event if event is not None else fence.event)
    fence.before_replay(rel)
    platform.replay(graph)
    fence.after_replay(rel)
    read_done = fence.take()
    kind = None
    if barrier is not None:
        kind = barrier.apply(schedule, platform.current_stream(), read_done)
    return read_done, kind


# -- capture time ----------------------------------------------------------------------------------


def test_prepare_seeds_a_fresh_external_event_then_plant_records_in_capture(platform):
    fence = ReadDoneFence(platform, ring_size=2)
    ev = fence.prepare()
    assert ev is fence.event and ev.external
    graph = platform.new_graph()
    with platform.capture(graph):
        assert fence.plant(ev) is ev
    assert fence.planted
    assert platform.log == [
        ("create_event", ev.id, True),
        ("record", ev.id, 0, False),  # the eager seed, on the current stream
        ("capture_begin", graph.id),
        ("record", ev.id, graph.stream.id, True),  # the plant, on the capture stream
        ("capture_end", graph.id),
    ]


def test_each_prepare_is_a_fresh_event_so_no_two_graphs_record_the_same(platform):
    fence = ReadDoneFence(platform)
    first, second = fence.prepare(), fence.prepare()
    assert first is not second and fence.event is second


def test_plant_outside_capture_records_nothing(platform):
    fence = ReadDoneFence(platform)
    event = fence.prepare()
    n = len(platform.log)
    assert fence.plant(event) is None
    assert not fence.planted
    assert platform.log[n:] == []


def test_without_external_events_nothing_is_planted():
    platform = sim_platform(external_events=False)
    fence = ReadDoneFence(platform)
    assert fence.prepare() is None
    with platform.capture(platform.new_graph()):
        assert fence.plant() is None
    assert fence.event is None and not fence.planted


@pytest.mark.parametrize("size", [1, 0, -3, MAX_RING_SIZE + 1, 10**7, 2.5, "4", None])
def test_ring_size_is_bounded_and_an_integer(platform, size):
    with pytest.raises(InputError, match="ring_size must be an integer from 2 to"):
        ReadDoneFence(platform, ring_size=size)


# -- per-step call sequences -------------------------------------------------------------------------


def test_pre_replay_records_before_replay(platform):
    fence, graph, _ = captured_fence(platform)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    n = len(platform.log)
    rd, kind = step(platform, fence, graph, P.PRE_REPLAY, barrier, sched)
    ring_ev = rd.event
    assert not ring_ev.external
    assert platform.log[n:] == [
        ("create_event", ring_ev.id, False),  # the ring's first use creates its event
        ("record", ring_ev.id, 0, False),
        ("replay", graph.id),
        ("record", fence.event.id, 0, "in_graph"),
        ("wait_event", sched.id, ring_ev.id),
    ]
    assert kind == "event" and rd.policy is P.PRE_REPLAY and rd.step == 1


def test_in_graph_hands_out_the_buckets_event_without_a_new_record(platform):
    fence, graph, event = captured_fence(platform)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    n = len(platform.log)
    rd, kind = step(platform, fence, graph, P.IN_GRAPH, barrier, sched)
    assert rd.event is event
    assert platform.log[n:] == [
        ("replay", graph.id),
        ("record", event.id, 0, "in_graph"),
        ("wait_event", sched.id, event.id),
    ]
    assert kind == "event"


def test_post_replay_records_after_replay(platform):
    fence, graph, _ = captured_fence(platform)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    fence.ring.fill()
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
    rel = release(P.PRE_REPLAY)
    fence.before_replay(rel, stream=fwd)
    fence.after_replay(rel, stream=fwd)
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


def test_a_release_without_the_event_cannot_be_in_graph():
    with pytest.raises(ValueError, match="in_graph release needs the event"):
        BucketRelease("decode", 1, P.IN_GRAPH)
    with pytest.raises(ValueError, match="only an in_graph release has one"):
        BucketRelease("decode", 1, P.POST_REPLAY, object())


def test_the_in_graph_record_is_built_once_per_bucket(platform):
    fence, graph, event = captured_fence(platform)
    rel = release(P.IN_GRAPH, event)
    seen = set()
    for _ in range(3):
        fence.before_replay(rel)
        platform.replay(graph)
        fence.after_replay(rel)
        seen.add(id(fence.take()))
    assert seen == {id(rel.read_done)}


# -- mailbox, step counter ----------------------------------------------------------------------------


def test_take_is_consume_once(platform):
    fence, graph, _ = captured_fence(platform)
    step(platform, fence, graph, P.IN_GRAPH)
    fence.before_replay(release(P.IN_GRAPH, fence.event))
    platform.replay(graph)
    fence.after_replay(release(P.IN_GRAPH, fence.event))
    assert isinstance(fence.take(), ReadDone)
    assert fence.take() is None


def test_untaken_event_goes_stale_when_next_step_begins(platform):
    fence, graph, _ = captured_fence(platform)
    fence.before_replay(release(P.POST_REPLAY))
    platform.replay(graph)
    fence.after_replay(release(P.POST_REPLAY))
    fence.before_replay(release(P.NONE))  # the next step launched
    assert fence.take() is None
    fence.after_replay(release(P.NONE))
    assert fence.take() is None


def test_step_counter_is_monotonic_and_stamps_the_record(platform):
    fence, graph, _ = captured_fence(platform)
    steps = []
    for policy in [P.IN_GRAPH, P.NONE, P.PRE_REPLAY, P.POST_REPLAY]:
        rd, _ = step(platform, fence, graph, policy)
        steps.append((fence.step, rd.step if rd else None))
        if rd is not None:
            rd.slot.taken = False  # as a barrier would
    assert steps == [(1, 1), (2, None), (3, 3), (4, 4)]


def test_after_replay_without_before_replay_starts_a_step(platform):
    fence = ReadDoneFence(platform)
    fence.after_replay(release(P.POST_REPLAY))
    assert fence.step == 1 and fence.take().step == 1


# -- the ring: never re-record an event a barrier may still wait on -------------------------------


def test_a_taken_event_is_not_recorded_again_until_a_barrier_waited(platform):
    fence = ReadDoneFence(platform, ring_size=2)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    held = []
    for _ in range(2):  # a lagging scheduler: takes, waits later
        fence.after_replay(release(P.POST_REPLAY))
        held.append(fence.take())
    assert {rd.slot.taken for rd in held} == {True}
    with pytest.warns(RuntimeWarning, match="ring events are still awaited"):
        fence.after_replay(release(P.POST_REPLAY))
    assert fence.take() is None and fence.published is P.NONE  # coarse, not a re-record
    assert fence.reporter.counts["fallback:ring"] == 1
    barrier.apply(sched, platform.current_stream(), held[0])
    assert not held[0].slot.taken
    fence.after_replay(release(P.POST_REPLAY))
    rd = fence.take()
    assert rd is not None and rd.event is held[0].event  # the waited-on one is free again


@settings(max_examples=120, deadline=None)
@given(
    ring_size=st.integers(2, 5),
    lag=st.integers(0, 7),
    policies=st.lists(st.sampled_from([P.PRE_REPLAY, P.POST_REPLAY, P.NONE]), max_size=30),
)
def test_no_pending_wait_ever_binds_to_a_later_record(ring_size, lag, policies):
    """Whatever the lag, a host record never lands on an event a barrier has not waited on."""
    platform = sim_platform()
    fence = ReadDoneFence(platform, ring_size=ring_size)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    pending: list[tuple[ReadDone, int]] = []  # (read_done, records of its event when taken)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for policy in policies:
            rel = release(policy)
            fence.before_replay(rel)
            fence.after_replay(rel)
            rd = fence.take()
            if rd is not None:
                pending.append((rd, rd.event.records))
            while len(pending) > lag:
                old, records = pending.pop(0)
                assert old.event.records == records  # not re-recorded while awaited
                barrier.apply(sched, platform.current_stream(), old)


# -- publishes tied to their own bucket ----------------------------------------------------------------


def test_each_bucket_hands_out_only_the_event_its_graph_records(platform):
    fence, first_graph, first = captured_fence(platform)
    second = fence.prepare()
    second_graph = platform.new_graph()
    with platform.capture(second_graph):
        assert fence.plant(second) is second
    rd, _ = step(platform, fence, first_graph, P.IN_GRAPH, event=first)
    assert rd.event is first
    rd, _ = step(platform, fence, second_graph, P.IN_GRAPH, event=second)
    assert rd.event is second


@pytest.mark.parametrize(
    "fault", [("record", "raise"), ("is_capturing", "raise"), ("is_capturing", "none")]
)
def test_a_failed_plant_during_a_rerun_replay_makes_that_step_publish_nothing(platform, fault):
    fence = ReadDoneFence(platform)
    event = fence.prepare()
    graph = platform.new_graph()
    planted = []
    platform.capture_callable(graph, lambda: planted.append(fence.plant(event)))
    assert planted[0] is event
    impl = sim_impl(platform)
    impl.inject(*fault, when=lambda: impl.replaying)
    with pytest.warns(RuntimeWarning, match="plant failed"):
        rd, _ = step(platform, fence, graph, P.IN_GRAPH, event=event)
    assert rd is None and fence.published is P.NONE
    impl.clear_faults()
    rd, _ = step(platform, fence, graph, P.IN_GRAPH, event=event)
    assert rd.policy is P.IN_GRAPH and rd.event is event  # the next good step is in_graph again


@pytest.mark.parametrize("mode", ["raise", "none"])
def test_a_failed_capture_state_query_is_a_failed_plant(platform, mode):
    fence = ReadDoneFence(platform)
    event = fence.prepare()
    sim_impl(platform).inject("is_capturing", mode)
    with pytest.warns(RuntimeWarning, match="plant failed"), platform.capture(platform.new_graph()):
        assert fence.plant(event) is None
    assert not fence.planted


# -- fail closed ---------------------------------------------------------------------------------------


def test_record_failure_before_replay_publishes_nothing(platform):
    fence, graph, _ = captured_fence(platform)
    impl = sim_impl(platform)
    impl.inject("record", "raise", when=lambda: not impl.replaying)
    barrier, sched = SchedulerBarrier(platform), platform.new_stream()
    with pytest.warns(RuntimeWarning, match="before_replay failed"):
        rd, kind = step(platform, fence, graph, P.PRE_REPLAY, barrier, sched)
    assert rd is None and kind == "coarse" and fence.published is P.NONE
    assert platform.log[-1] == ("wait_stream", sched.id, 0)


@pytest.mark.parametrize("mode", ["raise", "act_then_raise"])
def test_record_failure_after_replay_publishes_nothing(platform, mode):
    fence, graph, _ = captured_fence(platform)
    sim_impl(platform).inject("record", mode)
    with pytest.warns(RuntimeWarning, match="after_replay failed"):
        rd, _ = step(platform, fence, graph, P.POST_REPLAY)
    assert rd is None


def test_plant_failure_returns_none(platform):
    fence = ReadDoneFence(platform)
    event = fence.prepare()
    sim_impl(platform).inject("record", "raise")
    with pytest.warns(RuntimeWarning, match="plant failed"), platform.capture(platform.new_graph()):
        assert fence.plant(event) is None
    assert not fence.planted


@pytest.mark.parametrize("op", ["create_event", "record"])
def test_prepare_failure_leaves_no_event(platform, op):
    sim_impl(platform).inject(op, "raise")
    fence = ReadDoneFence(platform)
    with pytest.warns(RuntimeWarning, match="prepare failed"):
        assert fence.prepare() is None
    assert fence.event is None


@pytest.mark.parametrize("mode", ["raise", "act_then_raise"])
def test_wait_event_failure_falls_back_to_coarse(platform, mode):
    fence, graph, _ = captured_fence(platform)
    sim_impl(platform).inject("wait_event", mode)
    sched = platform.new_stream()
    with pytest.warns(RuntimeWarning, match="wait_event failed"):
        rd, kind = step(platform, fence, graph, P.IN_GRAPH, SchedulerBarrier(platform), sched)
    assert rd is not None and kind == "coarse" and not rd.slot.taken
    assert platform.log[-1] == ("wait_stream", sched.id, 0)


def test_coarse_failure_falls_back_to_synchronize(platform):
    sim_impl(platform).inject("wait_stream", "raise")
    with pytest.warns(RuntimeWarning, match="wait_stream failed"):
        kind = SchedulerBarrier(platform).apply(
            platform.new_stream(), platform.current_stream(), None
        )
    assert kind == "coarse"
    assert platform.log[-1] == ("synchronize",)


def test_warns_once_per_place_but_counts_every_failure(platform):
    fence, graph, _ = captured_fence(platform)
    sim_impl(platform).inject("record", "raise")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            step(platform, fence, graph, P.POST_REPLAY)
    assert len(caught) == 1
    assert fence.reporter.counts["fallback:after_replay"] == 5


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


def observed(rt):
    fence, graph, event = captured_fence(rt.platform, observers=rt.observers)
    return fence, graph, event, SchedulerBarrier(rt.platform, observers=rt.observers)


def test_observers_see_every_publish_and_barrier(rt):
    platform = rt.platform
    fence, graph, _, barrier = observed(rt)
    rec = Recorder()
    rt.pm.register(rec)
    sched = platform.new_stream()
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


def test_observers_see_fallbacks_and_the_policy_really_published(rt):
    fence, graph, _, _ = observed(rt)
    rec = Recorder()
    rt.pm.register(rec)
    sim_impl(rt.platform).inject("record", "raise")
    with pytest.warns(RuntimeWarning):
        step(rt.platform, fence, graph, P.POST_REPLAY)
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


def test_a_raising_observer_changes_neither_the_publish_nor_the_barrier(rt):
    platform = rt.platform
    fence, graph, event, barrier = observed(rt)
    rec = Recorder()
    rt.pm.register(rec)
    rt.pm.register(Bad(), name="bad")  # registered last: pluggy calls it first
    sched = platform.new_stream()
    with pytest.warns(RuntimeWarning) as caught:
        rd, kind = step(platform, fence, graph, P.IN_GRAPH, barrier, sched)
    assert sorted(str(w.message).split(": ", 1)[1] for w in caught) == [
        "observer plugin 'bad' raised in warpolicy_on_barrier (ValueError('observer bug')); ignored",
        "observer plugin 'bad' raised in warpolicy_on_publish (ValueError('observer bug')); ignored",
    ]
    assert rd.event is event and kind == "event"
    assert platform.log[-1] == ("wait_event", sched.id, event.id)
    assert ("fallback", "fence 'decode':warpolicy_on_publish:bad", "ValueError") in rec.calls
    assert ("publish", "decode", 1, P.IN_GRAPH, True) in rec.calls  # the others still called


def test_observers_cost_nothing_when_none_is_registered(rt, monkeypatch):
    fence, graph, _, barrier = observed(rt)
    calls = []
    monkeypatch.setattr(type(fence.reporter), "publish", lambda *a: calls.append("publish"))
    monkeypatch.setattr(type(barrier.reporter), "barrier", lambda *a: calls.append("barrier"))
    step(rt.platform, fence, graph, P.IN_GRAPH, barrier, rt.platform.new_stream())
    assert calls == []
    rt.pm.register(Recorder(), name="rec")
    step(rt.platform, fence, graph, P.IN_GRAPH, barrier, rt.platform.new_stream())
    assert calls == ["publish", "barrier"]  # picked up without rebuilding the fence


# -- one owner thread ------------------------------------------------------------------------------------


def test_a_fence_belongs_to_the_first_thread_that_uses_it(platform):
    fence, graph, event = captured_fence(platform)  # this thread now owns it
    errors = []

    def other():
        for call in (
            lambda: fence.before_replay(release(P.IN_GRAPH, event)),
            lambda: fence.after_replay(release(P.IN_GRAPH, event)),
            fence.take,
            lambda: fence.plant(event),
        ):
            try:
                call()
            except WrongThreadError as exc:
                errors.append(str(exc))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(errors) == 4 and all("fence 'decode' belongs to thread" in e for e in errors)
    assert fence.step == 0  # nothing happened
    fence.release_thread()
    thread = threading.Thread(target=lambda: step(platform, fence, graph, P.IN_GRAPH))
    thread.start()
    thread.join()
    assert fence.step == 1  # handed over: the other thread owns it now
    with pytest.raises(WrongThreadError):
        fence.take()


def test_the_step_token_makes_one_owner_check_per_step(platform, monkeypatch):
    import warpolicy.runtime.fence as fence_module

    fence, graph, event = captured_fence(platform)
    barrier = SchedulerBarrier(platform)
    schedule = platform.new_stream()
    checks = []
    real = fence_module.get_ident
    monkeypatch.setattr(fence_module, "get_ident", lambda: checks.append(1) or real())
    for policy in (P.IN_GRAPH, P.POST_REPLAY, P.PRE_REPLAY, P.NONE):
        rel = release(policy, event)
        checks.clear()
        token = fence.before_replay(rel)
        platform.replay(graph)
        fence.after_replay(rel, step=token)
        read_done = fence.take(token)
        assert token == fence.step and len(checks) == 1, policy
        assert (read_done is None) == (policy is P.NONE) and fence.published is policy
        barrier.apply(schedule, platform.current_stream(), read_done)
        checks.clear()
        step(platform, fence, graph, policy, event=event)  # no token: every call checks
        assert len(checks) == 3


def test_a_stale_or_foreign_token_is_checked(platform):
    fence, graph, event = captured_fence(platform)
    rel = release(P.POST_REPLAY)
    old = fence.before_replay(rel)
    fence.after_replay(rel, step=old)
    fence.take(old)
    fence.before_replay(rel)  # a new step: the old token proves nothing
    errors = []

    def other():
        for call in (lambda: fence.take(old), lambda: fence.after_replay(rel, step=old + 7)):
            try:
                call()
            except WrongThreadError as exc:
                errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(errors) == 2 and fence.take() is None  # nothing published yet, nothing taken


# -- profiler ranges -----------------------------------------------------------------------------------


def test_publish_and_barrier_show_up_in_torch_profiler_when_asked(platform):
    torch = pytest.importorskip("torch")
    _, graph, event = captured_fence(platform)
    fence = ReadDoneFence(platform, profile_ranges=True)
    barrier, sched = SchedulerBarrier(platform, profile_ranges=True), platform.new_stream()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for policy in (P.PRE_REPLAY, P.POST_REPLAY, P.IN_GRAPH):
            rd, _ = step(platform, fence, graph, policy, barrier, sched, event=event)
            assert rd is not None and rd.policy is policy
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
    for section in ("overhead", "standin"):
        rows = result[section]["per_policy"]
        assert set(rows) == {"post_replay", "in_graph"}
        for row in rows.values():
            assert row["hooks_us_median"] > 0 and row["raw_us_median"] > 0 and row["ratio"] > 0
    in_graph, post = rows["in_graph"], rows["post_replay"]  # the stand-in's rows
    vs_post = in_graph["hooks_us_median"] / post["raw_us_median"]
    assert in_graph["ratio_vs_raw_post_replay"] == pytest.approx(vs_post)
    vs_event_first = in_graph["hooks_us_median"] / in_graph["raw_event_first_us_median"]
    assert in_graph["ratio_vs_raw_event_first"] == pytest.approx(vs_event_first)
    assert "ratio_vs_raw_event_first" not in post  # one wait form per policy: in_graph only
    text = format_fence_bench(result)
    assert "overhead per step (in_graph)" in text and "indicative only" in text
    assert "in_graph (fence) vs a raw post_replay step" in text
    assert "in_graph (fence) vs the raw event-first wait" in text
    assert "fence's own cost per step (in_graph, C-builtin stand-in platform)" in text
    assert json.loads(render(result, "json", format_fence_bench))["iters"] == 20


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
    sim_impl(platform).inject(inject, "raise")
    n = len(platform.log)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            SchedulerBarrier(platform).apply(
                sched, platform.current_stream(), None if inject == "wait_stream" else read_done
            )
    expected = {"wait_event": ("wait_stream", sched.id, 0), "wait_stream": ("synchronize",)}[inject]
    assert platform.log[-1] == expected and len(platform.log) > n


@pytest.mark.parametrize("force_coarse", [False, True])
def test_a_keyboard_interrupt_in_the_wait_still_orders_the_schedule_stream(platform, force_coarse):
    """Whatever the caller does after a KeyboardInterrupt, the schedule stream is already
    ordered after the forward stream (or the host waited)."""
    fence, graph, _ = captured_fence(platform)
    sched = platform.new_stream()
    read_done, _ = step(platform, fence, graph, P.IN_GRAPH)
    barrier = SchedulerBarrier(platform, force_coarse=force_coarse)

    def interrupted(*args):
        raise KeyboardInterrupt

    if force_coarse:
        barrier._wait_stream = interrupted
    else:
        barrier._event_wait = interrupted
    with pytest.raises(KeyboardInterrupt):
        barrier.apply(sched, platform.current_stream(), read_done)
    expected = ("synchronize",) if force_coarse else ("wait_stream", sched.id, 0)
    assert platform.log[-1] == expected


# -- launch: the step in one call --------------------------------------------------------------------


def _stepped(policies, how):
    """Steps of ``policies`` on a fresh fence, begun and published ``how``: the split calls
    with the step's token (``"token"``) or without it (``"split"``), or `launch`. Returns
    (per step: token, published, the taken event's step, the barrier), and the platform's log."""
    platform = sim_platform()
    fence, graph, event = captured_fence(platform)
    barrier = SchedulerBarrier(platform)
    schedule = platform.new_stream()
    records_on = platform.new_stream()  # not the current one: a dropped stream shows
    start = len(platform.log)
    out = []
    for policy in policies:
        rel = release(policy, event)
        if how == "launch":
            token = fence.launch(rel, platform.replay, graph, records_on)
        else:
            token = fence.before_replay(rel, records_on)
            platform.replay(graph)
            fence.after_replay(rel, records_on, step=token if how == "token" else None)
        read_done = fence.take(token if how != "split" else None)
        kind = barrier.apply(schedule, platform.current_stream(), read_done)
        out.append((token, fence.published, read_done and read_done.slot.step, kind))
    return out, platform.log[start:]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([P.IN_GRAPH, P.POST_REPLAY, P.PRE_REPLAY, P.NONE]), max_size=12))
def test_token_split_and_launch_steps_do_the_same(policies):
    """With or without the token, or in one call: the same platform calls in the same order,
    the same publishes and barriers."""
    split = _stepped(policies, "split")
    assert _stepped(policies, "token") == split
    assert _stepped(policies, "launch") == split


@pytest.mark.parametrize("error", [RuntimeError("replay failed"), KeyboardInterrupt()])
@pytest.mark.parametrize("policy", [P.IN_GRAPH, P.POST_REPLAY, P.PRE_REPLAY])
def test_a_replay_that_raises_in_launch_publishes_nothing(platform, policy, error):
    fence, graph, event = captured_fence(platform)
    rel = release(policy, event)
    fence.launch(rel, platform.replay, graph)  # a good step first: something to go stale
    assert fence.published is policy

    def broken(graph):
        platform.replay(graph)  # some of the forward was enqueued
        raise error

    with pytest.raises(type(error)):
        fence.launch(rel, broken, graph)
    assert fence.take() is None and fence.published is P.NONE and fence.step == 2
    barrier = SchedulerBarrier(platform)
    assert barrier.apply(platform.new_stream(), platform.current_stream(), None) == "coarse"
    token = fence.launch(rel, platform.replay, graph)  # the next step publishes again
    read_done = fence.take(token)
    assert read_done is not None and read_done.policy is policy and read_done.step == 3


def test_launch_checks_the_owner_once_and_before_anything(platform, monkeypatch):
    import warpolicy.runtime.fence as fence_module

    fence, graph, event = captured_fence(platform)
    rel = release(P.IN_GRAPH, event)
    checks = []
    real = fence_module.get_ident
    monkeypatch.setattr(fence_module, "get_ident", lambda: checks.append(1) or real())
    read_done = fence.take(fence.launch(rel, platform.replay, graph))
    assert read_done is not None and len(checks) == 1
    replays, errors = [], []

    def other():
        try:
            fence.launch(rel, replays.append, graph)
        except WrongThreadError as exc:
            errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(errors) == 1 and replays == [] and fence.step == 1


# -- apply_step: take and barrier in one call ----------------------------------------------------------


def _barriered(steps, how):
    """Steps on a fresh fence with a recording observer; each step is (policy, force_coarse,
    token kind, wait fault); a ``"dropped"`` step's read-done is taken and never waited on.
    The scheduler takes and applies ``how``: ``"apply"`` (``apply(..., take(token))``) or
    ``"apply_step"``. Returns (per step: the barrier's kind, the published policy, the
    mailbox after it, the slots' marks), the observer's calls and the platform log."""
    rt = sim_runtime()
    recorder = Recorder()
    rt.pm.register(recorder)
    rt.observers.refresh()
    platform = rt.platform
    fence, graph, event, barrier = observed(rt)
    schedule, forward = platform.new_stream(), platform.current_stream()
    releases = {policy: release(policy, event) for policy in P}  # one per bucket, as a runner's
    start = len(platform.log)
    out = []
    with warnings.catch_warnings():  # the fallbacks warn (the observer records them)
        warnings.simplefilter("ignore")
        for policy, force_coarse, token_kind, fault in steps:
            barrier.force_coarse = force_coarse
            rel = releases[policy]
            token = fence.launch(rel, platform.replay, graph)
            if token_kind == "dropped":  # a scheduler that takes and never waits (its bug)
                fence.take(token)
                out.append((None, fence.published, None, None))
                continue
            given_token = {"token": token, "none": None, "stale": token - 1}[token_kind]
            if fault:
                sim_impl(platform).inject("wait_event", fault)
            if how == "apply":
                kind = barrier.apply(schedule, forward, fence.take(given_token))
            else:
                kind = barrier.apply_step(schedule, forward, fence, given_token)
            sim_impl(platform).clear_faults()
            marks = [(slot.step, slot.taken) for slot in fence.ring.slots]
            if rel.read_done is not None:
                marks.append((rel.read_done.slot.step, rel.read_done.slot.taken))
            out.append((kind, fence.published, fence.take(), marks))
    return out, recorder.calls, platform.log[start:]


_BARRIER_STEPS = st.tuples(
    st.sampled_from([P.IN_GRAPH, P.POST_REPLAY, P.PRE_REPLAY, P.NONE]),
    st.booleans(),
    st.sampled_from(["token", "none", "stale", "dropped"]),
    st.sampled_from([None, "raise", "act_then_raise"]),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(_BARRIER_STEPS, max_size=10))
@example([(P.IN_GRAPH, False, "dropped", None), (P.IN_GRAPH, False, "token", None)])
@example([(P.POST_REPLAY, False, "dropped", None)] * 4 + [(P.POST_REPLAY, False, "none", None)])
@example([(P.IN_GRAPH, True, "stale", "raise"), (P.PRE_REPLAY, False, "token", "act_then_raise")])
def test_apply_step_is_apply_of_take(steps):
    """The fused call waits, falls back, reports and marks slots exactly as ``apply`` of
    ``take`` does, for every policy, forced coarse or not, any token, a failing wait."""
    assert _barriered(steps, "apply_step") == _barriered(steps, "apply")


def test_apply_step_waits_on_the_steps_own_event_with_the_event_first(platform):
    fence, graph, event = captured_fence(platform)
    barrier = SchedulerBarrier(platform)
    schedule = platform.new_stream()
    token = fence.launch(release(P.IN_GRAPH, event), platform.replay, graph)
    assert barrier.apply_step(schedule, platform.current_stream(), fence, token) == "event"
    assert platform.log[-1] == ("wait_event", schedule.id, event.id)
    assert fence.take(token) is None  # consumed once


def test_apply_step_on_an_interrupted_wait_orders_the_schedule_stream(platform):
    fence, graph, event = captured_fence(platform)
    barrier = SchedulerBarrier(platform)
    schedule = platform.new_stream()
    rel = release(P.IN_GRAPH, event)
    token = fence.launch(rel, platform.replay, graph)

    def interrupted(event, stream):
        raise KeyboardInterrupt

    barrier._event_wait = interrupted
    with pytest.raises(KeyboardInterrupt):
        barrier.apply_step(schedule, platform.current_stream(), fence, token)
    assert platform.log[-1] == ("wait_stream", schedule.id, 0)
    assert rel.read_done.slot.taken is False


@pytest.mark.parametrize("how", ["apply", "apply_step"])
def test_the_taken_slot_is_awaited_while_its_wait_is_enqueued(platform, how):
    """A launch on the owner thread while the scheduler (another thread, with the token) is
    inside the wait must not re-record the event being waited on: its slot is marked."""
    fence, graph, event = captured_fence(platform)
    barrier = SchedulerBarrier(platform)
    schedule = platform.new_stream()
    token = fence.launch(release(P.POST_REPLAY), platform.replay, graph)
    marks = []
    wait = barrier._event_wait

    def watching(event, stream):
        marks.extend(slot.taken for slot in fence.ring.slots if slot.event is event)
        wait(event, stream)

    barrier._event_wait = watching
    if how == "apply":
        barrier.apply(schedule, platform.current_stream(), fence.take(token))
    else:
        barrier.apply_step(schedule, platform.current_stream(), fence, token)
    assert marks == [True]
    assert not any(slot.taken for slot in fence.ring.slots)  # and cleared once enqueued


class _Mailbox:
    """A read-done source that is not a fence (a speculative step's mailbox, say)."""

    def __init__(self, read_done=None, error=None):
        self.read_done, self.error = read_done, error

    def take(self):
        if self.error is not None:
            raise self.error
        read_done, self.read_done = self.read_done, None
        return read_done


def test_apply_step_takes_from_any_mailbox(platform):
    fence, graph, event = captured_fence(platform)
    barrier = SchedulerBarrier(platform)
    schedule = platform.new_stream()
    fence.launch(release(P.IN_GRAPH, event), platform.replay, graph)
    mailbox = _Mailbox(fence.take())
    assert barrier.apply_step(schedule, platform.current_stream(), mailbox) == "event"
    assert platform.log[-1] == ("wait_event", schedule.id, event.id)
    assert barrier.apply_step(schedule, platform.current_stream(), mailbox) == "coarse"
    assert platform.log[-1] == ("wait_stream", schedule.id, 0)  # nothing left: coarse


@pytest.mark.parametrize("error", [WrongThreadError("not yours"), KeyboardInterrupt()])
def test_apply_step_orders_the_schedule_stream_before_a_failed_take_propagates(platform, error):
    barrier = SchedulerBarrier(platform)
    schedule = platform.new_stream()
    with pytest.raises(type(error)):
        barrier.apply_step(schedule, platform.current_stream(), _Mailbox(error=error))
    assert platform.log[-1] == ("wait_stream", schedule.id, 0)
