"""What every command group shares: exit codes, output, argument groups, flags and facts, the
engine a command reads, and the plugin manager (built once per process at the composition root,
`warpolicy.runtime.manager.get_plugin_manager`).

One rule for exit codes (docs/cli.md, "Exit codes"): 0 the command did what was asked and found
nothing wrong; 1 it ran and its check failed (validate found problems, diff found a change it
was told to fail on, audit found an UNSAFE declaration); 2 it could not run as asked (bad
arguments, an unknown name, a registry that cannot be read, or, for a command that needs one
loaded, an invalid registry; a broken plugin; no PyTorch or no CUDA for a GPU command); 3 an
audit proved nothing for some declaration; 4 the output could not be written; 130 interrupted.
"""

from __future__ import annotations

import argparse
import enum
import functools
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn, TypedDict

import attrs
import pluggy

from warpolicy.errors import InputError, Problem, UnknownNameError, WarpolicyError
from warpolicy.registry.decision import FORCE_COARSE, Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.facts import check_facts, parse_fact_value
from warpolicy.registry.inputs import parse_bool
from warpolicy.registry.loader import default_registry_path, load_registry
from warpolicy.registry.report import FORMATS
from warpolicy.runtime import manager

#: The runner facts a command line can give (``--platform``, ``--[no-]external-events``,
#: ``--eager``, ``--no-plant``).
FACT_OPTIONS = ("platform", "external_events", "eager", "planted")


class ExitCode(enum.IntEnum):
    """Documented exit codes of every ``warpolicy`` command (see the module docstring)."""

    OK = 0
    CHECK_FAILED = 1  # the command ran and its check failed
    USAGE = 2  # the command could not run as asked
    INCONCLUSIVE = 3  # audit proved nothing for some declaration (or failed)
    OUTPUT = 4  # the output could not be written: full disk, closed stdout, unencodable text
    INTERRUPTED = 130


class OutputError(Exception):
    """stdout could not take the output; carries the one line to print on stderr."""


class UsageError(InputError):
    """A command line argparse refused; ``prog`` names the (sub)command."""

    def __init__(self, prog: str, message: str) -> None:
        self.prog = prog
        super().__init__(message)


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)


# -- argument groups shared by several commands ---------------------------------------------


def add_format(p: argparse.ArgumentParser, formats: Sequence[str] = FORMATS) -> None:
    p.add_argument("--format", choices=formats, default="text")


def add_registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--capabilities",
        action="append",
        metavar="FILE",
        help="registry file (repeatable, layered in order; 'default' names the "
        "packaged one); default: $WARPOLICY_CAPABILITIES or the packaged file",
    )


def add_flag_args(p: argparse.ArgumentParser, *, what: str = "this query") -> None:
    p.add_argument(
        "--flag",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"set a registry flag for {what} (repeatable)",
    )
    p.add_argument(
        "--eager", action="store_true", default=None, help="the forward runs eagerly (no graph)"
    )
    p.add_argument(
        "--no-plant", action="store_true", default=None, help="the read-done node was not planted"
    )
    events = p.add_mutually_exclusive_group()
    events.add_argument(
        "--external-events",
        dest="external_events",
        action="store_true",
        default=None,
        help="the platform has external events (default: only cuda)",
    )
    events.add_argument(
        "--no-external-events",
        dest="external_events",
        action="store_false",
        help="the platform has no external events",
    )
    p.add_argument(
        "--platform",
        default=None,
        type=platform_name,
        help="platform name, any case (default: cuda)",
    )


def add_batch_fact_args(p: argparse.ArgumentParser, *, what: str) -> None:
    p.add_argument(
        "--fact",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a per-batch fact the registry declares (repeatable): {what}; an integer for an "
        "int fact, true/false for a bool fact or an action, a name for a name fact",
    )


