"""The ``warpolicy`` command line.

`main(argv) -> int` does the work and returns an `ExitCode`; `run()` is the console-script
entry that turns known errors into one line on stderr (no traceback) and exits.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import sys
from typing import Iterable, Optional, Sequence

from warpolicy.errors import InputError, RegistryError, WarpolicyError

FORMATS = ("text", "json")


class ExitCode(enum.IntEnum):
    """Documented exit codes of every ``warpolicy`` command."""

    OK = 0
    CHECK_FAILED = 1  # validate found problems; audit found an UNSAFE declaration; diff --exit-code
    USAGE = 2  # bad arguments or input: unknown name, unreadable/invalid registry, broken plugin, no CUDA
    INCONCLUSIVE = 3  # audit proved nothing for some declaration (or failed); see --allow-inconclusive
    INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str):  # type: ignore[override]
        raise InputError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    """argparse type for counts (iterations, trials, steps): a traceback-free usage error."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


# -- argument groups shared by several commands ---------------------------------------------

def _add_registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--capabilities", action="append", metavar="FILE",
                   help="registry file (repeatable, layered in order; 'default' names the "
                        "packaged one); default: $WARPOLICY_CAPABILITIES or the packaged file")


def _add_flag_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flag", action="append", default=[], metavar="NAME=VALUE",
                   help="set a registry flag for this query (repeatable)")
    p.add_argument("--eager", action="store_true", help="the forward runs eagerly (no graph)")
    p.add_argument("--no-plant", action="store_true", help="the read-done node was not planted")
    events = p.add_mutually_exclusive_group()
    events.add_argument("--external-events", dest="external_events", action="store_true",
                        default=None, help="the platform has external events (default: only cuda)")
    events.add_argument("--no-external-events", dest="external_events", action="store_false",
                        help="the platform has no external events")
    p.add_argument("--platform", default="cuda", help="platform name (default: cuda)")


def _add_context_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, help="attention backend name")
    p.add_argument("--mode", required=True, help="forward mode (decode, extend, target_verify, ...)")
    p.add_argument("--spec", default="none", help="speculative algorithm (default: none)")
    _add_flag_args(p)
    _add_registry_args(p)
    p.add_argument("--format", choices=FORMATS, default="text")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="warpolicy", description=(
        "Decide, explain and audit where an LLM serving engine's forward may release the "
        "scheduler (WAR read-done policy)."))
    from warpolicy import __version__

    parser.add_argument("--version", action="version", version=f"warpolicy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("query", help="the policy for one backend, mode and spec algorithm")
    _add_context_args(p)
    p = sub.add_parser("explain", help="every input the decision considered")
    _add_context_args(p)

    p = sub.add_parser("table", help="the policy for every combination")
    p.add_argument("--backend", action="append", help="only these backends (repeatable)")
    p.add_argument("--spec", action="append", help="only these spec algorithms (repeatable)")
    p.add_argument("--mode", action="append", help="only these modes (repeatable)")
    _add_flag_args(p)
    _add_registry_args(p)
    p.add_argument("--format", choices=FORMATS + ("markdown",), default="text")

    p = sub.add_parser("validate", help="check registry files; every problem as FILE:LINE:COL")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="files to validate, layered (default: the registry in use)")

    sub.add_parser("schema", help="print the JSON Schema of the registry format")

    p = sub.add_parser("diff", help="cells whose policy differs between two registries")
    p.add_argument("old", metavar="OLD", help="old registry: a file, 'default', or files "
                   "joined with the path separator (layered, like WARPOLICY_CAPABILITIES)")
    p.add_argument("new", metavar="NEW", help="new registry, same form as OLD")
    p.add_argument("--mode", action="append", help="only these modes (repeatable)")
    _add_flag_args(p)
    p.add_argument("--format", choices=FORMATS + ("markdown",), default="text")
    p.add_argument("--exit-code", action="store_true", help="exit 1 when any cell differs")

    p = sub.add_parser("plugins", help="list plugins, their source and the hooks they implement")
    p.add_argument("--format", choices=FORMATS, default="text")

    p = sub.add_parser("audit", help="prove or refute declared read ends on a GPU")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--factory", metavar="MODULE:CALLABLE",
                        help="callable returning the audit target (see README)")
    target.add_argument("--synthetic", metavar="NAME",
                        help="a built-in synthetic backend ('all' for every one)")
    p.add_argument("--modes", nargs="+", metavar="MODE", help="modes to audit")
    p.add_argument("--trials", type=int, default=50, help="trials per mode (default: 50)")
    p.add_argument("--stall-us", type=float, default=None, metavar="US",
                   help="GPU stall inserted around each segment to widen the race window")
    p.add_argument("--device", default=None,
                   help="cuda (default) or fake (a CPU simulation, for demos and tests)")
    p.add_argument("--allow-inconclusive", action="store_true",
                   help="exit 0 when nothing is unsafe even if some declaration stayed "
                        "inconclusive (a failed audit still exits 3)")
    p.add_argument("--format", choices=FORMATS, default="text")

    p = sub.add_parser("bench", help="benchmarks (ratios measured side by side in one run)")
    bench = p.add_subparsers(dest="bench", metavar="BENCH", parser_class=_Parser)
    bench.required = True
    b = bench.add_parser("decide", help="per-step lookup vs the anchor's if-chain (CPU)")
    b.add_argument("--iterations", type=_positive_int, default=200_000)
    b.add_argument("--format", choices=FORMATS, default="text")
    b = bench.add_parser("overlap", help="scheduler overlap per policy on a synthetic decode model (GPU)")
    b.add_argument("--layers", type=_positive_int, default=32)
    b.add_argument("--batch", type=_positive_int, default=32)
    b.add_argument("--steps", type=_positive_int, default=150)
    b.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the streams")
    b.add_argument("--sched-kind", choices=("copy", "latency", "matmul"), default="copy",
                   help="scheduler GPU bookkeeping: a pinned host-to-device upload (default), "
                        "a one-SM spin kernel, or a matmul competing for every SM")
    b.add_argument("--window-us", type=float, default=0.0, metavar="US",
                   help="GPU work before the in-graph read (widens the race window)")
    b.add_argument("--format", choices=FORMATS, default="text")
    b = bench.add_parser("fence", help="in-graph release time and fence host overhead (GPU)")
    b.add_argument("--iterations", type=_positive_int, default=3000)
    b.add_argument("--format", choices=FORMATS, default="text")
    return parser


