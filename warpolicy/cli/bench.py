"""``bench``: benchmarks that print ratios measured side by side in one run.

One subcommand per benchmark, each declared by its own module (`warpolicy.bench.command.
Benchmark`: its options, how it measures); this module adds them and prints their report as
text or JSON.
"""

from __future__ import annotations

import argparse
import functools

from warpolicy.bench import canary, decide, fence, overlap_command
from warpolicy.bench.command import Benchmark
from warpolicy.cli import common
from warpolicy.cli.common import ExitCode
from warpolicy.registry.report import DATA_FORMATS

#: The subcommands, in the order ``warpolicy bench --help`` lists them.
BENCHMARKS: tuple[Benchmark, ...] = (
    decide.BENCHMARK,
    overlap_command.BENCHMARK,
    canary.BENCHMARK,
    fence.BENCHMARK,
)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (ratios measured side by side in one run)")
    commands = p.add_subparsers(dest="bench", metavar="BENCH", parser_class=common.Parser)
    commands.required = True
    for benchmark in BENCHMARKS:
        b = commands.add_parser(benchmark.name, help=benchmark.help)
        benchmark.add_options(b)
        b.add_argument("--format", choices=DATA_FORMATS, default="text")
        b.set_defaults(handler=functools.partial(cmd_bench, benchmark))


def cmd_bench(benchmark: Benchmark, args: argparse.Namespace) -> int:
    if benchmark.torch:
        common.quiet_torch()
    report = benchmark.measure(args)
    if report is not None:  # None: a torchrun rank other than 0 prints nothing
        common.out(report.render(args.format))
    return ExitCode.OK