def add_context_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, help="attention backend name, any case")
    p.add_argument(
        "--mode", required=True, help="forward mode (decode, extend, target_verify, ...)"
    )
    p.add_argument("--spec", default="none", help="speculative algorithm, any case (default: none)")
    add_flag_args(p)
    add_batch_fact_args(p, what="the batch reports it (default: every fact not reported)")
    add_registry_args(p)
    add_format(p)


# -- flags and facts -------------------------------------------------------------------------


def platform_name(text: str) -> str:
    """Platform names are case-folded (``CUDA`` is ``cuda``), as registries spell them."""
    return text.strip().lower()


def _assignment(option: str, item: str, expected: str = "") -> tuple[str, str]:
    """``NAME=VALUE`` given to ``option`` as (name, value); `InputError` (one line) when either
    part is missing (``expected`` says what an empty value should have been)."""
    name, sep, value = item.partition("=")
    name = name.strip()
    if not sep or not name:
        raise InputError(f"{option} {item!r}: expected NAME=VALUE")
    if not value.strip():
        raise InputError(f"{option} {item!r}: empty value; expected NAME=VALUE{expected}")
    return name, value


def parse_flags(items: Iterable[str]) -> dict[str, bool]:
    flags: dict[str, bool] = {}
    for item in items:
        name, value = _assignment(
            "--flag", item, " with a boolean (1/0, true/false, yes/no, on/off)"
        )
        flags[name] = parse_bool(value, f"--flag {name}")
    return flags


def batch_facts(items: Iterable[str], engines: Sequence[PolicyEngine]) -> dict[str, object]:
    """``--fact NAME=VALUE`` items as per-batch fact values, each parsed as the fact the last
    engine that declares it says (`parse_fact_value`). Raises `UnknownNameError` with close
    matches for a fact no engine declares, `InputError` (one line) for a malformed item or a
    value of the wrong type."""
    facts: dict[str, object] = {}
    for item in items:
        name, value = _assignment("--fact", item)
        declared = [e.registry.facts[name] for e in engines if name in e.registry.facts]
        if not declared:
            known = {n for e in engines for n in e.registry.facts}
            raise UnknownNameError("fact", name, known)
        parsed = parse_fact_value(declared[-1], value)
        if not any(fact.valid(parsed) for fact in declared):
            check_facts({name: declared[-1]}, {name: parsed})  # raises: one line, the why
        facts[name] = parsed
    return facts


def known_flag(name: str, engines: Sequence[PolicyEngine]) -> None:
    """Raise `UnknownNameError` (with close matches) unless some engine declares ``name``;
    the built-in ``force_coarse`` is always known."""
    if name == FORCE_COARSE.name or any(name in e.registry.flags for e in engines):
        return
    engines[-1].registry.flag(name)


class Facts(TypedDict):
    platform: str
    external_events: bool
    eager: bool
    planted: bool


def facts(args: argparse.Namespace) -> Facts:
    platform = args.platform or "cuda"
    external = args.external_events
    if external is None:  # external events exist only on CUDA (torch >= 2.8)
        external = platform == "cuda"
    return {
        "platform": platform,
        "external_events": external,
        "eager": bool(args.eager),
        "planted": not args.no_plant,
    }


def given_facts(args: argparse.Namespace) -> dict[str, object]:
    """Only the facts the user set, for commands that otherwise enumerate them (diff)."""
    given: dict[str, object] = {}
    if args.platform is not None:
        given["platform"] = args.platform
    if args.external_events is not None:
        given["external_events"] = args.external_events
    elif args.platform is not None:  # as for query: external events exist only on CUDA
        given["external_events"] = args.platform == "cuda"
    if args.eager is not None:
        given["eager"] = True
    if args.no_plant is not None:
        given["planted"] = False
    return given


def context(args: argparse.Namespace, engine: PolicyEngine) -> Context:
    return Context(
        args.backend,
        args.mode,
        args.spec,
        parse_flags(args.flag),
        **facts(args),
        facts=batch_facts(args.fact, [engine]),
    )


# -- the plugin manager and the engine -------------------------------------------------------


