"""The ``warpolicy`` command line.

`main(argv) -> int` does the work and returns an `ExitCode`; `run()` is the console-script
entry. Known errors become one line on stderr and a documented exit code, never a traceback:
bad input, broken plugins, a missing CUDA device, and output that cannot be written (a full
disk, a closed stdout, a terminal encoding that cannot show the text).

Over 400 lines: one argparse parser and one small handler per subcommand, plus the one-line
output and error handling they share; splitting per command would scatter the exit-code rules.
"""

from __future__ import annotations

import argparse
import enum
import functools
import os
import sys
import warnings
from typing import TYPE_CHECKING, Iterable, NoReturn, Optional, Sequence, TypedDict

from warpolicy.errors import InputError, RegistryError, WarpolicyError
from warpolicy.registry.inputs import parse_bool, parse_positive_int
from warpolicy.registry.report import FORMATS

#: Formats of commands whose output is not a table (benchmarks, audit).

if TYPE_CHECKING:  # annotations only: the commands import the engine when they run
    from warpolicy.registry.engine import Context, PolicyEngine

DATA_FORMATS = tuple(f for f in FORMATS if f != "markdown")
#: Devices of the GPU benchmarks: ``sim`` is the simulated platform (``fake``: its 0.1 name).
BENCH_DEVICES = ("cuda", "sim", "fake")


class ExitCode(enum.IntEnum):
    """Documented exit codes of every ``warpolicy`` command."""

    OK = 0
    CHECK_FAILED = 1  # validate found problems; audit found an UNSAFE declaration; diff --exit-code
    USAGE = 2  # bad arguments or input: unknown name, unreadable/invalid registry, broken plugin, no CUDA
    INCONCLUSIVE = (
        3  # audit proved nothing for some declaration (or failed); see --allow-inconclusive
    )
    OUTPUT = 4  # the output could not be written: full disk, closed stdout, unencodable text
    INTERRUPTED = 130


