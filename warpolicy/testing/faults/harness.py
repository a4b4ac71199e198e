"""The harness: one simulated platform with every operation fault-injectable, the oracle
listening to its call log, and the engine's side of a scenario (marks, errors, warnings).

A `Harness` is built per case. It wraps each `PlatformImpl` operation of a fresh `SimPlatform`
(and the graph-walk probe and walk) in the `Injector`, announces each graph launch to the
oracle, gives the simulated platform a graph model built from what each capture really did,
registers `HarnessObservers` on a fresh plugin manager, and builds the `Platform` the runtime
uses. The scenario (see `warpolicy.testing.faults.scenarios`) then plays the engine: it
captures, steps, writes, and hands every exception the runtime lets out to `guard`.

Every early write the oracle sees is classified when it happens: **after an error** (an
exception already reached the engine in this case), **after a warning** (a ``RuntimeWarning``
was issued, none raised), or **silent**.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.platforms import PLATFORM_OPERATIONS, RESTORE_METHODS
from warpolicy.runtime.platforms.sim import SimGraph, SimPlatform
from warpolicy.testing.faults.compat import component_kwargs, make_platform
from warpolicy.testing.faults.injection import Fault, Injector, injected
from warpolicy.testing.faults.model import HarnessObservers, graph_model
from warpolicy.testing.faults.oracle import Oracle, Point

#: The graph-walk operations of the simulated platform (the probe first).
WALK_TARGETS = ("graph_walk_unavailable", "plant_derived", "check_marker", "instantiate")
#: The restoring operations (clone, save and rebind the planted nodes).
RESTORE_TARGETS = RESTORE_METHODS
#: Platform operations the harness can fail. ``capture`` (the context-manager form) is left
#: out: no runner captures through it (they use ``capture_callable``), so it never fires.
PLATFORM_TARGETS = (
    tuple(op for op in PLATFORM_OPERATIONS if op != "capture") + WALK_TARGETS + RESTORE_TARGETS
)


@attrs.frozen
class Outcome:
    """What one run of a scenario did (the oracle's verdict and the engine's view)."""

    fired: int
    errors: tuple[str, ...]  # ``Type: message`` of each exception that reached the engine
    warnings: int
    reads: int
    writes: int
    early_writes: int
    early_silent: int
    early_warned: int
    early_after_error: int
    stale_reads: int
    first_early: str | None
    calls: tuple[tuple[str, int], ...]  # calls per target (for sizing n-th call faults)
    phases: tuple[tuple[str, str], ...]  # (target, phase) pairs that saw calls
    fired_second: int = 0  # hits of the second fault (the two-fault mode)


_MANAGER: tuple[Any, HarnessObservers] | None = None


def _manager() -> tuple[Any, HarnessObservers]:
    """One plugin manager (no entry points) with the harness's observers, per process."""
    global _MANAGER
    if _MANAGER is None:
        observers = HarnessObservers()
        pm = new_plugin_manager(load_entry_points=False, environ={})
        pm.register(observers, name="harness-observers")
        _MANAGER = (pm, observers)
    return _MANAGER


class Baton:
    """Strict turns between scheduler lanes at each `Harness.pause` (a reproducible
    interleaving of two threads: each runs from one pause to its next, then hands over)."""

    def __init__(self, lanes: int) -> None:
        self._cond = threading.Condition()
        self._turn = 0
        self._active = set(range(lanes))

    def _hand_over(self, lane: int) -> None:
        others = sorted(self._active - {lane})
        if others:
            later = [o for o in others if o > lane]
            self._turn = later[0] if later else others[0]
            self._cond.notify_all()

    def start(self, lane: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._turn == lane, timeout=5.0)

    def pause(self, lane: int) -> None:
        with self._cond:
            if lane not in self._active or len(self._active) < 2:
                return
            self._hand_over(lane)
            self._cond.wait_for(lambda: self._turn == lane or len(self._active) < 2, timeout=5.0)

    def done(self, lane: int) -> None:
        with self._cond:
            self._hand_over(lane)
            self._active.discard(lane)
            self._cond.notify_all()


