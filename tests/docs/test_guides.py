"""The guides say what the code does: exit codes and table modes (docs/cli.md), the plugin
section (docs/runtime.md), the pre-commit configurations (docs/registry-checks.md) and every
`rev:` they name resolving to a tag (issue 22 items 8, 16, 17; issue 27 item 7)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

import warpolicy
from warpolicy.cli.common import ExitCode
from warpolicy.registry.vocabulary import TABLE_MODES

from doc_blocks import documents

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MANIFEST = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def section(doc: str, heading: str) -> str:
    text = read(doc)
    start = text.index(heading + "\n") + len(heading) + 1
    nxt = re.search(r"^#{1,2} ", text[start:], re.M)
    return text[start : start + nxt.start()] if nxt else text[start:]


def yaml_blocks(text: str) -> list[dict]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def test_the_exit_code_table_lists_every_exit_code():
    codes = {
        int(c) for c in re.findall(r"^\| `(\d+)` \|", section("cli.md", "## Exit codes"), re.M)
    }
    assert codes == {int(c) for c in ExitCode}


def test_table_default_modes_are_what_table_prints():
    modes = ", ".join(m.label for m in TABLE_MODES[:-1]) + f" and {TABLE_MODES[-1].label}"
    assert f"every backend and spec over {modes})" in read("cli.md")


def test_writing_a_plugin_is_not_an_empty_heading():
    text = section("runtime.md", "## Writing a plugin")
    assert "[project.entry-points.warpolicy]" in text and "warpolicy_platform" in text


def precommit_blocks() -> tuple[dict, dict]:
    blocks = yaml_blocks(read("registry-checks.md"))
    local = next(b for b in blocks if b["repos"][0]["repo"] == "local")
    remote = next(b for b in blocks if b["repos"][0]["repo"] != "local")
    return local, remote


def test_the_remote_snippet_pins_the_tag_the_release_creates():
    """0.2's README pinned rev v0.2.0, a tag that did not exist. The release process tags every
    release v<version> (docs/releasing.md), and the snippet names the current version's tag."""
    _local, remote = precommit_blocks()
    assert remote["repos"][0]["rev"] == f"v{warpolicy.__version__}"
    assert "git tag -a vX.Y.Z" in read("releasing.md")
    assert {h["id"] for h in remote["repos"][0]["hooks"]} == set(MANIFEST)


def named_revs() -> dict[str, str]:
    """Every `rev:` a document names (in any block), with where."""
    revs = {}
    for doc in documents():
        for number, line in enumerate(doc.read_text(encoding="utf-8").split("\n"), 1):
            found = re.match(r"^\s*-?\s*rev:\s*['\"]?([^\s'\"#]+)", line)
            if found:
                revs[f"{doc.relative_to(ROOT)}:{number}"] = found[1]
    return revs


def repository_tags() -> set[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tags live in the git repository")
    inside = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        check=False,
    )
    if inside.returncode != 0 or pathlib.Path(inside.stdout.strip()).resolve() != ROOT:
        pytest.skip("not a git checkout (an unpacked source distribution): no tags to check")
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "tag", "--list"], capture_output=True, text=True, check=True
    )
    tags = set(listed.stdout.split())
    if not tags:
        pytest.skip("the checkout has no tags (a shallow clone? git fetch --tags)")
    return tags


def test_the_named_revs_are_found_in_the_docs():
    """The check below must see the snippet's rev, or it would pass by finding nothing."""
    assert f"v{warpolicy.__version__}" in named_revs().values()


def test_every_rev_the_docs_name_is_a_tag():
    """A `rev:` in a guide must resolve where users copy it from: a tag of this repository
    (docs/releasing.md tags every release before CI runs on it)."""
    tags = repository_tags()
    missing = {where: rev for where, rev in named_revs().items() if rev not in tags}
    assert not missing, f"rev(s) that are not tags of this repository: {missing}"


def test_the_local_snippet_runs_the_manifests_entries():
    local, _remote = precommit_blocks()
    hooks = {h["id"]: h for h in local["repos"][0]["hooks"]}
    assert set(hooks) == set(MANIFEST)
    for name, hook in hooks.items():
        assert hook["entry"] == MANIFEST[name]["entry"]
        assert hook["files"] == MANIFEST[name]["files"]


def git(repo: pathlib.Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def test_pre_commit_runs_the_readmes_local_hooks(tmp_path):
    """No rev to resolve: pre-commit runs the installed `warpolicy` on the sample repository."""
    exe = shutil.which("pre-commit")
    if exe is None or shutil.which("git") is None:
        pytest.skip("needs pre-commit and git")
    bindir = pathlib.Path(sys.executable).parent
    if not (bindir / "warpolicy").exists():
        pytest.skip("the warpolicy console script is not installed next to this python")
    local, _remote = precommit_blocks()
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / ".pre-commit-config.yaml").write_text(yaml.safe_dump(local))
    registry = "version: 1\nbackends:\n  mine:\n    reads_end: {decode: post_replay}\n    doc: x\n"
    (repo / "capabilities.yaml").write_text(registry)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "registry")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    env = dict(
        os.environ,
        PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        PRE_COMMIT_HOME=str(tmp_path / "home"),
    )

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, "run", "--all-files"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    (repo / "capabilities.yaml").write_text(registry.replace("post_replay", "in_graph"))
    done = run()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "warpolicy validate" in done.stdout and "Passed" in done.stdout
    assert re.search(r"mine\s+decode\s+none\s+any\s+post_replay\s+in_graph\s+earlier", done.stdout)


def test_the_index_lists_every_guide():
    """docs/README.md is where the README sends a reader: every guide is one row of it."""
    index = read("README.md")
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    guides = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert guides - linked == set(), "guides the index does not list"
    assert linked - guides == set(), "index rows naming no guide"
    assert "docs/README.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_fits_a_few_screens():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 250
