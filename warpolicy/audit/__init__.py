"""Prove or refute a backend's declared read end on the GPU.

* `run_audit` / `format_audit`: what ``warpolicy audit`` calls;
* `warpolicy.audit.dynamic`: the differential race test (poison at the release, compare);
* `warpolicy.audit.static`: the walk of the captured graph (late readers of shared buffers);
* `warpolicy.audit.report`: verdicts and results;
* synthetic backends for self-test and demos live in `warpolicy.testing.synthetic`.

Importing this package does not import torch; the audit itself needs it.
"""

from warpolicy.audit.api import ALL, parse_modes, parse_synthetic, resolve_factory, run_audit
from warpolicy.audit.dynamic import DEFAULT_STALL_US, AuditSubject, StalledModel, audit_mode
from warpolicy.audit.report import (FORMATS, STATIC_BLIND_SPOTS, AuditEntry, AuditReport,
                                    DynamicResult, Mismatch, Offender, StaticResult, Verdict,
                                    format_audit)

__all__ = [
    "ALL", "AuditEntry", "AuditReport", "AuditSubject", "DEFAULT_STALL_US", "DynamicResult",
    "FORMATS", "Mismatch", "Offender", "STATIC_BLIND_SPOTS", "StalledModel", "StaticResult",
    "Verdict", "audit_mode", "format_audit", "parse_modes", "parse_synthetic",
    "resolve_factory", "run_audit",
]
