"""docs/plugins.md stays true to the code: every hook documented with its real arguments, the
example plugin it walks through is the one in the tree, and docs/runtime.md points at it."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

from warpolicy.runtime import hookspecs
from warpolicy.runtime.manager import new_plugin_manager

REPO = pathlib.Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "plugins.md"
EXAMPLE = REPO / "plugins" / "warpolicy-example"


@pytest.fixture(scope="module")
def guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def test_every_observer_hook_is_documented_with_its_arguments(guide):
    for name, args in hookspecs.OBSERVER_HOOKS.items():
        row = f"| `{name}` | `({', '.join(args)})` |"
        assert row in guide, f"docs/plugins.md lacks the row {row!r}"


def test_every_hook_the_manager_knows_is_documented(guide):
    pm = new_plugin_manager(load_entry_points=False, environ={})
    names = {name for name in dir(pm.hook) if name.startswith("warpolicy_")}
    assert names  # the manager has the specs
    assert {name for name in names if f"`{name}" not in guide} == set()


def test_the_documented_observer_arguments_are_the_hookspecs():
    for name, args in hookspecs.OBSERVER_HOOKS.items():
        spec = inspect.signature(getattr(hookspecs, name))
        assert tuple(spec.parameters) == args, name


def test_the_example_plugin_is_the_one_the_guide_walks_through(guide):
    pyproject = (EXAMPLE / "pyproject.toml").read_text(encoding="utf-8")
    entry = re.search(r"\[project\.entry-points\.warpolicy\]\n(.+)\n", pyproject)
    assert entry is not None and entry.group(1) in guide
    capabilities = (EXAMPLE / "warpolicy_example" / "capabilities.yaml").read_text()
    body = capabilities[capabilities.index("version: 1") :]
    assert body in guide, "the guide quotes warpolicy_example/capabilities.yaml as it is"
    for path in re.findall(r"^  ((?:warpolicy_example|tests)/\S+)", guide, re.M):
        assert (EXAMPLE / path).is_file(), path


def test_the_example_observer_code_quoted_in_the_guide_is_the_code(guide):
    source = (EXAMPLE / "warpolicy_example" / "__init__.py").read_text(encoding="utf-8")
    block = guide[guide.index("class CoarseSteps:\n    @hookimpl\n    def warpolicy_on_publish") :]
    block = block[: block.index("        ...\n")]
    for line in block.splitlines()[1:]:
        assert line in source.splitlines(), f"not in warpolicy_example: {line!r}"


def test_the_runtime_guide_points_writing_a_plugin_at_the_guide():
    runtime = (REPO / "docs" / "runtime.md").read_text(encoding="utf-8")
    section = runtime[runtime.index("## Writing a plugin") :]
    section = section[: section.index("\n#", 1)]
    assert "docs/plugins.md" in section and "plugins/warpolicy-example" in section
