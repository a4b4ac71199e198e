"""The review gates: ``validate``, ``diff`` and ``schema``.

``validate`` checks registry files (every problem as ``FILE:LINE:COL: message``) and reports
any layer that makes a cell earlier than the layers below it. ``diff`` compares two registries
cell by cell (`warpolicy.registry.compare`). The pre-commit hooks are the same two commands
with two options: ``validate --each [--base FILE]... FILE...`` checks each file on its own over
the base files, and ``diff --ref REF [--base FILE]... FILE...`` compares each file with its
version at a git revision and fails on any cell that needs an audit.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

from warpolicy.cli import common, git
from warpolicy.cli.common import ExitCode, UsageError
from warpolicy.cli.layout import add_wide, output_width
from warpolicy.errors import Problem, RegistryError
from warpolicy.registry.cells import CellSpace, cell_space
from warpolicy.registry.compare import Diff, LayerChange, diff_engines, earlier_layers
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.inputs import non_negative_int_argument
from warpolicy.registry.loader import (
    Fragment,
    Source,
    load_registry,
    registry_sources,
    validate_sources,
    validate_warnings,
)
from warpolicy.registry.report import (
    DATA_FORMATS,
    DEFAULT_LIMIT,
    DIFF_SCHEMA_VERSION,
    format_diff,
    json_document,
    layer_warnings,
)
from warpolicy.registry.schema import registry_json_schema
from warpolicy.runtime import manager

#: ``diff --plugins``: which sides load installed plugin fragments, per comparison.
PLUGIN_MODES = ("both", "none", "on", "new")
_PLUGIN_RUNS: dict[str, tuple[tuple[str | None, bool, bool], ...]] = {
    "none": ((None, False, False),),
    "on": ((None, True, True),),
    "new": ((None, False, True),),
    "both": (("off", False, False), ("on", True, True)),
}
#: ``diff --ref``: the revision the pre-commit hook compares with unless told otherwise.
DEFAULT_REF = "origin/main"


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check registry files; every problem as FILE:LINE:COL",
        description="Check registry files, layered in order (default: the registry in use, "
        "plugin fragments included). With --each, each FILE is checked on its own over the "
        "--base files (the pre-commit hook).",
    )
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="files to validate ('default' names the packaged registry)",
    )
    _add_each_args(p, "each FILE on its own, over the --base files (the pre-commit hook)")
    common.add_format(p, DATA_FORMATS)
    p.set_defaults(handler=cmd_validate)

    p = sub.add_parser("schema", help="print the JSON Schema of the registry format")
    p.set_defaults(handler=cmd_schema)

    p = sub.add_parser(
        "diff",
        help="cells whose policy differs between two registries",
        description="Compare OLD and NEW cell by cell. With --ref REF, compare each FILE with "
        "its version at the git revision REF instead (the pre-commit hook; fails on any cell "
        "that needs an audit).",
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="OLD NEW | FILE",
        help="OLD and NEW registries: a file, 'default', or files joined with the path "
        "separator (layered, like WARPOLICY_CAPABILITIES); with --ref: the files to compare",
    )
    p.add_argument(
        "--ref",
        default=None,
        metavar="REF",
        help=f"compare each FILE with its version at this git revision (the pre-commit hook "
        f"uses {DEFAULT_REF}); implies --fail-on earlier",
    )
    p.add_argument(
        "--base",
        action="append",
        default=[],
        metavar="FILE",
        help="with --ref: registry files each FILE layers over ('default' = the packaged one)",
    )
    p.add_argument("--mode", action="append", help="only these modes (default: every mode)")
    common.add_flag_args(p, what="both sides (default: every combination that a gate tests)")
    common.add_batch_fact_args(
        p, what="compare only batches that report it (default: every class of every fact)"
    )
    p.add_argument(
        "--plugins",
        choices=PLUGIN_MODES,
        default=None,
        help="both: compare without and with installed plugin fragments and report "
        "either (default); none: without (always with --ref); on: with, on both sides; "
        "new: OLD without, NEW with (a plugin's own effect)",
    )
    common.add_format(p)
    p.add_argument(
        "--limit",
        type=non_negative_int_argument,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"list at most N rows, the ones that need an audit first (default {DEFAULT_LIMIT}; "
        "0: every row); the summary always counts every change",
    )
    p.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when any cell differs (every earlier cell included)",
    )
    p.add_argument(
        "--fail-on",
        choices=("any", "earlier"),
        default=None,
        help="which changes exit 1 (default any with --exit-code; 'earlier' for CI checks "
        "where a later point is always safe: earlier and moved cells, and environment names "
        "of a tested flag); implies --exit-code",
    )
    add_wide(p)
    p.set_defaults(handler=cmd_diff)


def _add_each_args(p: argparse.ArgumentParser, each_help: str) -> None:
    p.add_argument("--each", action="store_true", help=each_help)
    p.add_argument(
        "--base",
        action="append",
        default=[],
        metavar="FILE",
        help="with --each: registry files each FILE layers over ('default' = the packaged one)",
    )


# -- validate --------------------------------------------------------------------------------


def _problem_json(problem: Problem) -> dict:
    return {
        "file": problem.file,
        "line": problem.line,
        "col": problem.col,
        "message": problem.message,
        "unreadable": problem.unreadable,
    }


def _layers_json(changes: Sequence[LayerChange]) -> list[dict]:
    return [
        {
            "layer": c.layer,
            "note": c.note or None,
            "cells": [
                {
                    "backend": d.backend,
                    "mode": d.mode,
                    "spec": d.spec,
                    "when": d.when,
                    "old": d.old,
                    "new": d.new,
                    "change": d.change,
                }
                for d in c.cells
            ],
            "flags": [
                {"flag": f.name, "old_env": list(f.old_env), "new_env": list(f.new_env)}
                for f in c.flags
            ],
        }
        for c in changes
    ]


def _check(sources: Sequence[Source], blame: bool) -> tuple[list[Problem], list[LayerChange]]:
    problems = validate_sources(sources)
    if blame:
        problems = manager.blame_plugins(common.plugin_manager(), problems)
    problems = common.with_default_hint(problems)
    layers = [] if problems else earlier_layers(sources)
    return problems, layers


def cmd_validate(args: argparse.Namespace) -> int:
    if args.base and not args.each:
        raise UsageError("warpolicy validate", "--base applies with --each (each FILE over it)")
    checks: list[tuple[list[str], list[Problem], list[LayerChange]]] = []
    checked: list[list[Source]] = []  # the sources of each check, for the hazard warnings
    if args.each:
        bases: list[Source] = list(registry_sources(args.base)) if args.base else []
        for path in args.files:
            sources = [*bases, path]
            problems, layers = _check(sources, blame=False)
            checks.append(([str(s) for s in sources], problems, layers))
            checked.append(sources)
    else:
        sources = list(registry_sources(args.files or None))
        if not args.files:  # the registry in use: installed plugins' fragments too
            sources.extend(manager.collect_fragments(common.plugin_manager()))
        problems, layers = _check(sources, blame=not args.files)
        names = [s.name if isinstance(s, Fragment) else os.fspath(s) for s in sources]
        checks.append((names, problems, layers))
        checked.append(sources)
    every = [p for _names, problems, _layers in checks for p in problems]
    # valid but hazardous (a per-batch router whose choice may change inside one forward):
    # warnings, per check, also under --each (the pre-commit hook)
    hazards = [[] if every else validate_warnings(sources) for sources in checked]
    code = (
        ExitCode.USAGE
        if any(p.unreadable for p in every)
        else ExitCode.CHECK_FAILED
        if every
        else ExitCode.OK
    )
    if args.format == "json":
        common.out(
            json_document(
                {
                    "valid": not every,
                    "exit_code": int(code),
                    "checks": [
                        {
                            "sources": names,
                            "problems": [_problem_json(p) for p in problems],
                            "earlier_layers": _layers_json(layers),
                            "warnings": [_problem_json(w) for w in warned],
                        }
                        for (names, problems, layers), warned in zip(checks, hazards)
                    ],
                }
            )
        )
        return code
    if every:
        common.err("".join(f"{p}\n" for p in every))
    for _names, _problems, layers in checks:  # a warning: layering may be intended
        for line in layer_warnings(layers):
            common.err(f"warpolicy: warning: {line}")
    for warned in hazards:
        for warning in warned:
            common.err(f"warpolicy: warning: {warning}")
    if not every:
        count = len(checks) if args.each else len(checks[0][0])
        common.out(f"ok: {count} {'file' if args.each else 'source'}(s) valid")
    return code


def cmd_schema(args: argparse.Namespace) -> int:
    common.out(json.dumps(registry_json_schema(), indent=2))
    return ExitCode.OK


# -- diff ------------------------------------------------------------------------------------


def _fails(diff: Diff, fail_on: str | None) -> bool:
    if fail_on == "any":
        return bool(diff.cells or diff.flags or any(diff.unlisted.values()))
    return fail_on == "earlier" and diff.needs_audit


def _fixed(args: argparse.Namespace) -> dict[str, object]:
    return {**common.parse_flags(args.flag), **common.given_facts(args)}


def _compare(
    old: PolicyEngine,
    new: PolicyEngine,
    args: argparse.Namespace,
    fixed: dict[str, object],
    label: str | None = None,
) -> tuple[Diff, CellSpace]:
    for name in fixed:
        if name not in common.FACT_OPTIONS:
            common.known_flag(name, [old, new])  # UnknownNameError with close matches
    fixed = {**fixed, **common.batch_facts(args.fact, [old, new])}
    space = cell_space([old.registry, new.registry], modes=args.mode, fixed=fixed)
    diff = diff_engines(old, new, space, label, expand=args.limit or None)
    return diff, space


def cmd_diff(args: argparse.Namespace) -> int:
    if args.ref is not None:
        return _diff_ref(args)
    if args.base:
        raise UsageError("warpolicy diff", "--base applies with --ref (each FILE over it)")
    if len(args.paths) != 2:
        raise UsageError(
            "warpolicy diff",
            f"expected OLD NEW (or --ref REF FILE...), got {len(args.paths)} path(s)",
        )
    old_files, new_files = (p.split(os.pathsep) for p in args.paths)
    fixed = _fixed(args)
    plugins = args.plugins or "both"
    total: Diff | None = None
    space = None
    compared = []
    for label, old_plugins, new_plugins in _PLUGIN_RUNS[plugins]:
        # no environment: an operator's flag variables must not mask a change
        old = common.engine(old_files, plugins=old_plugins, environ={})
        new = common.engine(new_files, plugins=new_plugins, environ={})
        if (old.registry, new.registry) in compared:
            continue  # no plugin contributes a fragment: "on" is the same comparison as "off"
        compared.append((old.registry, new.registry))
        diff, space = _compare(old, new, args, fixed, label)
        total = diff if total is None else total + diff
    assert total is not None and space is not None
    width = output_width(args.wide)
    common.out(format_diff(total, space, args.format, plugins, args.limit, width=width))
    fail_on = args.fail_on or ("any" if args.exit_code else None)
    return ExitCode.CHECK_FAILED if _fails(total, fail_on) else ExitCode.OK


def _diff_ref(args: argparse.Namespace) -> int:
    """Each FILE against its version at ``--ref`` (over the ``--base`` files): the pre-commit
    diff hook. Fails closed (2) when a version cannot be read or a side does not load."""
    if args.plugins not in (None, "none"):
        raise UsageError("warpolicy diff", "--ref compares the files alone: --plugins must be none")
    bases: list[Source] = list(registry_sources(args.base)) if args.base else []
    fail_on = args.fail_on or "earlier"
    fixed = _fixed(args)
    code = ExitCode.OK
    documents = []
    for path in args.paths:
        try:
            old_version = git.old_version(args.ref, path)
        except git.GitError as exc:
            common.err(
                f"warpolicy: diff: {path}: cannot read its version at {args.ref}: {exc}; "
                "failing closed"
            )
            code = ExitCode.USAGE
            continue
        old_sources: list[Source] = list(bases)
        if old_version.text is not None:
            old_sources.append(Fragment(name=old_version.spec, data=old_version.text))
        try:
            new = PolicyEngine(load_registry([*bases, path]), environ={})
            if not old_sources:
                common.out(
                    f"{path}: new file (absent at {args.ref}) and no --base: every cell is "
                    "added, none can be earlier"
                )
                documents.append({"file": path, "ref": args.ref, "status": "new", "cells": []})
                continue
            old = PolicyEngine(load_registry(old_sources), environ={})
            diff, space = _compare(old, new, args, fixed)
        except RegistryError as exc:
            problems = common.with_default_hint(exc.problems)
            common.err("".join(f"{p}\n" for p in problems))
            common.err(
                f"warpolicy: diff: {path}: cannot compare with {old_version.spec} "
                "(invalid registry); failing closed"
            )
            code = ExitCode.USAGE
            continue
        against = old_version.spec if old_version.text is not None else "the --base files"
        if args.format == "json":
            doc = json.loads(format_diff(diff, space, "json", None, args.limit))
            doc.pop("schema_version")
            documents.append({"file": path, "ref": old_version.spec, "status": "compared", **doc})
        else:
            common.out(f"== {path} vs {against}")
            width = output_width(args.wide)
            common.out(format_diff(diff, space, args.format, None, args.limit, width=width))
        if _fails(diff, fail_on):
            what = "need an audit" if fail_on == "earlier" else "changed"
            common.err(
                f"warpolicy: diff: {path}: {_count(diff, fail_on)} cell(s) {what} against "
                f"{against}; audit them "
                "(warpolicy audit) before they land, then skip this hook once "
                "(SKIP=warpolicy-diff)"
            )
            if code == ExitCode.OK:
                code = ExitCode.CHECK_FAILED
    if args.format == "json":
        common.out(
            json.dumps(
                {"schema_version": DIFF_SCHEMA_VERSION, "ref": args.ref, "files": documents},
                indent=2,
                default=str,
            )
        )
    return code


def _count(diff: Diff, fail_on: str) -> int:
    if fail_on == "earlier":
        cells = {(c.backend, c.mode, c.spec) for c in diff.cells if c.needs_audit}
        flags = sum(1 for f in diff.flags if f.needs_audit)
        return len(cells) + flags + len(diff.uncompared)  # a column not compared: fail closed
    return sum(diff.counts().values()) + len(diff.flags)
