"""``audit``: prove or refute declared read ends on a GPU (or the simulated platform)."""

from __future__ import annotations

import argparse

from warpolicy.audit import format_audit, run_audit
from warpolicy.cli import common
from warpolicy.registry.report import DATA_FORMATS


def add_commands(sub: argparse._SubParsersAction) -> None:
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

    p.set_defaults(handler=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    common.quiet_torch()

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
    common.out(format_audit(report, args.format))
    return report.exit_code
