"""What a platform is: the `PlatformImpl` protocol, the optional `EventFirstWait`, `GraphWalker`
and `GraphRestorer` protocols, opaque handle types, the check a claimed implementation must
pass, and device-type helpers.

A platform plugin answers the ``warpolicy_platform(device)`` hook with an object satisfying
`PlatformImpl` for the devices it handles (and None for the others). The composition root
(`warpolicy.runtime.manager.open_platform`) asks that hook once, checks the answer with
`implementation_problems` and wraps it in the `warpolicy.runtime.platforms.facade.Platform`
facade; from then on the chosen object's methods are called directly.

The built-ins are `warpolicy.runtime.platforms.cuda` (``torch.cuda``) and
`warpolicy.runtime.platforms.sim` (a simulated platform for CPU runs); they import only this
module, the graph walk and `warpolicy.runtime.markers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from warpolicy.runtime.graphwalk import DerivedPlant, SelfCheck
from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.graphwalk.plant import SharedBuffers
from warpolicy.runtime.graphwalk.restore import Rebound

# Opaque platform handles. A platform hands them out and takes them back; the fence and the
# runners never look inside (a torch.cuda.Event / Stream / CUDAGraph on CUDA, sim objects on
# the simulated platform), so they are typed as what they are to callers: opaque.
EventHandle = Any
StreamHandle = Any
GraphHandle = Any
PoolHandle = Any


@runtime_checkable
class PlatformImpl(Protocol):
    """The operations a platform provides for one device.

    Methods raise on failure (never return a "not handled" marker): the fence and runners turn
    every exception into the coarse barrier. ``stream=None`` always means the current stream.
    """

    #: the platform's name, e.g. ``"cuda"`` or ``"sim"`` (registry platform facts use it)
    name: str
    #: the device as callers should see it (a ``torch.device`` on CUDA, ``"sim"`` simulated)
    device: Any
    #: whether an event recorded during a capture becomes an in-graph node
    external_events_supported: bool

    def create_event(self, external: bool) -> EventHandle:
        """A new event; ``external=True`` for one whose record during capture is a graph node."""

    def record(self, event: EventHandle, stream: StreamHandle | None = None) -> None:
        """Record ``event`` on ``stream`` (None: the current stream, as a plant requires)."""

    def wait_event(self, stream: StreamHandle, event: EventHandle) -> None:
        """``stream`` waits for the latest record of ``event``."""

    def wait_stream(self, stream: StreamHandle, other: StreamHandle) -> None:
        """``stream`` waits for all work queued so far on ``other`` (the coarse barrier)."""

    def is_capturing(self) -> bool:
        """Whether the current stream is capturing a graph."""

    def new_stream(self) -> StreamHandle:
        """A new stream on the device."""

    def current_stream(self) -> StreamHandle:
        """The current stream of the device."""

    def use_stream(self, stream: StreamHandle) -> AbstractContextManager[Any]:
        """A context manager making ``stream`` current while entered."""

    def new_graph(self, keep_graph: bool) -> GraphHandle:
        """An empty graph; ``keep_graph=True`` keeps the raw graph (static audit)."""

    def graph_pool(self) -> PoolHandle:
        """A memory-pool handle several graphs can share."""

    def capture(
        self, graph: GraphHandle, stream: StreamHandle | None, pool: PoolHandle | None
    ) -> AbstractContextManager[Any]:
        """A context manager capturing its block into ``graph``."""

    def capture_callable(
        self,
        graph: GraphHandle,
        fn: Callable[[], Any],
        stream: StreamHandle | None,
        pool: PoolHandle | None,
    ) -> None:
        """Capture ``fn()`` into ``graph`` (a platform without real graphs may re-run ``fn``
        at each replay, as the simulated one does)."""

    def replay(self, graph: GraphHandle) -> None:
        """Enqueue a replay of ``graph`` on the current stream."""

    def synchronize(self) -> None:
        """Block the host until all work on the device is done."""


@runtime_checkable
class EventFirstWait(Protocol):
    """Optional `PlatformImpl` capability: `PlatformImpl.wait_event` with the event first, for a
    platform whose own call takes it first (``torch.cuda.Event.wait(event, stream)``). The
    scheduler barrier's per-step wait then is that call, with no frame to reorder the
    arguments; without it the facade reorders (`warpolicy.runtime.platforms.facade`). It must
    be the same operation as ``wait_event``: everything else (the runners, the coarse
    fallbacks) calls that one.
    """

    def event_wait(self, event: EventHandle, stream: StreamHandle) -> None:
        """``stream`` waits for the latest record of ``event``."""


@runtime_checkable
class GraphWalker(Protocol):
    """Optional `PlatformImpl` capability: read the platform's own captured graphs, for derived
    placement and the marker self-check. A platform without it cannot walk its graphs (the
    runner then plants no derived node and skips the self-check); one with part of it is
    refused at the claim. The two walking methods raise
    `warpolicy.runtime.graphwalk.PlacementError` on any failure.
    """

    def graph_walk_unavailable(self) -> str | None:
        """None when kept graphs can be walked here, else one line saying why not."""

    def plant_derived(
        self, graph: GraphHandle, shared_buffers: SharedBuffers, event: EventHandle
    ) -> DerivedPlant:
        """Add the read-done node after the last shared readers of a kept, not yet
        instantiated graph."""

    def check_marker(
        self, graph: GraphHandle, shared_buffers: SharedBuffers, event: EventHandle
    ) -> SelfCheck:
        """The static check of the marker recording ``event`` in a kept graph."""

    def instantiate(self, graph: GraphHandle) -> None:
        """Build the executable graph of a kept graph before its first replay."""


@runtime_checkable
class GraphRestorer(Protocol):
    """Optional `PlatformImpl` capability (with `GraphWalker`): keep the release point of a
    graph across a clone, a restore from a saved description, or a recapture. The planted
    read-done nodes are found again by position (`warpolicy.runtime.graphwalk.anchor`), never
    by a handle of the old process. Each method raises
    `warpolicy.runtime.graphwalk.PlacementError` on any failure.
    """

    def save_planted(self, graph: GraphHandle, planted: Mapping[str, EventHandle]) -> SavedAnchors:
        """Where the planted nodes of a kept graph sit (``planted``: label -> the event its
        node records now), as plain data to persist beside the graph."""

    def rebind_planted(
        self, graph: GraphHandle, saved: SavedAnchors, events: Mapping[str, EventHandle]
    ) -> Rebound:
        """Find every planted node of ``saved`` in the restored ``graph`` and make it record
        ``events[label]`` (the graph, and its executable when already instantiated)."""

    def clone_graph(self, graph: GraphHandle, private_events: bool) -> GraphHandle:
        """A copy of a kept graph, not instantiated, replayable on this platform;
        ``private_events=True``: its event-record nodes record fresh events nobody knows
        (what a persistence library's restore leaves)."""


#: The operations every `PlatformImpl` provides (its methods), in one place for the claim check
#: and the simulated platform's fault injection (`warpolicy.testing`).
PLATFORM_OPERATIONS = (
    "create_event",
    "record",
    "wait_event",
    "wait_stream",
    "is_capturing",
    "new_stream",
    "current_stream",
    "use_stream",
    "new_graph",
    "graph_pool",
    "capture",
    "capture_callable",
    "replay",
    "synchronize",
)
#: The methods of `GraphWalker`.
GRAPH_WALK_METHODS = ("graph_walk_unavailable", "plant_derived", "check_marker", "instantiate")
#: The methods of `GraphRestorer`.
RESTORE_METHODS = ("save_planted", "rebind_planted", "clone_graph")

#: Device types of the simulated platform (``fake`` is its 0.1 name, kept as an alias): the one
#: list every module asks through `is_simulated`.
SIM_DEVICE_TYPES = ("sim", "fake")


def implementation_problems(impl: object) -> list[str]:
    """What keeps ``impl`` from being a `PlatformImpl`, one phrase each (empty: none).

    Types are checked, not only presence: ``name`` a non-empty string,
    ``external_events_supported`` a real ``bool`` (a method or the string ``"false"`` would
    read as true), every operation callable; a `GraphWalker` part is all there or absent.
    """
    problems: list[str] = []
    name = getattr(impl, "name", None)
    if not isinstance(name, str) or not name:
        problems.append(f"name must be a non-empty str, not {name!r}")
    if not hasattr(impl, "device"):
        problems.append("no device")
    external = getattr(impl, "external_events_supported", None)
    if type(external) is not bool:
        shown = f" {external!r}" if isinstance(external, (str, int, float)) else ""
        problems.append(
            f"external_events_supported must be a bool, not {type(external).__name__}{shown}"
        )
    missing = [op for op in PLATFORM_OPERATIONS if not callable(getattr(impl, op, None))]
    if missing:
        problems.append(f"without {', '.join(missing)} (or not callable)")
    walk = [m for m in GRAPH_WALK_METHODS if callable(getattr(impl, m, None))]
    if walk and len(walk) != len(GRAPH_WALK_METHODS):
        absent = [m for m in GRAPH_WALK_METHODS if m not in walk]
        problems.append(f"a partial graph walker: has {', '.join(walk)}, lacks {', '.join(absent)}")
    restore = [m for m in RESTORE_METHODS if callable(getattr(impl, m, None))]
    if restore and len(restore) != len(RESTORE_METHODS):
        absent = [m for m in RESTORE_METHODS if m not in restore]
        problems.append(
            f"a partial graph restorer: has {', '.join(restore)}, lacks {', '.join(absent)}"
        )
    if restore and len(walk) != len(GRAPH_WALK_METHODS):
        problems.append("a graph restorer that cannot walk its graphs")
    if hasattr(impl, "event_wait") and not callable(getattr(impl, "event_wait", None)):
        problems.append("event_wait is not callable")
    return problems


def is_simulated(device: Any) -> bool:
    """Whether ``device`` names the simulated platform (``sim`` or its alias ``fake``)."""
    return device_type(device) in SIM_DEVICE_TYPES


def device_type(device: Any) -> str:
    """The type part of a device: ``torch.device("cuda:0")`` and ``"cuda:0"`` give ``"cuda"``."""
    kind = getattr(device, "type", None)
    if isinstance(kind, str):
        return kind
    return str(device).split(":", 1)[0].strip().lower()


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device (False without torch)."""
    try:
        import torch  # noqa: PLC0415 - deferred: the registry, engine and CLI run without torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


__all__ = [
    "GRAPH_WALK_METHODS",
    "PLATFORM_OPERATIONS",
    "RESTORE_METHODS",
    "SIM_DEVICE_TYPES",
    "EventFirstWait",
    "EventHandle",
    "GraphHandle",
    "GraphRestorer",
    "GraphWalker",
    "PlatformImpl",
    "PoolHandle",
    "StreamHandle",
    "cuda_available",
    "device_type",
    "implementation_problems",
    "is_simulated",
]
