"""The ``warpolicy`` command line: one parser, declared here once from the command groups.

`main(argv) -> int` does the work and returns an `ExitCode`; `run()` is the console-script
entry. Known errors become one line on stderr and a documented exit code (the rule is in
`warpolicy.cli.common`; with ``--format json``, one JSON object: `warpolicy.cli.failure`),
never a traceback. The command groups, one module each: `decide` (query, explain, table),
`review` (validate, diff, schema: the review gates and the pre-commit hooks), `plugins`,
`audit`, `bench`, `variables` (env).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from warpolicy import __version__
from warpolicy.cli import audit, bench, common, decide, plugins, review, variables
from warpolicy.cli.common import (
    ExitCode,
    OutputError,
    Parser,
    UsageError,
    err,
    with_default_hint,
)
from warpolicy.cli.failure import Failure, wants_json
from warpolicy.errors import (
    CudaUnavailableError,
    InputError,
    PluginError,
    RegistryError,
    UnknownNameError,
    WarpolicyError,
)

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
    parser.add_argument(
        "--disable-plugin-autoload",
        action="store_true",
        help="load no plugin from installed distributions (the 'warpolicy' entry points) for "
        "this command; as $WARPOLICY_DISABLE_PLUGIN_AUTOLOAD=1 does for every command",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for group in (decide, review, plugins, audit, bench, variables):
        group.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its `ExitCode`: known errors become one line on stderr, or
    one JSON object there when the command line asks for ``--format json`` (`failure`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse after --help / --version: keep main(argv) -> int
        code = exc.code
        return _flushed(code if isinstance(code, int) else ExitCode.OK if code is None else 2)
    except UsageError as exc:
        return _failed(Failure.usage(exc.prog, str(exc), ExitCode.USAGE), as_json)
    as_json = getattr(args, "format", None) == "json"
    common.set_plugin_autoload(not args.disable_plugin_autoload)
    try:
        return int(args.handler(args))
    except BaseException as exc:  # known errors become one Failure; the rest re-raise
        failure = _failure(exc, f"warpolicy {args.command}")
        if failure is None:
            raise
        return _failed(failure, as_json)


def _failure(exc: BaseException, command: str) -> Failure | None:
    """The `Failure` a known error makes (None: a bug, which keeps its traceback)."""
    usage = ExitCode.USAGE
    if isinstance(exc, OutputError):
        return Failure("output", command, ExitCode.OUTPUT, f"warpolicy: {exc}", str(exc))
    if isinstance(exc, UsageError):
        return Failure.usage(exc.prog, str(exc), usage)
    if isinstance(exc, RegistryError):  # located lines, as validate prints them
        return Failure.registry(command, with_default_hint(exc.problems), usage)
    if isinstance(exc, WarpolicyError):
        return _known(exc, command)
    if isinstance(exc, ModuleNotFoundError) and exc.name == "torch":
        # the registry, engine and CLI run without torch
        return Failure(
            "missing_dependency",
            command,
            usage,
            f"warpolicy: {TORCH_HINT}",
            TORCH_HINT,
            details={"module": "torch"},
        )
    if isinstance(exc, KeyboardInterrupt):
        message = f"{command.split()[-1]} interrupted; no result"
        return Failure(
            "interrupted", command, ExitCode.INTERRUPTED, f"warpolicy: {message}", message
        )
    if isinstance(exc, SystemExit):  # not argparse: a plugin hook called sys.exit mid-command
        message = (
            f"sys.exit({exc.code!r}) was called while running {command.split()[-1]!r} "
            "(a plugin hook?); no result"
        )
        return Failure("exit_called", command, usage, f"warpolicy: {message}", message)
    return None


def _known(exc: WarpolicyError, command: str) -> Failure:
    """A `WarpolicyError` that is not a registry's: its kind and, where it has one, its place."""
    text, message = f"warpolicy: {exc}", str(exc)
    if isinstance(exc, PluginError):
        where = {"plugin": exc.plugin, "entry_point": exc.entry_point}
        return Failure("plugin", command, ExitCode.USAGE, text, message, location=where)
    if isinstance(exc, UnknownNameError):
        details = {"name": exc.name, "name_kind": exc.kind, "suggestions": exc.suggestions}
        return Failure("unknown_name", command, ExitCode.USAGE, text, message, details=details)
    if isinstance(exc, CudaUnavailableError):
        return Failure("cuda", command, ExitCode.USAGE, text, message)
    kind = "input" if isinstance(exc, InputError) else "error"
    return Failure(kind, command, ExitCode.USAGE, text, message)


def _failed(failure: Failure, as_json: bool) -> int:
    err(failure.render(as_json))
    return failure.exit_code


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
