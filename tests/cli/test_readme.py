"""README says what the code does: exit codes, table modes, the plugin section, and the
pre-commit configurations it shows (issue 22 items 8, 16, 17)."""

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

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MANIFEST = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def section(heading: str) -> str:
    start = README.index(heading + "\n") + len(heading) + 1
    nxt = re.search(r"^#{1,3} ", README[start:], re.M)
    return README[start : start + nxt.start()] if nxt else README[start:]


def yaml_blocks(text: str) -> list[dict]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def test_the_exit_code_table_lists_every_exit_code():
    codes = {int(c) for c in re.findall(r"^\| `(\d+)` \|", section("### Exit codes"), re.M)}
    assert codes == {int(c) for c in ExitCode}


def test_table_default_modes_are_what_table_prints():
    modes = ", ".join(m.label for m in TABLE_MODES[:-1]) + f" and {TABLE_MODES[-1].label}"
    assert f"every backend and spec over {modes})" in README


def test_writing_a_plugin_is_not_an_empty_heading():
    text = section("### Writing a plugin")
    assert "[project.entry-points.warpolicy]" in text and "warpolicy_platform" in text


def precommit_blocks() -> tuple[dict, dict]:
    blocks = yaml_blocks(section("### Registry checks in your CI (pre-commit)"))
    local = next(b for b in blocks if b["repos"][0]["repo"] == "local")
    remote = next(b for b in blocks if b["repos"][0]["repo"] != "local")
    return local, remote


def test_the_remote_snippet_pins_the_tag_the_release_creates():
    """0.2's README pinned rev v0.2.0, a tag that did not exist. The release process tags every
    release v<version> (docs/releasing.md), and the snippet names the current version's tag."""
    _local, remote = precommit_blocks()
    assert remote["repos"][0]["rev"] == f"v{warpolicy.__version__}"
    assert "git tag -a vX.Y.Z" in (ROOT / "docs" / "releasing.md").read_text(encoding="utf-8")
    assert {h["id"] for h in remote["repos"][0]["hooks"]} == set(MANIFEST)


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
