"""Fault-injection matrix of the fence and the overlap loop, on the simulated platform (CPU).

Every case injects one fault: a platform operation (`warpolicy.runtime.platforms.sim.OPERATIONS`) or an
observer hook, in one phase of a runner's life, under one policy, in one mode (raise, return
None, act then raise). The case then captures a two-bucket decode runner, runs six scheduler
steps through `OverlapLoop` (graph replays, eager steps, a re-capture in the middle) and checks
on the simulated platform's happens-before model that

* every scheduler write is ordered after every shared read the forward already made
  (a write that is not is an **early release**, the one thing that must never happen), and
* every shared read is ordered after the scheduler's previous writes (a **stale read**).

The model reads shared state at the latest point its policy allows (``pre_replay``: the host
prep; ``in_graph``: the in-graph prep; ``post_replay`` / ``none``: the forward), so any fence
error that releases early is caught.

"Return None" applies to operations that return a handle or a flag; for the others (record,
waits, replay, capture_callable, synchronize) returning nothing *is* success, and an
implementation that silently skips its work cannot be told from a correct one by any caller.

Run ``python -m warpolicy.testing.faults`` for the table; ``run_fault_matrix`` returns it.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import attrs

from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    PRE_REPLAY,
    ForwardMode,
    WarReadDonePolicy,
)
from warpolicy.runtime import hookspecs
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.platforms.sim import Mark, SimPlatform
from warpolicy.runtime.runners.decode import DecodeRunner
from warpolicy.runtime.runners.overlap import OverlapLoop
from warpolicy.testing.sim import FAULT_MODES, OPERATIONS, FaultySimPlatform

#: Phases of a runner's life a fault can be armed in.
PHASES = (
    "prepare",
    "capture",
    "launch",
    "before_replay",
    "replay",
    "after_replay",
    "take",
    "barrier",
    "write",
)
POLICIES = (PRE_REPLAY, IN_GRAPH, POST_REPLAY, NONE)
#: Operations that return a handle or a flag (the only ones "return None" applies to).
VALUED_OPERATIONS = (
    "create_event",
    "is_capturing",
    "new_stream",
    "current_stream",
    "use_stream",
    "new_graph",
    "graph_pool",
    "capture",
)
OBSERVER_MODES = ("raise", "act_then_raise")
BATCHES = (2, 4, 8, 3, 2, 8)  # batch sizes per step: buckets 2 and 4, eager for 8
RECAPTURE_AFTER = 3  # steps before the runner captures again (after draining, as it must)

_READ_AT = {
    PRE_REPLAY: "host_prep",
    IN_GRAPH: "graph_prep",
    POST_REPLAY: "forward",
    NONE: "forward",
}


@attrs.frozen
class Case:
    target: str  # a platform operation or an observer hook
    phase: str
    policy: WarReadDonePolicy
    mode: str


@attrs.frozen
class CaseResult:
    case: Case
    fired: int  # how often the fault was hit
    early_releases: int  # writes not ordered after a read the forward already made
    stale_reads: int  # reads not ordered after the scheduler's previous writes
    errors: int  # exceptions that reached the caller
    warnings: int  # fail-closed warnings


class _State:
    """The harness's current phase, the armed fault and the happens-before checker."""

    def __init__(self, impl: SimPlatform) -> None:
        self.impl = impl
        self.phase = "setup"
        self.armed: Optional[Case] = None
        self.fired = 0
        self.reads: list[Mark] = []
        self.last_write: Optional[Mark] = None
        self.early = 0
        self.stale = 0

    def on(self, target: str) -> bool:
        case = self.armed
        return case is not None and case.target == target and case.phase == self.phase

    def read(self) -> None:
        mark = self.impl.mark("read")
        if not mark.executed:  # captured work does not run
            return
        if self.last_write is not None and not self.impl.happens_before(self.last_write, mark):
            self.stale += 1
        self.reads.append(mark)

    def write(self) -> None:
        mark = self.impl.mark("write")
        self.early += sum(1 for r in self.reads if not self.impl.happens_before(r, mark))
        self.reads = []
        self.last_write = mark


class _Model:
    """A `ModelAdapter` that reads shared state at ``read_at`` (and nowhere later)."""

    shared_buffers: Mapping[str, Any] = {}

    def __init__(self, state: _State, read_at: str) -> None:
        self.state = state
        self.read_at = read_at

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return (2, 4)

    def prepare_bucket(self, bucket: int) -> None:
        pass

    def host_prep(self, batch: Any, bucket: int) -> None:
        if self.read_at == "host_prep":
            self.state.read()

    def graph_prep(self, bucket: int) -> None:
        if self.read_at in ("graph_prep", "forward"):
            self.state.read()

    def forward(self, bucket: int) -> Any:
        if self.read_at == "forward":
            self.state.read()
        return bucket


