"""The pre-commit hooks on a sample git repository: the entry points run as pre-commit runs
them (file arguments, in the repository root), the manifest checked by pre-commit itself, and
``pre-commit try-repo`` against this repository where pre-commit and a package index exist."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

from warpolicy.cli import precommit

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = ROOT / ".pre-commit-hooks.yaml"

REGISTRY = textwrap.dedent("""\
    version: 1
    flags:
      prefill_read_done:
        default: false
        env: [SAMPLE_PREFILL_READ_DONE]
        doc: Opt in to publishing read-done from extend forwards.
    backends:
      mine:
        reads_end: {decode: post_replay, extend: post_replay}
        doc: Our backend.
    gates:
      - id: prefill-opt-in
        when: {mode: extend, flags: {prefill_read_done: false}}
        at_least: none
        because: Publishing read-done from prefill is opt-in.
    """)


def git(repo: pathlib.Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository whose ``origin/main`` has ``capabilities.yaml`` = REGISTRY; the test
    runs in its root, as pre-commit does."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "capabilities.yaml").write_text(REGISTRY)
    git(root, "add", ".")
    git(root, "commit", "-qm", "registry")
    git(root, "update-ref", "refs/remotes/origin/main", "HEAD")  # as after a fetch
    monkeypatch.chdir(root)
    return root


def hook(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a hook's entry in a subprocess, in the current directory, as pre-commit does."""
    entry = next(h["entry"] for h in yaml.safe_load(MANIFEST.read_text()) if h["id"] == name)
    argv = entry.split()
    assert argv[0] == "python"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, *argv[1:], *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def edit(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


# -- the manifest ----------------------------------------------------------------------------------


def test_manifest_offers_both_hooks_on_registry_files():
    hooks = {h["id"]: h for h in yaml.safe_load(MANIFEST.read_text())}
    assert set(hooks) == {"warpolicy-validate", "warpolicy-diff"}
    import re

    for h in hooks.values():
        assert h["language"] == "python"
        pattern = re.compile(h["files"])
        assert pattern.search("capabilities.yaml") and pattern.search(
            "deploy/capabilities-prod.yml"
        )
        assert not pattern.search("config.yaml") and not pattern.search("capabilities/other.yaml")


def test_pre_commit_accepts_the_manifest():
    exe = shutil.which("pre-commit")
    if exe is None:
        pytest.skip("pre-commit is not installed")
    done = subprocess.run(
        [exe, "validate-manifest", str(MANIFEST)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- validate --------------------------------------------------------------------------------------


def test_validate_passes_a_valid_file(repo):
    done = hook("warpolicy-validate", "capabilities.yaml")
    assert done.returncode == 0 and done.stderr == ""


def test_validate_reports_every_problem_with_its_place(repo):
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: later_please")
    edit(repo / "capabilities.yaml", "doc: Our backend.", "doc: Our backend.\n    colour: blue")
    done = hook("warpolicy-validate", "capabilities.yaml")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("capabilities.yaml:") for line in lines)
    assert "later_please" in done.stderr and "colour" in done.stderr
    assert "Traceback" not in done.stderr


def test_validate_checks_each_file_on_its_own(repo):
    """Two complete registries in one batch (both define ``mine``): each is valid alone."""
    (repo / "capabilities-staging.yaml").write_text(REGISTRY)
    assert (
        hook("warpolicy-validate", "capabilities.yaml", "capabilities-staging.yaml").returncode == 0
    )


def test_validate_layers_each_file_over_base(repo):
    layer = repo / "capabilities-local.yaml"
    layer.write_text(
        "version: 1\nbackends:\n  ours:\n    inherits: base\n    doc: Ours, over the default.\n"
    )
    alone = hook("warpolicy-validate", "capabilities-local.yaml")
    assert alone.returncode == 1 and "base" in alone.stderr
    assert (
        hook("warpolicy-validate", "--base", "default", "capabilities-local.yaml").returncode == 0
    )


# -- diff ------------------------------------------------------------------------------------------


def test_diff_unchanged_and_later_pass(repo):
    assert hook("warpolicy-diff", "capabilities.yaml").returncode == 0
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: none")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 0, done.stderr


def test_diff_fails_on_an_earlier_cell(repo):
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: in_graph")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 1
    assert (
        "capabilities.yaml: backend mine, mode decode, spec none: post_replay -> in_graph (earlier)"
        in done.stderr.splitlines()
    )
    assert "1 cell(s) release earlier than at origin/main" in done.stderr


def test_diff_finds_an_earlier_cell_behind_an_opt_in_flag(repo):
    """extend is `none` under the flag's default; the change shows only with the flag on."""
    edit(repo / "capabilities.yaml", "extend: post_replay", "extend: pre_replay")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 1
    assert (
        "capabilities.yaml: backend mine, mode extend, spec none when prefill_read_done=true: "
        "post_replay -> pre_replay (earlier)"
    ) in done.stderr


def test_diff_compares_with_a_configurable_ref(repo):
    git(repo, "checkout", "-qb", "feature")
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: pre_replay")
    git(repo, "commit", "-qam", "earlier")
    assert hook("warpolicy-diff", "--ref", "feature", "capabilities.yaml").returncode == 0
    assert hook("warpolicy-diff", "--ref", "main", "capabilities.yaml").returncode == 1


def test_diff_new_file_has_nothing_to_compare(repo):
    (repo / "capabilities-new.yaml").write_text(REGISTRY)
    done = hook("warpolicy-diff", "capabilities-new.yaml")
    assert done.returncode == 0 and "new file" in done.stdout


def test_diff_in_a_subdirectory_reads_the_right_old_file(repo):
    sub = repo / "deploy"
    sub.mkdir()
    (sub / "capabilities.yaml").write_text(REGISTRY.replace("decode: post_replay", "decode: none"))
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "deploy")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    edit(sub / "capabilities.yaml", "decode: none", "decode: post_replay")
    done = hook("warpolicy-diff", "deploy/capabilities.yaml")
    assert done.returncode == 1 and "none -> post_replay (earlier)" in done.stderr


def test_diff_unknown_ref_fails_closed_in_one_line(repo):
    done = hook("warpolicy-diff", "--ref", "origin/trunk", "capabilities.yaml")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "unknown git ref 'origin/trunk'" in line and line.endswith("failing closed")


def test_diff_without_git_fails_closed_in_one_line(repo, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(repo / "no-such-dir"))
    assert precommit.main(["diff", "capabilities.yaml"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "warpolicy-diff: capabilities.yaml: cannot read the version at origin/main: "
        "git is not available; failing closed"
    )


def test_diff_outside_a_repository_fails_closed(tmp_path, monkeypatch, capsys):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    (tmp_path / "capabilities.yaml").write_text(REGISTRY)
    assert precommit.main(["diff", "capabilities.yaml"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_diff_with_an_invalid_new_file_fails_with_its_problems(repo):
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: soon")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 1
    assert done.stderr.splitlines()[0].startswith("capabilities.yaml:")
    assert done.stderr.splitlines()[-1].endswith("(invalid registry); failing closed")


# -- pre-commit itself -----------------------------------------------------------------------------


def test_pre_commit_try_repo_runs_both_hooks(repo, tmp_path):
    """pre-commit installs this repository's HEAD into a hook environment and runs the hooks on
    the sample repository. Needs pre-commit, this checkout's git metadata and a package index
    (pip's own configuration; skipped when none answers)."""
    exe = shutil.which("pre-commit")
    if exe is None:
        pytest.skip("pre-commit is not installed")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))
    env.pop("PYTHONPATH", None)  # the hook must work from its own installed environment
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: in_graph")
    git(repo, "add", ".")

    def try_repo(hook_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [exe, "try-repo", str(ROOT), hook_id, "--files", "capabilities.yaml"],
            cwd=repo,
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )

    done = try_repo("warpolicy-validate")
    if done.returncode != 0 and (
        "No matching distribution" in done.stdout + done.stderr
        or "Could not find a version" in done.stdout + done.stderr
    ):
        pytest.skip("no package index to install the hook environment from")
    assert done.returncode == 0, done.stdout[-2000:]
    assert "warpolicy validate" in done.stdout and "Passed" in done.stdout
    done = try_repo("warpolicy-diff")
    assert done.returncode == 1, done.stdout[-2000:]
    assert "backend mine, mode decode, spec none: post_replay -> in_graph (earlier)" in done.stdout
