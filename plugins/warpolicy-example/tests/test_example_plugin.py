"""Tests of the example plugin with warpolicy's test support (`warpolicy.testing`).

* the fragment, loaded by the engine exactly as the CLI and an engine load it;
* the observer on the simulated platform: a real runner and overlap loop, no GPU, with faults
  injected into the platform (`FaultySimPlatform.inject`);
* the installed distribution's entry point (run these tests after ``pip install .``).
"""

from __future__ import annotations

import functools
import logging

import pytest

import warpolicy_example
from warpolicy import ForwardMode, WarReadDonePolicy
from warpolicy.registry.engine import PolicyEngine
from warpolicy.runtime.manager import (
    blame_plugins,
    collect_fragments,
    describe_plugins,
    new_plugin_manager,
)
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop
from warpolicy.testing import RecModel, sim_impl
from warpolicy_example import CoarseSteps


def fixed(policy: WarReadDonePolicy):
    """A policy callable: the same answer for every mode (the runtime still demotes an answer
    the facts cannot support, e.g. in_graph for an eager step)."""

    def lookup(mode: ForwardMode, eager: bool = False, planted: bool = True):
        return policy

    return lookup


def run(rt, policy: WarReadDonePolicy, steps: int, name: str = "decode") -> OverlapLoop:
    runner = DecodeRunner(RecModel(), fixed(policy), rt.platform, name=name, observers=rt.observers)
    runner.capture()
    loop = OverlapLoop(runner)
    for _ in range(steps):
        loop.step([1.0, 2.0], write_next=lambda: None)
    return loop


def test_the_plugin_registers_its_hooks_on_a_manager(warpolicy_pm):
    warpolicy_pm.register(warpolicy_example.plugin, name="example")
    hooks = sorted(c.name for c in warpolicy_pm.get_hookcallers(warpolicy_example.plugin) or [])
    assert hooks == [
        "warpolicy_capabilities",
        "warpolicy_on_barrier",
        "warpolicy_on_demotion",
        "warpolicy_on_fallback",
        "warpolicy_on_publish",
    ]


# -- the fragment ----------------------------------------------------------------------------------


def test_the_fragment_adds_its_backend_to_the_default_registry(warpolicy_pm, warpolicy_register):
    warpolicy_register(CoarseSteps(), "example")
    engine = PolicyEngine.load(
        fragments=collect_fragments(warpolicy_pm),
        blame=functools.partial(blame_plugins, warpolicy_pm),
    )
    policy = engine.compile("example_attn", spec="none", strict=True)
    assert policy.lookup(ForwardMode.DECODE) is WarReadDonePolicy.IN_GRAPH  # from base
    # extend: its own post_replay, once prefill read-done is opted into (a default gate)
    assert policy.lookup(ForwardMode.EXTEND) is WarReadDonePolicy.NONE
    opted_in = engine.compile("example_attn", flags={"prefill_read_done": True}, strict=True)
    assert opted_in.lookup(ForwardMode.EXTEND) is WarReadDonePolicy.POST_REPLAY


def test_without_the_plugin_the_backend_is_unknown(warpolicy_pm):
    engine = PolicyEngine.load(fragments=collect_fragments(warpolicy_pm))
    with pytest.raises(Exception, match="example_attn"):
        engine.compile("example_attn", strict=True)


# -- the observer on the simulated platform ------------------------------------------------------


def test_steps_released_in_the_graph_are_counted(warpolicy_sim):
    observer = CoarseSteps()
    warpolicy_sim.pm.register(observer)
    loop = run(warpolicy_sim, WarReadDonePolicy.IN_GRAPH, 4)
    assert loop.last_barrier == "event"
    assert observer.released == {"decode": 4} and observer.coarse == {}
    assert observer.coarse_share("decode") == 0.0


def test_a_runner_that_publishes_nothing_is_coarse_and_logged_once(warpolicy_sim, caplog):
    observer = CoarseSteps()
    warpolicy_sim.pm.register(observer)
    with caplog.at_level(logging.WARNING, logger="warpolicy.example"):
        run(warpolicy_sim, WarReadDonePolicy.NONE, 3, name="prefill")
    assert observer.coarse == {"prefill": 3} and observer.coarse_share("prefill") == 1.0
    assert [r.getMessage() for r in caplog.records] == [
        "warpolicy-example: runner 'prefill' went coarse (the scheduler waited for the whole "
        "forward)"
    ]


def test_a_failing_wait_is_a_fallback_and_a_coarse_step(warpolicy_sim):
    """Fault injection: the scheduler's wait on the read-done event raises. The runtime falls
    back to the coarse barrier (never an earlier release) and tells the observers."""
    observer = CoarseSteps()
    warpolicy_sim.pm.register(observer)
    loop = run(warpolicy_sim, WarReadDonePolicy.IN_GRAPH, 1)
    fault = sim_impl(warpolicy_sim.platform).inject("wait_event")
    with pytest.warns(RuntimeWarning, match="injected raise in wait_event"):
        loop.step([1.0], write_next=None)
    assert fault.fired >= 1
    assert loop.last_barrier == "coarse"
    assert observer.coarse == {"decode": 1}
    assert "barrier 'scheduler':wait_event" in observer.fallbacks


def test_an_observer_that_raises_never_changes_the_step(warpolicy_sim):
    observer = CoarseSteps()
    observer.released = None  # every barrier now raises TypeError in the observer
    warpolicy_sim.pm.register(observer, name="broken")
    with pytest.warns(RuntimeWarning, match="'broken' raised in warpolicy_on_barrier"):
        loop = run(warpolicy_sim, WarReadDonePolicy.IN_GRAPH, 2)
    assert loop.last_barrier == "event"  # the release did not move


# -- the installed distribution --------------------------------------------------------------------


def test_the_installed_entry_point_registers_the_plugin():
    """Needs the distribution installed (``pip install .``): the entry point is in its
    metadata, not in the source tree."""
    pm = new_plugin_manager(environ={})
    row = next((r for r in describe_plugins(pm) if r["name"] == "example"), None)
    assert row is not None, "warpolicy-example is not installed: pip install . first"
    assert row["source"] == "distribution:warpolicy-example"
    assert row["status"] == "active"
    assert "warpolicy_capabilities" in row["hooks"] and "warpolicy_on_barrier" in row["hooks"]


def test_the_plugin_can_be_disabled_by_name():
    pm = new_plugin_manager(environ={"WARPOLICY_DISABLE_PLUGINS": "example"})
    assert pm.get_plugin("example") is None
    assert collect_fragments(pm) == []
