"""The Platform facade: device resolution, delegation, errors, the one-time log line and the
first-result fast path staying equivalent to pluggy."""

from __future__ import annotations

import logging

import pytest

from warpolicy import platform as platform_mod
from warpolicy.errors import CudaUnavailableError, UnknownNameError
from warpolicy.hookspecs import hookimpl
from warpolicy.platform import Platform, device_type
from warpolicy.plugins import new_plugin_manager

torch = pytest.importorskip("torch")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")


@pytest.mark.parametrize("device, kind", [
    ("cuda:1", "cuda"), ("fake", "fake"), ("CPU", "cpu"), (torch.device("cuda", 0), "cuda"),
])
def test_device_type(device, kind):
    assert device_type(device) == kind


@no_cuda
def test_default_device_is_the_fake_without_cuda(pm):
    p = Platform.for_device(None, pm)
    assert p.name == "fake" and p.device == "fake"


def test_cpu_is_normalized_to_a_torch_device_and_served_by_the_fake(pm):
    p = Platform.for_device("cpu", pm)
    assert p.device == torch.device("cpu") and p.name == "fake"


@no_cuda
def test_cuda_without_cuda_is_a_user_error(pm):
    with pytest.raises(CudaUnavailableError, match="CUDA"):
        Platform.for_device("cuda:0", pm)


def test_unknown_device_type(pm):
    with pytest.raises(UnknownNameError, match="tpu"):
        Platform.for_device("tpu", pm)


def test_disabled_fake_leaves_no_platform():
    pm = new_plugin_manager(load_entry_points=False, environ={"WARPOLICY_DISABLE_PLUGINS": "fake"})
    with pytest.raises(UnknownNameError):
        Platform.for_device("fake", pm)


class Minimal:
    """A platform plugin for device type "mini" that names itself and does nothing else."""

    @hookimpl
    def warpolicy_platform_name(self, device):
        return "mini" if device_type(device) == "mini" else None

    @hookimpl
    def warpolicy_capture(self, device, graph):
        if device_type(device) != "mini":
            return None
        import contextlib

        self.captured = []

        @contextlib.contextmanager
        def cm():
            self.captured.append(graph)
            yield

        return cm()


def test_operations_nobody_implements_raise_not_implemented(pm, register):
    register(Minimal())
    p = Platform.for_device("mini", pm)
    assert p.external_events_supported() is False
    for call in (lambda: p.create_event(), lambda: p.record(object()), lambda: p.replay(object()),
                 lambda: p.wait_event(object(), object()), lambda: p.current_stream()):
        with pytest.raises(NotImplementedError, match="mini"):
            call()
    with pytest.raises(NotImplementedError, match="does not record"):
        p.log


def test_capture_callable_falls_back_to_the_context_manager_form(pm, register):
    plugin = register(Minimal())
    p = Platform.for_device("mini", pm)
    ran = []
    p.capture_callable("g", lambda: ran.append(True))
    assert ran == [True] and plugin.captured == ["g"]


def test_third_party_plugin_overrides_the_builtin_for_its_device(pm, register):
    calls = []

    class Override:
        @hookimpl
        def warpolicy_record_event(self, device, event, stream):
            calls.append((str(device), event))
            return True

    p = Platform.for_device("fake", pm)
    ev = p.create_event()
    register(Override())  # registered after the Platform was built: still honoured
    p.record(ev)
    assert calls == [("fake", ev)]
    assert p.log.of("record") == []


def test_fast_path_matches_pluggy_with_subset_arguments_and_fallthrough(pm, register):
    seen = []

    class Partial:
        @hookimpl
        def warpolicy_wait_event(self, event):  # a subset, in another order
            seen.append(event)
            return None  # declines: falls through to the fake

    p = Platform.for_device("fake", pm)
    ev, s = p.create_event(), p.new_stream()
    register(Partial())
    p.wait_event(s, ev)
    assert seen == [ev]
    assert p.log[-1] == ("wait_event", s.id, ev.id)


def test_fast_path_honours_wrappers(pm, register):
    order = []

    class Wrapper:
        @hookimpl(wrapper=True)
        def warpolicy_wait_stream(self, device, stream, other):
            order.append("before")
            result = yield
            order.append("after")
            return result

    p = Platform.for_device("fake", pm)
    s = p.new_stream()
    register(Wrapper())
    p.wait_stream(s, s)
    assert order == ["before", "after"]


def test_fast_path_honours_tracing(capsys):
    pm = new_plugin_manager(load_entry_points=False, environ={"WARPOLICY_TRACE_HOOKS": "1"})
    p = Platform.for_device("fake", pm)
    ev = p.create_event()
    capsys.readouterr()
    p.record(ev)
    assert "warpolicy_record_event" in capsys.readouterr().err


def test_exceptions_propagate_unchanged(pm, register):
    class Raises:
        @hookimpl
        def warpolicy_replay(self, device, graph):
            raise KeyError("injected")

    p = Platform.for_device("fake", pm)
    register(Raises())
    with pytest.raises(KeyError, match="injected"):
        p.replay(p.new_graph())