# -- helpers -------------------------------------------------------------------------------

def _parse_flags(items: Iterable[str]) -> dict[str, bool]:
    from warpolicy.engine import parse_bool

    flags: dict[str, bool] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InputError(f"--flag {item!r}: expected NAME=VALUE")
        flags[name.strip()] = parse_bool(value, f"--flag {name.strip()}")
    return flags


def _facts(args: argparse.Namespace) -> dict:
    external = args.external_events
    if external is None:  # external events exist only on CUDA (torch >= 2.8)
        external = args.platform == "cuda"
    return {"platform": args.platform, "external_events": external,
            "eager": args.eager, "planted": not args.no_plant}


def _engine(files: Optional[Sequence[str]]):
    from warpolicy.engine import PolicyEngine

    return PolicyEngine.load(files)


def _context(args: argparse.Namespace):
    from warpolicy.engine import Context

    return Context(args.backend, args.mode, args.spec, _parse_flags(args.flag), **_facts(args))


def _out(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


# -- commands ------------------------------------------------------------------------------

def cmd_query(args: argparse.Namespace) -> int:
    decision = _engine(args.capabilities).decision(_context(args))
    if args.format == "json":
        _out(json.dumps(decision.to_json(), indent=2))
        return ExitCode.OK
    lines = [decision.policy.label]
    lines += [f"  {r.id}: {r.message}" + (f" [{r.origin}]" if r.origin else "")
              for r in decision.reasons]
    _out("\n".join(lines))
    return ExitCode.OK


def cmd_explain(args: argparse.Namespace) -> int:
    from warpolicy.report import format_explanation

    explanation = _engine(args.capabilities).explain(_context(args))
    if args.format == "json":
        _out(json.dumps(explanation.to_json(), indent=2))
    else:
        _out(format_explanation(explanation))
    return ExitCode.OK


def cmd_table(args: argparse.Namespace) -> int:
    from warpolicy.report import format_table

    engine = _engine(args.capabilities)
    rows = engine.table(args.backend, args.spec, args.mode, _parse_flags(args.flag),
                        **_facts(args))
    _out(format_table(rows, args.format))
    return ExitCode.OK


def cmd_validate(args: argparse.Namespace) -> int:
    from warpolicy.loader import registry_sources, validate_sources
    from warpolicy.plugins import blame_plugins, collect_fragments, get_plugin_manager

    sources: list = list(registry_sources(args.files or None))
    if args.files:  # exactly the given files: installed plugins play no part
        problems = validate_sources(sources)
    else:
        pm = get_plugin_manager()
        sources.extend(collect_fragments(pm))
        problems = blame_plugins(pm, validate_sources(sources))
    if problems:
        sys.stderr.write("".join(f"{p}\n" for p in problems))
        return ExitCode.CHECK_FAILED
    _out(f"ok: {len(sources)} source(s) valid")
    return ExitCode.OK


def cmd_schema(args: argparse.Namespace) -> int:
    from warpolicy.schema import registry_json_schema

    _out(json.dumps(registry_json_schema(), indent=2))
    return ExitCode.OK


def cmd_diff(args: argparse.Namespace) -> int:
    from warpolicy.engine import PolicyEngine
    from warpolicy.report import diff_engines, format_diff

    old = PolicyEngine.load(args.old.split(os.pathsep))
    new = PolicyEngine.load(args.new.split(os.pathsep))
    cells = diff_engines(old, new, args.mode, _parse_flags(args.flag), **_facts(args))
    _out(format_diff(cells, args.format))
    return ExitCode.CHECK_FAILED if cells and args.exit_code else ExitCode.OK


def cmd_plugins(args: argparse.Namespace) -> int:
    from warpolicy.plugins import describe_plugins, get_plugin_manager
    from warpolicy.report import format_plugins

    _out(format_plugins(describe_plugins(get_plugin_manager()), args.format))
    return ExitCode.OK


def cmd_audit(args: argparse.Namespace) -> int:
    from warpolicy.audit import format_audit, run_audit

    extra = {} if args.stall_us is None else {"stall_us": args.stall_us}
    report = run_audit(factory=args.factory, synthetic=args.synthetic, modes=args.modes,
                       trials=args.trials, device=args.device,
                       allow_inconclusive=args.allow_inconclusive, **extra)
    _out(format_audit(report, args.format))
    return report.exit_code


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench == "decide":
        from warpolicy.bench.decide import format_decide, run_decide_bench

        _out(format_decide(run_decide_bench(args.iterations), args.format))
    elif args.bench == "overlap":
        from warpolicy.bench.overlap import format_overlap, run_overlap_bench

        result = run_overlap_bench(layers=args.layers, batch=args.batch, steps=args.steps,
                                   trace=args.trace, sched_kind=args.sched_kind,
                                   window_us=args.window_us)
        _out(format_overlap(result, args.format))
    else:
        from warpolicy.bench.fence import format_fence_bench, run_fence_bench

        _out(format_fence_bench(run_fence_bench(iters=args.iterations), args.format))
    return ExitCode.OK


COMMANDS = {"query": cmd_query, "explain": cmd_explain, "table": cmd_table,
            "validate": cmd_validate, "schema": cmd_schema, "diff": cmd_diff,
            "plugins": cmd_plugins, "audit": cmd_audit, "bench": cmd_bench}


def dispatch(argv: Sequence[str]) -> int:
    """Parse and run one command; known errors propagate as `WarpolicyError`."""
    args = build_parser().parse_args(list(argv))
    return int(COMMANDS[args.command](args))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command and return its `ExitCode`: known errors become one line on stderr."""
    try:
        return dispatch(sys.argv[1:] if argv is None else argv)
    except RegistryError as exc:
        sys.stderr.write("".join(f"warpolicy: {p}\n" for p in exc.problems))
    except WarpolicyError as exc:
        sys.stderr.write(f"warpolicy: {exc}\n")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        # the registry, engine and CLI run without torch; the runtime commands need it
        sys.stderr.write("warpolicy: this command needs PyTorch; install it with "
                         "pip install 'warpolicy[torch]'\n")
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except SystemExit as exc:  # argparse after --help / --version: keep main(argv) -> int
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or ExitCode.OK
        return ExitCode.USAGE
    except BrokenPipeError:
        return ExitCode.OK
    return ExitCode.USAGE


def run() -> None:
    """Console-script entry point."""
    sys.exit(int(main()))
