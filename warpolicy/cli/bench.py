"""``bench``: benchmarks that print ratios measured side by side in one run."""

from __future__ import annotations

import argparse

from warpolicy.bench.canary import format_canary, run_from_args
from warpolicy.bench.decide import format_decide, run_decide_bench
from warpolicy.bench.fence import format_fence_bench, run_fence_bench
from warpolicy.bench.overlap import format_overlap, run_overlap_bench
from warpolicy.bench.overlap_factory import format_factory_overlap, run_factory_overlap
from warpolicy.bench.overlap_spec import format_overlap_spec, run_overlap_spec_bench
from warpolicy.bench.overlap_tp import format_overlap_tp, run_overlap_tp
from warpolicy.cli import common
from warpolicy.cli.common import ExitCode
from warpolicy.errors import InputError
from warpolicy.runtime.nvtx import NvtxPlugin

#: Devices of the GPU benchmarks: ``sim`` is the simulated platform (``fake``: its 0.1 name).
BENCH_DEVICES = ("cuda", "sim", "fake")


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (ratios measured side by side in one run)")
    bench = p.add_subparsers(dest="bench", metavar="BENCH", parser_class=common.Parser)
    bench.required = True
    b = bench.add_parser("decide", help="per-step lookup vs the anchor's if-chain (CPU)")
    b.add_argument("--iterations", type=common.positive_int, default=200_000)
    b.add_argument("--format", choices=common.DATA_FORMATS, default="text")
    b = bench.add_parser(
        "overlap",
        help="scheduler overlap per policy on a synthetic decode model, or on your own model "
        "with --factory (GPU)",
    )
    b.add_argument(
        "--factory",
        metavar="MODULE:CALLABLE",
        help="benchmark your own model: the callable `audit --factory` takes (called with the "
        "platform, returns an AuditSubject or a list); e.g. warpolicy.bench.llama:decode",
    )
    b.add_argument(
        "--layers",
        type=common.positive_int,
        default=None,
        help="synthetic model's layers (default 32)",
    )
    b.add_argument(
        "--batch",
        type=common.positive_int,
        default=None,
        help="synthetic model's batch (default 32)",
    )
    b.add_argument("--steps", type=common.positive_int, default=150)
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
        type=common.positive_int,
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
    b.add_argument("--format", choices=common.DATA_FORMATS, default="text")
    b = bench.add_parser(
        "canary", help="WAR canary: cost per step at 1/1000 and 1/100, release lead (GPU)"
    )
    b.add_argument("--steps", type=common.positive_int, default=3000)
    b.add_argument("--layers", type=common.positive_int, default=16)
    b.add_argument("--batch", type=common.positive_int, default=64)
    b.add_argument("--repeats", type=common.positive_int, default=2)
    b.add_argument(
        "--lead-rate",
        type=float,
        default=0.1,
        metavar="R",
        help="share of steps timed for the lead",
    )
    b.add_argument(
        "--factory",
        default=None,
        metavar="MODULE:CALLABLE",
        help="the models of an audit factory (e.g. warpolicy.bench.llama:decode) instead of "
        "the synthetic decode",
    )
    b.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="ATOL",
        help="with --factory: compare within this absolute tolerance (default bitwise)",
    )
    b.add_argument(
        "--sched-kind",
        choices=("copy", "latency", "matmul"),
        default="copy",
        help="scheduler GPU bookkeeping after its writes, as in bench overlap",
    )
    b.add_argument("--sched-us", type=float, default=300.0, metavar="US")
    b.add_argument("--device", choices=BENCH_DEVICES, default=None, help="cuda (default) or sim")
    b.add_argument("--format", choices=common.DATA_FORMATS, default="text")
    b = bench.add_parser("fence", help="in-graph release time and fence host overhead (GPU)")
    b.add_argument("--iterations", type=common.positive_int, default=3000)
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
    b.add_argument("--format", choices=common.DATA_FORMATS, default="text")
    p.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench == "decide":
        common.out(format_decide(run_decide_bench(args.iterations), args.format))
    elif args.bench == "overlap":
        _bench_overlap(args)
    elif args.bench == "canary":
        common.quiet_torch()
        common.out(format_canary(run_from_args(args), args.format))
    else:
        common.quiet_torch()
        result = run_fence_bench(
            iters=args.iterations, device=args.device, observers=_fence_observers(args)
        )
        common.out(format_fence_bench(result, args.format))
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
    synthetic_only = [
        name
        for name, given in (
            ("--layers", args.layers is not None),
            ("--batch", args.batch is not None),
            ("--window-us", args.window_us is not None),
            ("--model", args.model != "in_graph"),
            ("--tp", args.tp is not None),
            ("--spec-step", args.spec_step),
        )
        if given
    ]
    if args.factory is not None and synthetic_only:
        raise InputError(
            f"bench overlap --factory: {', '.join(synthetic_only)} describe the synthetic "
            "model; the factory's model has its own"
        )
    layers = args.layers if args.layers is not None else 32
    batch = args.batch if args.batch is not None else 32
    common.quiet_torch()
    if args.factory is not None:
        measured = run_factory_overlap(
            args.factory,
            steps=args.steps,
            device=args.device,
            sched_kind=args.sched_kind,
            trace=args.trace,
        )
        common.out(format_factory_overlap(measured, args.format))
        return
    if args.tp is not None:
        extra = {} if args.mismatch_env is None else {"mismatch_env": args.mismatch_env}
        result = run_overlap_tp(
            args.tp,
            layers=layers,
            batch=batch,
            steps=args.steps,
            sched_kind=args.sched_kind,
            device=args.device or "cuda",
            mismatch_rank=args.mismatch_rank,
            strict=args.strict,
            **extra,
        )
        if result is not None:  # under torchrun, ranks other than 0 print nothing
            common.out(format_overlap_tp(result, args.format))
    elif args.spec_step:
        result = run_overlap_spec_bench(batch=batch, steps=args.steps, device=args.device)
        common.out(format_overlap_spec(result, args.format))
    else:
        result = run_overlap_bench(
            layers=layers,
            batch=batch,
            steps=args.steps,
            trace=args.trace,
            sched_kind=args.sched_kind,
            window_us=args.window_us or 0.0,
            device=args.device,
            model_name=args.model,
        )
        common.out(format_overlap(result, args.format))


def _fence_observers(args: argparse.Namespace) -> list[tuple[str, object]]:
    """The observer plugins ``bench fence`` times besides the no-op one (``--metrics``,
    ``--nvtx``)."""
    observers: list[tuple[str, object]] = []
    if args.metrics:
        try:  # a separate distribution (plugins/warpolicy-metrics); optional
            import prometheus_client  # noqa: PLC0415 - optional: the metrics plugin's dependency

            import warpolicy_metrics  # noqa: PLC0415 - optional plugin
        except ImportError as exc:
            raise InputError(
                f"bench fence --metrics needs the warpolicy-metrics plugin "
                f"(pip install plugins/warpolicy-metrics): {exc}"
            ) from None
        observers.append(
            ("metrics", warpolicy_metrics.WarpolicyMetrics(prometheus_client.CollectorRegistry()))
        )
    if args.nvtx:
        observers.append(("nvtx", NvtxPlugin()))
    return observers
