"""`Platform`: the streams, events and graphs of one device, on the implementation that claimed it.

`Platform.for_device` asks the ``warpolicy_platform`` hook once (`warpolicy.runtime.manager.
claim_platform`); the facade then binds the chosen `PlatformImpl`'s per-step methods as its
own attributes, so ``platform.record(event, stream)`` is the implementation's call with no
dispatch in between. Runners, the fence and the audit use only this facade, so the same code
runs on CUDA (`warpolicy.runtime.platforms.cuda`) and on the simulated platform
(`warpolicy.runtime.platforms.sim`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, ContextManager, Optional

import pluggy

from warpolicy.errors import CudaUnavailableError, UnknownNameError
from warpolicy.runtime.graphwalk import DerivedPlant, PlacementError, SelfCheck
from warpolicy.runtime.graphwalk.plant import SharedBuffers
from warpolicy.runtime.manager import claim_platform, get_plugin_manager, new_plugin_manager
from warpolicy.runtime.platforms import (
    EventHandle,
    GraphHandle,
    PlatformImpl,
    PoolHandle,
    StreamHandle,
    cuda_available,
    device_type,
)
from warpolicy.runtime.platforms.sim import CallLog, SimPlatform

log = logging.getLogger("warpolicy")

_ANNOUNCED: set[tuple[str, str, bool]] = set()  # (platform, device, external) already logged

__all__ = ["Platform", "cuda_available", "device_type", "sim_platform"]


def _normalize(device: Any) -> str:
    """None -> ``"cuda"`` when CUDA is available, else ``"sim"``; anything else its lower-case
    string (``torch.device("cuda", 0)`` -> ``"cuda:0"``)."""
    if device is None:
        return "cuda" if cuda_available() else "sim"
    return str(device).strip().lower()


class PlatformError(RuntimeError):
    """A platform operation broke its contract (e.g. returned None where a handle is due)."""


class Platform:
    """Streams, events and graphs of one device, delegated to the `PlatformImpl` that claimed it.

    Build it with `Platform.for_device`. ``record``, ``wait_event``, ``wait_stream``,
    ``replay`` and ``is_capturing`` are the implementation's own bound methods.
    """

    record: Callable[..., None]
    wait_event: Callable[[StreamHandle, EventHandle], None]
    wait_stream: Callable[[StreamHandle, StreamHandle], None]
    replay: Callable[[GraphHandle], None]
    is_capturing: Callable[[], bool]

    def __init__(self, impl: PlatformImpl, pm: pluggy.PluginManager) -> None:
        self.impl = impl
        self.pm = pm
        self.device = impl.device
        self._name = str(impl.name)
        self._external = bool(impl.external_events_supported)
        # the hot path: bound once, called directly (no dispatch, no wrapper frame)
        self.record = impl.record  # (event, stream=None): None = the current stream
        self.wait_event = impl.wait_event  # (stream, event)
        self.wait_stream = impl.wait_stream  # (stream, other): the coarse barrier
        self.replay = impl.replay  # (graph): enqueue on the current stream
        self.is_capturing = impl.is_capturing

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def for_device(cls, device: Any = None, pm: Optional[pluggy.PluginManager] = None) -> Platform:
        """The platform for ``device`` (``torch.device``, ``"cuda"``, ``"cuda:0"``, ``"sim"``,
        or None = CUDA if available, else the simulated platform).

        Raises `CudaUnavailableError` when CUDA is asked for and not available,
        `UnknownNameError` when no plugin claims the device type, and `PluginError` when two do.
        """
        if pm is None:
            pm = get_plugin_manager()
        wanted = _normalize(device)
        kind = device_type(wanted)
        if kind == "cuda" and not cuda_available():
            raise CudaUnavailableError(
                f"device {wanted!r} needs CUDA, but torch.cuda.is_available() is False"
            )
        claim = claim_platform(pm, wanted)
        if claim is None:
            raise UnknownNameError("device type", kind, ["cuda", "sim"])
        platform = cls(claim[1], pm)
        platform._announce()
        return platform

    def _announce(self) -> None:
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
        impl_log = getattr(self.impl, "log", None)
        if not isinstance(impl_log, CallLog):
            raise NotImplementedError(f"platform {self._name!r} does not record calls")
        return impl_log

    # -- events and streams (not per step: checked) ---------------------------------------------

    def create_event(self, external: bool = False) -> EventHandle:
        """A new event; ``external=True`` for the persistent event planted in graphs."""
        return self._handle(self.impl.create_event(bool(external)), "create_event")

    def new_stream(self) -> StreamHandle:
        return self._handle(self.impl.new_stream(), "new_stream")

    def current_stream(self) -> StreamHandle:
        return self._handle(self.impl.current_stream(), "current_stream")

    def stream(self, stream: StreamHandle) -> ContextManager[Any]:
        """Context manager making ``stream`` current."""
        return self._handle(self.impl.use_stream(stream), "use_stream")

    # -- graphs ---------------------------------------------------------------------------------

    def new_graph(self, keep_graph: bool = False) -> GraphHandle:
        """An empty graph; ``keep_graph=True`` keeps the raw graph (static audit)."""
        return self._handle(self.impl.new_graph(bool(keep_graph)), "new_graph")

    def graph_pool(self) -> PoolHandle:
        """A memory-pool handle several graphs can share (pass as ``pool=``)."""
        return self._handle(self.impl.graph_pool(), "graph_pool")

    def capture(
        self,
        graph: GraphHandle,
        stream: Optional[StreamHandle] = None,
        pool: Optional[PoolHandle] = None,
    ) -> ContextManager[Any]:
        """Context manager capturing its block into ``graph``."""
        return self._handle(self.impl.capture(graph, stream, pool), "capture")

    def capture_callable(
        self,
        graph: GraphHandle,
        fn: Callable[[], Any],
        stream: Optional[StreamHandle] = None,
        pool: Optional[PoolHandle] = None,
    ) -> None:
        """Capture ``fn()`` into ``graph``. On the simulated platform each replay runs ``fn`` again."""
        self.impl.capture_callable(graph, fn, stream, pool)

    def synchronize(self) -> None:
        """Block the host until the device is idle."""
        self.impl.synchronize()

    # -- graph walk (derived placement, marker self-check) --------------------------------------

    def graph_walk_unavailable(self) -> Optional[str]:
        """None when this platform can walk its kept graphs, else one line saying why not."""
        fn = getattr(self.impl, "graph_walk_unavailable", None)
        if fn is None:
            return f"platform {self._name!r} cannot walk its captured graphs"
        try:
            reason = fn()
        except Exception as exc:  # noqa: BLE001 - a failing probe means "cannot walk"
            return f"platform {self._name!r}: graph_walk_unavailable raised {exc!r}"
        return None if reason is None else str(reason)

    def plant_derived(
        self, graph: GraphHandle, shared_buffers: SharedBuffers, event: EventHandle
    ) -> DerivedPlant:
        """Add the read-done node recording ``event`` after the shared readers of the kept,
        not yet instantiated ``graph``. Raises `PlacementError` (one line) on any failure."""
        return self._walk("plant_derived", graph, shared_buffers, event)

    def check_marker(
        self, graph: GraphHandle, shared_buffers: SharedBuffers, event: EventHandle
    ) -> SelfCheck:
        """The static check of the marker recording ``event`` in the kept ``graph``. Raises
        `PlacementError` (one line) when it cannot be done."""
        return self._walk("check_marker", graph, shared_buffers, event)

    def instantiate(self, graph: GraphHandle) -> None:
        """Build the executable graph of a kept graph before its first replay (a platform
        without the method instantiates at replay)."""
        fn = getattr(self.impl, "instantiate", None)
        if fn is not None:
            fn(graph)

    def _walk(self, op: str, *args: Any) -> Any:
        fn = getattr(self.impl, op, None)
        if fn is None:
            raise PlacementError(
                f"platform {self._name!r} cannot walk its captured graphs (no {op})"
            )
        try:
            result = fn(*args)
        except PlacementError:
            raise
        except Exception as exc:  # noqa: BLE001 - fail closed: the caller demotes the bucket
            text = str(exc).strip().splitlines()
            raise PlacementError(
                f"{op} failed: {type(exc).__name__}: {text[0] if text else ''}"
            ) from None
        if result is None:
            raise PlacementError(f"platform {self._name!r}: {op} returned None")
        return result

    def _handle(self, result: Any, op: str) -> Any:
        if result is None:
            raise PlatformError(f"platform {self._name!r}: {op} returned None")
        return result


def sim_platform(
    *,
    external_events: bool = True,
    pm: Optional[pluggy.PluginManager] = None,
    log_cap: Optional[int] = None,
) -> Platform:
    """A `Platform` on a fresh `SimPlatform` (its own log and clocks), on ``pm`` or a fresh
    plugin manager without entry points. ``platform.impl`` is the `SimPlatform`."""
    if pm is None:
        pm = new_plugin_manager(load_entry_points=False, environ={})
    impl = (
        SimPlatform(external_events)
        if log_cap is None
        else SimPlatform(external_events, log_cap=log_cap)
    )
    return Platform(impl, pm)


def sim_impl(platform: Platform) -> SimPlatform:
    """The `SimPlatform` behind ``platform`` (typed access to its log, listeners and clocks)."""
    if not isinstance(platform.impl, SimPlatform):
        raise LookupError(f"{platform!r} is not the simulated platform")
    return platform.impl
