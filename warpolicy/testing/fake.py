"""The built-in fake platform plugin: device types ``fake`` and ``cpu``, no CUDA needed.

It records every platform call, in order, in a log so CPU tests can assert the exact
sequence of plant / record / replay / wait. Log entries:

    ("create_event", event_id, external)
    ("record", event_id, stream_id, phase)   phase: False = eager record,
                                             True = recorded during a capture,
                                             "in_graph" = a planted node firing during replay
    ("wait_event", stream_id, event_id)
    ("wait_stream", stream_id, other_stream_id)
    ("capture_begin", graph_id) / ("capture_end", graph_id)
    ("replay", graph_id)
    ("synchronize",)

Graph semantics, modelled on CUDA:

* A capture runs its body once, eagerly, with ``is_capturing()`` True and the graph's
  capture stream current.
* A record during capture *plants* a node only for an external event recorded on the
  capture stream (``stream=None`` or the capture stream itself). A non-external event
  recorded during capture makes no node and becomes unusable: waiting on it later raises
  ``RuntimeError("invalid argument")``, as on the H200.
* ``replay`` logs ``("replay", id)`` and then fires the planted nodes. A graph captured with
  ``capture_callable`` re-runs its body at each replay (``is_capturing()`` True, ``replaying``
  True) so runner logic executes again, and a planted record fires at its place in the body;
  other records in the body make no node and are skipped. A graph captured with the
  context-manager form fires its planted nodes right after the replay entry.

Every plugin manager gets its own `FakePlatformPlugin` instance, hence its own log.
``listeners`` are called with each log entry as it is appended (the audit uses this to
poison shared buffers at the moment an event fires).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Iterator, Optional

import attrs

from warpolicy.hookspecs import hookimpl
from warpolicy.platform import Platform, device_type

#: Device types this plugin handles.
DEVICE_TYPES = ("fake", "cpu")


@attrs.define(eq=False)
class FakeEvent:
    """An event; ``records`` counts eager and in-graph fires, ``invalid`` mimics CUDA's error."""

    id: int
    external: bool
    records: int = 0
    invalid: bool = False

    def __repr__(self) -> str:
        return f"FakeEvent(id={self.id}, external={self.external})"


@attrs.define(eq=False)
class FakeStream:
    id: int

    def __repr__(self) -> str:
        return f"FakeStream(id={self.id})"


@attrs.define(eq=False)
class FakeGraph:
    """A captured graph: the planted events and, for the callable form, the body."""

    id: int
    keep_graph: bool = False
    captured: bool = False
    stream: Optional[FakeStream] = None
    planted: list = attrs.Factory(list)  # FakeEvent, in plant order
    fn: Optional[Callable[[], Any]] = None
    replays: int = 0

    def planted_ids(self) -> set[int]:
        return {e.id for e in self.planted}


@attrs.define(eq=False)
class FakePool:
    id: int


