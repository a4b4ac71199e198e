"""Faults: what fails, how, and when (the n-th call of a target, or every call in a phase).

A *target* is anything the runtime calls that can fail: a platform operation (including the
graph-walk probe and the walk itself), a model callback, the scheduler's ``write_next``, the
policy callable, or an observer hook. The harness routes every such call through
`Injector.call`, which counts it and, when the armed `Fault` is due, makes it fail:

* ``raise``: raise `InjectedError` (a ``RuntimeError``) without doing the work;
* ``interrupt``: raise ``KeyboardInterrupt`` without doing the work;
* ``base``: raise `InjectedBaseException` (a ``BaseException`` that is neither ``Exception``
  nor ``KeyboardInterrupt``) without doing the work;
* ``none``: return None without doing the work;
* ``act_then_raise``: do the work, then raise `InjectedError`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs

#: How a fault fails (see the module docstring).
MODES = ("raise", "interrupt", "base", "none", "act_then_raise")
#: The modes that raise (an observer hook has no result, so ``none`` means nothing there).
RAISING_MODES = ("raise", "interrupt", "base", "act_then_raise")
#: The per-batch action hook's modes: every mode, plus answering ``False`` or a truthy non-bool
#: (``1``) without acting.
ACTION_MODES = (*MODES, "false", "nonbool")
#: Modes only the positive controls use: ``lie`` answers True without acting (a broken action
#: plugin, outside the runtime: the matrix never injects it).
CONTROL_MODES = ("lie",)

#: Phases of a scenario a fault can be armed for (every call of the target while in it).
PHASES = ("capture", "recapture", "wait", "run", "barrier", "write")


class InjectedError(RuntimeError):
    """The ``RuntimeError`` an injected ``raise`` / ``act_then_raise`` fault raises."""


class InjectedBaseException(BaseException):
    """Another ``BaseException``: neither ``Exception`` nor ``KeyboardInterrupt``."""


class InjectedInterrupt(KeyboardInterrupt):
    """The ``KeyboardInterrupt`` an ``interrupt`` fault raises (a subclass, so the harness can
    tell it from a real Ctrl-C, which it lets through)."""


def injected(error: BaseException) -> bool:
    """Whether ``error`` is an injected failure (or any ordinary exception), i.e. something the
    engine carries on after; a real ``KeyboardInterrupt`` or ``SystemExit`` is not."""
    if isinstance(error, (InjectedInterrupt, InjectedBaseException, Exception)):
        return True
    return not isinstance(error, (KeyboardInterrupt, SystemExit))


@attrs.frozen
class Fault:
    """One injected failure of ``target``: its ``nth`` call (1-based), every call while the
    scenario is in ``phase``, or (both given) its ``nth`` call in ``phase``."""

    target: str
    mode: str = attrs.field(validator=attrs.validators.in_(ACTION_MODES + CONTROL_MODES))
    nth: int | None = None
    phase: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(PHASES))
    )

    def __attrs_post_init__(self) -> None:
        if self.nth is None and self.phase is None:
            raise ValueError("a fault fires on the n-th call, in a phase, or both")

    @property
    def when(self) -> str:
        if self.phase is None:
            return f"call {self.nth}"
        return f"phase {self.phase}" if self.nth is None else f"call {self.nth} of {self.phase}"

    def due(self, count: int, phase: str, count_in_phase: int) -> bool:
        """Whether the call numbered ``count`` (``count_in_phase`` in ``phase``) fails."""
        if self.phase is not None and self.phase != phase:
            return False
        if self.nth is None:
            return True
        return self.nth == (count if self.phase is None else count_in_phase)

    def describe(self) -> str:
        return f"{self.target} {self.mode} at {self.when}"


def fail(fault: Fault, act: Callable[[], Any]) -> Any:
    """Make one call fail as ``fault`` says (``act`` does the call's work)."""
    if fault.mode == "none":
        return None
    if fault.mode == "false":
        return False
    if fault.mode == "nonbool":
        return 1
    if fault.mode == "lie":
        return True
    if fault.mode == "act_then_raise":
        act()
    where = fault.describe()
    if fault.mode == "interrupt":
        raise InjectedInterrupt(f"injected: {where}")
    if fault.mode == "base":
        raise InjectedBaseException(f"injected: {where}")
    raise InjectedError(f"injected: {where}")


class Injector:
    """Counts calls per target and fires the armed faults when they are due.

    ``faults`` are the case's fault first, then any trigger (a second fault that makes the
    runtime take the path the first one aims at); ``fired`` counts the first one's hits.
    ``second`` (the two-fault mode) arms once the first fault has fired: its ``nth`` counts the
    calls of its target from then on (its phase, if any, still applies), so it lands in the
    fallback the first fault sent the runtime down; ``fired_second`` counts its hits.
    ``phase`` is the scenario's current phase; calls made while `quiet` (the harness's own
    calls to the platform, as the engine) are neither counted nor faulted. Thread-safe counts.
    """

    def __init__(
        self,
        *faults: Fault,
        second: Fault | None = None,
        on_fire: Callable[[], None] | None = None,
    ) -> None:
        self.faults = faults
        self.second = second
        self.on_fire = on_fire
        self.phase = "setup"
        self.calls: dict[str, int] = {}
        self.by_phase: dict[tuple[str, str], int] = {}
        self.fired = 0
        self.fired_second = 0
        self._after_first: dict[str, int] = {}  # calls per target since the first fault fired
        self._lock = threading.Lock()
        self._quiet = threading.local()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """The harness's own calls (the engine's, not the runtime's): never faulted."""
        depth = getattr(self._quiet, "depth", 0)
        self._quiet.depth = depth + 1
        try:
            yield
        finally:
            self._quiet.depth = depth

    def call(self, target: str, act: Callable[[], Any]) -> Any:
        """Run ``act`` as one call of ``target``, failing it when the fault is due."""
        if getattr(self._quiet, "depth", 0):
            return act()
        with self._lock:
            count = self.calls[target] = self.calls.get(target, 0) + 1
            key = (target, self.phase)
            in_phase = self.by_phase[key] = self.by_phase.get(key, 0) + 1
            second = self._second_due(target)
            due = [
                i
                for i, f in enumerate(self.faults)
                if f.target == target and f.due(count, self.phase, in_phase)
            ]
            if second is None and due and due[0] == 0:
                self.fired += 1
        if second is not None:
            return fail(second, act)
        if not due:
            return act()
        if self.on_fire is not None:
            self.on_fire()
        return fail(self.faults[due[0]], act)

    def _second_due(self, target: str) -> Fault | None:
        """The second fault, when this call is the one it fails (under the lock)."""
        second = self.second
        if second is None or not self.fired or second.target != target:
            return None
        count = self._after_first[target] = self._after_first.get(target, 0) + 1
        if second.phase is not None and second.phase != self.phase:
            return None
        if second.nth is not None and second.nth != count:
            return None
        self.fired_second += 1
        return second

    def wrap(self, target: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` with its calls routed through `call` as ``target``."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return self.call(target, lambda: function(*args, **kwargs))

        wrapped.__name__ = getattr(function, "__name__", target)
        return wrapped
