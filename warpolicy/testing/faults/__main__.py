"""``python -m warpolicy.testing.faults [--full] [--scenario NAME ...] [--target NAME ...]
[--two-faults [--sample N] [--seed S]]``: run the fault matrix and print its table; exit 1 when
any case releases early or reads stale. ``--two-faults`` runs the two-fault mode instead (a
second fault in the fallback after the first; ``--sample 0``: every such case)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from warpolicy.testing.faults import SCENARIOS, TARGETS, cases, format_matrix, run_cases
from warpolicy.testing.faults.controls import controls_hold, format_controls, run_controls
from warpolicy.testing.faults.matrix import TWO_FAULT_SAMPLE, TWO_FAULT_SEED, two_fault_cases
from warpolicy.testing.faults.report import MatrixResult


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warpolicy.testing.faults")
    parser.add_argument("--full", action="store_true", help="every n-th call, not a sample")
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--target", action="append", choices=["(no fault)", *TARGETS])
    parser.add_argument("--by-scenario", action="store_true", help="also a row per scenario")
    parser.add_argument(
        "--controls",
        action="store_true",
        help="run the positive controls only (exit 1 unless each fails)",
    )
    parser.add_argument(
        "--two-faults",
        action="store_true",
        help="a second fault (an interrupt) in the fallback after the first",
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=TWO_FAULT_SAMPLE,
        help=f"two-fault cases to draw (default {TWO_FAULT_SAMPLE}; 0: all)",
    )
    parser.add_argument("--seed", type=int, default=TWO_FAULT_SEED, help="the sample's seed")
    args = parser.parse_args(argv)
    start = time.process_time()
    if args.controls:
        runs = run_controls()
        print(format_controls(runs))
        return 0 if controls_hold(runs) else 1
    if args.two_faults:
        selected = two_fault_cases(
            sample=args.sample or None, seed=args.seed, scenarios=args.scenario
        )
    else:
        selected = list(cases(full=args.full, scenarios=args.scenario, targets=args.target))
    result = MatrixResult(tuple(run_cases(selected)))
    print(format_matrix(result, scenarios=args.by_scenario))
    print(f"\n{time.process_time() - start:.1f} s CPU")
    return 1 if result.early or result.stale else 0


if __name__ == "__main__":
    sys.exit(main())
