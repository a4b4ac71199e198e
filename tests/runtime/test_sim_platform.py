"""The simulated platform: the exact call log (bounded), CUDA-like capture / plant / replay
semantics, the happens-before model and fault injection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.errors import UnknownNameError
from warpolicy.runtime.manager import open_platform
from warpolicy.runtime.platforms.sim import DEFAULT_LOG_CAP, SimPlatform, SimPlugin
from warpolicy.testing import InjectedFault, sim_impl, sim_platform


@pytest.fixture
def platform():
    return sim_platform()


def test_each_platform_gets_its_own_log():
    a, b = sim_platform(), sim_platform()
    a.create_event()
    assert a.log == [("create_event", 1, False)]
    assert b.log == []
    assert sim_impl(a) is not sim_impl(b)


def test_eager_record_and_waits_are_logged_in_order(platform):
    ev = platform.create_event(external=False)
    s = platform.new_stream()
    cur = platform.current_stream()
    platform.record(ev)
    platform.wait_event(s, ev)
    platform.wait_stream(s, cur)
    platform.synchronize()
    assert platform.log == [
        ("create_event", ev.id, False),
        ("record", ev.id, cur.id, False),
        ("wait_event", s.id, ev.id),
        ("wait_stream", s.id, cur.id),
        ("synchronize",),
    ]
    assert ev.records == 1


def test_capture_makes_capture_stream_current_and_is_capturing(platform):
    g = platform.new_graph()
    outside = platform.current_stream()
    assert not platform.is_capturing()
    with platform.capture(g):
        assert platform.is_capturing()
        inside = platform.current_stream()
    assert inside is not outside and inside is g.stream
    assert not platform.is_capturing()
    assert platform.current_stream() is outside
    assert platform.log == [("capture_begin", g.id), ("capture_end", g.id)]


def test_external_record_on_capture_stream_is_planted_and_fires_on_replay(platform):
    ev = platform.create_event(external=True)
    g = platform.new_graph()
    with platform.capture(g):
        platform.record(ev)
    assert g.planted == [ev]
    launch = platform.current_stream()
    platform.replay(g)
    assert platform.log[-2:] == [("replay", g.id), ("record", ev.id, launch.id, "in_graph")]
    assert ev.records == 1  # the capture record does not fire; the replay does


def test_record_on_another_stream_during_capture_plants_nothing(platform):
    ev = platform.create_event(external=True)
    other = platform.new_stream()
    g = platform.new_graph()
    with platform.capture(g):
        platform.record(ev, other)  # the pitfall: not the capture stream -> no node
    assert g.planted == []
    platform.replay(g)
    assert platform.log[-1] == ("replay", g.id)


def test_non_external_event_recorded_in_capture_errors_when_used(platform):
    ev = platform.create_event(external=False)
    g = platform.new_graph()
    with platform.capture(g):
        platform.record(ev)
    assert g.planted == []
    with pytest.raises(RuntimeError, match="invalid argument"):
        platform.wait_event(platform.new_stream(), ev)


def test_callable_capture_reruns_body_on_replay_with_record_in_place(platform):
    ev = platform.create_event(external=True)
    g = platform.new_graph()
    seen = []

    def body():
        seen.append(("prep", platform.is_capturing(), sim_impl(platform).replaying))
        platform.record(ev)
        seen.append(("forward",))

    platform.capture_callable(g, body)
    assert seen == [("prep", True, False), ("forward",)]
    seen.clear()
    marks = []
    sim_impl(platform).listeners.append(lambda entry: marks.append((entry, list(seen))))
    platform.replay(g)
    assert seen == [("prep", True, True), ("forward",)]
    fired = [m for m in marks if m[0][0] == "record"]
    assert fired == [
        (("record", ev.id, platform.current_stream().id, "in_graph"), [("prep", True, True)])
    ]


def test_a_clone_replays_the_body_and_its_private_event_fires_in_place(platform):
    ev = platform.create_event(external=True)
    platform.record(ev)
    g = platform.new_graph(keep_graph=True)
    platform.capture_callable(g, lambda: platform.record(ev))
    clone = platform.clone_graph(g, private_events=True)
    private = clone.planted[0]
    assert private is not ev and clone.origin == g.id and clone.sources == {ev.id: 0}
    assert platform.log[-1] == ("clone", g.id, clone.id, True)
    platform.replay(clone)
    fired = [e for e in platform.log.of("record") if e[3] == "in_graph"]
    assert fired == [("record", private.id, platform.current_stream().id, "in_graph")]
    same = platform.clone_graph(clone)  # a clone of a clone keeps the first graph and the map
    assert same.origin == g.id and same.planted == [private] and same.sources == {ev.id: 0}


def test_only_a_kept_captured_graph_is_cloned(platform):
    from warpolicy.runtime.graphwalk import PlacementError

    g = platform.new_graph()
    platform.capture_callable(g, lambda: None)
    with pytest.raises(PlacementError, match="kept, captured"):
        platform.clone_graph(g)


def test_callable_replay_skips_records_that_made_no_node(platform):
    external = platform.create_event(external=True)
    plain = platform.create_event(external=False)
    g = platform.new_graph()
    other = platform.new_stream()

    def body():
        platform.record(external, other)  # wrong stream: no node

    platform.capture_callable(g, body)
    n = len(platform.log)
    platform.replay(g)
    assert platform.log[n:] == [("replay", g.id)]
    assert plain.records == 0


def test_replay_of_uncaptured_graph_and_nested_capture_raise(platform):
    g = platform.new_graph()
    with pytest.raises(RuntimeError, match="never captured"):
        platform.replay(g)
    with platform.capture(g), pytest.raises(RuntimeError, match="nested"):
        with platform.capture(platform.new_graph()):
            pass


def test_failed_capture_leaves_graph_uncaptured(platform):
    g = platform.new_graph()
    with pytest.raises(ValueError), platform.capture(g):
        raise ValueError("boom")
    assert not g.captured and not platform.is_capturing()
    assert platform.log == [("capture_begin", g.id), ("capture_end", g.id)]


def test_stream_context_manager_nests(platform):
    a, b = platform.new_stream(), platform.new_stream()
    base = platform.current_stream()
    with platform.stream(a):
        assert platform.current_stream() is a
        with platform.stream(b):
            assert platform.current_stream() is b
        assert platform.current_stream() is a
    assert platform.current_stream() is base


def test_without_external_events():
    platform = sim_platform(external_events=False)
    assert platform.external_events_supported() is False
    with pytest.raises(TypeError):
        platform.create_event(external=True)


def test_sim_and_its_alias_fake_are_claimed_but_cpu_is_not(warpolicy_pm):
    assert open_platform(warpolicy_pm, "sim").name == "sim"
    assert open_platform(warpolicy_pm, "FAKE").name == "sim"
    with pytest.raises(UnknownNameError, match="cpu"):
        open_platform(warpolicy_pm, "cpu")


def test_each_claim_is_a_fresh_platform_with_its_own_log(warpolicy_pm):
    a, b = open_platform(warpolicy_pm, "sim"), open_platform(warpolicy_pm, "sim")
    a.create_event()
    assert len(a.log) == 1 and len(b.log) == 0


def test_plugin_ignores_other_devices():
    plugin = SimPlugin()
    assert plugin.warpolicy_platform(device="cuda:0") is None
    assert plugin.warpolicy_platform(device="cpu") is None
    assert isinstance(plugin.warpolicy_platform(device="sim"), SimPlatform)


# -- the bounded log -----------------------------------------------------------------------------


def test_log_keeps_the_last_entries_and_counts_the_dropped():
    p = sim_platform(log_cap=3)
    events = [p.create_event() for _ in range(5)]
    assert p.log == [("create_event", e.id, False) for e in events[2:]]
    assert p.log.dropped == 2 and p.log.maxlen == 3
    assert p.log[-1] == ("create_event", events[-1].id, False) and p.log[1:] == list(p.log)[1:]
    assert DEFAULT_LOG_CAP >= 10_000


def test_log_cap_must_be_positive():
    with pytest.raises(ValueError, match="at least 1"):
        SimPlatform(log_cap=0)


# -- happens-before ------------------------------------------------------------------------------


def test_marks_on_one_stream_are_ordered_and_other_streams_are_not(platform):
    impl = sim_impl(platform)
    s = platform.new_stream()
    a = impl.mark("a")
    b = impl.mark("b")
    with platform.stream(s):
        c = impl.mark("c")
    assert impl.happens_before(a, b) and not impl.happens_before(b, a)
    assert not impl.happens_before(a, c) and not impl.happens_before(c, a)


def test_event_wait_orders_only_what_was_recorded_before_it(platform):
    impl = sim_impl(platform)
    sched = platform.new_stream()
    ev = platform.create_event()
    before = impl.mark("read")
    platform.record(ev)
    after = impl.mark("late read")
    platform.wait_event(sched, ev)
    with platform.stream(sched):
        write = impl.mark("write")
    assert impl.happens_before(before, write)
    assert not impl.happens_before(after, write)  # recorded too early for this read


def test_wait_stream_and_synchronize_order_everything_queued(platform):
    impl = sim_impl(platform)
    a, b, c = platform.new_stream(), platform.new_stream(), platform.new_stream()
    with platform.stream(a):
        read = impl.mark("read")
    platform.wait_stream(b, a)
    with platform.stream(b):
        assert impl.happens_before(read, impl.mark("b"))
    with platform.stream(c):
        assert not impl.happens_before(read, impl.mark("c before sync"))
    platform.synchronize()
    with platform.stream(c):
        assert impl.happens_before(read, impl.mark("c after sync"))


def test_the_planted_node_orders_what_precedes_it_in_the_replayed_body(platform):
    impl = sim_impl(platform)
    ev = platform.create_event(external=True)
    g = platform.new_graph()
    marks = {}

    def body():
        marks["prep"] = impl.mark("prep")
        platform.record(ev)
        marks["forward"] = impl.mark("forward")

    platform.capture_callable(g, body)
    assert marks["prep"].executed is False  # captured work does not run
    platform.replay(g)
    sched = platform.new_stream()
    platform.wait_event(sched, ev)
    with platform.stream(sched):
        write = impl.mark("write")
    assert marks["prep"].executed and impl.happens_before(marks["prep"], write)
    assert not impl.happens_before(marks["forward"], write)


def _planted_graph(platform, marks):
    """A callable-captured graph: a shared read, the planted event, then the forward."""
    impl = sim_impl(platform)
    ev = platform.create_event(external=True)
    platform.record(ev)  # the eager seed
    g = platform.new_graph()

    def body():
        marks.append(impl.mark("read"))
        platform.record(ev)

    platform.capture_callable(g, body)
    marks.clear()
    return g, ev


def test_launches_of_one_graph_are_serialized_across_streams(platform):
    """A wait bound to a later launch of the same graph on another stream only over-waits:
    CUDA serializes the launches of one graph exec (checked on the H200: 0/20 corrupted)."""
    impl = sim_impl(platform)
    marks = []
    g, ev = _planted_graph(platform, marks)
    a, b, sched = platform.new_stream(), platform.new_stream(), platform.new_stream()
    with platform.stream(a):
        platform.replay(g)  # step k on stream a; the scheduler takes ev but waits later
    with platform.stream(b):
        platform.replay(g)  # step k+1 on stream b records ev again
    platform.wait_event(sched, ev)  # binds to the latest record: step k+1's
    with platform.stream(sched):
        write = impl.mark("write")
    assert impl.happens_before(marks[0], write)  # step k's read: covered (over-wait)
    assert impl.happens_before(marks[1], write)


def test_launches_of_different_graphs_are_not_serialized(platform):
    """Two graphs recording one event on unordered streams: the later record says nothing
    about the earlier graph's reads (why each bucket gets its own event)."""
    impl = sim_impl(platform)
    ev = platform.create_event(external=True)
    platform.record(ev)
    reads = []
    graphs = []
    for _ in range(2):
        g = platform.new_graph()

        def body():
            reads.append(impl.mark("read"))
            platform.record(ev)

        platform.capture_callable(g, body)
        graphs.append(g)
    reads.clear()
    a, b, sched = platform.new_stream(), platform.new_stream(), platform.new_stream()
    with platform.stream(a):
        platform.replay(graphs[0])
    with platform.stream(b):
        platform.replay(graphs[1])
    platform.wait_event(sched, ev)
    with platform.stream(sched):
        write = impl.mark("write")
    assert not impl.happens_before(reads[0], write)  # an early release, as on CUDA


