"""Platforms: the `PlatformImpl` protocol every platform implements, and device-type helpers.

A platform plugin answers the ``warpolicy_platform(device)`` hook with an object satisfying
`PlatformImpl` for the devices it handles (and None for the others). `warpolicy.runtime.platform.
Platform.for_device` asks that hook once, and from then on calls the chosen object's methods
directly: no plugin dispatch per operation.

The built-ins are `warpolicy.runtime.platforms.cuda` (``torch.cuda``) and `warpolicy.runtime.platforms.sim` (a
simulated platform for CPU runs and tests). Modules here import only `warpolicy.runtime.hookspecs` and
this base; the plugin manager (`warpolicy.runtime.manager`) registers them.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Optional, Protocol, runtime_checkable

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

    def record(self, event: EventHandle, stream: Optional[StreamHandle] = None) -> None:
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

    def use_stream(self, stream: StreamHandle) -> ContextManager[Any]:
        """A context manager making ``stream`` current while entered."""

    def new_graph(self, keep_graph: bool) -> GraphHandle:
        """An empty graph; ``keep_graph=True`` keeps the raw graph (static audit)."""

    def graph_pool(self) -> PoolHandle:
        """A memory-pool handle several graphs can share."""

    def capture(
        self, graph: GraphHandle, stream: Optional[StreamHandle], pool: Optional[PoolHandle]
    ) -> ContextManager[Any]:
        """A context manager capturing its block into ``graph``."""

    def capture_callable(
        self,
        graph: GraphHandle,
        fn: Callable[[], Any],
        stream: Optional[StreamHandle],
        pool: Optional[PoolHandle],
    ) -> None:
        """Capture ``fn()`` into ``graph`` (a platform without real graphs may re-run ``fn``
        at each replay, as the simulated one does)."""

    def replay(self, graph: GraphHandle) -> None:
        """Enqueue a replay of ``graph`` on the current stream."""

    def synchronize(self) -> None:
        """Block the host until all work on the device is done."""


#: Optional `PlatformImpl` methods for derived placement and the marker self-check (a platform
#: without them cannot walk its graphs; the runner then fails closed):
#:
#: * ``graph_walk_unavailable() -> Optional[str]``: None when captured graphs can be walked,
#:   else one line saying why not (cuda-bindings missing, no graph model);
#: * ``plant_derived(graph, shared_buffers, event) -> DerivedPlant``: add the read-done node
#:   after the last shared readers of a kept, not yet instantiated graph;
#: * ``check_marker(graph, shared_buffers, event) -> SelfCheck``: the static check of a marker;
#: * ``instantiate(graph) -> None``: build the executable graph of a kept graph.
#:
#: The two walking methods raise ``warpolicy.runtime.graphwalk.PlacementError`` on any failure.
#: The operations every `PlatformImpl` provides (its methods), in one place for the claim check
#: and the simulated platform's fault injection.
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
GRAPH_WALK_METHODS = ("graph_walk_unavailable", "plant_derived", "check_marker", "instantiate")


def device_type(device: Any) -> str:
    """The type part of a device: ``torch.device("cuda:0")`` and ``"cuda:0"`` give ``"cuda"``."""
    kind = getattr(device, "type", None)
    if isinstance(kind, str):
        return kind
    return str(device).split(":", 1)[0].strip().lower()


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device (False without torch)."""
    try:
        import torch  # deferred: the registry, engine and CLI run without torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


__all__ = [
    "PLATFORM_OPERATIONS",
    "GRAPH_WALK_METHODS",
    "EventHandle",
    "GraphHandle",
    "PlatformImpl",
    "PoolHandle",
    "StreamHandle",
    "cuda_available",
    "device_type",
]
