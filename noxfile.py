"""The test matrix CI runs (`.ci/run` calls ``nox``): every Python the classifiers claim, and the
oldest and newest pluggy that ``pyproject.toml`` allows.

Sessions (``nox -l`` lists them; docs/development.md says what each covers):

* ``tests-3.10``, ``tests-3.11``, ``tests-3.12``, ``tests-3.13``: the package with its test
  extra and **no torch**, the whole suite. The registry, the engine, the CLI, the loader's
  hostile-input tests and the docs' torch-free blocks run; every test that needs torch skips,
  saying so (a module that cannot import torch is a skipped module, never a collection error).
* ``torch`` (3.11): the same with torch (``TORCH``) installed first: the whole suite, the runtime
  included. CI has a CPU wheel for one interpreter only; elsewhere point pip at PyTorch's CPU
  index first (``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu``) or pip resolves
  ``torch`` to a multi-GB CUDA build.
* ``pluggy(oldest)``, ``pluggy(newest)`` (3.11, with torch): the plugin, observer, hook and
  fault-matrix tests, and the metrics plugin's own tests, under the oldest pluggy
  ``pyproject.toml`` allows (with the newest pytest that runs on it) and the newest one;
  observers and platform claims are called exactly as the installed pluggy calls them, and
  pluggy's versions differ in how they pass arguments.

``.ci/run`` runs the suite with torch and the newest pluggy in its own venv first, so it asks
nox for the other sessions only (``nox -s tests-3.10 tests-3.12 tests-3.13 "pluggy(oldest)"``).
"""

from __future__ import annotations

import pathlib
import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
#: the interpreter the torch sessions use (CI has a CPU torch wheel for it)
TORCH_PYTHON = "3.11"
TORCH = "torch==2.13.0"
#: pluggy's oldest supported version (pyproject's floor) with the newest pytest that runs on it,
#: and its newest
PLUGGY = {
    "oldest": ["pluggy==1.3.0", "pytest==8.0.2"],
    "newest": ["pluggy==1.7.0"],
}
#: the tests that exercise pluggy itself: plugins, observers, hook specs, the fault matrix
PLUGGY_TESTS = [
    "tests/testing",
    "tests/plugins",
    "tests/runtime/test_plugins.py",
    "tests/runtime/test_hookspecs.py",
    "tests/runtime/test_observers.py",
    "tests/runtime/test_soundness_regressions.py",
]
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]


def _install(session: nox.Session, *extra: str) -> None:
    # the package as users install it (not editable), so the tests import the installed copy
    session.install(*extra, ".[test]")


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The whole suite without torch."""
    _install(session)
    session.run("python", "-c", "import importlib.util as u; assert u.find_spec('torch') is None")
    session.run("python", *PYTEST, *session.posargs)


@nox.session(name="torch", python=TORCH_PYTHON)
def with_torch(session: nox.Session) -> None:
    """The whole suite with torch."""
    session.install(TORCH)
    _install(session)
    session.run("python", *PYTEST, *session.posargs)


@nox.session(python=TORCH_PYTHON)
@nox.parametrize("pluggy", list(PLUGGY), ids=list(PLUGGY))
def pluggy(session: nox.Session, pluggy: str) -> None:
    """The pluggy-facing tests under the oldest and the newest supported pluggy."""
    session.install(TORCH)
    _install(session, *PLUGGY[pluggy])
    session.run(
        "python", "-c", "import pluggy, pytest; print(pluggy.__version__, pytest.__version__)"
    )
    session.run("python", *PYTEST, *(session.posargs or PLUGGY_TESTS))
    if session.posargs:
        return
    # the metrics plugin's own tests (they live with it), installed like any plugin; `pytest`
    # from its directory, so its source stays off sys.path and the installed copy is tested
    plugin = pathlib.Path("plugins/warpolicy-metrics")
    session.install("--no-deps", f"./{plugin}")
    shutil.rmtree(plugin / "build", ignore_errors=True)
    for metadata in plugin.glob("*.egg-info"):
        shutil.rmtree(metadata)
    with session.chdir(plugin):
        session.run("pytest", "-q", "-p", "no:cacheprovider")
