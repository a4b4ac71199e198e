"""``audit``: prove or refute declared read ends on a GPU (or the simulated platform)."""

from __future__ import annotations

import argparse

from warpolicy.audit import format_audit, run_audit
from warpolicy.cli import common
from warpolicy.cli.progress import add_quiet, progress_for
from warpolicy.registry.report import DATA_FORMATS


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="prove or refute declared read ends on a GPU")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--factory",
        metavar="MODULE:CALLABLE",
        help="callable returning the audit target (see docs/audit.md)",
    )
    target.add_argument(
        "--synthetic", metavar="NAME", help="a built-in synthetic backend ('all' for every one)"
    )
    target.add_argument(
        "--zoo",
        nargs="?",
        const="all",
        metavar="FIXTURES",
        help="run the zoo of field bug shapes (every fixture, or NAME,NAME): each buggy variant "
        "must be detected and each fixed one pass; prints fixture, report, detected by "
        "(dynamic / static / canary), trials and time (docs/zoo.md)",
    )
    p.add_argument("--modes", nargs="+", metavar="MODE", help="modes to audit")
    p.add_argument(
        "--trials",
        type=int,
        default=None,
        help="trials per mode (default: 50; --zoo: 2 on the simulated platform, 10 on a GPU)",
    )
    p.add_argument(
        "--widen-race-us",
        type=float,
        default=None,
        metavar="US",
        help="--zoo: spin this long at the release point to widen race windows (default: "
        "$WARPOLICY_WIDEN_RACE_US, else off)",
    )
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
    p.add_argument(
        "--isolation",
        choices=("auto", "process", "off"),
        default="auto",
        help="process: audit the subjects in a child process, so a device fault (a "
        "device-side assert loses the whole CUDA context) fails only the subject that met it; "
        "auto (default): process on CUDA, off on the simulated platform",
    )
    p.add_argument("--format", choices=DATA_FORMATS, default="text")
    add_quiet(p)

    p.set_defaults(handler=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    common.quiet_torch()
    if args.zoo is not None:
        return cmd_zoo(args)
    extra: dict = {} if args.stall_us is None else {"stall_us": args.stall_us}
    if args.trials is not None:
        extra["trials"] = args.trials
    report = run_audit(
        factory=args.factory,
        synthetic=args.synthetic,
        modes=args.modes,
        device=args.device,
        allow_inconclusive=args.allow_inconclusive,
        placement=args.placement,
        progress=progress_for("warpolicy audit", args.quiet),
        isolate=_isolate(args),
        **extra,
    )
    common.out(format_audit(report, args.format))
    return report.exit_code


def cmd_zoo(args: argparse.Namespace) -> int:
    """``audit --zoo``: exit 0 when every buggy variant was detected and every fixed one passed,
    1 when one was not, 3 when a variant could not be judged (`warpolicy.audit.zoo.run`)."""
    from warpolicy.audit.api import describe_device, platform_for  # noqa: PLC0415 - deferred: imports torch
    from warpolicy.audit.zoo import format_zoo, parse_fixtures, run_zoo  # noqa: PLC0415 - deferred: imports torch
    from warpolicy.runtime.runners.widen import RaceWidener  # noqa: PLC0415 - deferred: imports torch

    fixtures = parse_fixtures(args.zoo)  # unknown names: one line, before any device work
    widener = RaceWidener.resolve(args.widen_race_us)
    platform = platform_for(args.device)
    report = run_zoo(platform, fixtures, args.trials, widener, device=describe_device(platform))
    common.out(format_zoo(report, args.format))
    return report.exit_code


def _isolate(args: argparse.Namespace) -> bool:
    """``--isolation``: auto isolates on CUDA (the default device), never on the simulated one."""
    if args.isolation != "auto":
        return bool(args.isolation == "process")
    from warpolicy.runtime.platforms import device_type  # noqa: PLC0415 - deferred: keeps the CLI's import light

    return device_type(args.device or "cuda") == "cuda"
