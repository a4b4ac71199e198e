"""Observer calls: each implementation receives exactly what the installed pluggy passes it
(its own parameter order, parameters with defaults included or not as that pluggy does), and
monitoring routes calls through pluggy."""

from __future__ import annotations

import inspect
import warnings

from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.runtime.hookspecs import OBSERVER_HOOKS, hookimpl
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.observers import Reporter

SPEC = OBSERVER_HOOKS["warpolicy_on_barrier"]
ARGS = {"runner": "decode", "step": 7, "kind": "event", "reason": "in_graph"}


def observer(names: list[str], defaults: int, seen: list):
    """A plugin whose ``warpolicy_on_barrier`` takes ``names`` in that order, the last
    ``defaults`` of them with a default, recording what it was given."""
    params = [
        f"{name}='default-{name}'" if i >= len(names) - defaults else name
        for i, name in enumerate(names)
    ]
    body = f"seen.append(({', '.join(names)}{',' if names else ''}))"
    scope: dict = {"seen": seen}
    exec(f"def warpolicy_on_barrier(self, {', '.join(params)}):\n    {body}\n", scope)
    plugin_class = type(
        "Observer", (), {"warpolicy_on_barrier": hookimpl(scope["warpolicy_on_barrier"])}
    )
    return plugin_class()


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(st.sampled_from(SPEC), unique=True).flatmap(st.permutations),
    defaults=st.integers(min_value=0, max_value=4),
)
def test_an_observer_gets_what_pluggy_itself_passes(names, defaults):
    defaults = min(defaults, len(names))
    through_runtime: list = []
    through_pluggy: list = []
    pm = new_plugin_manager(load_entry_points=False, environ={})
    pm.register(observer(names, defaults, through_runtime), name="runtime-side")
    Reporter(pm.observers, "test").barrier(**ARGS)
    reference = new_plugin_manager(load_entry_points=False, environ={})
    reference.register(observer(names, defaults, through_pluggy), name="pluggy-side")
    reference.hook.warpolicy_on_barrier(**ARGS)
    assert through_runtime == through_pluggy


def test_monitoring_routes_observers_through_pluggy():
    pm = new_plugin_manager(load_entry_points=False, environ={})
    seen: list = []
    pm.register(observer(list(SPEC), 0, seen), name="watch")
    monitored: list = []
    undo = pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: monitored.append(name), lambda *a: None
    )
    Reporter(pm.observers, "test").barrier(**ARGS)
    assert monitored == ["warpolicy_on_barrier"] and len(seen) == 1
    undo()
    Reporter(pm.observers, "test").barrier(**ARGS)
    assert monitored == ["warpolicy_on_barrier"] and len(seen) == 2


# -- the wiring is derived from the hookspecs: one typed Reporter method per observer hook -------


class _Recorder:
    """Implements every observer hook by name, recording the keyword arguments pluggy would
    pass (built from the hookspecs, so a new hook is covered without editing this test)."""

    def __init__(self) -> None:
        self.seen: dict[str, dict] = {}
        for hook, names in OBSERVER_HOOKS.items():
            setattr(self, hook, hookimpl(self._recording(hook, names)))

    def _recording(self, hook: str, names: tuple[str, ...]):
        scope: dict = {"seen": self.seen, "hook": hook}
        args = ", ".join(names)
        record = ", ".join(f"{name!r}: {name}" for name in names)
        exec(f"def {hook}({args}):\n    seen[hook] = {{{record}}}\n", scope)
        return scope[hook]


def test_each_observer_hook_reaches_its_plugins_through_its_typed_reporter_method():
    pm = new_plugin_manager(load_entry_points=False, environ={})
    recorder = _Recorder()
    pm.register(recorder, name="recorder")
    reporter = Reporter(pm.observers, "test")
    for hook, names in OBSERVER_HOOKS.items():
        attribute = hook.removeprefix("warpolicy_")
        assert len(getattr(pm.observers, attribute)) == 1, hook
        method = getattr(reporter, attribute.removeprefix("on_"))
        params = list(inspect.signature(method).parameters)
        assert params[: len(names)] == list(names), f"Reporter.{method.__name__} vs {hook}"
        values = [object() for _ in names]
        if hook == "warpolicy_on_fallback":
            values[1] = RuntimeError("absorbed")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            method(*values)
        got = recorder.seen[hook]
        expected = dict(zip(names, values))
        if hook == "warpolicy_on_fallback":  # the reporter names its component
            expected["where"] = f"test:{values[0]}"
        assert got == expected, hook
    assert set(recorder.seen) == set(OBSERVER_HOOKS)
    assert repr(pm.observers).count(": 1") == len(OBSERVER_HOOKS)