def test_a_recapture_starts_a_new_launch_order(platform):
    marks = []
    g, _ = _planted_graph(platform, marks)
    platform.replay(g)
    assert g.done_clock is not None
    platform.capture_callable(g, lambda: None)
    assert g.done_clock is None


def test_a_stream_created_after_a_synchronize_is_ordered_after_everything(platform):
    impl = sim_impl(platform)
    with platform.stream(platform.new_stream()):
        read = impl.mark("read")
    platform.synchronize()
    with platform.stream(platform.new_stream()):
        assert impl.happens_before(read, impl.mark("a later stream's work"))


def test_a_wait_on_a_never_recorded_event_orders_nothing(platform):
    impl = sim_impl(platform)
    sched = platform.new_stream()
    read = impl.mark("read")
    platform.wait_event(sched, platform.create_event())
    with platform.stream(sched):
        assert not impl.happens_before(read, impl.mark("write"))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["mark", "record", "wait_event", "wait_stream", "sync"]),
            st.integers(0, 2),
            st.integers(0, 2),
        ),
        max_size=25,
    )
)
def test_happens_before_is_transitive_and_respects_program_order(ops):
    p = sim_platform()
    impl = sim_impl(p)
    streams = [p.current_stream(), p.new_stream(), p.new_stream()]
    events = [p.create_event() for _ in range(3)]
    marks = []
    for op, i, j in ops:
        with p.stream(streams[i]):
            if op == "mark":
                marks.append(impl.mark())
            elif op == "record":
                p.record(events[j])
            elif op == "wait_event":
                p.wait_event(streams[i], events[j])
            elif op == "wait_stream":
                p.wait_stream(streams[i], streams[j])
            else:
                p.synchronize()
    for x in marks:
        for y in marks:
            if x.stream == y.stream:
                assert impl.happens_before(x, y) == (x.tick <= y.tick)
            for z in marks:
                if impl.happens_before(x, y) and impl.happens_before(y, z):
                    assert impl.happens_before(x, z)


