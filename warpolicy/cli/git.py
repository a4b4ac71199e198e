"""A registry file's version at a git revision, for ``warpolicy diff --ref`` (the pre-commit
diff hook). Everything that keeps the old version from being read exactly fails closed with a
`GitError` (exit 2): no git, no repository, an unknown ref, a path outside the repository, or
something at that path that is not a regular file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Optional, Sequence

import attrs

from warpolicy.errors import InputError


class GitError(InputError):
    """git is missing or cannot give the old file exactly (the diff fails closed)."""


@attrs.frozen
class OldVersion:
    """``path`` (as given) is ``relpath`` from the repository root; ``text`` is its content at
    the ref, or None when no file exists there (a new file)."""

    path: str
    relpath: str
    spec: str  # ``REF:relpath``, as git names it
    text: Optional[str]


def _git(args: Sequence[str], cwd: Optional[str] = None) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        raise GitError("git is not available")
    try:
        return subprocess.run([git, *args], capture_output=True, timeout=60, check=False, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git failed to run ({type(exc).__name__}: {exc})") from exc


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text.splitlines()[0] if text else "no message"


def repository_path(path: str) -> str:
    """``path`` (relative to the working directory, or absolute) relative to the root of the
    repository that holds the working directory, with ``/`` separators."""
    top = _git(["rev-parse", "--show-toplevel"])
    if top.returncode != 0:
        raise GitError(f"not in a git repository ({_first_line(top.stderr)})")
    root = os.path.realpath(top.stdout.decode("utf-8", "replace").strip())
    # resolve the directory, not the file: a symlinked registry is compared as itself
    full = os.path.join(
        os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path)
    )
    rel = os.path.relpath(full, root)
    if rel == os.curdir or rel.startswith(os.pardir + os.sep) or rel == os.pardir:
        raise GitError(f"{path} is outside the repository at {root}")
    return rel.replace(os.sep, "/")


def old_version(ref: str, path: str) -> OldVersion:
    """The text of ``path`` at ``ref`` (None: absent there). Raises `GitError`."""
    probe = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
    if probe.returncode != 0:
        why = _first_line(probe.stderr) if probe.stderr else "not found"
        raise GitError(f"unknown git ref {ref!r} ({why}); fetch it or pass --ref")
    rel = repository_path(path)
    spec = f"{ref}:{rel}"
    listed = _git(["ls-tree", "-z", "--full-tree", ref, "--", rel])
    if listed.returncode != 0:
        raise GitError(f"git ls-tree {ref} -- {rel} failed: {_first_line(listed.stderr)}")
    entry = listed.stdout.split(b"\0", 1)[0]
    if not entry:
        return OldVersion(path, rel, spec, None)
    mode, kind = entry.split(b" ", 2)[:2]
    if kind != b"blob" or mode not in (b"100644", b"100755"):
        what = "a symbolic link" if mode == b"120000" else f"a {kind.decode(errors='replace')}"
        raise GitError(f"{spec} is {what}, not a regular file")
    shown = _git(["cat-file", "blob", spec])
    if shown.returncode != 0:
        raise GitError(f"git cat-file blob {spec} failed: {_first_line(shown.stderr)}")
    try:
        return OldVersion(path, rel, spec, shown.stdout.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise GitError(f"{spec} is not UTF-8 (byte {exc.start})") from exc
