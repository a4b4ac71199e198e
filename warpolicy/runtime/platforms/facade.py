"""`Platform`: the streams, events and graphs of one device, on the implementation that claimed it.

The composition root builds it (`warpolicy.runtime.manager.open_platform` asks the
``warpolicy_platform`` hook once); tests build one on a simulated implementation directly
(`warpolicy.testing.sim_platform`). The facade checks the implementation's types once
(`warpolicy.runtime.platforms.base.implementation_problems`), then binds its per-step methods
as its own attributes, so ``platform.record(event, stream)`` is the implementation's call with
no dispatch in between. Runners, the fence and the audit use only this facade, so the same code
runs on CUDA and on the simulated platform. The facade holds no plugin manager: observers are
passed to the components that report (`warpolicy.runtime.observers`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from warpolicy.errors import WarpolicyError
from warpolicy.runtime.graphwalk import DerivedPlant, PlacementError, SelfCheck
from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.graphwalk.plant import SharedBuffers
from warpolicy.runtime.graphwalk.restore import Rebound
from warpolicy.runtime.platforms.base import (
    EventFirstWait,
    EventHandle,
    GraphHandle,
    GraphRestorer,
    GraphWalker,
    PlatformImpl,
    PoolHandle,
    StreamHandle,
    implementation_problems,
)
from warpolicy.runtime.platforms.sim import CallLog, SimPlatform

log = logging.getLogger("warpolicy")

_ANNOUNCED: set[tuple[str, str, bool]] = set()  # (platform, device, external) already logged


class PlatformError(WarpolicyError, RuntimeError):
    """A platform implementation that is not one (checked once), or an operation that broke its
    contract (e.g. returned None where a handle is due)."""


def _event_first(
    wait_event: Callable[[StreamHandle, EventHandle], None],
) -> Callable[[EventHandle, StreamHandle], None]:
    """``wait_event(stream, event)`` as ``(event, stream)``, for an implementation without
    `EventFirstWait`."""

    def event_wait(event: EventHandle, stream: StreamHandle) -> None:
        wait_event(stream, event)

    return event_wait


def _one_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0] if lines else ""


class Platform:
    """Streams, events and graphs of one device, delegated to the `PlatformImpl` that claimed it.

    ``record``, ``wait_event``, ``wait_stream``, ``replay`` and ``is_capturing`` are the
    implementation's own bound methods; ``event_wait(event, stream)`` is ``wait_event`` with
    the event first (the implementation's own with `EventFirstWait`, else a reordering
    wrapper), the scheduler barrier's per-step wait. ``walker`` is the implementation when it can walk its
    graphs (`GraphWalker`), else None.
    """

    record: Callable[..., None]
    wait_event: Callable[[StreamHandle, EventHandle], None]
    event_wait: Callable[[EventHandle, StreamHandle], None]
    wait_stream: Callable[[StreamHandle, StreamHandle], None]
    replay: Callable[[GraphHandle], None]
    is_capturing: Callable[[], bool]

    def __init__(self, impl: PlatformImpl) -> None:
        problems = implementation_problems(impl)
        if problems:
            raise PlatformError(
                f"{type(impl).__name__} is not a platform implementation: {'; '.join(problems)}"
            )
        self.impl = impl
        self.device = impl.device
        self._name = impl.name
        self._external = impl.external_events_supported
        self.walker: GraphWalker | None = impl if isinstance(impl, GraphWalker) else None
        #: the implementation when it can keep a release point across a clone or a restore
        self.restorer: GraphRestorer | None = (
            impl if self.walker is not None and isinstance(impl, GraphRestorer) else None
        )
        # the hot path: bound once, called directly (no dispatch, no wrapper frame)
        self.record = impl.record  # (event, stream=None): None = the current stream
        self.wait_event = impl.wait_event  # (stream, event)
        self.event_wait = (  # (event, stream): the barrier's per-step wait
            impl.event_wait if isinstance(impl, EventFirstWait) else _event_first(impl.wait_event)
        )
        self.wait_stream = impl.wait_stream  # (stream, other): the coarse barrier
        self.replay = impl.replay  # (graph): enqueue on the current stream
        self.is_capturing = impl.is_capturing

    def announce(self) -> None:
        """Log once per process which read-done path is active on this platform."""
        key = (self._name, str(self.device), self._external)
        if key in _ANNOUNCED:
            return
        _ANNOUNCED.add(key)
        if self._name == "cuda":
            if self._external:
                log.info("warpolicy: CUDA external events available: in-graph read-done enabled")
            else:
                log.info(
                    "warpolicy: CUDA external events unavailable (this torch has no "
                    "torch.cuda.Event(external=...)): in-graph read-done disabled, "
                    "in_graph demotes to post_replay"
                )
        else:
            state = "simulated" if self._external else "disabled"
            log.info(
                "warpolicy: platform %r on device %s: in-graph read-done %s",
                self._name,
                self.device,
                state,
            )

    def __repr__(self) -> str:
        return f"Platform(name={self._name!r}, device={self.device!r})"

    # -- identity -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The platform's name, e.g. ``"cuda"`` or ``"sim"``."""
        return self._name

    def external_events_supported(self) -> bool:
        """Whether a record during capture becomes an in-graph node (fixed per platform)."""
        return self._external

    @property
    def log(self) -> CallLog:
        """The call log of the simulated platform; raises on real platforms."""
        impl = self.impl
        if not isinstance(impl, SimPlatform) or not isinstance(impl.log, CallLog):
            raise NotImplementedError(f"platform {self._name!r} does not record calls")
        return impl.log

    # -- events and streams (not per step: checked) ---------------------------------------------

    def create_event(self, external: bool = False) -> EventHandle:
        """A new event; ``external=True`` for the read-done events planted in graphs."""
        return self._handle(self.impl.create_event(bool(external)), "create_event")

    def new_stream(self) -> StreamHandle:
        return self._handle(self.impl.new_stream(), "new_stream")

    def current_stream(self) -> StreamHandle:
        return self._handle(self.impl.current_stream(), "current_stream")

    def stream(self, stream: StreamHandle) -> AbstractContextManager[Any]:
        """Context manager making ``stream`` current."""
        return self._handle(self.impl.use_stream(stream), "use_stream")

    # -- graphs ---------------------------------------------------------------------------------

    def new_graph(self, keep_graph: bool = False) -> GraphHandle:
        """An empty graph; ``keep_graph=True`` keeps the raw graph (graph walk, static audit)."""
        return self._handle(self.impl.new_graph(bool(keep_graph)), "new_graph")

    def graph_pool(self) -> PoolHandle:
        """A memory-pool handle several graphs can share (pass as ``pool=``)."""
        return self._handle(self.impl.graph_pool(), "graph_pool")

    def capture(
        self,
        graph: GraphHandle,
        stream: StreamHandle | None = None,
        pool: PoolHandle | None = None,
    ) -> AbstractContextManager[Any]:
        """Context manager capturing its block into ``graph``."""
        return self._handle(self.impl.capture(graph, stream, pool), "capture")

    def capture_callable(
        self,
        graph: GraphHandle,
        fn: Callable[[], Any],
        stream: StreamHandle | None = None,
        pool: PoolHandle | None = None,
    ) -> None:
        """Capture ``fn()`` into ``graph``. On the simulated platform each replay runs ``fn`` again."""
        self.impl.capture_callable(graph, fn, stream, pool)

    def synchronize(self) -> None:
        """Block the host until the device is idle."""
        self.impl.synchronize()

    # -- graph walk (derived placement, marker self-check) --------------------------------------

    def graph_walk_unavailable(self) -> str | None:
        """None when this platform can walk its kept graphs, else one line saying why not.

        A probe that raises is not "cannot walk": it raises `PlacementError` (one line), and a
        runner makes the bucket coarse, as for a check that raised.
        """
        walker = self.walker
        if walker is None:
            return f"platform {self._name!r} cannot walk its captured graphs"
        try:
            reason = walker.graph_walk_unavailable()
        except Exception as exc:  # noqa: BLE001 - one line; the caller fails closed
            raise PlacementError(
                f"graph_walk_unavailable raised {type(exc).__name__}: {_one_line(str(exc))}"
            ) from None
        if reason is not None and not isinstance(reason, str):
            raise PlacementError(
                f"graph_walk_unavailable returned {type(reason).__name__}, not None or a str"
            )
        return reason

    def plant_derived(
        self, graph: GraphHandle, shared_buffers: SharedBuffers, event: EventHandle
    ) -> DerivedPlant:
        """Add the read-done node recording ``event`` after the shared readers of the kept,
        not yet instantiated ``graph``. Raises `PlacementError` (one line) on any failure."""
        walker = self._walker("plant_derived")
        try:
            result = walker.plant_derived(graph, shared_buffers, event)
        except PlacementError:
            raise
        except Exception as exc:  # noqa: BLE001 - fail closed: the caller demotes the bucket
            raise PlacementError(
                f"plant_derived failed: {type(exc).__name__}: {_one_line(str(exc))}"
            ) from None
        if not isinstance(result, DerivedPlant):
            raise PlacementError(
                f"platform {self._name!r}: plant_derived returned {type(result).__name__}"
            )
        return result

    def check_marker(
        self, graph: GraphHandle, shared_buffers: SharedBuffers, event: EventHandle
    ) -> SelfCheck:
        """The static check of the marker recording ``event`` in the kept ``graph``. Raises
        `PlacementError` (one line) when it cannot be done."""
        walker = self._walker("check_marker")
        try:
            result = walker.check_marker(graph, shared_buffers, event)
        except PlacementError:
            raise
        except Exception as exc:  # noqa: BLE001 - fail closed: the caller demotes the bucket
            raise PlacementError(
                f"check_marker failed: {type(exc).__name__}: {_one_line(str(exc))}"
            ) from None
        if not isinstance(result, SelfCheck):
            raise PlacementError(
                f"platform {self._name!r}: check_marker returned {type(result).__name__}"
            )
        return result

    def instantiate(self, graph: GraphHandle) -> None:
        """Build the executable graph of a kept graph before its first replay (a platform that
        cannot walk its graphs instantiates at replay). Raises what the platform raises."""
        if self.walker is not None:
            self.walker.instantiate(graph)

    # -- restoring (clone, find the planted nodes again, rebind) ---------------------------------

    def save_planted(self, graph: GraphHandle, planted: Mapping[str, EventHandle]) -> SavedAnchors:
        """Where the planted nodes of the kept ``graph`` sit (``planted``: label -> the event
        its node records), to persist beside it. Raises `PlacementError` (one line)."""
        result = self._restore_call("save_planted", lambda r: r.save_planted(graph, planted))
        if not isinstance(result, SavedAnchors):
            raise PlacementError(
                f"platform {self._name!r}: save_planted returned {type(result).__name__}"
            )
        return result

    def rebind_planted(
        self, graph: GraphHandle, saved: SavedAnchors, events: Mapping[str, EventHandle]
    ) -> Rebound:
        """Find the planted nodes of ``saved`` in the restored ``graph`` by position and make
        each record ``events[label]``. Raises `PlacementError` (one line) on any doubt."""
        result = self._restore_call(
            "rebind_planted", lambda r: r.rebind_planted(graph, saved, events)
        )
        if not isinstance(result, Rebound):
            raise PlacementError(
                f"platform {self._name!r}: rebind_planted returned {type(result).__name__}"
            )
        return result

    def clone_graph(self, graph: GraphHandle, *, private_events: bool = False) -> GraphHandle:
        """A copy of the kept ``graph``, not instantiated, replayable here (``private_events``:
        its event-record nodes record fresh events nobody knows, as after a persistence
        library's restore). Raises `PlacementError` (one line)."""
        result = self._restore_call(
            "clone_graph", lambda r: r.clone_graph(graph, bool(private_events))
        )
        if result is None:
            raise PlacementError(f"platform {self._name!r}: clone_graph returned None")
        return result

    def _restore_call(self, op: str, call: Callable[[GraphRestorer], Any]) -> Any:
        restorer = self.restorer
        if restorer is None:
            raise PlacementError(
                f"platform {self._name!r} cannot restore its captured graphs (no {op})"
            )
        try:
            return call(restorer)
        except PlacementError:
            raise
        except Exception as exc:  # noqa: BLE001 - fail closed: the caller makes it coarse
            raise PlacementError(
                f"{op} failed: {type(exc).__name__}: {_one_line(str(exc))}"
            ) from None

    def _walker(self, op: str) -> GraphWalker:
        if self.walker is None:
            raise PlacementError(
                f"platform {self._name!r} cannot walk its captured graphs (no {op})"
            )
        return self.walker

    def _handle(self, result: Any, op: str) -> Any:
        if result is None:
            raise PlatformError(f"platform {self._name!r}: {op} returned None")
        return result


__all__ = ["Platform", "PlatformError"]