def test_fast_path_logs_once_per_platform(pm, caplog, monkeypatch):
    monkeypatch.setattr(platform_mod, "_ANNOUNCED", set())
    with caplog.at_level(logging.INFO, logger="warpolicy"):
        Platform.for_device("fake", pm)
        Platform.for_device("fake", pm)
    lines = [r.getMessage() for r in caplog.records if "in-graph read-done" in r.getMessage()]
    assert lines == ["warpolicy: platform 'fake' on device fake: in-graph read-done simulated"]


def test_cuda_announcement_names_the_fast_path(pm, caplog, monkeypatch):
    monkeypatch.setattr(platform_mod, "_ANNOUNCED", set())
    p = Platform(torch.device("cuda"), pm, "cuda")
    p._external = True
    with caplog.at_level(logging.INFO, logger="warpolicy"):
        p._announce()
    assert caplog.records[-1].getMessage() == (
        f"warpolicy: CUDA external events available (torch {torch.__version__}): in-graph read-done enabled")


def test_cuda_plugin_detects_external_events_from_the_signature():
    from warpolicy import cuda

    assert cuda.external_events_in_signature() is True  # torch >= 2.8 on CI
    assert cuda.warpolicy_platform_name(device="fake") is None


# -- the first-result fast path: used when equivalent, plain pluggy otherwise ----------------------

def test_fast_path_is_taken_by_default(pm):
    p = Platform.for_device("fake", pm)
    for caller in (p._h_record, p._h_wait_event, p._h_wait_stream, p._h_is_capturing, p._h_replay,
                   p._h_current_stream):
        assert caller.fast


def test_fast_path_off_with_wrappers_tracing_or_without_pluggys_dispatcher(pm, monkeypatch):
    p = Platform.for_device("fake", pm)

    class Wrapper:
        @hookimpl(wrapper=True)
        def warpolicy_record_event(self, device, event, stream):
            return (yield)

    wrapper = Wrapper()
    pm.register(wrapper)
    try:
        assert not p._h_record.fast and p._h_wait_event.fast
    finally:
        pm.unregister(wrapper)
    assert p._h_record.fast
    traced = Platform.for_device("fake", new_plugin_manager(load_entry_points=False,
                                                            environ={"WARPOLICY_TRACE_HOOKS": "1"}))
    assert not traced._h_record.fast
    monkeypatch.setattr(platform_mod, "_PLUGGY_MULTICALL", None)  # another pluggy layout
    assert not p._h_record.fast
    ev, s = p.create_event(), p.new_stream()
    p.record(ev, s)
    assert p.log[-1] == ("record", ev.id, s.id, False)


def test_unknown_pluggy_hookimpl_layout_degrades_to_plain_pluggy(pm, monkeypatch):
    import pluggy

    class Odd:  # a HookImpl of some other pluggy: no argnames / wrapper attributes
        def __init__(self, impl):
            self.function = impl.function

    real = pluggy.HookCaller.get_hookimpls
    monkeypatch.setattr(pluggy.HookCaller, "get_hookimpls", lambda self: [Odd(i) for i in real(self)])
    p = Platform.for_device("fake", pm)
    assert not p._h_record.fast  # no AttributeError on every call: pluggy itself answers
    ev = p.create_event()
    p.record(ev)
    assert p.log[-1] == ("record", ev.id, 0, False)


def test_fast_path_is_never_used_for_a_collecting_hook(pm):
    caller = platform_mod.FirstResultCaller(pm, "warpolicy_on_publish", ("runner", "step", "policy", "event"))
    assert not caller.fast


def _make_impl(tag, calls, args, answer, tryfirst, trylast):
    """A plugin implementing warpolicy_wait_event with the given argument subset."""
    params = ", ".join(args)
    src = (f"def warpolicy_wait_event(self, {params}):\n"
           f"    calls.append(({tag!r}, [{', '.join(args)}]))\n"
           f"    return answer\n")
    scope = {"calls": calls, "answer": answer}
    exec(src, scope)
    fn = hookimpl(tryfirst=tryfirst, trylast=trylast)(scope["warpolicy_wait_event"])
    return type(f"P{tag}", (), {"warpolicy_wait_event": fn})()


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.lists(st.tuples(
    st.sets(st.sampled_from(["device", "stream", "event"])).map(sorted),
    st.sampled_from([None, "x", "y"]),
    st.sampled_from([(False, False), (True, False), (False, True)])), max_size=5))
def test_fast_path_is_equivalent_to_pluggy(specs):
    results = []
    for fast in (True, False):
        pm = new_plugin_manager(load_entry_points=False, environ={})
        pm.unregister(name="fake")  # only the inline plugins (and the CUDA one, which declines)
        calls: list = []
        for i, (args, answer, (first, last)) in enumerate(specs):
            pm.register(_make_impl(str(i), calls, args, answer, first, last))
        caller = platform_mod.FirstResultCaller(pm, "warpolicy_wait_event", ("device", "stream", "event"))
        assert caller.fast
        got = caller("fake", "S", "E") if fast else pm.hook.warpolicy_wait_event(
            device="fake", stream="S", event="E")
        results.append((got, calls))
    assert results[0] == results[1]
