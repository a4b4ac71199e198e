"""Entry points of the pre-commit hooks in ``.pre-commit-hooks.yaml``, for users' own registries.

``python -m warpolicy.cli.precommit validate [--base FILE]... FILE...``
    Every problem of every file, each as ``FILE:LINE:COL: message``. Files are checked one by
    one (pre-commit may pass several, in batches of its choosing; layering them together would
    make the verdict depend on the batch), each on top of the ``--base`` files, e.g.
    ``--base default`` for a file that layers over the packaged registry.

``python -m warpolicy.cli.precommit diff [--ref REF] [--base FILE]... FILE...``
    Compares each file with its version at ``REF`` (default ``origin/main``, read with
    ``git show``) and fails on any (backend, mode, spec) cell whose policy became *earlier*,
    under the flags' defaults and with each flag flipped in turn (a cell gated by an opt-in
    flag changes only with that flag on). Later, added and removed cells pass. A file absent
    at ``REF`` is new: nothing to compare. Without git, or with an unknown ``REF``, it fails
    closed with one line.

Exit codes as the CLI's: 0 ok, 1 a check failed, 2 usage or input error (no git, unknown ref,
unreadable file).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from typing import Optional, Sequence, TextIO

from warpolicy.errors import RegistryError, WarpolicyError
from warpolicy.registry.compare import cell_space, diff_engines
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import Fragment, load_registry, registry_sources, validate_sources
from warpolicy.registry.vocabulary import WarReadDonePolicy

OK, CHECK_FAILED, INPUT_ERROR = 0, 1, 2
DEFAULT_REF = "origin/main"


# -- validate --------------------------------------------------------------------------------------


def validate_files(
    files: Sequence[str], base: Sequence[str] = (), err: Optional[TextIO] = None
) -> int:
    """Validate each file on top of ``base``; every problem on ``err`` (default stderr)."""
    err = err if err is not None else sys.stderr
    bases = list(registry_sources(base)) if base else []
    failed = False
    for path in files:
        problems = validate_sources(bases + [path])
        err.write("".join(f"{p}\n" for p in problems))
        failed = failed or bool(problems)
    return CHECK_FAILED if failed else OK


# -- diff ------------------------------------------------------------------------------------------


class GitError(WarpolicyError):
    """git is missing or cannot give the old file (the diff hook fails closed)."""


def _git(args: Sequence[str]) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        raise GitError("git is not available")
    try:
        return subprocess.run([git, *args], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git failed to run ({type(exc).__name__}: {exc})") from exc


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text.splitlines()[0] if text else "no message"


def old_version(ref: str, path: str) -> Optional[str]:
    """The text of ``path`` (relative to the working directory) at ``ref``, or None when the
    file does not exist there. Raises `GitError` when git or the ref is unusable."""
    probe = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
    if probe.returncode != 0:
        why = _first_line(probe.stderr) if probe.stderr else "not found"
        raise GitError(f"unknown git ref {ref!r} ({why}); fetch it or pass --ref")
    spec = f"{ref}:./{path}"
    if _git(["cat-file", "-e", spec]).returncode != 0:
        return None
    shown = _git(["show", spec])
    if shown.returncode != 0:
        raise GitError(f"git show {spec} failed: {_first_line(shown.stderr)}")
    try:
        return shown.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GitError(f"{spec} is not UTF-8 (byte {exc.start})") from exc


def earlier_cells(old_sources: Sequence, new_sources: Sequence) -> list[str]:
    """One line per cell that is earlier in the new registry: every mode, every spec, and every
    combination of the flags and platform facts that some gate tests (`compare.cell_space`)."""
    old = PolicyEngine(load_registry(old_sources), environ={})
    new = PolicyEngine(load_registry(new_sources), environ={})
    space = cell_space([old.registry, new.registry])
    lines: list[str] = []
    for cell in diff_engines(old, new, space):
        if "absent" in (cell.old, cell.new):
            continue
        if WarReadDonePolicy.parse(cell.new) < WarReadDonePolicy.parse(cell.old):
            when = "" if cell.when == "any" else f" when {cell.when}"
            lines.append(
                f"backend {cell.backend}, mode {cell.mode.value}, spec {cell.spec}"
                f"{when}: {cell.old} -> {cell.new} (earlier)"
            )
    return lines


def diff_files(
    files: Sequence[str],
    ref: str = DEFAULT_REF,
    base: Sequence[str] = (),
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
) -> int:
    """Fail (1) when any file has an earlier cell than its version at ``ref``."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    bases = list(registry_sources(base)) if base else []
    status = OK
    for path in files:
        try:
            text = old_version(ref, path)
        except GitError as exc:
            err.write(
                f"warpolicy-diff: {path}: cannot read the version at {ref}: {exc}; failing closed\n"
            )
            return INPUT_ERROR
        if text is None:
            out.write(f"{path}: new file (absent at {ref}), nothing to compare\n")
            continue
        try:
            lines = earlier_cells(
                bases + [Fragment(name=f"{ref}:{path}", data=text)], bases + [path]
            )
        except RegistryError as exc:
            err.write("".join(f"{p}\n" for p in exc.problems))
            err.write(
                f"warpolicy-diff: {path}: cannot compare with {ref} (invalid registry); "
                "failing closed\n"
            )
            status = CHECK_FAILED
            continue
        except WarpolicyError as exc:
            err.write(f"warpolicy-diff: {path}: {exc}\n")
            return INPUT_ERROR
        for line in lines:
            err.write(f"{path}: {line}\n")
        if lines:
            err.write(
                f"warpolicy-diff: {path}: {len(lines)} cell(s) release earlier than at {ref}; "
                "audit them (warpolicy audit) before they land\n"
            )
            status = CHECK_FAILED
    return status


# -- command line ----------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m warpolicy.cli.precommit", description="warpolicy's pre-commit hooks"
    )
    sub = parser.add_subparsers(dest="hook", required=True)
    for name in ("validate", "diff"):
        p = sub.add_parser(name)
        p.add_argument("files", nargs="*", metavar="FILE")
        p.add_argument(
            "--base",
            action="append",
            default=[],
            metavar="FILE",
            help="registry files each FILE layers over ('default' = the packaged one)",
        )
        if name == "diff":
            p.add_argument(
                "--ref",
                default=DEFAULT_REF,
                help=f"git ref to compare with (default {DEFAULT_REF})",
            )
    args = parser.parse_args(argv)
    try:
        if args.hook == "validate":
            return validate_files(args.files, args.base)
        return diff_files(args.files, args.ref, args.base)
    except WarpolicyError as exc:  # e.g. an unreadable --base file
        sys.stderr.write(f"warpolicy-{args.hook}: {exc}\n")
        return INPUT_ERROR


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
