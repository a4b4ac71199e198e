"""The simulated platform for tests: fault injection on top of the product `SimPlatform`.

`sim_platform()` gives a `Platform` on a fresh `FaultySimPlatform` (its own call log, clocks and
faults); `sim_impl(platform)` returns that implementation typed; `sim_runtime()` adds a fresh
plugin manager (built-ins only, no entry points, an empty environment) and its observers, as
the composition root would build them.

`FaultySimPlatform.inject(op, mode, when)` makes any platform operation (`OPERATIONS`: every
`PlatformImpl` method and the graph-walk methods) raise `InjectedFault`, return None, or act and
then raise, whenever ``when()`` holds. The product platform has none of this: a fault check per
call costs time on every step of every CPU run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs

from warpolicy.runtime.manager import Runtime, new_plugin_manager
from warpolicy.runtime.platforms import GRAPH_WALK_METHODS, PLATFORM_OPERATIONS, Platform
from warpolicy.runtime.platforms.sim import DEFAULT_LOG_CAP, SimPlatform

#: The operations `FaultySimPlatform.inject` can make fail.
OPERATIONS = (*PLATFORM_OPERATIONS, *GRAPH_WALK_METHODS)

#: Fault modes: raise (nothing done), return None (nothing done), act then raise.
FAULT_MODES = ("raise", "none", "act_then_raise")


class InjectedFault(RuntimeError):
    """The error an injected ``raise`` / ``act_then_raise`` fault raises."""


@attrs.define(eq=False)
class Fault:
    """An injected failure of one operation; ``fired`` counts the calls it hit."""

    op: str
    mode: str
    when: Callable[[], bool] | None = None
    fired: int = 0


def _faultable(op: str) -> Callable[..., Any]:
    base = getattr(SimPlatform, op)

    @functools.wraps(base)
    def method(self: FaultySimPlatform, *args: Any, **kwargs: Any) -> Any:
        fault = self.faults.get(op)
        if fault is None or (fault.when is not None and not fault.when()):
            return base(self, *args, **kwargs)
        fault.fired += 1
        if fault.mode == "none":
            return None
        if fault.mode == "act_then_raise":
            base(self, *args, **kwargs)
        raise InjectedFault(f"sim: injected {fault.mode} in {op}")

    return method


class FaultySimPlatform(SimPlatform):
    """`SimPlatform` whose every operation can be made to fail (`inject`)."""

    def __init__(
        self, external_events: bool = True, *, device: str = "sim", log_cap: int = DEFAULT_LOG_CAP
    ) -> None:
        super().__init__(external_events, device=device, log_cap=log_cap)
        self.faults: dict[str, Fault] = {}

    def inject(self, op: str, mode: str = "raise", when: Callable[[], bool] | None = None) -> Fault:
        """Make operation ``op`` fail: ``"raise"`` (`InjectedFault`, nothing done), ``"none"``
        (return None, nothing done) or ``"act_then_raise"`` (do it, then raise), whenever
        ``when()`` is true (always by default). Replaces an earlier fault of ``op``."""
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode must be one of {', '.join(FAULT_MODES)}, not {mode!r}")
        if op not in OPERATIONS:
            raise ValueError(f"{op!r} is not a simulated platform operation")
        fault = Fault(op, mode, when)
        self.faults[op] = fault
        return fault

    def clear_faults(self) -> None:
        self.faults.clear()


for _op in OPERATIONS:
    setattr(FaultySimPlatform, _op, _faultable(_op))


def sim_platform(*, external_events: bool = True, log_cap: int | None = None) -> Platform:
    """A `Platform` on a fresh `FaultySimPlatform` (``platform.impl``)."""
    impl = FaultySimPlatform(
        external_events, log_cap=DEFAULT_LOG_CAP if log_cap is None else log_cap
    )
    return Platform(impl)


def sim_impl(platform: Platform) -> FaultySimPlatform:
    """The `FaultySimPlatform` behind ``platform`` (typed access to faults, log and clocks)."""
    if not isinstance(platform.impl, FaultySimPlatform):
        raise LookupError(f"{platform!r} is not a platform from warpolicy.testing.sim_platform()")
    return platform.impl


def sim_runtime(*, external_events: bool = True, log_cap: int | None = None) -> Runtime:
    """A `Runtime` on `sim_platform()` with a fresh plugin manager (built-ins only, no entry
    points, an empty environment): register observer plugins on ``runtime.pm``."""
    pm = new_plugin_manager(load_entry_points=False, environ={})
    return Runtime(pm, sim_platform(external_events=external_events, log_cap=log_cap), pm.observers)


__all__ = [
    "FAULT_MODES",
    "OPERATIONS",
    "Fault",
    "FaultySimPlatform",
    "InjectedFault",
    "sim_impl",
    "sim_platform",
    "sim_runtime",
]
