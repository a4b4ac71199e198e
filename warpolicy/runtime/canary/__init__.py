"""The WAR canary: catch an early release in a running engine, then fail closed.

* `Canary` (one per process), `CanaryConfig` (off by default), `CanarySession` (one per runner,
  or per mode of an engine's own graphs), `Violation`, `CanaryCell`, `CanaryError`
  (`warpolicy.runtime.canary.core`);
* `CanarySpec`, `Snapshot`, `Whole`, `Rows`: what an adapter tells the canary about a step
  (`warpolicy.runtime.canary.state`);
* `Tolerance`, `Difference`, `first_difference`, `flatten_outputs`: comparing results, shared
  with the dynamic audit (`warpolicy.runtime.canary.compare`);
* `ReleaseLeadProbe`, `LeadSummary`, `LeadKey`, clocks: the release lead measured live
  (`warpolicy.runtime.canary.lead`).

docs/canary.md says how to run it in production, what it can and cannot catch, and what to
alert on.
"""

from warpolicy.runtime.canary.compare import (
    Difference,
    Tolerance,
    first_difference,
    flatten_outputs,
)
from warpolicy.runtime.canary.core import (
    DEFAULT_MAX_BYTES,
    Canary,
    CanaryCell,
    CanaryConfig,
    CanaryError,
    CanarySession,
    Sample,
    Violation,
)
from warpolicy.runtime.canary.lead import (
    CudaLeadClock,
    HostLeadClock,
    LeadClock,
    LeadKey,
    LeadMark,
    LeadSummary,
    ReleaseLeadProbe,
)
from warpolicy.runtime.canary.state import CanarySpec, Rows, Snapshot, Whole, as_snapshot

__all__ = [
    "DEFAULT_MAX_BYTES",
    "Canary",
    "CanaryCell",
    "CanaryConfig",
    "CanaryError",
    "CanarySession",
    "CanarySpec",
    "CudaLeadClock",
    "Difference",
    "HostLeadClock",
    "LeadClock",
    "LeadKey",
    "LeadMark",
    "LeadSummary",
    "ReleaseLeadProbe",
    "Rows",
    "Sample",
    "Snapshot",
    "Tolerance",
    "Violation",
    "Whole",
    "as_snapshot",
    "first_difference",
    "flatten_outputs",
]
