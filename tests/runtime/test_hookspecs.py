"""The hook specifications: naming, documentation and types, the one platform hook, and the
observer hooks reaching every plugin."""

from __future__ import annotations

import inspect

import pytest

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime import hookspecs
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.observers import Reporter

SPECS = {
    name: fn
    for name, fn in vars(hookspecs).items()
    if callable(fn) and hasattr(fn, "warpolicy_spec")
}
OBSERVERS = {
    "warpolicy_on_decision",
    "warpolicy_on_publish",
    "warpolicy_on_barrier",
    "warpolicy_on_fallback",
    "warpolicy_on_demotion",
    "warpolicy_on_violation",
    "warpolicy_on_release_lead",
}
FRAGMENTS = {"warpolicy_capabilities"}
ACTIONS = {"warpolicy_batch_action"}


@pytest.fixture
def pm():
    return new_plugin_manager(load_entry_points=False, environ={})


def test_the_hooks_are_exactly_fragments_platform_observers_and_the_action_hook():
    assert set(SPECS) == FRAGMENTS | OBSERVERS | ACTIONS | {"warpolicy_platform"}
    assert set(hookspecs.OBSERVER_HOOKS) == OBSERVERS
    assert set(hookspecs.ACTION_HOOKS) == ACTIONS
    assert dict(hookspecs.DIRECT_HOOKS) == {**hookspecs.OBSERVER_HOOKS, **hookspecs.ACTION_HOOKS}
    assert not set(hookspecs.REMOVED_PLATFORM_HOOKS) & set(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_hook_is_prefixed_typed_and_documented(name):
    fn = SPECS[name]
    assert name.startswith("warpolicy_")
    doc = inspect.getdoc(fn) or ""
    assert len(doc.split()) >= 8, f"{name} needs a docstring saying when it fires"
    assert "fires" in doc.lower()
    sig = inspect.signature(fn)
    assert "return" in fn.__annotations__
    assert all(p.name in fn.__annotations__ for p in sig.parameters.values())
    assert all("Any" not in str(fn.__annotations__[p]) for p in sig.parameters), "typed, not Any"
    assert all(f":param {p}:" in doc for p in sig.parameters)


def test_the_action_hook_says_how_results_combine():
    doc = inspect.getdoc(SPECS["warpolicy_batch_action"]) or ""
    for words in ("exactly ``True``", "independently of call order", "BaseException"):
        assert words in doc


@pytest.mark.parametrize("name", sorted(SPECS))
def test_no_hook_is_firstresult(name):
    assert not SPECS[name].warpolicy_spec.get("firstresult")


def test_every_builtin_answers_the_platform_hook_for_its_devices_only(pm):
    answers = pm.hook.warpolicy_platform(device="sim")
    assert [type(a).__name__ for a in answers] == ["SimPlatform"]
    assert pm.hook.warpolicy_platform(device="tpu") == []
    assert pm.hook.warpolicy_platform(device="cpu") == []


def test_observer_hooks_reach_every_plugin(pm):
    calls = []

    class A:
        @hookimpl
        def warpolicy_on_decision(self, decision, where):
            calls.append(("A", decision, where))

    class B:
        @hookimpl
        def warpolicy_on_decision(self, where):  # a subset of the arguments is fine
            calls.append(("B", where))

    a, b = A(), B()
    pm.register(a)
    pm.register(b)
    try:
        assert pm.hook.warpolicy_on_decision(decision="d", where="engine") == []
    finally:
        pm.unregister(a)
        pm.unregister(b)
    assert sorted(calls) == [("A", "d", "engine"), ("B", "engine")]


def test_the_reporter_tells_violation_and_release_lead_observers(pm):
    seen: list[tuple] = []

    class Watch:
        @hookimpl
        def warpolicy_on_violation(self, runner, mode, bucket, step, detail):
            seen.append(("violation", runner, mode, bucket, step, detail))

        @hookimpl
        def warpolicy_on_release_lead(self, runner, bucket, lead_us):
            seen.append(("lead", runner, bucket, lead_us))

    pm.register(Watch(), name="watch")
    reporter = Reporter(pm.observers, "runner 'decode'")
    reporter.violation("decode", "fa3", ForwardMode.DECODE, "none", 8, 3, "out[0]: 1 != 2")
    reporter.release_lead("decode", ForwardMode.DECODE, 8, 3, 12.5)
    assert seen == [
        ("violation", "decode", ForwardMode.DECODE, 8, 3, "out[0]: 1 != 2"),
        ("lead", "decode", 8, 12.5),
    ]
    assert reporter.counts["violation:8"] == 1
