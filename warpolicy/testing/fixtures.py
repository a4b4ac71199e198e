"""pytest fixtures for testing warpolicy plugins and backends.

Use them from a ``conftest.py``::

    pytest_plugins = ["warpolicy.testing.fixtures"]

* ``warpolicy_pm``: a fresh plugin manager (built-ins only, no entry points, empty environment);
* ``warpolicy_sim``: a `warpolicy.runtime.manager.Runtime` on the fault-injectable simulated
  platform (`warpolicy.testing.sim_runtime`): register your observer plugin on
  ``warpolicy_sim.pm`` and build runners with ``warpolicy_sim.platform`` and
  ``observers=warpolicy_sim.observers``;
* ``warpolicy_register``: registers inline plugins on ``warpolicy_pm`` and unregisters them
  after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from warpolicy.runtime.manager import Runtime, WarpolicyPluginManager, new_plugin_manager
from warpolicy.testing.sim import sim_runtime


@pytest.fixture
def warpolicy_pm() -> WarpolicyPluginManager:
    """A fresh plugin manager (built-ins only, no entry points, an empty environment)."""
    return new_plugin_manager(load_entry_points=False, environ={})


@pytest.fixture
def warpolicy_sim() -> Runtime:
    """A runtime on the fault-injectable simulated platform, with its own plugin manager."""
    return sim_runtime()


@pytest.fixture
def warpolicy_register(
    warpolicy_pm: WarpolicyPluginManager,
) -> Iterator[Callable[[Any, str | None], Any]]:
    """Register inline plugins on ``warpolicy_pm``; every one is unregistered afterwards."""
    added: list[Any] = []

    def add(plugin: Any, name: str | None = None) -> Any:
        warpolicy_pm.register(plugin, name=name)
        added.append(plugin)
        return plugin

    yield add
    for plugin in added:
        warpolicy_pm.unregister(plugin)
