"""The pre-commit hooks on a sample git repository: the entries (``warpolicy validate --each``,
``warpolicy diff --ref origin/main``) run as pre-commit runs them (file arguments, in the
repository root), the manifest checked by pre-commit itself, ``pre-commit try-repo`` against
this repository, and README's local-hook configuration run by pre-commit."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import yaml

from warpolicy.cli.main import main

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


def entry(name: str) -> list[str]:
    return next(h["entry"] for h in yaml.safe_load(MANIFEST.read_text()) if h["id"] == name).split()


def hook(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a hook's entry in a subprocess, in the current directory, as pre-commit does (the
    console script ``warpolicy`` is ``python -m warpolicy``)."""
    argv = entry(name)
    assert argv[0] == "warpolicy"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "warpolicy", *argv[1:], *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def row(text: str, backend: str, mode: str, spec: str = "none") -> list[str]:
    """The diff table's row for ``backend``, ``mode`` and ``spec``, split on its column gaps."""
    import re

    (found,) = [
        re.split(r"\s{2,}", line.strip())
        for line in text.splitlines()
        if line.split()[:3] == [backend, mode, spec]
    ]
    return found


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
    assert row(done.stdout, "mine", "decode") == [
        "mine",
        "decode",
        "none",
        "any",
        "post_replay",
        "in_graph",
        "earlier",
    ]
    (line,) = done.stderr.splitlines()
    assert line.startswith("warpolicy: diff: capabilities.yaml: 1 cell(s) need an audit against ")
    assert "origin/main:capabilities.yaml" in line and "SKIP=warpolicy-diff" in line


def test_diff_finds_an_earlier_cell_behind_an_opt_in_flag(repo):
    """extend is `none` under the flag's default; the change shows only with the flag on."""
    edit(repo / "capabilities.yaml", "extend: post_replay", "extend: pre_replay")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 1
    assert row(done.stdout, "mine", "extend") == [
        "mine",
        "extend",
        "none",
        "prefill_read_done=true",
        "post_replay",
        "pre_replay",
        "earlier",
    ]


def test_diff_compares_with_a_configurable_ref(repo):
    git(repo, "checkout", "-qb", "feature")
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: pre_replay")
    git(repo, "commit", "-qam", "earlier")
    assert hook("warpolicy-diff", "--ref", "feature", "capabilities.yaml").returncode == 0
    assert hook("warpolicy-diff", "--ref", "main", "capabilities.yaml").returncode == 1


def test_diff_new_standalone_file_has_no_earlier_cell(repo):
    (repo / "capabilities-new.yaml").write_text(REGISTRY)
    done = hook("warpolicy-diff", "capabilities-new.yaml")
    assert done.returncode == 0 and "new file" in done.stdout


def test_diff_new_file_over_base_is_compared_with_the_base(repo):
    """A new layer over the default that claims fa3 decodes pre_replay: not "nothing to
    compare" (0.2 passed it), but the base alone against the base with the file."""
    (repo / "capabilities-fast.yaml").write_text(
        "version: 1\nbackends:\n  fa3:\n    override: true\n"
        "    reads_end: {decode: pre_replay}\n    doc: claims a snapshot\n"
    )
    done = hook("warpolicy-diff", "--base", "default", "capabilities-fast.yaml")
    assert done.returncode == 1, done.stdout + done.stderr
    assert row(done.stdout, "fa3", "decode")[4:] == ["in_graph", "pre_replay", "earlier"]
    assert "vs the --base files" in done.stdout


def test_diff_in_a_subdirectory_reads_the_right_old_file(repo):
    sub = repo / "deploy"
    sub.mkdir()
    (sub / "capabilities.yaml").write_text(REGISTRY.replace("decode: post_replay", "decode: none"))
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "deploy")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    edit(sub / "capabilities.yaml", "decode: none", "decode: post_replay")
    done = hook("warpolicy-diff", "deploy/capabilities.yaml")
    assert done.returncode == 1
    assert row(done.stdout, "mine", "decode")[4:] == ["none", "post_replay", "earlier"]


def test_diff_unknown_ref_fails_closed_in_one_line(repo):
    done = hook("warpolicy-diff", "--ref", "origin/trunk", "capabilities.yaml")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "unknown git ref 'origin/trunk'" in line and line.endswith("failing closed")


