"""``query``, ``explain`` and ``table``: decisions of the registry in use."""

from __future__ import annotations

import argparse

from warpolicy.cli import common
from warpolicy.cli.common import ExitCode
from warpolicy.registry.report import format_decision, format_explanation, format_table
from warpolicy.registry.vocabulary import TABLE_MODES


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("query", help="the policy for one backend, mode and spec algorithm")
    common.add_context_args(p)
    p.set_defaults(handler=cmd_query)

    p = sub.add_parser("explain", help="every input the decision considered")
    common.add_context_args(p)
    p.set_defaults(handler=cmd_explain)

    default_modes = ", ".join(m.label for m in TABLE_MODES)
    p = sub.add_parser("table", help="the policy for every combination")
    p.add_argument("--backend", action="append", help="only these backends (repeatable)")
    p.add_argument("--spec", action="append", help="only these spec algorithms (repeatable)")
    p.add_argument(
        "--mode", action="append", help=f"only these modes (repeatable; default: {default_modes})"
    )
    common.add_flag_args(p)
    common.add_batch_fact_args(
        p, what="every batch reports it (default: the column 'per batch' shows how a cell varies)"
    )
    common.add_registry_args(p)
    common.add_format(p)
    p.set_defaults(handler=cmd_table)


def cmd_query(args: argparse.Namespace) -> int:
    engine = common.engine(args.capabilities)
    decision = engine.decision(common.context(args, engine))
    common.out(format_decision(decision, args.format))
    return ExitCode.OK


def cmd_explain(args: argparse.Namespace) -> int:
    engine = common.engine(args.capabilities)
    explanation = engine.explain(common.context(args, engine))
    common.out(format_explanation(explanation, args.format))
    return ExitCode.OK


def cmd_table(args: argparse.Namespace) -> int:
    engine = common.engine(args.capabilities)
    flags = common.parse_flags(args.flag)
    given = common.batch_facts(args.fact, [engine])
    rows = engine.table(
        args.backend, args.spec, args.mode, flags, batch_facts=given, **common.facts(args)
    )
    classes = engine.class_table(rows, flags, batch_facts=given, **common.facts(args))
    common.out(format_table(rows, args.format, classes))
    return ExitCode.OK
