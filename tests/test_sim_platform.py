"""The fake platform plugin: the exact call log and CUDA-like capture / plant / replay semantics."""

from __future__ import annotations

import pytest

from warpolicy.testing.fake import FakePlatformPlugin, fake_platform, fake_plugin


@pytest.fixture
def platform():
    return fake_platform()


def test_each_platform_gets_its_own_log():
    a, b = fake_platform(), fake_platform()
    a.create_event()
    assert a.log == [("create_event", 1, False)]
    assert b.log == []
    assert fake_plugin(a) is not fake_plugin(b)


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
        seen.append(("prep", platform.is_capturing(), fake_plugin(platform).replaying))
        platform.record(ev)
        seen.append(("forward",))

    platform.capture_callable(g, body)
    assert seen == [("prep", True, False), ("forward",)]
    seen.clear()
    marks = []
    fake_plugin(platform).listeners.append(lambda entry: marks.append((entry, list(seen))))
    platform.replay(g)
    assert seen == [("prep", True, True), ("forward",)]
    fired = [m for m in marks if m[0][0] == "record"]
    assert fired == [(("record", ev.id, platform.current_stream().id, "in_graph"), [("prep", True, True)])]


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
    with platform.capture(g):
        with pytest.raises(RuntimeError, match="nested"):
            with platform.capture(platform.new_graph()):
                pass


def test_failed_capture_leaves_graph_uncaptured(platform):
    g = platform.new_graph()
    with pytest.raises(ValueError):
        with platform.capture(g):
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
    platform = fake_platform(external_events=False)
    assert platform.external_events_supported() is False
    with pytest.raises(TypeError):
        platform.create_event(external=True)


def test_cpu_device_is_handled_by_the_fake():
    from warpolicy.platform import Platform

    p = fake_platform()
    cpu = Platform.for_device("cpu", p.pm)
    assert cpu.name == "fake"
    cpu.create_event()
    assert p.log == [("create_event", 1, False)]


def test_plugin_ignores_other_devices():
    plugin = FakePlatformPlugin()
    assert plugin.warpolicy_platform_name(device="cuda") is None
    assert plugin.warpolicy_create_event(device="cuda:0", external=False) is None
    assert plugin.log == []