class FakeLog(list):
    """A list of call tuples that also notifies listeners on append."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: list[Callable[[tuple], None]] = []

    def emit(self, entry: tuple) -> None:
        self.append(entry)
        for listener in list(self.listeners):
            listener(entry)

    def of(self, kind: str) -> list[tuple]:
        """The entries of one kind, e.g. ``log.of("record")``."""
        return [e for e in self if e[0] == kind]

    def kinds(self) -> list[str]:
        return [e[0] for e in self]


class FakePlatformPlugin:
    """Platform hooks for device types ``fake`` and ``cpu``, recording every call.

    ``external_events=False`` simulates a platform (or torch) without external events:
    creating an external event raises and the engine should demote ``in_graph``.
    """

    def __init__(self, external_events: bool = True) -> None:
        self.external_events = external_events
        self.log = FakeLog()
        self._ids = itertools.count(1)
        self.default_stream = FakeStream(0)
        self._streams: list[FakeStream] = [self.default_stream]
        self._capturing: Optional[FakeGraph] = None
        self._replaying: Optional[FakeGraph] = None

    # -- state a test may read ---------------------------------------------------------------

    @property
    def listeners(self) -> list[Callable[[tuple], None]]:
        return self.log.listeners

    @property
    def replaying(self) -> bool:
        """True while a callable-captured graph's body re-runs for a replay."""
        return self._replaying is not None

    def _handles(self, device: Any) -> bool:
        return device_type(device) in DEVICE_TYPES

    def _next_id(self) -> int:
        return next(self._ids)

    # -- identity -----------------------------------------------------------------------------

    @hookimpl(trylast=True)
    def warpolicy_platform_name(self, device: Any) -> Optional[str]:
        return "fake" if self._handles(device) else None

    @hookimpl(trylast=True)
    def warpolicy_external_events_supported(self, device: Any) -> Optional[bool]:
        return self.external_events if self._handles(device) else None

    @hookimpl(trylast=True)
    def warpolicy_platform_log(self, device: Any) -> Optional[list]:
        return self.log if self._handles(device) else None

    # -- events -------------------------------------------------------------------------------

    @hookimpl(trylast=True)
    def warpolicy_create_event(self, device: Any, external: bool) -> Optional[FakeEvent]:
        if not self._handles(device):
            return None
        if external and not self.external_events:
            raise TypeError("fake platform: external events are disabled")
        event = FakeEvent(self._next_id(), bool(external))
        self.log.emit(("create_event", event.id, event.external))
        return event

    @hookimpl(trylast=True)
    def warpolicy_record_event(self, device: Any, event: FakeEvent, stream: Any) -> Optional[bool]:
        if not self._handles(device):
            return None
        current = self._streams[-1]
        target = current if stream is None else stream
        if self._replaying is not None:
            self._fire_in_replay(self._replaying, event, target)
        elif self._capturing is not None and target is current:
            self._record_in_capture(self._capturing, event, target)
        else:
            event.records += 1
            event.invalid = False
            self.log.emit(("record", event.id, target.id, False))
        return True

    def _record_in_capture(self, graph: FakeGraph, event: FakeEvent, stream: FakeStream) -> None:
        if event.external:
            graph.planted.append(event)
        else:
            event.invalid = True  # CUDA: no node, and the event errors when used later
        self.log.emit(("record", event.id, stream.id, True))

    def _fire_in_replay(self, graph: FakeGraph, event: FakeEvent, stream: FakeStream) -> None:
        if event.id in graph.planted_ids():
            event.records += 1
            event.invalid = False
            self.log.emit(("record", event.id, stream.id, "in_graph"))
        # any other record in the body made no node at capture: nothing fires

    @hookimpl(trylast=True)
    def warpolicy_wait_event(self, device: Any, stream: FakeStream, event: FakeEvent) -> Optional[bool]:
        if not self._handles(device):
            return None
        if event.invalid:
            raise RuntimeError("invalid argument (fake: a non-external event was recorded during "
                               "capture and then used)")
        self.log.emit(("wait_event", stream.id, event.id))
        return True

    @hookimpl(trylast=True)
    def warpolicy_wait_stream(self, device: Any, stream: FakeStream, other: FakeStream) -> Optional[bool]:
        if not self._handles(device):
            return None
        self.log.emit(("wait_stream", stream.id, other.id))
        return True

    # -- streams ------------------------------------------------------------------------------

    @hookimpl(trylast=True)
    def warpolicy_is_capturing(self, device: Any) -> Optional[bool]:
        if not self._handles(device):
            return None
        return self._capturing is not None or self._replaying is not None

    @hookimpl(trylast=True)
    def warpolicy_new_stream(self, device: Any) -> Optional[FakeStream]:
        return FakeStream(self._next_id()) if self._handles(device) else None

    @hookimpl(trylast=True)
    def warpolicy_current_stream(self, device: Any) -> Optional[FakeStream]:
        return self._streams[-1] if self._handles(device) else None

    @hookimpl(trylast=True)
    def warpolicy_use_stream(self, device: Any, stream: FakeStream) -> Any:
        return self._use_stream(stream) if self._handles(device) else None

    @contextlib.contextmanager
    def _use_stream(self, stream: FakeStream) -> Iterator[FakeStream]:
        self._streams.append(stream)
        try:
            yield stream
        finally:
            self._streams.pop()

    # -- graphs -------------------------------------------------------------------------------

    @hookimpl(trylast=True)
    def warpolicy_new_graph(self, device: Any, keep_graph: bool) -> Optional[FakeGraph]:
        return FakeGraph(self._next_id(), bool(keep_graph)) if self._handles(device) else None

    @hookimpl(trylast=True)
    def warpolicy_graph_pool(self, device: Any) -> Optional[FakePool]:
        return FakePool(self._next_id()) if self._handles(device) else None

    @hookimpl(trylast=True)
    def warpolicy_capture(self, device: Any, graph: FakeGraph, stream: Any, pool: Any) -> Any:
        return self._capture(graph, stream) if self._handles(device) else None

    @hookimpl(trylast=True)
    def warpolicy_capture_callable(self, device: Any, graph: FakeGraph, fn: Callable[[], Any],
                                   stream: Any, pool: Any) -> Optional[bool]:
        if not self._handles(device):
            return None
        with self._capture(graph, stream):
            fn()
        graph.fn = fn
        return True

    @contextlib.contextmanager
    def _capture(self, graph: FakeGraph, stream: Optional[FakeStream]) -> Iterator[FakeGraph]:
        if self._capturing is not None or self._replaying is not None:
            raise RuntimeError("fake platform: nested graph capture")
        # torch.cuda.graph captures on a side stream unless one is given
        graph.stream = stream if stream is not None else FakeStream(self._next_id())
        graph.planted.clear()
        graph.captured = False
        self.log.emit(("capture_begin", graph.id))
        self._capturing = graph
        self._streams.append(graph.stream)
        try:
            yield graph
        finally:
            self._streams.pop()
            self._capturing = None
            self.log.emit(("capture_end", graph.id))
        graph.captured = True  # only reached when the body did not raise

    @hookimpl(trylast=True)
    def warpolicy_replay(self, device: Any, graph: FakeGraph) -> Optional[bool]:
        if not self._handles(device):
            return None
        if not graph.captured:
            raise RuntimeError(f"fake platform: graph {graph.id} was never captured")
        if self._capturing is not None or self._replaying is not None:
            raise RuntimeError("fake platform: replay inside a capture or replay")
        graph.replays += 1
        self.log.emit(("replay", graph.id))
        launch = self._streams[-1]
        if graph.fn is None:
            for event in graph.planted:
                self._fire_in_replay(graph, event, launch)
            return True
        self._replaying = graph
        try:
            graph.fn()
        finally:
            self._replaying = None
        return True

    @hookimpl(trylast=True)
    def warpolicy_synchronize(self, device: Any) -> Optional[bool]:
        if not self._handles(device):
            return None
        self.log.emit(("synchronize",))
        return True


# -- conveniences for tests and CPU runs -----------------------------------------------------------

def fake_platform(*, external_events: bool = True, pm: Any = None) -> Platform:
    """A `Platform` on a fresh fake plugin (its own log), in a fresh plugin manager by default.

    With ``pm`` given, its built-in ``"fake"`` plugin is replaced by a fresh one.
    """
    if pm is None:
        from warpolicy.plugins import new_plugin_manager  # late: plugins imports this module
        pm = new_plugin_manager(load_entry_points=False, environ={})
    if pm.get_plugin("fake") is not None:
        pm.unregister(name="fake")
    pm.register(FakePlatformPlugin(external_events=external_events), name="fake")
    return Platform.for_device("fake", pm)


def fake_plugin(platform: Platform) -> FakePlatformPlugin:
    """The fake plugin instance behind ``platform`` (for listeners and graph state)."""
    plugin = platform.pm.get_plugin("fake")
    if not isinstance(plugin, FakePlatformPlugin):
        raise LookupError(f"{platform!r} is not backed by the built-in fake plugin")
    return plugin
