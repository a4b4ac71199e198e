"""What every CLI test starts from: no ``WARPOLICY_*`` or ``SGLANG_*`` variable of the
environment running the suite (registry paths, flags, the kill switch) reaches the CLI."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("WARPOLICY_", "SGLANG_")):
            monkeypatch.delenv(name)


@pytest.fixture
def broken_plugin(monkeypatch):
    """The CLI's plugin manager holds one plugin, ``raises``, whose capabilities hook raises
    ``RuntimeError("no fragment today")``."""
    from warpolicy import hookimpl
    from warpolicy.runtime import manager

    class Raises:
        @hookimpl
        def warpolicy_capabilities(self):
            raise RuntimeError("no fragment today")

    pm = manager.new_plugin_manager(load_entry_points=False, environ={})
    pm.register(Raises(), name="raises")
    monkeypatch.setattr(manager, "get_plugin_manager", lambda: pm)
    return pm
