"""Test support for warpolicy and for users testing their own plugins and backends.

Nothing in the package imports it (an import-linter contract checks that).

* `sim_platform`, `sim_impl`, `sim_runtime`, `FaultySimPlatform`: the simulated platform with
  fault injection (`warpolicy.testing.sim`);
* `RecModel`: a recording model adapter (`warpolicy.testing.models`);
* pytest fixtures: ``pytest_plugins = ["warpolicy.testing.fixtures"]``;
* `warpolicy.testing.faults`: the fault-injection matrix.

Importing `warpolicy.testing` does not import torch (`RecModel` imports it when built).
"""

from warpolicy.testing.models import ClassMarkModel, RecModel
from warpolicy.testing.sim import (
    FAULT_MODES,
    OPERATIONS,
    Fault,
    FaultySimPlatform,
    InjectedFault,
    sim_impl,
    sim_platform,
    sim_runtime,
)

__all__ = [
    "FAULT_MODES",
    "OPERATIONS",
    "Fault",
    "FaultySimPlatform",
    "InjectedFault",
    "ClassMarkModel",
    "RecModel",
    "sim_impl",
    "sim_platform",
    "sim_runtime",
]
