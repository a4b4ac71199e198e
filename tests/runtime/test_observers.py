"""Observer calls: each implementation receives exactly what the installed pluggy passes it
(its own parameter order, parameters with defaults included or not as that pluggy does), and
monitoring routes calls through pluggy."""

from __future__ import annotations

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
