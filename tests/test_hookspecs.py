"""The hook specifications: naming, documentation, first-result semantics, and every platform
hook exercised through a plugin manager on the fake device."""

from __future__ import annotations

import inspect

import pytest

from warpolicy import hookspecs
from warpolicy.hookspecs import hookimpl
from warpolicy.plugins import new_plugin_manager

SPECS = {name: fn for name, fn in vars(hookspecs).items()
         if callable(fn) and hasattr(fn, "warpolicy_spec")}
OBSERVERS = {"warpolicy_on_decision", "warpolicy_on_publish", "warpolicy_on_barrier",
             "warpolicy_on_fallback"}
FRAGMENTS = {"warpolicy_capabilities"}
PLATFORM = set(SPECS) - OBSERVERS - FRAGMENTS


@pytest.fixture
def pm():
    return new_plugin_manager(load_entry_points=False, environ={})


def test_the_required_hooks_exist():
    required = {"warpolicy_capabilities", "warpolicy_create_event", "warpolicy_record_event",
                "warpolicy_wait_event", "warpolicy_wait_stream"} | OBSERVERS
    assert required <= set(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_hook_is_prefixed_typed_and_documented(name):
    fn = SPECS[name]
    assert name.startswith("warpolicy_")
    doc = inspect.getdoc(fn) or ""
    assert len(doc.split()) >= 8, f"{name} needs a docstring saying when it fires"
    sig = inspect.signature(fn)
    assert "return" in fn.__annotations__
    assert all(p.name in fn.__annotations__ for p in sig.parameters.values())


@pytest.mark.parametrize("name", sorted(PLATFORM))
def test_platform_hooks_are_firstresult_and_take_device(name):
    fn = SPECS[name]
    assert fn.warpolicy_spec.get("firstresult") is True
    assert next(iter(inspect.signature(fn).parameters)) == "device"


@pytest.mark.parametrize("name", sorted(OBSERVERS | FRAGMENTS))
def test_collecting_hooks_are_not_firstresult(name):
    assert not SPECS[name].warpolicy_spec.get("firstresult")


def test_every_platform_hook_is_answered_for_the_fake_device(pm):
    h = pm.hook
    ev = h.warpolicy_create_event(device="fake", external=True)
    s = h.warpolicy_new_stream(device="fake")
    g = h.warpolicy_new_graph(device="fake", keep_graph=False)
    answers = {
        "warpolicy_platform_name": h.warpolicy_platform_name(device="fake"),
        "warpolicy_external_events_supported": h.warpolicy_external_events_supported(device="fake"),
        "warpolicy_platform_log": h.warpolicy_platform_log(device="fake"),
        "warpolicy_create_event": ev,
        "warpolicy_new_stream": s,
        "warpolicy_new_graph": g,
        "warpolicy_current_stream": h.warpolicy_current_stream(device="fake"),
        "warpolicy_is_capturing": h.warpolicy_is_capturing(device="fake"),
        "warpolicy_use_stream": h.warpolicy_use_stream(device="fake", stream=s),
        "warpolicy_graph_pool": h.warpolicy_graph_pool(device="fake"),
        "warpolicy_record_event": h.warpolicy_record_event(device="fake", event=ev, stream=None),
        "warpolicy_wait_event": h.warpolicy_wait_event(device="fake", stream=s, event=ev),
        "warpolicy_wait_stream": h.warpolicy_wait_stream(device="fake", stream=s, other=s),
        "warpolicy_capture": h.warpolicy_capture(device="fake", graph=g, stream=None, pool=None),
        "warpolicy_capture_callable": h.warpolicy_capture_callable(
            device="fake", graph=h.warpolicy_new_graph(device="fake", keep_graph=False),
            fn=lambda: None, stream=None, pool=None),
        "warpolicy_synchronize": h.warpolicy_synchronize(device="fake"),
    }
    with answers["warpolicy_capture"]:
        pass
    answers["warpolicy_replay"] = h.warpolicy_replay(device="fake", graph=g)
    assert set(answers) == PLATFORM
    assert answers["warpolicy_platform_name"] == "fake"
    assert answers["warpolicy_is_capturing"] is False
    assert all(v is not None for v in answers.values())


def test_unknown_device_gets_no_answer(pm):
    assert pm.hook.warpolicy_platform_name(device="tpu") is None
    assert pm.hook.warpolicy_create_event(device="tpu", external=False) is None


def test_first_plugin_handling_the_device_wins_and_none_falls_through(pm):
    class Declines:
        @hookimpl
        def warpolicy_platform_name(self, device):
            return None

    class Claims:
        @hookimpl
        def warpolicy_platform_name(self, device):
            return "mine" if str(device) == "fake" else None

    declines, claims = Declines(), Claims()
    pm.register(declines)
    try:
        assert pm.hook.warpolicy_platform_name(device="fake") == "fake"  # fell through
        pm.register(claims)
        try:
            assert pm.hook.warpolicy_platform_name(device="fake") == "mine"  # beats trylast built-in
            assert pm.hook.warpolicy_platform_name(device="cpu") == "fake"
        finally:
            pm.unregister(claims)
    finally:
        pm.unregister(declines)


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
