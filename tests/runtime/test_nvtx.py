"""NVTX ranges (warpolicy.runtime.nvtx): names, push/pop balance under failing hooks, the switch, and
the real torch binding on a GPU. CPU tests inject a recording stand-in for torch.cuda.nvtx."""

from __future__ import annotations

import sys
import types
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY
from warpolicy.runtime import nvtx as wnvtx
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop
from warpolicy.testing import RecModel, sim_runtime


class RecordingNvtx:
    """Records calls; tracks the range depth and whether a pop ever had nothing to pop.
    ``fail_push`` / ``fail_mark`` make the next such call raise (as the CPU stub does)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.depth = 0
        self.max_depth = 0
        self.unbalanced_pop = False
        self.fail_push = False
        self.fail_mark = False

    def range_push(self, msg: str) -> int:
        if self.fail_push:
            self.fail_push = False
            raise RuntimeError("push failed")
        self.calls.append(("push", msg))
        self.depth += 1
        self.max_depth = max(self.max_depth, self.depth)
        return self.depth - 1

    def range_pop(self) -> int:
        self.calls.append(("pop", ""))
        if self.depth == 0:
            self.unbalanced_pop = True
            return -1
        self.depth -= 1
        return self.depth

    def mark(self, msg: str) -> None:
        if self.fail_mark:
            self.fail_mark = False
            raise RuntimeError("mark failed")
        self.calls.append(("mark", msg))


@pytest.fixture
def nvtx(monkeypatch):
    """A stand-in module installed as ``torch.cuda.nvtx`` for `load_nvtx`."""
    rec = RecordingNvtx()
    module = types.ModuleType("torch.cuda.nvtx")
    module.range_push, module.range_pop, module.mark = rec.range_push, rec.range_pop, rec.mark
    monkeypatch.setitem(sys.modules, "torch.cuda.nvtx", module)
    return rec


def run(plugin, policy="in_graph", steps=3, extra=(), **loop_kw):
    rt = sim_runtime()
    for observer in extra:  # registered first, so pluggy calls them after the NVTX plugin
        rt.pm.register(observer)
    rt.pm.register(plugin)
    runner = DecodeRunner(
        RecModel(), fixed_policy(policy), rt.platform, name="decode", observers=rt.observers
    )
    runner.capture()
    loop = OverlapLoop(runner, **loop_kw)
    for _ in range(steps):
        loop.step([1.0], None)
    return loop


# -- the switch ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "0", "false", "off"])
def test_off_registers_nothing(value, nvtx):
    environ = {} if value is None else {wnvtx.ENV: value}
    assert wnvtx.nvtx_plugin_if_enabled(environ) is None
    assert nvtx.calls == []


def test_on_with_nvtx_gives_the_plugin(nvtx):
    plugin = wnvtx.nvtx_plugin_if_enabled({wnvtx.ENV: "1"})
    assert isinstance(plugin, wnvtx.NvtxPlugin) and plugin.enabled
    assert nvtx.calls == [("mark", "warpolicy: NVTX ranges on")]


def test_on_without_nvtx_is_one_log_line_and_no_plugin(nvtx, caplog):
    nvtx.fail_mark = True  # what a CPU-only torch's stub does
    with caplog.at_level("WARNING", logger="warpolicy"):
        assert wnvtx.nvtx_plugin_if_enabled({wnvtx.ENV: "yes"}) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "WARPOLICY_NVTX is set but NVTX is unavailable" in line and "\n" not in line


def test_on_with_the_cpu_torch_stub_is_no_plugin(caplog):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA build has real NVTX")
    with caplog.at_level("WARNING", logger="warpolicy"):
        assert wnvtx.nvtx_plugin_if_enabled({wnvtx.ENV: "1"}) is None


def test_a_non_boolean_value_is_off_with_one_log_line(nvtx, caplog):
    with caplog.at_level("WARNING", logger="warpolicy"):
        assert wnvtx.nvtx_plugin_if_enabled({wnvtx.ENV: "maybe"}) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "WARPOLICY_NVTX='maybe' is not a boolean" in line and nvtx.calls == []


def test_the_plugin_manager_registers_the_nvtx_observer_when_asked(nvtx):
    from warpolicy.runtime.manager import describe_plugins, new_plugin_manager, observers_of

    off = new_plugin_manager(load_entry_points=False, environ={})
    assert off.get_plugin("nvtx") is None and not observers_of(off).on_publish
    pm = new_plugin_manager(load_entry_points=False, environ={wnvtx.ENV: "1"})
    plugin = pm.get_plugin("nvtx")
    assert isinstance(plugin, wnvtx.NvtxPlugin)
    assert pm.sources["nvtx"].source == "builtin"
    assert any(r["name"] == "nvtx" and r["status"] == "active" for r in describe_plugins(pm))
    assert observers_of(pm).on_publish  # the fence sees it as an observer
    blocked = new_plugin_manager(
        load_entry_points=False, environ={wnvtx.ENV: "1", "WARPOLICY_DISABLE_PLUGINS": "nvtx"}
    )
    assert blocked.get_plugin("nvtx") is None


# -- ranges on a run -------------------------------------------------------------------------------


def test_each_step_is_a_range_from_publish_to_the_release(nvtx):
    plugin = wnvtx.NvtxPlugin()
    run(plugin, "in_graph", steps=2)
    steps = [c for c in nvtx.calls if not c[1].startswith("warpolicy decide")]
    assert steps == [
        ("push", "warpolicy decode step 1 in_graph"),
        ("pop", ""),
        ("mark", "warpolicy decode step 1 released: event (in_graph)"),
        ("push", "warpolicy decode step 2 in_graph"),
        ("pop", ""),
        ("mark", "warpolicy decode step 2 released: event (in_graph)"),
    ]
    assert nvtx.depth == 0 and plugin.pushed == plugin.popped == 2
    decides = [c[1] for c in nvtx.calls if c[1].startswith("warpolicy decide")]
    # one decision per captured bucket, and the eager path's (demoted: no graph)
    assert decides == ["warpolicy decide runner:decode decode in_graph"] * 4 + [
        "warpolicy decide runner:decode decode post_replay"
    ]


def test_a_coarse_step_says_nothing_was_published(nvtx):
    run(wnvtx.NvtxPlugin(), "none", steps=1)
    names = [c[1] for c in nvtx.calls if c[0] != "pop"]
    assert "warpolicy decode step 1 none (nothing published)" in names
    assert "warpolicy scheduler step None released: coarse (no read-done event)" in names


class RaisingBarrierObserver:
    @hookimpl
    def warpolicy_on_barrier(self, runner, step, kind, reason):
        raise RuntimeError("observer broke")


class RaisingPublishObserver:
    @hookimpl
    def warpolicy_on_publish(self, runner, step, policy, event):
        raise RuntimeError("observer broke")


@pytest.mark.parametrize("observer", [RaisingBarrierObserver, RaisingPublishObserver])
def test_balance_holds_when_another_observer_raises(nvtx, observer):
    """Each observer is its own call: a raising observer is reported (a warning and a
    fallback notification) and changes neither the other observers' calls nor the step; the
    NVTX plugin must never pop what it did not push and keep at most one range open."""
    plugin = wnvtx.NvtxPlugin()
    rt = sim_runtime()
    rt.pm.register(plugin)
    rt.pm.register(observer(), name="broken")
    runner = DecodeRunner(
        RecModel(), fixed_policy("in_graph"), rt.platform, name="decode", observers=rt.observers
    )
    runner.capture()
    loop = OverlapLoop(runner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            loop.step([1.0], None)
    assert any("'broken' raised" in str(w.message) for w in caught)
    assert not nvtx.unbalanced_pop and nvtx.max_depth <= 1
    plugin.close()
    assert nvtx.depth == 0 and plugin.pushed == plugin.popped
    assert loop.last_barrier == "event"  # an observer never changes the publish or barrier
    fallbacks = [c[1] for c in nvtx.calls if c[1].startswith("warpolicy fallback")]
    assert fallbacks and all("broken" in f for f in fallbacks)  # NVTX saw the failure


def test_a_failing_push_turns_ranges_off_not_the_step_coarse(nvtx, caplog):
    plugin = wnvtx.NvtxPlugin()
    nvtx.fail_push = True
    with caplog.at_level("WARNING", logger="warpolicy"):
        loop = run(plugin, "in_graph", steps=3)
    assert loop.last_barrier == "event" and not plugin.enabled
    assert nvtx.depth == 0 and not nvtx.unbalanced_pop and plugin.pushed == plugin.popped == 0
    assert len([r for r in caplog.records if "NVTX ranges are off" in r.getMessage()]) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["publish", "barrier", "fallback", "close", "decision"]), st.booleans()
        ),
        max_size=40,
    )
)
def test_push_pop_balance_for_any_hook_sequence(script):
    """Whatever order the hooks come in (some skipped, some NVTX calls failing), no pop without
    a push, at most one open range, and none after close."""
    rec = RecordingNvtx()
    plugin = wnvtx.NvtxPlugin(rec)
    for step, (what, fail) in enumerate(script, 1):
        rec.fail_push = rec.fail_mark = fail
        if what == "publish":
            plugin.warpolicy_on_publish(
                runner="decode", step=step, policy=POST_REPLAY, event=object()
            )
        elif what == "barrier":
            plugin.warpolicy_on_barrier(
                runner="decode", step=step, kind="event", reason="post_replay"
            )
        elif what == "fallback":
            plugin.warpolicy_on_fallback(
                where="fence 'decode':after_replay", error=RuntimeError("x")
            )
        elif what == "decision":
            plugin.warpolicy_on_decision(decision=NONE, where="engine")
        else:
            plugin.close()
    assert not rec.unbalanced_pop and rec.max_depth <= 1
    plugin.close()
    assert rec.depth == 0 and plugin.pushed == plugin.popped


# -- GPU: torch's real binding ---------------------------------------------------------------------


@pytest.mark.cuda
def test_real_nvtx_binding_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
    from warpolicy.runtime.manager import open_runtime
    from warpolicy.runtime.release import BucketRelease

    plugin = wnvtx.nvtx_plugin_if_enabled({wnvtx.ENV: "1"})
    assert plugin is not None
    rt = open_runtime("cuda", load_entry_points=False, environ={})
    platform = rt.platform
    rt.pm.register(plugin)
    fence = ReadDoneFence(platform, name="decode", observers=rt.observers)
    event = fence.prepare()
    graph = platform.new_graph()
    with platform.capture(graph):
        torch.cuda._sleep(100_000)
        planted = fence.plant(event)  # the event this graph records
        torch.cuda._sleep(100_000)
    policy = IN_GRAPH if planted is not None else POST_REPLAY
    release = BucketRelease("decode", 1, policy, planted if policy is IN_GRAPH else None)
    barrier, sched = SchedulerBarrier(platform, observers=rt.observers), platform.new_stream()
    kinds = []
    for _ in range(5):
        fence.before_replay(release)
        platform.replay(graph)
        fence.after_replay(release)
        kinds.append(barrier.apply(sched, platform.current_stream(), fence.take()))
    platform.synchronize()
    assert kinds == ["event"] * 5
    assert plugin.enabled and plugin.pushed == plugin.popped == 5