class _PerThreadStack:
    """A current-stream stack per thread, as torch keeps the current stream per thread (the
    simulated platform keeps one stack; the two-thread scenario gives it this one)."""

    def __init__(self, bottom: Any) -> None:
        self._bottom = bottom
        self._local = threading.local()

    def _stack(self) -> list[Any]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = [self._bottom]
        return stack

    def __getitem__(self, index: int) -> Any:
        return self._stack()[index]

    def __len__(self) -> int:
        return len(self._stack())

    def append(self, item: Any) -> None:
        self._stack().append(item)

    def pop(self) -> Any:
        return self._stack().pop()


class Harness:
    """One case's platform, oracle, injector and engine-side bookkeeping."""

    def __init__(
        self,
        *faults: Fault,
        second: Fault | None = None,
        check_stale: bool = True,
        external_events: bool = True,
        yield_points: bool = False,
        platform_hook: Callable[[Harness, SimPlatform], None] | None = None,
        runner_options: dict[str, Any] | None = None,
        wrap_runner: Callable[[Harness, Any], Any] | None = None,
    ) -> None:
        self.injector = Injector(*faults, second=second, on_fire=self.fired)
        self.oracle = Oracle(check_stale=check_stale)
        self.oracle.on_early = self._classify
        self.impl = SimPlatform(external_events, log_cap=64)
        self.oracle.attach(self.impl.log.listeners)
        self._current = self.impl.current_stream  # the sim's own call, never faulted
        self.yield_points = yield_points
        #: extra keyword arguments for every runner the scenario builds (controls)
        self.runner_options: dict[str, Any] = dict(runner_options or {})
        #: what the engine steps instead of the runner (controls: a runner with a bug)
        self.wrap_runner = wrap_runner
        #: the model whose per-batch snapshot the harness's action hook builds (per_batch)
        self.snapshot_model: Any | None = None
        self.baton: Baton | None = Baton(2) if yield_points else None
        if yield_points and isinstance(getattr(self.impl, "_streams", None), list):
            self.impl._streams = _PerThreadStack(self.impl.default_stream)  # type: ignore[assignment]
        self.errors: list[BaseException] = []
        self.warned: list[warnings.WarningMessage] = []
        self.early = {"silent": 0, "warned": 0, "error": 0}
        self.steps: dict[int, int] = {}
        self._local = threading.local()
        self.launching: list[int] = []  # graphs being replayed (innermost last)
        self.origins: dict[int, int] = {}  # launched graph -> the graph whose capture it replays
        self._fired_at: tuple[int, int] | None = None  # (errors, warnings) at first fire
        self._install()
        if platform_hook is not None:  # positive controls: a platform that misbehaves
            platform_hook(self, self.impl)
        self.platform = self._platform()

    # -- construction ---------------------------------------------------------------------------

    def _install(self) -> None:
        impl = self.impl
        for op in PLATFORM_TARGETS:
            setattr(impl, op, self.injector.wrap(op, getattr(impl, op)))
        replay = impl.replay

        def launch(graph: Any) -> None:
            gid, sid = getattr(graph, "id", -1), self.stream_id()
            origin = getattr(graph, "origin", None)
            self.origins[gid] = origin if origin is not None else gid
            self.emit(("launch", gid, sid))
            self.launching.append(gid)
            try:
                replay(graph)
            finally:
                self.launching.pop()
                self.emit(("landed", gid, sid))

        impl.replay = launch  # type: ignore[method-assign]
        impl.graph_model = self._graph_model

    def replaying(self) -> int | None:
        """The graph whose captured body the simulated platform is re-running, if any.

        A real graph replays what was captured: the model then repeats the capture's reads
        and work, and its callbacks are not calls (never counted nor faulted)."""
        return self.launching[-1] if self.launching and self.impl.replaying else None

    def replay_stage(self, graph: int, label: str) -> None:
        """Repeat what the capture of ``graph`` logged for ``label``."""
        for entry in self.oracle.captured.get(self.origins.get(graph, graph), ()):
            if entry[0] == "read" and entry[4] == label:
                self.read(label)
            elif entry[0] == "work" and entry[2] == label:
                self.work(label)

    def _graph_model(self, graph: SimGraph) -> Any:
        # a clone replays what its first graph's capture logged; its nodes may record other
        # events than the ones the capture recorded (`SimGraph.sources`)
        origin = graph.origin if graph.origin is not None else graph.id
        renamed = {body: graph.planted[i].id for body, i in graph.sources.items()}
        return graph_model(self.oracle.captured.get(origin, ()), graph.planted_ids(), renamed)

    def _platform(self) -> Any:
        """The platform the runtime uses, with the harness's observers (composition root);
        `kw` is what every component the engine builds gets (its observers)."""
        pm, observers = _manager()
        observers.harness = self
        observers.seen.clear()
        self.observers = observers
        self.pm = pm
        #: keyword arguments for every runtime component (runner, loop, barrier, spec step)
        self.kw = component_kwargs(pm)
        return make_platform(self.impl, pm)

    # -- marks ------------------------------------------------------------------------------------

    def emit(self, entry: tuple) -> None:
        self.impl.log.emit(entry)

    def stream_id(self) -> int:
        return int(self._current().id)

    @property
    def lane(self) -> int:
        """The scheduler lane of this thread (0 unless a scenario runs several)."""
        return int(getattr(self._local, "lane", 0))

    @lane.setter
    def lane(self, value: int) -> None:
        self._local.lane = value

    def begin_step(self) -> int:
        """A new step of this thread's lane; returns its number (1-based)."""
        step = self.steps[self.lane] = self.steps.get(self.lane, 0) + 1
        return step

    def pause(self) -> None:
        """A point where another thread may run (the two-thread scenario; outside any
        platform operation, so the simulated platform's own state stays consistent)."""
        if self.baton is not None:
            self.baton.pause(self.lane)

    def read(self, label: str) -> None:
        lane = self.lane
        self.emit(("read", self.stream_id(), lane, self.steps.get(lane, 0), label))

    def work(self, label: str) -> None:
        self.emit(("work", self.stream_id(), label))

    def write(self, label: str = "write", through: int | None = None) -> None:
        lane = self.lane
        step = self.steps.get(lane, 0) if through is None else through
        self.emit(("write", self.stream_id(), lane, step, label))

    def fired(self) -> None:
        """The armed fault fired: trouble the engine hears of from now on is its echo."""
        if self._fired_at is None:
            self._fired_at = (len(self.errors), len(self.warned))

    def _classify(self, point: Point) -> None:
        errors, warned = self._fired_at if self._fired_at is not None else (0, 0)
        kind = (
            "error"
            if len(self.errors) > errors
            else "warned"
            if len(self.warned) > warned
            else "silent"
        )
        self.early[kind] += 1

    # -- the engine's view ------------------------------------------------------------------------

    def phase(self, name: str) -> None:
        self.injector.phase = name

    def guard(self, fn: Callable[[], Any]) -> Any:
        """Call the runtime as an engine does: an exception it lets out is noted, and the
        engine carries on (the promise holds after any failure)."""
        try:
            return fn()
        except BaseException as exc:  # every escape is counted; a real Ctrl-C is re-raised
            if not injected(exc):
                raise  # a real Ctrl-C (or exit) stops the matrix
            self.errors.append(exc)
            return None

    def quiet(self) -> contextlib.AbstractContextManager[None]:
        """The engine's own platform calls: never faulted."""
        return self.injector.quiet()

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.warned = caught
            yield

    def outcome(self) -> Outcome:
        verdict = self.oracle.verdict
        return Outcome(
            fired=self.injector.fired,
            errors=tuple(f"{type(e).__name__}: {e}" for e in self.errors),
            warnings=len(self.warned),
            reads=verdict.reads,
            writes=verdict.writes,
            early_writes=verdict.early_writes,
            early_silent=self.early["silent"],
            early_warned=self.early["warned"],
            early_after_error=self.early["error"],
            stale_reads=verdict.stale_reads,
            first_early=verdict.first_early,
            calls=tuple(sorted(self.injector.calls.items())),
            phases=tuple(sorted(self.injector.by_phase)),
            fired_second=self.injector.fired_second,
        )
