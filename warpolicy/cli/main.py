"""The ``warpolicy`` command line: one parser, declared here once from the command groups.

`main(argv) -> int` does the work and returns an `ExitCode`; `run()` is the console-script
entry. Known errors become one line on stderr and a documented exit code (the rule is in
`warpolicy.cli.common`), never a traceback. The command groups, one module each: `decide`
(query, explain, table), `review` (validate, diff, schema: the review gates and the pre-commit
hooks), `plugins`, `audit`, `bench`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from warpolicy import __version__
from warpolicy.cli import audit, bench, decide, plugins, review
from warpolicy.cli.common import (
    ExitCode,
    OutputError,
    Parser,
    UsageError,
    err,
    with_default_hint,
)
from warpolicy.errors import RegistryError, WarpolicyError

__all__ = ["TORCH_HINT", "ExitCode", "build_parser", "main", "run"]

#: The hint a runtime command gives without torch: the CPU wheel first, so pip does not pull a
#: multi-GB CUDA build (README, "Quick start").
TORCH_HINT = (
    "this command needs PyTorch; install it with pip install 'warpolicy[torch]' (CPU only: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu first)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="warpolicy",
        description=(
            "Decide, explain and audit where an LLM serving engine's forward may release the "
            "scheduler (WAR read-done policy)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"warpolicy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for group in (decide, review, plugins, audit, bench):
        group.add_commands(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command and return its `ExitCode`: known errors become one line on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(list(argv))
    except SystemExit as exc:  # argparse after --help / --version: keep main(argv) -> int
        code = exc.code
        return _flushed(code if isinstance(code, int) else ExitCode.OK if code is None else 2)
    except UsageError as exc:
        err(f"{exc.prog}: {exc}")
        return ExitCode.USAGE
    try:
        return int(args.handler(args))
    except OutputError as exc:
        err(f"warpolicy: {exc}")
        return ExitCode.OUTPUT
    except UsageError as exc:
        err(f"{exc.prog}: {exc}")
    except RegistryError as exc:  # located lines, as validate prints them
        err("".join(f"{p}\n" for p in with_default_hint(exc.problems)))
    except WarpolicyError as exc:
        err(f"warpolicy: {exc}")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        err(f"warpolicy: {TORCH_HINT}")  # the registry, engine and CLI run without torch
    except KeyboardInterrupt:
        err(f"warpolicy: {args.command} interrupted; no result")
        return ExitCode.INTERRUPTED
    except SystemExit as exc:  # not argparse: a plugin hook called sys.exit mid-command
        err(
            f"warpolicy: sys.exit({exc.code!r}) was called while running {args.command!r} "
            "(a plugin hook?); no result"
        )
    return ExitCode.USAGE


def _flushed(code: int) -> int:
    """``--help`` / ``--version`` wrote through argparse: surface a failed write too."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):
        err("warpolicy: cannot write the output")
        return ExitCode.OUTPUT
    return int(code)


def run() -> None:
    """Console-script entry point."""
    code = main()
    if code == ExitCode.OUTPUT:
        _discard_stdout()
    sys.exit(int(code))


def _discard_stdout() -> None:
    """After a failed write, point fd 1 at /dev/null: the interpreter's final flush of the
    unwritten buffer would otherwise print a second error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
