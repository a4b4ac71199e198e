"""A registry file's version at a git revision, for ``warpolicy diff --ref`` (the pre-commit
diff hook). Everything that keeps the old version from being read exactly fails closed with a
`GitError` (exit 2): no git, no repository, an unknown ref, a path outside the repository, or
something at that path that is not a regular file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

import attrs

from warpolicy.errors import InputError


class GitError(InputError):
    """git is missing or cannot give the old file exactly (the diff fails closed)."""


#: Symbolic links followed at a ref, at most (a longer chain or a loop fails closed).
MAX_LINKS = 8


@attrs.frozen
class OldVersion:
    """``path`` (as given) is ``relpath`` from the repository root; ``text`` is its content at
    the ref, or None when no file exists there (a new file). ``spec`` names the blob read: a
    symbolic link is followed to its target, and a file renamed since the ref is read at its
    old path (``renamed_from``)."""

    path: str
    relpath: str
    spec: str  # ``REF:relpath`` of the blob read, as git names it
    text: str | None
    renamed_from: str | None = None


def _git(args: Sequence[str], cwd: str | None = None) -> subprocess.CompletedProcess[bytes]:
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
    """The text of ``path`` at ``ref`` (None: absent there, and not renamed from a file that
    was there). A symbolic link (at the ref) is followed to its target; a path absent at the
    ref that git sees as renamed (or copied) from another path since is read at that path.
    Raises `GitError`."""
    probe = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
    if probe.returncode != 0:
        why = _first_line(probe.stderr) if probe.stderr else "not found"
        raise GitError(f"unknown git ref {ref!r} ({why}); fetch it or pass --ref")
    rel = repository_path(path)
    spec, text = _blob_at(ref, rel)
    if text is not None:
        return OldVersion(path, rel, spec, text)
    source = _renamed_from(ref, rel)
    if source is None:
        return OldVersion(path, rel, spec, None)
    spec, text = _blob_at(ref, source)
    return OldVersion(path, rel, spec, text, renamed_from=source)


def _blob_at(ref: str, rel: str) -> tuple[str, str | None]:
    """``(REF:path, text)`` of the regular file at ``rel`` at ``ref``, following symbolic links
    (relative to the link's directory, inside the repository); text None when absent."""
    seen: list[str] = []
    while True:
        spec = f"{ref}:{rel}"
        listed = _git(["ls-tree", "-z", "--full-tree", ref, "--", rel])
        if listed.returncode != 0:
            raise GitError(f"git ls-tree {ref} -- {rel} failed: {_first_line(listed.stderr)}")
        entry = listed.stdout.split(b"\0", 1)[0]
        if not entry:
            return spec, None
        mode, kind = entry.split(b" ", 2)[:2]
        shown = _git(["cat-file", "blob", spec]) if kind == b"blob" else None
        if shown is not None and shown.returncode != 0:
            raise GitError(f"git cat-file blob {spec} failed: {_first_line(shown.stderr)}")
        if mode == b"120000" and shown is not None:
            seen.append(rel)
            target = shown.stdout.decode("utf-8", "replace")
            joined = os.path.normpath(os.path.join(os.path.dirname(rel), target)).replace(
                os.sep, "/"
            )
            if os.path.isabs(target) or joined.startswith("../") or joined == "..":
                raise GitError(f"{spec} is a symbolic link out of the repository ({target})")
            if joined in seen or len(seen) > MAX_LINKS:
                raise GitError(f"{spec}: symbolic links loop or chain too long ({target})")
            rel = joined
            continue
        if kind != b"blob" or mode not in (b"100644", b"100755") or shown is None:
            raise GitError(f"{spec} is a {kind.decode(errors='replace')}, not a regular file")
        try:
            return spec, shown.stdout.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GitError(f"{spec} is not UTF-8 (byte {exc.start})") from exc


def _renamed_from(ref: str, rel: str) -> str | None:
    """The path at ``ref`` that ``rel`` was renamed or copied from since, as git sees it in
    the index (what a commit will hold) or, failing that, in the working tree; None if none."""
    for cached in (["--cached"], []):
        found = _git(["diff", *cached, "-M", "-C", "-z", "--name-status", ref, "--"])
        if found.returncode != 0:
            raise GitError(f"git diff {ref} failed: {_first_line(found.stderr)}")
        fields = found.stdout.decode("utf-8", "replace").split("\0")
        i = 0
        while i < len(fields) - 1:
            status = fields[i]
            if status[:1] in ("R", "C"):
                old, new = fields[i + 1], fields[i + 2]
                if new == rel:
                    return old
                i += 3
            else:
                i += 2
    return None
