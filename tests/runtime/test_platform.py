"""The Platform facade: device resolution through one claim, direct calls to the chosen
implementation, one-line plugin errors, and the one-time log line."""

from __future__ import annotations

import contextlib
import gc
import logging
import pathlib
import re

import pytest

from warpolicy.errors import CudaUnavailableError, PluginError, UnknownNameError
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.manager import new_plugin_manager, open_platform
from warpolicy.runtime.platforms import (
    PLATFORM_OPERATIONS,
    EventFirstWait,
    Platform,
    PlatformError,
    PlatformImpl,
    device_type,
    implementation_problems,
    is_simulated,
)
from warpolicy.runtime.platforms import facade as facade_mod
from warpolicy.runtime.platforms.sim import SimPlatform
from warpolicy.testing import sim_platform

torch = pytest.importorskip("torch")


def for_device(device, warpolicy_pm):
    return open_platform(warpolicy_pm, device)


no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")


@pytest.mark.parametrize(
    "device, kind",
    [
        ("cuda:1", "cuda"),
        ("sim", "sim"),
        ("CPU", "cpu"),
        (torch.device("cuda", 0), "cuda"),
    ],
)
def test_device_type(device, kind):
    assert device_type(device) == kind


@no_cuda
def test_default_device_is_the_simulated_one_without_cuda(warpolicy_pm):
    p = for_device(None, warpolicy_pm)
    assert p.name == "sim" and p.device == "sim"


@no_cuda
def test_cuda_without_cuda_is_a_user_error(warpolicy_pm):
    with pytest.raises(CudaUnavailableError, match="CUDA"):
        for_device("cuda:0", warpolicy_pm)


def test_unknown_device_type(warpolicy_pm):
    with pytest.raises(UnknownNameError, match="tpu"):
        for_device("tpu", warpolicy_pm)


def test_disabled_sim_leaves_no_platform():
    pm = new_plugin_manager(load_entry_points=False, environ={"WARPOLICY_DISABLE_PLUGINS": "sim"})
    with pytest.raises(UnknownNameError):
        for_device("sim", pm)


class Mini(SimPlatform):
    name = "mini"


class MiniPlugin:
    """A platform plugin for device type "mini", counting how often it is asked."""

    def __init__(self, kind="mini"):
        self.kind = kind
        self.asked = []

    @hookimpl
    def warpolicy_platform(self, device):
        self.asked.append(device)
        return Mini(device=device) if device_type(device) == self.kind else None


def test_the_claim_is_asked_once_and_its_methods_are_bound(warpolicy_pm, warpolicy_register):
    plugin = warpolicy_register(MiniPlugin())
    p = for_device("Mini:3", warpolicy_pm)
    assert plugin.asked == ["mini:3"] and p.name == "mini" and isinstance(p.impl, Mini)
    assert isinstance(p.impl, PlatformImpl)
    for op in ("record", "wait_event", "wait_stream", "replay", "is_capturing"):
        assert getattr(p, op) == getattr(p.impl, op)  # the implementation's own bound method
    ev = p.create_event()
    p.record(ev)
    p.wait_event(p.new_stream(), ev)
    assert plugin.asked == ["mini:3"]  # operations never go back to the plugins
    assert p.log.of("record") == [("record", ev.id, 0, False)]


def test_the_facade_carries_no_plugin_manager(warpolicy_pm):
    assert not hasattr(for_device("sim", warpolicy_pm), "warpolicy_pm")


def test_a_later_plugin_does_not_change_a_built_platform(warpolicy_pm, warpolicy_register):
    p = for_device("sim", warpolicy_pm)
    warpolicy_register(MiniPlugin(kind="sim"))  # would conflict if asked again
    p.create_event()
    assert len(p.log) == 1
    with pytest.raises(PluginError):
        for_device("sim", warpolicy_pm)


@pytest.mark.parametrize("order", ["a-first", "b-first"])
def test_two_claims_are_one_line_naming_both_plugins_whatever_the_order(warpolicy_pm, order):
    a, b = MiniPlugin(), MiniPlugin()
    for plugin, name in (
        [(a, "alpha"), (b, "beta")] if order == "a-first" else [(b, "beta"), (a, "alpha")]
    ):
        warpolicy_pm.register(plugin, name=name)
    with pytest.raises(PluginError) as info:
        for_device("mini", warpolicy_pm)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("plugin 'alpha'") and "plugin 'beta'" in text and "'mini'" in text


