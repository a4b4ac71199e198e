"""The Platform facade: device resolution through one claim, direct calls to the chosen
implementation, one-line plugin errors, and the one-time log line."""

from __future__ import annotations

import contextlib
import logging
import pathlib
import re

import pytest

from warpolicy.errors import CudaUnavailableError, PluginError, UnknownNameError
from warpolicy.runtime import platform as platform_mod
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.platform import Platform, PlatformError, sim_platform
from warpolicy.runtime.platforms import PlatformImpl, device_type
from warpolicy.runtime.platforms.sim import SimPlatform

torch = pytest.importorskip("torch")
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
def test_default_device_is_the_simulated_one_without_cuda(pm):
    p = Platform.for_device(None, pm)
    assert p.name == "sim" and p.device == "sim"


@no_cuda
def test_cuda_without_cuda_is_a_user_error(pm):
    with pytest.raises(CudaUnavailableError, match="CUDA"):
        Platform.for_device("cuda:0", pm)


def test_unknown_device_type(pm):
    with pytest.raises(UnknownNameError, match="tpu"):
        Platform.for_device("tpu", pm)


def test_disabled_sim_leaves_no_platform():
    pm = new_plugin_manager(load_entry_points=False, environ={"WARPOLICY_DISABLE_PLUGINS": "sim"})
    with pytest.raises(UnknownNameError):
        Platform.for_device("sim", pm)


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


def test_the_claim_is_asked_once_and_its_methods_are_bound(pm, register):
    plugin = register(MiniPlugin())
    p = Platform.for_device("Mini:3", pm)
    assert plugin.asked == ["mini:3"] and p.name == "mini" and isinstance(p.impl, Mini)
    assert isinstance(p.impl, PlatformImpl)
    for op in ("record", "wait_event", "wait_stream", "replay", "is_capturing"):
        assert getattr(p, op) == getattr(p.impl, op)  # the implementation's own bound method
    ev = p.create_event()
    p.record(ev)
    p.wait_event(p.new_stream(), ev)
    assert plugin.asked == ["mini:3"]  # operations never go back to the plugins
    assert p.log.of("record") == [("record", ev.id, 0, False)]


def test_a_later_plugin_does_not_change_a_built_platform(pm, register):
    p = Platform.for_device("sim", pm)
    register(MiniPlugin(kind="sim"))  # would conflict if asked again
    p.create_event()
    assert len(p.log) == 1
    with pytest.raises(PluginError):
        Platform.for_device("sim", pm)


@pytest.mark.parametrize("order", ["a-first", "b-first"])
def test_two_claims_are_one_line_naming_both_plugins_whatever_the_order(pm, order):
    a, b = MiniPlugin(), MiniPlugin()
    for plugin, name in (
        [(a, "alpha"), (b, "beta")] if order == "a-first" else [(b, "beta"), (a, "alpha")]
    ):
        pm.register(plugin, name=name)
    with pytest.raises(PluginError) as info:
        Platform.for_device("mini", pm)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("plugin 'alpha'") and "plugin 'beta'" in text and "'mini'" in text


def test_a_raising_claim_names_the_plugin(pm, register):
    class Broken:
        @hookimpl
        def warpolicy_platform(self, device):
            raise KeyError("boom")

    register(Broken(), name="broken")
    with pytest.raises(PluginError, match=r"plugin 'broken'.*raised KeyError"):
        Platform.for_device("sim", pm)


def test_an_incomplete_implementation_is_refused_with_what_it_lacks(pm, register):
    class Half:
        name, device, external_events_supported = "half", "half", False

        def record(self, event, stream=None):
            pass

    class HalfPlugin:
        @hookimpl
        def warpolicy_platform(self, device):
            return Half() if device == "half" else None

    register(HalfPlugin(), name="half")
    with pytest.raises(PluginError, match=r"plugin 'half'.*without create_event, wait_event"):
        Platform.for_device("half", pm)


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


def test_log_is_only_for_the_simulated_platform(pm, register):
    class Quiet(Mini):
        def __init__(self):
            super().__init__()
            self.log = None  # not a recording platform

    class QuietPlugin:
        @hookimpl
        def warpolicy_platform(self, device):
            return Quiet() if device == "quiet" else None

    register(QuietPlugin())
    with pytest.raises(NotImplementedError, match="does not record"):
        _ = Platform.for_device("quiet", pm).log


def test_announces_once_per_platform(pm, caplog, monkeypatch):
    monkeypatch.setattr(platform_mod, "_ANNOUNCED", set())
    with caplog.at_level(logging.INFO, logger="warpolicy"):
        Platform.for_device("sim", pm)
        Platform.for_device("sim", pm)
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