class OutputError(Exception):
    """stdout could not take the output; carries the one line to print on stderr."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    """argparse type for counts (iterations, trials, steps): a traceback-free usage error."""
    try:
        return parse_positive_int(text, "count")
    except InputError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


# -- argument groups shared by several commands ---------------------------------------------


def _add_registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--capabilities",
        action="append",
        metavar="FILE",
        help="registry file (repeatable, layered in order; 'default' names the "
        "packaged one); default: $WARPOLICY_CAPABILITIES or the packaged file",
    )


def _add_flag_args(p: argparse.ArgumentParser, *, what: str = "this query") -> None:
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
    p.add_argument("--platform", default=None, help="platform name (default: cuda)")


def _add_context_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, help="attention backend name")
    p.add_argument(
        "--mode", required=True, help="forward mode (decode, extend, target_verify, ...)"
    )
    p.add_argument("--spec", default="none", help="speculative algorithm (default: none)")
    _add_flag_args(p)
    _add_registry_args(p)
    p.add_argument("--format", choices=FORMATS, default="text")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="warpolicy",
        description=(
            "Decide, explain and audit where an LLM serving engine's forward may release the "
            "scheduler (WAR read-done policy)."
        ),
    )
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
    p.add_argument("--format", choices=FORMATS, default="text")

    p = sub.add_parser("validate", help="check registry files; every problem as FILE:LINE:COL")
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="files to validate, layered (default: the registry in use)",
    )

    sub.add_parser("schema", help="print the JSON Schema of the registry format")

    p = sub.add_parser("diff", help="cells whose policy differs between two registries")
    p.add_argument(
        "old",
        metavar="OLD",
        help="old registry: a file, 'default', or files "
        "joined with the path separator (layered, like WARPOLICY_CAPABILITIES)",
    )
    p.add_argument("new", metavar="NEW", help="new registry, same form as OLD")
    p.add_argument("--mode", action="append", help="only these modes (default: every mode)")
    _add_flag_args(p, what="both sides (default: every combination that a gate tests)")
    p.add_argument(
        "--plugins",
        choices=PLUGIN_MODES,
        default="both",
        help="both: compare without and with installed plugin fragments and report "
        "either (default); none: without; on: with, on both sides; new: OLD "
        "without, NEW with (a plugin's own effect)",
    )
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument(
        "--exit-code",
        action="store_true",
        help="exit 1 when any cell differs (every earlier cell included)",
    )
    p.add_argument(
        "--fail-on",
        choices=("any", "earlier"),
        default=None,
        help="with --exit-code: which changes fail (default any; 'earlier' for CI "
        "checks where a later point is always safe); implies --exit-code",
    )

    p = sub.add_parser("plugins", help="list plugins, their source and the hooks they implement")
    p.add_argument("--format", choices=FORMATS, default="text")

    p = sub.add_parser("audit", help="prove or refute declared read ends on a GPU")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--factory",
        metavar="MODULE:CALLABLE",
        help="callable returning the audit target (see README)",
    )
    target.add_argument(
        "--synthetic", metavar="NAME", help="a built-in synthetic backend ('all' for every one)"
    )
    p.add_argument("--modes", nargs="+", metavar="MODE", help="modes to audit")
    p.add_argument("--trials", type=int, default=50, help="trials per mode (default: 50)")
    p.add_argument(
        "--stall-us",
        type=float,
        default=None,
        metavar="US",
        help="GPU stall inserted around each segment to widen the race window",
    )
    p.add_argument(
        "--device",
        default=None,
        help="cuda (default) or sim (the simulated platform, for demos and tests; "
        "fake is its 0.1 name)",
    )
    p.add_argument(
        "--allow-inconclusive",
        action="store_true",
        help="exit 0 when nothing is unsafe even if some declaration stayed "
        "inconclusive (a failed audit still exits 3)",
    )
    p.add_argument(
        "--placement",
        choices=("declared", "marker", "derived"),
        default="declared",
        help="with --synthetic: where the read-done node goes (default: as declared; "
        "derived: after the last shared reader found in the captured graph)",
    )
    p.add_argument("--format", choices=DATA_FORMATS, default="text")

    p = sub.add_parser("bench", help="benchmarks (ratios measured side by side in one run)")
    bench = p.add_subparsers(dest="bench", metavar="BENCH", parser_class=_Parser)
    bench.required = True
    b = bench.add_parser("decide", help="per-step lookup vs the anchor's if-chain (CPU)")
    b.add_argument("--iterations", type=_positive_int, default=200_000)
    b.add_argument("--format", choices=DATA_FORMATS, default="text")
    b = bench.add_parser(
        "overlap", help="scheduler overlap per policy on a synthetic decode model (GPU)"
    )
    b.add_argument("--layers", type=_positive_int, default=32)
    b.add_argument("--batch", type=_positive_int, default=32)
    b.add_argument("--steps", type=_positive_int, default=150)
    b.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the streams")
    b.add_argument(
        "--sched-kind",
        choices=("copy", "latency", "matmul"),
        default="copy",
        help="scheduler GPU bookkeeping: a pinned host-to-device upload (default), "
        "a one-SM spin kernel, or a matmul competing for every SM",
    )
    b.add_argument(
        "--window-us",
        type=float,
        default=None,
        metavar="US",
        help="GPU work before the in-graph read (widens the race window)",
    )
    b.add_argument(
        "--device",
        choices=BENCH_DEVICES,
        default=None,
        help="cuda (default) or sim: the simulated platform, tiny and host-timed "
        "(exercises the code path; numbers meaningless)",
    )
    b.add_argument(
        "--tp",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tensor parallel: N ranks (one GPU each), every layer ending in an "
        "all-reduce, with the cross-rank consistency check",
    )
    b.add_argument(
        "--mismatch-rank",
        type=int,
        default=None,
        metavar="R",
        help="with --tp: give rank R --mismatch-env (every rank must end coarse)",
    )
    b.add_argument(
        "--mismatch-env",
        default=None,
        metavar="NAME=VALUE",
        help="with --tp: the environment change of --mismatch-rank "
        "(default WARPOLICY_FORCE_COARSE=1)",
    )
    b.add_argument(
        "--strict",
        action="store_true",
        help="with --tp: a cross-rank mismatch raises on every rank",
    )
    b.add_argument(
        "--spec-step",
        action="store_true",
        help="the speculative-step variant (EAGLE-like and DFlash-like phase steps)",
    )
    b.add_argument(
        "--model",
        choices=("in_graph", "first_layer_rebuild"),
        default="in_graph",
        help="the synthetic model: reads in the prep only (default), or a first "
        "layer that rebuilds the metadata from the live table",
    )
    b.add_argument("--format", choices=DATA_FORMATS, default="text")
    b = bench.add_parser("fence", help="in-graph release time and fence host overhead (GPU)")
    b.add_argument("--iterations", type=_positive_int, default=3000)
    b.add_argument(
        "--device",
        choices=BENCH_DEVICES,
        default=None,
        help="cuda (default) or sim: the overhead part on the simulated platform",
    )
    b.add_argument(
        "--metrics",
        action="store_true",
        help="also time a step with the warpolicy-metrics plugin registered",
    )
    b.add_argument(
        "--nvtx",
        action="store_true",
        help="also time a step with the NVTX range observer registered",
    )
    b.add_argument("--format", choices=DATA_FORMATS, default="text")
    return parser


# -- helpers -------------------------------------------------------------------------------


def _parse_flags(items: Iterable[str]) -> dict[str, bool]:
    flags: dict[str, bool] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(f"--flag {item!r}: expected NAME=VALUE")
        if not value.strip():
            raise InputError(
                f"--flag {item!r}: empty value; expected NAME=VALUE with a boolean "
                "(1/0, true/false, yes/no, on/off)"
            )
        flags[name] = parse_bool(value, f"--flag {name}")
    return flags


class _Facts(TypedDict):
    platform: str
    external_events: bool
    eager: bool
    planted: bool


def _facts(args: argparse.Namespace) -> _Facts:
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


def _given_facts(args: argparse.Namespace) -> dict[str, object]:
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


def _engine(
    files: Optional[Sequence[str]],
    *,
    plugins: bool = True,
    environ: Optional[dict[str, str]] = None,
) -> PolicyEngine:
    from warpolicy.registry.engine import PolicyEngine
    from warpolicy.runtime.manager import blame_plugins, collect_fragments, get_plugin_manager

    if not plugins:
        return PolicyEngine.load(files, environ=environ)
    pm = get_plugin_manager()
    return PolicyEngine.load(
        files,
        fragments=collect_fragments(pm),
        blame=functools.partial(blame_plugins, pm),
        environ=environ,
    )


def _context(args: argparse.Namespace) -> Context:
    from warpolicy.registry.engine import Context

    return Context(args.backend, args.mode, args.spec, _parse_flags(args.flag), **_facts(args))


def _out(text: str) -> None:
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


def _quiet_torch() -> None:
    """Import torch once with its import-time warnings silenced (e.g. "Failed to initialize
    NumPy"), so a GPU command without CUDA prints one line, not a warning first. Deferred to
    the commands that need torch; a missing torch is the caller's ModuleNotFoundError."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401  (deferred: only runtime commands need torch)


# -- commands ------------------------------------------------------------------------------


def cmd_query(args: argparse.Namespace) -> int:
    from warpolicy.registry.report import format_decision

    _out(format_decision(_engine(args.capabilities).decision(_context(args)), args.format))
    return ExitCode.OK


def cmd_explain(args: argparse.Namespace) -> int:
    from warpolicy.registry.report import format_explanation

    _out(format_explanation(_engine(args.capabilities).explain(_context(args)), args.format))
    return ExitCode.OK


def cmd_table(args: argparse.Namespace) -> int:
    from warpolicy.registry.report import format_table

    engine = _engine(args.capabilities)
    rows = engine.table(args.backend, args.spec, args.mode, _parse_flags(args.flag), **_facts(args))
    _out(format_table(rows, args.format))
    return ExitCode.OK


def cmd_validate(args: argparse.Namespace) -> int:
    from warpolicy.registry.compare import earlier_layers
    from warpolicy.registry.loader import registry_sources, validate_sources
    from warpolicy.registry.report import layer_warnings
    from warpolicy.runtime.manager import blame_plugins, collect_fragments, get_plugin_manager

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
    for line in layer_warnings(earlier_layers(sources)):  # a warning: layering may be intended
        sys.stderr.write(f"warpolicy: warning: {line}\n")
    _out(f"ok: {len(sources)} source(s) valid")
    return ExitCode.OK


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from warpolicy.registry.schema import registry_json_schema

    _out(json.dumps(registry_json_schema(), indent=2))
    return ExitCode.OK


#: ``diff --plugins``: which sides load installed plugin fragments, per comparison.
PLUGIN_MODES = ("both", "none", "on", "new")
_PLUGIN_RUNS: dict[str, tuple[tuple[Optional[str], bool, bool], ...]] = {
    "none": ((None, False, False),),
    "on": ((None, True, True),),
    "new": ((None, False, True),),
    "both": (("off", False, False), ("on", True, True)),
}


def cmd_diff(args: argparse.Namespace) -> int:
    from warpolicy.registry.compare import cell_space, diff_engines
    from warpolicy.registry.report import format_diff

    fixed: dict[str, object] = {**_parse_flags(args.flag), **_given_facts(args)}
    cells = []
    space = None
    compared = []
    for label, old_plugins, new_plugins in _PLUGIN_RUNS[args.plugins]:
        # no environment: an operator's flag variables must not mask a change
        old = _engine(args.old.split(os.pathsep), plugins=old_plugins, environ={})
        new = _engine(args.new.split(os.pathsep), plugins=new_plugins, environ={})
        if (old.registry, new.registry) in compared:
            continue  # no plugin contributes a fragment: "on" is the same comparison as "off"
        compared.append((old.registry, new.registry))
        for name in fixed:
            if (
                name not in ("platform", "external_events", "eager", "planted")
                and name not in old.registry.flags
                and name not in new.registry.flags
            ):
                new.registry.flag(name)  # raises UnknownNameError with suggestions
        space = cell_space([old.registry, new.registry], modes=args.mode, fixed=fixed)
        cells += diff_engines(old, new, space, label)
    assert space is not None
    _out(format_diff(cells, space, args.format, args.plugins))
    fail_on = args.fail_on or ("any" if args.exit_code else None)
    if (fail_on == "any" and cells) or (
        fail_on == "earlier" and any(c.change == "earlier" for c in cells)
    ):
        return ExitCode.CHECK_FAILED
    return ExitCode.OK


def cmd_plugins(args: argparse.Namespace) -> int:
    from warpolicy.registry.compare import earlier_layers
    from warpolicy.registry.loader import registry_sources
    from warpolicy.registry.report import format_plugins
    from warpolicy.runtime.manager import collect_fragments, describe_plugins, get_plugin_manager

    pm = get_plugin_manager()
    fragments = collect_fragments(pm)
    layers = earlier_layers([*registry_sources(), *fragments]) if fragments else []
    _out(format_plugins(describe_plugins(pm), args.format, layers))
    return ExitCode.OK


def cmd_audit(args: argparse.Namespace) -> int:
    _quiet_torch()
    from warpolicy.audit import format_audit, run_audit

    extra = {} if args.stall_us is None else {"stall_us": args.stall_us}
    report = run_audit(
        factory=args.factory,
        synthetic=args.synthetic,
        modes=args.modes,
        trials=args.trials,
        device=args.device,
        allow_inconclusive=args.allow_inconclusive,
        placement=args.placement,
        **extra,
    )
    _out(format_audit(report, args.format))
    return report.exit_code


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench == "decide":
        from warpolicy.bench.decide import format_decide, run_decide_bench

        _out(format_decide(run_decide_bench(args.iterations), args.format))
    elif args.bench == "overlap":
        _bench_overlap(args)
    else:
        _quiet_torch()
        from warpolicy.bench.fence import format_fence_bench, run_fence_bench

        result = run_fence_bench(
            iters=args.iterations, device=args.device, observers=_fence_observers(args)
        )
        _out(format_fence_bench(result, args.format))
    return ExitCode.OK


def _bench_overlap(args: argparse.Namespace) -> None:
    """``bench overlap``: the single-GPU run, ``--tp N`` or ``--spec-step``."""
    tp_only = [
        name
        for name, given in (
            ("--mismatch-rank", args.mismatch_rank is not None),
            ("--mismatch-env", args.mismatch_env is not None),
            ("--strict", args.strict),
        )
        if given
    ]
    if args.tp is None and tp_only:
        raise InputError(f"bench overlap: {', '.join(tp_only)} only applies with --tp N")
    single_only = [
        name
        for name, given in (
            ("--window-us", args.window_us is not None),
            ("--trace", args.trace is not None),
        )
        if given
    ]
    if args.tp is not None and (single_only or args.spec_step):
        raise InputError(
            f"bench overlap --tp: {', '.join(single_only or ['--spec-step'])} "
            "is not supported with --tp"
        )
    if args.spec_step and single_only:
        raise InputError(
            f"bench overlap --spec-step: {', '.join(single_only)} is not supported with --spec-step"
        )
    _quiet_torch()
    if args.tp is not None:
        from warpolicy.bench.overlap_tp import format_overlap_tp, run_overlap_tp

        extra = {} if args.mismatch_env is None else {"mismatch_env": args.mismatch_env}
        result = run_overlap_tp(
            args.tp,
            layers=args.layers,
            batch=args.batch,
            steps=args.steps,
            sched_kind=args.sched_kind,
            device=args.device or "cuda",
            mismatch_rank=args.mismatch_rank,
            strict=args.strict,
            **extra,
        )
        if result is not None:  # under torchrun, ranks other than 0 print nothing
            _out(format_overlap_tp(result, args.format))
    elif args.spec_step:
        from warpolicy.bench.overlap_spec import format_overlap_spec, run_overlap_spec_bench

        result = run_overlap_spec_bench(batch=args.batch, steps=args.steps, device=args.device)
        _out(format_overlap_spec(result, args.format))
    else:
        from warpolicy.bench.overlap import format_overlap, run_overlap_bench

        result = run_overlap_bench(
            layers=args.layers,
            batch=args.batch,
            steps=args.steps,
            trace=args.trace,
            sched_kind=args.sched_kind,
            window_us=args.window_us or 0.0,
            device=args.device,
            model_name=args.model,
        )
        _out(format_overlap(result, args.format))


def _fence_observers(args: argparse.Namespace) -> list[tuple[str, object]]:
    """The observer plugins ``bench fence`` times besides the no-op one (``--metrics``,
    ``--nvtx``)."""
    observers: list[tuple[str, object]] = []
    if args.metrics:
        try:  # a separate distribution (plugins/warpolicy-metrics); optional
            import prometheus_client

            import warpolicy_metrics  # type: ignore[import-not-found]
        except ImportError as exc:
            raise InputError(
                f"bench fence --metrics needs the warpolicy-metrics plugin "
                f"(pip install plugins/warpolicy-metrics): {exc}"
            ) from None
        observers.append(
            ("metrics", warpolicy_metrics.WarpolicyMetrics(prometheus_client.CollectorRegistry()))
        )
    if args.nvtx:
        from warpolicy.runtime.nvtx import NvtxPlugin

        observers.append(("nvtx", NvtxPlugin()))
    return observers


COMMANDS = {
    "query": cmd_query,
    "explain": cmd_explain,
    "table": cmd_table,
    "validate": cmd_validate,
    "schema": cmd_schema,
    "diff": cmd_diff,
    "plugins": cmd_plugins,
    "audit": cmd_audit,
    "bench": cmd_bench,
}


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def _err(line: str) -> None:
    """One line on stderr; if stderr is gone too, there is nobody left to tell."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(line if line.endswith("\n") else line + "\n")
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command and return its `ExitCode`: known errors become one line on stderr."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = _parse(argv)
    except SystemExit as exc:  # argparse after --help / --version: keep main(argv) -> int
        return _flushed(
            exc.code
            if isinstance(exc.code, int)
            else ExitCode.OK
            if exc.code is None
            else ExitCode.USAGE
        )
    except WarpolicyError as exc:
        _err(f"warpolicy: {exc}")
        return ExitCode.USAGE
    try:
        return int(COMMANDS[args.command](args))
    except OutputError as exc:
        _err(f"warpolicy: {exc}")
        return ExitCode.OUTPUT
    except RegistryError as exc:
        _err("".join(f"warpolicy: {p}\n" for p in exc.problems))
    except WarpolicyError as exc:
        _err(f"warpolicy: {exc}")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        # the registry, engine and CLI run without torch; the runtime commands need it
        _err(
            "warpolicy: this command needs PyTorch; install it with pip install 'warpolicy[torch]'"
        )
    except KeyboardInterrupt:
        _err(f"warpolicy: {args.command} interrupted; no result")
        return ExitCode.INTERRUPTED
    except SystemExit as exc:  # not argparse: a plugin hook called sys.exit mid-command
        _err(
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
        _err("warpolicy: cannot write the output")
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
