"""A fault matrix that can fail: faults injected into the runtime on the simulated platform,
judged by an independent happens-before oracle over the platform's call log.

Parts, in dependency order:

* `oracle`: vector clocks from the call log alone (not the simulated platform's own clocks);
* `injection`: faults (target, mode, n-th call or phase) and the `Injector`;
* `model`: the engine's parts the harness plays (a model with shared buffers and a graph model,
  observers, a policy callable), each callback a fault target;
* `harness`: one case's platform (every operation faultable), oracle and bookkeeping;
* `scenarios`: runners of every kind, streams, a lagging scheduler, two threads;
* `matrix`: the cases and how one runs;
* `controls`: positive controls (each must show early releases) and negative ones;
* `report`: the table per target.

Run ``python -m warpolicy.testing.faults`` (``--full`` for every n-th call) for the table.
"""

from warpolicy.testing.faults.injection import (
    MODES,
    PHASES,
    Fault,
    InjectedBaseException,
    InjectedError,
    InjectedInterrupt,
)
from warpolicy.testing.faults.matrix import TARGETS, Case, CaseResult, cases, run_case, run_cases
from warpolicy.testing.faults.oracle import Oracle, Verdict
from warpolicy.testing.faults.report import MatrixResult, format_matrix
from warpolicy.testing.faults.scenarios import SCENARIOS


def run_fault_matrix(*, full: bool = False, **selection: object) -> MatrixResult:
    """Run the matrix (``full``: every n-th call; ``scenarios=`` / ``targets=``: a subset)."""
    return MatrixResult(tuple(run_cases(list(cases(full=full, **selection)))))  # type: ignore[arg-type]


__all__ = [
    "MODES",
    "PHASES",
    "SCENARIOS",
    "TARGETS",
    "Case",
    "CaseResult",
    "Fault",
    "InjectedBaseException",
    "InjectedError",
    "InjectedInterrupt",
    "MatrixResult",
    "Oracle",
    "Verdict",
    "cases",
    "format_matrix",
    "run_case",
    "run_cases",
    "run_fault_matrix",
]
