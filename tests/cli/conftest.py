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