class _FaultyObservers:
    """Every observer hook; raises (after doing its no-op work) when armed."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def _maybe_fail(self, hook: str) -> None:
        if self.state.on(hook):
            self.state.fired += 1
            raise RuntimeError(f"injected failure in observer {hook}")

    @hookimpl
    def warpolicy_on_decision(self, decision: Any, where: str) -> None:
        self._maybe_fail("warpolicy_on_decision")

    @hookimpl
    def warpolicy_on_publish(self, runner: str, step: int, policy: Any, event: Any) -> None:
        self._maybe_fail("warpolicy_on_publish")

    @hookimpl
    def warpolicy_on_barrier(
        self, runner: str, step: Optional[int], kind: str, reason: str
    ) -> None:
        self._maybe_fail("warpolicy_on_barrier")

    @hookimpl
    def warpolicy_on_fallback(self, where: str, error: BaseException) -> None:
        self._maybe_fail("warpolicy_on_fallback")

    @hookimpl
    def warpolicy_on_demotion(self, runner: str, bucket: int, reason: str) -> None:
        self._maybe_fail("warpolicy_on_demotion")


def _in_phase(
    state: _State, phase: str, fn: Callable[..., Any], after: Optional[str] = None
) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        outer, state.phase = state.phase, phase
        try:
            return fn(*args, **kwargs)
        finally:
            state.phase = after if after is not None else outer

    return wrapped


class _Probe:
    def __init__(self, state: _State) -> None:
        self.state = state

    def mark(self, point: str, stream: Any) -> None:
        if point == "released":
            self.state.phase = "write"


def cases() -> Iterator[Case]:
    """Every case of the matrix, in a stable order."""
    for target, phase, policy in itertools.product(OPERATIONS, PHASES, POLICIES):
        for mode in FAULT_MODES:
            if mode == "none" and target not in VALUED_OPERATIONS:
                continue
            yield Case(target, phase, policy, mode)
    for target, phase, policy, mode in itertools.product(
        hookspecs.OBSERVER_HOOKS, PHASES, POLICIES, OBSERVER_MODES
    ):
        yield Case(target, phase, policy, mode)


def run_case(case: Case) -> CaseResult:
    """Run one case from a fresh plugin manager and platform."""
    impl = FaultySimPlatform(log_cap=64)
    state = _State(impl)
    pm = new_plugin_manager(load_entry_points=False, environ={})
    pm.register(_FaultyObservers(state), name="faulty-observers")
    platform = Platform(impl)
    if case.target in OPERATIONS:
        fault = impl.inject(case.target, case.mode, when=lambda: state.on(case.target))
    policy = case.policy
    runner = DecodeRunner(
        _Model(state, _READ_AT[policy]),
        lambda mode, eager, planted: policy,
        platform,
        ring_size=4,
        observers=pm.observers,
    )
    loop = OverlapLoop(runner, probe=_Probe(state))
    fence = runner.fence
    fence.prepare = _in_phase(state, "prepare", fence.prepare)  # type: ignore[method-assign]
    fence.before_replay = _in_phase(  # type: ignore[method-assign]
        state, "before_replay", fence.before_replay, after="replay"
    )
    fence.after_replay = _in_phase(  # type: ignore[method-assign]
        state, "after_replay", fence.after_replay, after="launched"
    )
    fence.take = _in_phase(state, "take", fence.take)  # type: ignore[method-assign]
    loop.barrier.apply = _in_phase(state, "barrier", loop.barrier.apply)  # type: ignore[method-assign]
    capture = _in_phase(state, "capture", runner.capture, after="setup")
    step = _in_phase(state, "launch", loop.step, after="setup")
    state.armed = case
    errors = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index, size in enumerate(BATCHES):
            if index in (0, RECAPTURE_AFTER):
                if index:
                    loop.drain()  # a capture never overlaps the scheduler's writes
                try:
                    capture()
                except Exception:  # noqa: BLE001 - counted: the caller sees the failure
                    errors += 1
            try:
                step([0] * size, state.write)
            except Exception:  # noqa: BLE001 - counted: the caller sees the failure
                errors += 1
    fired = state.fired + (fault.fired if case.target in OPERATIONS else 0)
    return CaseResult(case, fired, state.early, state.stale, errors, len(caught))


@attrs.frozen
class MatrixResult:
    results: tuple[CaseResult, ...]

    def rows(self) -> list[dict[str, Any]]:
        """One summary row per injected target (and a total row)."""
        out = []
        groups: dict[str, list[CaseResult]] = {}
        for result in self.results:
            groups.setdefault(result.case.target, []).append(result)
        for target, items in list(groups.items()) + [("total", list(self.results))]:
            fired = [r for r in items if r.fired]
            out.append(
                {
                    "target": target,
                    "cases": len(items),
                    "fired": len(fired),
                    "early_releases": sum(r.early_releases for r in items),
                    "stale_reads": sum(r.stale_reads for r in items),
                    "surfaced": sum(1 for r in fired if r.errors or r.warnings),
                    "silent": sum(1 for r in fired if not (r.errors or r.warnings)),
                }
            )
        return out


def run_fault_matrix(selected: Optional[Sequence[Case]] = None) -> MatrixResult:
    """Run every case (or ``selected``)."""
    return MatrixResult(tuple(run_case(c) for c in (selected if selected is not None else cases())))


def format_fault_matrix(result: MatrixResult) -> str:
    """The summary table: per target, cases, cases whose fault fired, early releases, stale
    reads, fired cases that surfaced an error or warning, and fired cases that stayed silent."""
    header = ("target", "cases", "fired", "early_releases", "stale_reads", "surfaced", "silent")
    rows = result.rows()
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in header]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    lines = [line, "  ".join("-" * w for w in widths)]
    for row in rows:
        lines.append("  ".join(str(row[h]).ljust(w) for h, w in zip(header, widths)))
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - the table for a release note
    print(format_fault_matrix(run_fault_matrix()))
