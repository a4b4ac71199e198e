"""Packaging (issue 22 items 6-8): what the source distribution carries, the license and the
metadata. CI (`.ci/run`) builds the sdist, installs it in a fresh venv and runs the tests from
the unpacked tree; these checks keep the configuration honest between those runs."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
SDIST = PYPROJECT["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]


def in_sdist(path: str) -> bool:
    return any(path == item or path.startswith(item.rstrip("/") + "/") for item in SDIST)


@pytest.mark.parametrize(
    "path",
    [
        "examples/tiny_engine.py",  # tests/bench and README's example engine
        ".pre-commit-hooks.yaml",  # the hook tests
        "capabilities.yaml",
        "hatch_build.py",  # the wheel built from the sdist needs its build hook
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "plugins/warpolicy-metrics/pyproject.toml",
        "scripts/derived-demo",
        "tests/conftest.py",
    ],
)
def test_the_sdist_carries_what_tests_and_readme_need(path):
    assert (ROOT / path).exists(), path
    assert in_sdist(path), f"{path} is not in [tool.hatch.build.targets.sdist] include"


def test_every_document_the_readme_links_is_in_the_sdist():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\((docs/[\w.-]+\.md)\)", readme))
    linked |= set(re.findall(r"`(docs/[\w.-]+\.md)`", readme))
    assert linked, "README links no docs/ page?"
    for path in sorted(linked):
        assert (ROOT / path).is_file(), path
        assert in_sdist(path), path


def test_apache_license_file_and_expression():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]


def test_classifiers_say_python_versions_and_typed():
    classifiers = set(PROJECT["classifiers"])
    assert "Typing :: Typed" in classifiers
    assert (ROOT / "warpolicy" / "py.typed").is_file()
    floor = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"])
    assert floor
    versions = {
        int(m.group(1))
        for c in classifiers
        if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c))
    }
    assert versions and min(versions) == int(floor.group(1))
    assert not any(c.startswith("License ::") for c in classifiers)  # the expression says it


def test_project_urls_and_the_schema_id_name_one_repository_and_its_files():
    """Every URL is the canonical repository or a file of it; no placeholder is left."""
    from warpolicy.registry.schema import REPOSITORY, SCHEMA_PATH, registry_json_schema

    urls = PROJECT["urls"]
    assert {"Homepage", "Repository", "Documentation", "Changelog"} <= set(urls)
    assert urls["Homepage"] == urls["Repository"] == REPOSITORY
    for label, url in urls.items():
        assert url == REPOSITORY or url.startswith(REPOSITORY + "/"), (label, url)
        path = url.split("/blob/main/", 1)[1] if "/blob/main/" in url else None
        if path is not None:
            assert (ROOT / path).exists(), (label, path)
    owner, name = REPOSITORY.removeprefix("https://github.com/").split("/")
    schema_id = registry_json_schema()["$id"]
    assert schema_id == f"https://raw.githubusercontent.com/{owner}/{name}/main/{SCHEMA_PATH}"
    assert (ROOT / SCHEMA_PATH).is_file()
    assert json.loads((ROOT / SCHEMA_PATH).read_text())["$id"] == schema_id


def test_no_placeholder_names_the_projects_home():
    """``OWNER``, ``<owner>`` or a made-up domain would reach users as a broken link."""
    texts = [
        ROOT / "pyproject.toml",
        ROOT / "warpolicy" / "capabilities.schema.json",
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    texts += [ROOT / "README.md", *sorted((ROOT / "plugins").glob("*/README.md"))]
    stale = re.compile(r"github\.com/(OWNER|<owner>)/|warpolicy\.dev\b")
    found = {str(p.relative_to(ROOT)) for p in texts if stale.search(p.read_text(encoding="utf-8"))}
    assert found == set()


def test_the_test_extra_carries_pre_commit():
    """Its hook tests skipped in CI without it (issue 22 item 18)."""
    assert any(re.match(r"pre-commit\b", r) for r in PROJECT["optional-dependencies"]["test"])