_AUTOLOAD = [True]  # this command loads entry-point plugins (not --disable-plugin-autoload)


def set_plugin_autoload(on: bool) -> None:
    """Whether `plugin_manager` loads the installed plugins for the command now running
    (``warpolicy --disable-plugin-autoload`` sets it off; `main` sets it on every command)."""
    _AUTOLOAD[0] = on


def plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager, built once by the composition root (without the
    entry-point plugins under ``--disable-plugin-autoload``)."""
    if _AUTOLOAD[0]:
        return manager.get_plugin_manager()
    return manager.get_plugin_manager(load_entry_points=False)


def engine(
    files: Sequence[str] | None,
    *,
    plugins: bool = True,
    environ: Mapping[str, str] | None = None,
) -> PolicyEngine:
    """The engine over ``files`` (else $WARPOLICY_CAPABILITIES, else the default), plus the
    installed plugins' fragments unless ``plugins`` is False."""
    if not plugins:
        return PolicyEngine.load(files, environ=environ)
    pm = plugin_manager()
    return PolicyEngine.load(
        files,
        fragments=manager.collect_fragments(pm),
        blame=functools.partial(manager.blame_plugins, pm),
        environ=environ,
    )


@functools.lru_cache(maxsize=1)
def _default_backends() -> frozenset[str]:
    try:
        return frozenset(load_registry([default_registry_path()]).backends)
    except WarpolicyError:  # a hint only; the default itself is tested elsewhere
        return frozenset()


def with_default_hint(problems: Sequence[Problem]) -> list[Problem]:
    """A problem naming an unknown backend that the packaged default defines (so the default
    was not loaded) says, on the same line, how to layer the file over it."""
    out = []
    for problem in problems:
        name = _unknown_backend(problem.message)
        if name is not None and name in _default_backends():
            hint = (
                f" ({name!r} is in the packaged default registry: layer this file over it with "
                f"`warpolicy validate default {problem.file}`, `--capabilities default "
                f"--capabilities {problem.file}` or `diff ... default:{problem.file}`; "
                "pre-commit: args: [--base, default])"
            )
            problem = attrs.evolve(problem, message=problem.message + hint)
        out.append(problem)
    return out


def _unknown_backend(message: str) -> str | None:
    marker = "unknown backend '"
    at = message.find(marker)
    if at < 0:
        return None
    rest = message[at + len(marker) :]
    end = rest.find("'")
    return rest[:end] if end > 0 else None


# -- output ----------------------------------------------------------------------------------


def out(text: str) -> None:
    """Write and flush now, so a full disk or a closed stdout is an `OutputError` here."""
    stream = sys.stdout
    if stream is None:  # started with stdout closed (``>&-``)
        raise OutputError("cannot write the output: stdout is closed")
    try:
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()
    except UnicodeEncodeError as exc:
        raise OutputError(
            f"cannot write the output: the output encoding "
            f"{getattr(stream, 'encoding', '?')} cannot encode "
            f"{exc.object[exc.start : exc.end]!a}; set PYTHONIOENCODING=utf-8"
        ) from None
    except BrokenPipeError:
        raise OutputError("cannot write the output: the reader closed the pipe") from None
    except (OSError, ValueError) as exc:  # ENOSPC, EBADF, or "I/O operation on closed file"
        why = getattr(exc, "strerror", None) or str(exc)
        raise OutputError(f"cannot write the output: {why}") from None


def err(line: str) -> None:
    """One line (or several, each ending in a newline) on stderr; if stderr is gone too, there
    is nobody left to tell."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(line if line.endswith("\n") else line + "\n")
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def quiet_torch() -> None:
    """Import torch once with its import-time warnings silenced (e.g. "Failed to initialize
    NumPy"), so a GPU command without CUDA prints one line, not a warning first. Deferred to
    the commands that need torch; a missing torch is the caller's ModuleNotFoundError."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401, PLC0415 - deferred: only runtime commands need torch
