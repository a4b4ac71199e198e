"""Fixtures shared across test modules: the ones the package ships for testing plugins and
backends (`warpolicy.testing.fixtures`: ``warpolicy_pm``, a fresh plugin manager per test;
``warpolicy_register``, inline plugins that are always unregistered; ``warpolicy_sim``), both
YAML composers of the loader, one torch thread; and the suite's hypothesis profile."""

from __future__ import annotations

import pytest
from hypothesis import settings

from warpolicy.registry.loader import reading

pytest_plugins = ["warpolicy.testing.fixtures"]

# No property test has a wall-clock deadline: a deadline is a timed assert, and a loaded CI
# machine would fail it for nothing. A failure prints the blob that reproduces it.
settings.register_profile("warpolicy", deadline=None, print_blob=True)
settings.load_profile("warpolicy")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """The CPU tests run many tiny torch ops. With torch's default intra-op thread pool each op
    hands work to workers that spin-wait; on a machine with more runnable threads than cores,
    each op then waits for a descheduled worker (a 0.1 s tiny-engine run took 27 s). One
    thread is all these sizes need, and it keeps the suite's time independent of the load."""
    try:
        import torch
    except ImportError:  # the registry and engine tests run without torch
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["libyaml", "python"])
def composer(request, monkeypatch):
    """Run a test with both YAML composers: they must report the same problems."""
    if request.param == "python":
        monkeypatch.setattr(reading, "C_LOADER", None)
    elif reading.C_LOADER is None:
        pytest.skip("PyYAML built without libyaml")
    return request.param