# -- fault injection -----------------------------------------------------------------------------


def test_the_product_platform_has_no_fault_injection():
    assert not hasattr(SimPlatform(), "inject")


@pytest.mark.parametrize(
    "mode, result, recorded",
    [("raise", InjectedFault, 0), ("none", None, 0), ("act_then_raise", InjectedFault, 1)],
)
def test_injected_faults(platform, mode, result, recorded):
    impl = sim_impl(platform)
    ev = platform.create_event()
    fault = impl.inject("record", mode)
    platform_record = impl.record  # the facade bound the same method: faults apply to it too
    if result is InjectedFault:
        with pytest.raises(InjectedFault, match="record"):
            platform_record(ev)
    else:
        assert platform_record(ev) is None
    assert ev.records == recorded and fault.fired == 1
    impl.clear_faults()
    platform.record(ev)
    assert ev.records == recorded + 1


def test_fault_condition_and_bad_requests(platform):
    impl = sim_impl(platform)
    armed = {"on": False}
    fault = impl.inject("new_stream", "none", when=lambda: armed["on"])
    assert platform.new_stream() is not None and fault.fired == 0
    armed["on"] = True
    with pytest.raises(Exception, match="new_stream returned None"):
        platform.new_stream()
    with pytest.raises(ValueError, match="not a simulated platform operation"):
        impl.inject("mark")
    impl.inject("graph_walk_unavailable")  # the graph-walk methods are operations too
    with pytest.raises(InjectedFault):
        impl.graph_walk_unavailable()
    with pytest.raises(ValueError, match="fault mode"):
        impl.inject("record", "explode")