def test_a_raising_claim_names_the_plugin(warpolicy_pm, warpolicy_register):
    class Broken:
        @hookimpl
        def warpolicy_platform(self, device):
            raise KeyError("boom")

    warpolicy_register(Broken(), name="broken")
    with pytest.raises(PluginError, match=r"plugin 'broken'.*raised KeyError"):
        for_device("sim", warpolicy_pm)


def test_an_incomplete_implementation_is_refused_with_what_it_lacks(
    warpolicy_pm, warpolicy_register
):
    class Half:
        name, device, external_events_supported = "half", "half", False

        def record(self, event, stream=None):
            pass

    class HalfPlugin:
        @hookimpl
        def warpolicy_platform(self, device):
            return Half() if device == "half" else None

    warpolicy_register(HalfPlugin(), name="half")
    with pytest.raises(PluginError, match=r"plugin 'half'.*without create_event, wait_event"):
        for_device("half", warpolicy_pm)


def test_handles_the_implementation_returns_none_for_are_errors():
    p = sim_platform()
    p.impl.inject("new_graph", "none")
    with pytest.raises(PlatformError, match="new_graph returned None"):
        p.new_graph()


def test_capture_and_capture_callable_reach_the_implementation():
    p = sim_platform()
    ran = []
    g = p.new_graph()
    p.capture_callable(g, lambda: ran.append(p.is_capturing()))
    with p.capture(p.new_graph()):
        ran.append(p.is_capturing())
    assert ran == [True, True] and g.captured


@pytest.mark.parametrize(
    "attribute, value, problem",
    [
        ("external_events_supported", "false", "must be a bool, not str 'false'"),
        ("external_events_supported", 1, "must be a bool, not int 1"),
        ("external_events_supported", None, "must be a bool"),
        ("name", 7, "name must be a non-empty str"),
        ("record", "not callable", "without record"),
    ],
)
def test_a_claim_is_checked_by_type_not_by_presence(
    warpolicy_pm, warpolicy_register, attribute, value, problem
):
    class Liar(Mini):
        def __init__(self):
            super().__init__()
            setattr(self, attribute, value)

    class LiarPlugin:
        @hookimpl
        def warpolicy_platform(self, device):
            return Liar() if device == "liar" else None

    warpolicy_register(LiarPlugin(), name="liar")
    with pytest.raises(PluginError, match=r"plugin 'liar'.*not a platform implementation") as info:
        for_device("liar", warpolicy_pm)
    assert problem in str(info.value) and "\n" not in str(info.value)


def test_external_events_as_a_method_is_refused_not_read_as_true():
    class Method:
        name, device = "method", "method"

        def external_events_supported(self):  # a method: truthy, and wrong
            return False

    for op in PLATFORM_OPERATIONS:
        setattr(Method, op, lambda self, *a: None)
    assert any("must be a bool, not method" in p for p in implementation_problems(Method()))
    with pytest.raises(PlatformError, match="external_events_supported must be a bool"):
        Platform(Method())


def test_event_wait_is_the_implementations_own_or_its_wait_event_reordered():
    plain = Platform(SimPlatform())
    assert not isinstance(plain.impl, EventFirstWait)
    ev, s = plain.create_event(), plain.new_stream()
    plain.record(ev)
    plain.event_wait(ev, s)  # reordered onto the implementation's wait_event
    assert plain.log[-1] == ("wait_event", s.id, ev.id)

    class EventFirst(SimPlatform):
        def event_wait(self, event, stream):
            self.log.emit(("event_wait", stream.id, event.id))

    own = Platform(EventFirst())
    assert isinstance(own.impl, EventFirstWait)
    assert own.event_wait == own.impl.event_wait  # bound as is: no wrapper frame
    ev, s = own.create_event(), own.new_stream()
    own.event_wait(ev, s)
    assert own.log[-1] == ("event_wait", s.id, ev.id)


def test_an_event_wait_that_is_not_callable_is_refused():
    class Broken(SimPlatform):
        event_wait = "yes"

    assert "event_wait is not callable" in implementation_problems(Broken())
    with pytest.raises(PlatformError, match="event_wait is not callable"):
        Platform(Broken())


def test_a_partial_graph_walker_is_refused():
    class Half(SimPlatform):
        check_marker = None

    assert any("partial graph walker" in p for p in implementation_problems(Half()))


def test_a_partial_graph_restorer_or_one_that_cannot_walk_is_refused():
    class Half(SimPlatform):
        rebind_planted = None

    assert any("partial graph restorer" in p for p in implementation_problems(Half()))

    class Blind(SimPlatform):
        check_marker = None
        plant_derived = None
        graph_walk_unavailable = None
        instantiate = None

    assert any("restorer that cannot walk" in p for p in implementation_problems(Blind()))
    assert Platform(SimPlatform()).restorer is not None


