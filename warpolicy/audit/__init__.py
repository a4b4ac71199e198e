"""Prove or refute a backend's declared read end on the GPU.

* `run_audit` / `format_audit`: what ``warpolicy audit`` calls (`warpolicy.audit.api`);
* `warpolicy.audit.subject`: `AuditSubject` (what a factory returns) and the GPU stalls;
* `warpolicy.audit.dynamic`: the differential race test (poison at the release, compare);
* `warpolicy.audit.poison`: the poison set per dtype and the output comparison;
* `warpolicy.audit.static`: the walk of every captured graph (late readers of shared buffers,
  read through `warpolicy.runtime.graphwalk`), with the verdicts in `warpolicy.audit.graph` and the
  choice of graph in `warpolicy.audit.cuda_graph`;
* `warpolicy.audit.report`: verdicts, results and exit codes;
* `warpolicy.audit.synthetic` / `warpolicy.audit.synthetic_model`: the synthetic backends behind
  ``--synthetic`` (the model also drives ``bench overlap``).

Importing this package does not import torch; the audit itself needs it.
"""

from warpolicy.audit.api import ALL, parse_modes, parse_synthetic, resolve_factory, run_audit
from warpolicy.audit.dynamic import MIN_TRIALS, audit_mode
from warpolicy.audit.report import (
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    EXIT_UNSAFE,
    FORMATS,
    STATIC_BLIND_SPOTS,
    AuditEntry,
    AuditReport,
    DynamicResult,
    Mismatch,
    Offender,
    Refutation,
    StaticResult,
    Verdict,
    format_audit,
)
from warpolicy.audit.subject import (
    DEFAULT_STALL_US,
    AuditSubject,
    StalledCanaryModel,
    StalledModel,
    stalled_model,
)

__all__ = [
    "ALL",
    "AuditEntry",
    "AuditReport",
    "AuditSubject",
    "DEFAULT_STALL_US",
    "DynamicResult",
    "EXIT_INCONCLUSIVE",
    "EXIT_OK",
    "EXIT_UNSAFE",
    "FORMATS",
    "MIN_TRIALS",
    "Mismatch",
    "Offender",
    "Refutation",
    "STATIC_BLIND_SPOTS",
    "StalledCanaryModel",
    "StalledModel",
    "stalled_model",
    "StaticResult",
    "Verdict",
    "audit_mode",
    "format_audit",
    "parse_modes",
    "parse_synthetic",
    "resolve_factory",
    "run_audit",
]