def test_diff_without_git_fails_closed_in_one_line(repo, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(repo / "no-such-dir"))
    assert main(["diff", "--ref", "origin/main", "capabilities.yaml"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "warpolicy: diff: capabilities.yaml: cannot read its version at origin/main: "
        "git is not available; failing closed"
    )


def test_diff_outside_a_repository_fails_closed(tmp_path, monkeypatch, capsys):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    (tmp_path / "capabilities.yaml").write_text(REGISTRY)
    assert main(["diff", "--ref", "HEAD", "capabilities.yaml"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_diff_with_an_invalid_new_file_fails_closed_with_its_problems(repo):
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: soon")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 2  # the comparison could not run: exit 2, like any unusable input
    assert done.stderr.splitlines()[0].startswith("capabilities.yaml:")
    assert done.stderr.splitlines()[-1].endswith("(invalid registry); failing closed")


def test_diff_given_an_absolute_path_compares_the_file_at_the_ref(repo):
    """0.2 built ``origin/main:./<absolute path>``, found nothing, said "new file" and exited 0."""
    edit(repo / "capabilities.yaml", "decode: post_replay", "decode: in_graph")
    done = hook("warpolicy-diff", str(repo / "capabilities.yaml"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "new file" not in done.stdout
    assert row(done.stdout, "mine", "decode")[4:] == ["post_replay", "in_graph", "earlier"]
    sub = repo / "deploy"
    sub.mkdir()
    done = subprocess.run(  # from a subdirectory, the absolute path still names the same file
        [
            sys.executable,
            "-m",
            "warpolicy",
            *entry("warpolicy-diff")[1:],
            str(repo / "capabilities.yaml"),
        ],
        cwd=sub,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=120,
        check=False,
    )
    assert done.returncode == 1 and "origin/main:capabilities.yaml" in done.stdout


def test_diff_of_a_path_outside_the_repository_fails_closed(repo, tmp_path):
    outside = tmp_path / "elsewhere" / "capabilities.yaml"
    outside.parent.mkdir()
    outside.write_text(REGISTRY)
    done = hook("warpolicy-diff", str(outside))
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "outside the repository" in line and line.endswith("failing closed")


def test_diff_of_a_directory_at_the_ref_fails_closed(repo):
    (repo / "capabilities.yaml").unlink()
    (repo / "capabilities.yaml").mkdir()
    (repo / "capabilities.yaml" / "x").write_text("x")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "now a directory")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    git(repo, "rm", "-rqf", "capabilities.yaml")
    (repo / "capabilities.yaml").write_text(REGISTRY)
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 2 and "not a regular file" in done.stderr


def test_diff_sees_a_flipped_flag_default(repo):
    """Issue 22 item 1: extend was none under the opt-in flag's default; with the default
    flipped it publishes. Enumerating the flag both ways on both sides hid it."""
    edit(repo / "capabilities.yaml", "default: false", "default: true")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 1, done.stdout
    assert row(done.stdout, "mine", "extend")[3:] == [
        "prefill_read_done=default",
        "none",
        "post_replay",
        "earlier",
    ]


def test_diff_sees_a_spec_algorithm_gaining_last_reader_target_verify(repo):
    """Issue 22 item 2: the step now hands the scheduler verify's event, before draft extend
    (which declares it reads nothing; one that decides none would keep the step coarse)."""
    edit(
        repo / "capabilities.yaml",
        "decode: post_replay, extend: post_replay",
        "decode: post_replay, extend: post_replay, target_verify: in_graph, draft_extend: nothing",
    )
    (repo / "capabilities.yaml").write_text(
        (repo / "capabilities.yaml").read_text()
        + "spec_algorithms:\n  eagle:\n    family: eagle\n    last_reader: draft_extend\n"
        "    doc: x\n"
    )
    git(repo, "commit", "-qam", "spec")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    assert hook("warpolicy-diff", "capabilities.yaml").returncode == 0
    edit(repo / "capabilities.yaml", "last_reader: draft_extend", "last_reader: target_verify")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 1, done.stdout
    assert row(done.stdout, "mine", "step", "eagle") == [
        "mine",
        "step",
        "eagle",
        "any",
        "pre_replay at draft_extend",
        "in_graph at target_verify",
        "earlier",
    ]


@pytest.mark.parametrize("name", ["warpolicy-validate", "warpolicy-diff"])
def test_an_unreadable_file_exits_2(repo, name):
    (repo / "capabilities-dir.yaml").mkdir()
    done = hook(name, "capabilities-dir.yaml")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


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
    assert row(done.stdout, "mine", "decode")[4:] == ["post_replay", "in_graph", "earlier"]


# -- issue 26 finding 8: symlinked and renamed registries ----------------------------------------


def _symlinked(repo: pathlib.Path) -> None:
    """``capabilities.yaml -> configs/prod.yaml`` at origin/main."""
    (repo / "configs").mkdir()
    git(repo, "mv", "capabilities.yaml", "configs/prod.yaml")
    (repo / "capabilities.yaml").symlink_to("configs/prod.yaml")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "symlinked")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")


def test_the_hooks_select_a_symlinked_registry(repo):
    """0.3.0's ``types: [yaml]`` never matched a symlink: pre-commit skipped it."""
    import re

    identify = pytest.importorskip("identify.identify")
    _symlinked(repo)
    tags = identify.tags_from_path("capabilities.yaml")
    for h in yaml.safe_load(MANIFEST.read_text()):
        wanted = set(h.get("types_or", [])) or None
        assert re.search(h["files"], "capabilities.yaml")
        assert wanted is not None and wanted & tags, (h["id"], tags)
        assert not set(h.get("types", [])) - tags


def test_diff_follows_a_symlinked_registry_to_its_target_at_the_ref(repo):
    _symlinked(repo)
    edit(repo / "configs" / "prod.yaml", "decode: post_replay", "decode: in_graph")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 1, done.stdout + done.stderr
    assert row(done.stdout, "mine", "decode")[4:] == ["post_replay", "in_graph", "earlier"]
    assert "origin/main:configs/prod.yaml" in done.stderr


def test_diff_compares_a_renamed_registry_with_its_old_path(repo):
    """0.3.0 compared a file renamed in the same commit as an earlier change as a new file
    (absent at the ref): exit 0."""
    git(repo, "mv", "capabilities.yaml", "capabilities-prod.yaml")
    edit(repo / "capabilities-prod.yaml", "decode: post_replay", "decode: in_graph")
    git(repo, "add", ".")
    done = hook("warpolicy-diff", "capabilities-prod.yaml")
    assert done.returncode == 1, done.stdout + done.stderr
    assert row(done.stdout, "mine", "decode")[4:] == ["post_replay", "in_graph", "earlier"]
    assert "origin/main:capabilities.yaml" in done.stderr


def test_a_symlink_out_of_the_repository_at_the_ref_fails_closed(repo, tmp_path):
    outside = tmp_path / "outside.yaml"
    outside.write_text(REGISTRY)
    (repo / "capabilities.yaml").unlink()
    (repo / "capabilities.yaml").symlink_to(outside)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "link out")
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    done = hook("warpolicy-diff", "capabilities.yaml")
    assert done.returncode == 2 and "out of the repository" in done.stderr