def test_the_claim_calls_each_plugin_as_pluggy_does(warpolicy_pm, warpolicy_register):
    """An implementation's parameter with a default gets what the installed pluggy passes."""
    got = []

    class Defaulted:
        @hookimpl
        def warpolicy_platform(self, device="nothing-passed"):
            got.append(device)

    warpolicy_register(Defaulted(), name="defaulted")
    warpolicy_pm.hook.warpolicy_platform(device="sim")
    pluggy_passes = got.pop()
    for_device("sim", warpolicy_pm)
    assert got == [pluggy_passes]


@pytest.mark.parametrize(
    "device, simulated",
    [("sim", True), ("fake", True), ("Sim:0", True), ("cuda", False), ("cpu", False)],
)
def test_one_alias_list_for_the_simulated_platform(device, simulated):
    assert is_simulated(device) is simulated


def test_log_is_only_for_the_simulated_platform(warpolicy_pm, warpolicy_register):
    class Quiet(Mini):
        def __init__(self):
            super().__init__()
            self.log = None  # not a recording platform

    class QuietPlugin:
        @hookimpl
        def warpolicy_platform(self, device):
            return Quiet() if device == "quiet" else None

    warpolicy_register(QuietPlugin())
    with pytest.raises(NotImplementedError, match="does not record"):
        _ = for_device("quiet", warpolicy_pm).log


def test_announces_once_per_platform(warpolicy_pm, caplog, monkeypatch):
    monkeypatch.setattr(facade_mod, "_ANNOUNCED", set())
    with caplog.at_level(logging.INFO, logger="warpolicy"):
        for_device("sim", warpolicy_pm)
        for_device("sim", warpolicy_pm)
    lines = [r.getMessage() for r in caplog.records if "in-graph read-done" in r.getMessage()]
    assert lines == ["warpolicy: platform 'sim' on device sim: in-graph read-done simulated"]


def test_cuda_platform_detects_external_events_from_the_signature():
    from warpolicy.runtime.platforms import cuda

    assert cuda.external_events_in_signature() is True  # torch >= 2.8 on CI
    assert cuda.warpolicy_platform(device="sim") is None


def test_no_private_pluggy_or_torch_access_in_the_package():
    root = pathlib.Path(__file__).resolve().parents[2] / "warpolicy"
    private = re.compile(r"\bpm\._|pluggy\._|_inner_hookexec|_multicall|_is_profiler_enabled")
    offenders = [
        f"{path.relative_to(root)}:{n}"
        for path in root.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert offenders == []


def test_the_sim_context_managers_nest_with_the_facade():
    p = sim_platform()
    s = p.new_stream()
    with contextlib.ExitStack() as stack:
        stack.enter_context(p.stream(s))
        assert p.current_stream() is s
    assert p.current_stream() is not s


class TestCudaCaptureWithoutCollection:
    """A garbage collection during capture can free an old graph's pool (``cudaFree``) and
    invalidate the capture: the CUDA platform keeps the collector off while it captures."""

    def platform_with(self, seen):
        import types

        from warpolicy.runtime.platforms.cuda import CudaPlatform

        @contextlib.contextmanager
        def graph(graph, pool=None, stream=None):
            seen.append(("enter", gc.isenabled()))
            yield graph
            seen.append(("exit", gc.isenabled()))

        platform = object.__new__(CudaPlatform)  # no CUDA here: only the torch calls it makes
        platform._torch = types.SimpleNamespace(cuda=types.SimpleNamespace(graph=graph))
        return platform

    @pytest.mark.parametrize("error", [None, RuntimeError, KeyboardInterrupt])
    def test_the_collector_is_off_during_capture_and_restored(self, error):
        seen = []
        platform = self.platform_with(seen)

        def body():
            seen.append(("body", gc.isenabled()))
            if error is not None:
                raise error("capture failed")

        assert gc.isenabled()
        with pytest.raises(error) if error is not None else contextlib.nullcontext():
            platform.capture_callable(object(), body, None, None)
        assert gc.isenabled()
        assert ("body", False) in seen and ("enter", False) in seen
        seen.clear()
        with platform.capture(object(), None, None):
            seen.append(("body", gc.isenabled()))
        assert seen == [("enter", False), ("body", False), ("exit", False)] and gc.isenabled()

    def test_a_disabled_collector_stays_disabled(self):
        platform = self.platform_with([])
        gc.disable()
        try:
            platform.capture_callable(object(), lambda: None, None, None)
            assert not gc.isenabled()
        finally:
            gc.enable()
