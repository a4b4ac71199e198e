"""Fixtures shared across test modules: the ones the package ships for testing plugins and
backends (`warpolicy.testing.fixtures`: ``warpolicy_pm``, a fresh plugin manager per test;
``warpolicy_register``, inline plugins that are always unregistered; ``warpolicy_sim``), both
YAML composers of the loader, one torch thread; and the suite's hypothesis profile."""

from __future__ import annotations

import importlib.util

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


# -- without torch (nox's tests-3.x sessions, `pip install ".[test]"` alone) -------------------

HAS_TORCH = importlib.util.find_spec("torch") is not None
NEEDS_TORCH = "needs torch, which is not installed (install a torch wheel first; README)"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Without torch, a test module that cannot import it is skipped with that reason, not a
    collection error; with torch installed, an import error stays an error."""
    outcome = yield
    report = outcome.get_result()
    if (
        not HAS_TORCH
        and report.failed
        and isinstance(collector, pytest.Module)
        and "No module named 'torch'" in str(report.longrepr)
    ):
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: {NEEDS_TORCH}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Without torch, a test that fails by importing it (a deferred import in the code under
    test) is skipped with that reason; any other failure stays a failure."""
    outcome = yield
    report = outcome.get_result()
    error = call.excinfo.value if call.excinfo is not None else None
    if (
        not HAS_TORCH
        and report.failed
        and isinstance(error, ModuleNotFoundError)
        and (error.name or "").split(".")[0] == "torch"
    ):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {NEEDS_TORCH}")
