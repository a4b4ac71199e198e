"""``python -m warpolicy.testing.faults [--full] [--scenario NAME ...] [--target NAME ...]``:
run the fault matrix and print its table; exit 1 when any case releases early or reads stale."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

from warpolicy.testing.faults import SCENARIOS, TARGETS, cases, format_matrix, run_cases
from warpolicy.testing.faults.controls import controls_hold, format_controls, run_controls
from warpolicy.testing.faults.report import MatrixResult


def main(argv: Optional[Sequence[str]] = None) -> int:
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
    args = parser.parse_args(argv)
    start = time.process_time()
    if args.controls:
        runs = run_controls()
        print(format_controls(runs))
        return 0 if controls_hold(runs) else 1
    selected = list(cases(full=args.full, scenarios=args.scenario, targets=args.target))
    result = MatrixResult(tuple(run_cases(selected)))
    print(format_matrix(result, scenarios=args.by_scenario))
    print(f"\n{time.process_time() - start:.1f} s CPU")
    return 1 if result.early or result.stale else 0


if __name__ == "__main__":
    sys.exit(main())
