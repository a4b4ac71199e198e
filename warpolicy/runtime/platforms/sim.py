"""The built-in simulated platform: device type ``sim`` (alias ``fake``), no CUDA needed.

It runs everything eagerly on the host, in program order, and keeps three things a CPU test or
demo can inspect:

* **A call log** (`CallLog`), bounded: the last `DEFAULT_LOG_CAP` entries (``log_cap=``), with
  ``log.dropped`` counting what fell off the front. Entries::

      ("create_event", event_id, external)
      ("record", event_id, stream_id, phase)   phase: False = eager record,
                                               True = recorded during a capture,
                                               "in_graph" = a planted node firing in a replay
      ("wait_event", stream_id, event_id)
      ("wait_stream", stream_id, other_stream_id)
      ("capture_begin", graph_id) / ("capture_end", graph_id)
      ("replay", graph_id)
      ("clone", graph_id, clone_id, private_events) / ("rebind", graph_id, labels)
      ("synchronize",)

* **A happens-before model**: every stream carries a vector clock; a record snapshots its
  stream's clock into the event, ``wait_event`` / ``wait_stream`` merge clocks, ``synchronize``
  orders everything after all queued work. `SimPlatform.mark` stamps a point on the current
  stream (say, a read of a shared buffer) and `happens_before` answers whether one mark is
  ordered before another, which is how the fault-injection matrix proves "no early release".

Fault injection (make any operation raise, return None, or act then raise) is test support:
`warpolicy.testing.FaultySimPlatform`, a subclass of this one.

Graph semantics, modelled on CUDA:

* A capture runs its body once, eagerly, with ``is_capturing()`` True and the graph's capture
  stream current. Work done during a capture is not executed work: marks made then are flagged
  ``executed=False``.
* A record during capture *plants* a node only for an external event recorded on the capture
  stream (``stream=None`` or the capture stream itself). A non-external event recorded during
  capture makes no node and becomes unusable: waiting on it later raises
  ``RuntimeError("invalid argument")``, as on the H200.
* Launches of one graph are serialized, on any streams, as CUDA serializes the launches of one
  graph exec: a replay starts after the previous replay of the same graph has finished (its
  stream's clock merges the end of that replay). So a wait on an in-graph event bound to a later
  launch of the same graph on another stream only over-waits, as on the H200.
* ``replay`` logs ``("replay", id)`` and then runs the graph's work. A graph captured with
  ``capture_callable`` re-runs its body at each replay on the launching stream
  (``is_capturing()`` True, ``replaying`` True), so a planted record fires at its place in the
  body; other records in the body made no node and are skipped. A graph captured with the
  context-manager form replays what the body recorded (`warpolicy.runtime.platforms.tape`):
  every torch call again, its results copied into the tensors the capture produced, and the
  planted records at their places between them; reading a tensor's value on the host inside
  that body raises, as on CUDA.

Graph walk (derived placement and the marker self-check): the simulated platform has no real
graph to read, so it walks a hand-made `warpolicy.runtime.graphwalk.Graph` that ``graph_model(graph)``
returns for each captured graph (set ``SimPlatform.graph_model``; without it the walk is
unavailable and a runner fails closed). A kept graph's ``raw_cuda_graph()`` is its id, and the
walk, the plant and ``instantiate`` also take a raw handle (`warpolicy.runtime.graphwalk.RawGraph`)
naming it, as the CUDA platform takes a ``cudaGraph_t``. A derived node fires at each replay after the whole
body (the sim cannot place it inside the body), on the launching stream; a test's graph model
says which readers it found.

Restoring (`warpolicy.runtime.platforms.base.GraphRestorer`): ``clone_graph`` copies a kept,
captured graph (a new id, the same body and nodes; ``origin`` names the first graph), and with
``private_events`` every node of the copy records a fresh event nobody knows, as after a
persistence library's restore: the body's record of the fence's event then fires that private
event (``SimGraph.sources`` maps the body's events to the nodes). ``save_planted`` /
``rebind_planted`` find the planted nodes on the graph model (derived nodes added after their
frontier, as the CUDA walk sees them) by position (`warpolicy.runtime.graphwalk.anchor`) and
re-point them for future replays. A test's ``graph_model`` is asked for the clone too (build it
from ``graph.planted``, and from ``graph.origin`` for what the capture logged).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, overload

import attrs

from warpolicy.runtime.graphwalk import (
    DerivedPlant,
    Graph,
    Node,
    NodeKind,
    Outcome,
    PlacementError,
    SelfCheck,
    derive_plan,
)
from warpolicy.runtime.graphwalk.anchor import SavedAnchors, find_anchored, save_anchors
from warpolicy.runtime.graphwalk.plant import SharedBuffers, check_walked, ranges_of
from warpolicy.runtime.graphwalk.restore import Rebound
from warpolicy.runtime.markers import hookimpl
from warpolicy.runtime.platforms.base import is_simulated
from warpolicy.runtime.platforms.tape import Tape

#: Entries the call log keeps by default (about 10 MB of tuples); older ones are dropped.
DEFAULT_LOG_CAP = 100_000

Clock = dict[int, int]  # stream id -> that stream's counter


def _merge(into: Clock, other: Clock) -> None:
    for key, value in other.items():
        if value > into.get(key, 0):
            into[key] = value


@attrs.define(eq=False)
class SimEvent:
    """An event; ``records`` counts eager and in-graph fires, ``invalid`` mimics CUDA's error,
    ``clock`` is the happens-before stamp of its latest record (None: never recorded)."""

    id: int
    external: bool
    records: int = 0
    invalid: bool = False
    clock: Clock | None = None

    def __repr__(self) -> str:
        return f"SimEvent(id={self.id}, external={self.external})"


@attrs.define(eq=False)
class SimStream:
    id: int
    clock: Clock = attrs.Factory(dict)

    def __repr__(self) -> str:
        return f"SimStream(id={self.id})"


@attrs.define(eq=False)
class SimGraph:
    """A captured graph: the planted events and, for the callable form, the body."""

    id: int
    keep_graph: bool = False
    captured: bool = False
    stream: SimStream | None = None
    planted: list[SimEvent] = attrs.Factory(list)  # in plant order
    fn: Callable[[], Any] | None = None
    replays: int = 0
    derived: list[SimEvent] = attrs.Factory(list)  # derived nodes: fire after the whole body
    tape: Tape | None = None  # the context-manager form's recorded work
    instantiated: bool = False
    #: the clock at the end of the latest replay: the next launch starts after it
    done_clock: Clock | None = None
    #: per derived node, the walk-model nodes it depends on (its frontier)
    derived_after: list[tuple[int, ...]] = attrs.Factory(list)
    #: a clone's (or a rebound graph's) nodes: the event the capture body records -> the index
    #: in ``planted`` of the node that record made (empty: each planted node records the
    #: body's own event)
    sources: dict[int, int] = attrs.Factory(dict)
    #: the graph this one was cloned from (its first ancestor), else None
    origin: int | None = None

    def planted_ids(self) -> set[int]:
        return {e.id for e in self.planted}

    def node_event(self, event: SimEvent) -> SimEvent | None:
        """The event the node made by the body's record of ``event`` records now (None: that
        record made no node)."""
        if any(e is event for e in self.planted):  # a node's own event (no body to re-run)
            return event
        if not self.sources:
            return event if event.id in self.planted_ids() else None
        index = self.sources.get(event.id)
        return self.planted[index] if index is not None and index < len(self.planted) else None

    def raw_cuda_graph(self) -> int:
        """The graph's id, as torch's ``CUDAGraph.raw_cuda_graph()`` answers the ``cudaGraph_t``
        (a kept, captured graph only): what an engine holding a raw handle passes around."""
        if not self.keep_graph:
            raise RuntimeError(
                "sim graph: the raw graph was not kept (capture with keep_graph=True)"
            )
        if not self.captured:
            raise RuntimeError(f"sim graph {self.id} was never captured")
        return self.id


@attrs.define(eq=False)
class SimPool:
    id: int


@attrs.frozen
class Mark:
    """A point on a stream (see `SimPlatform.mark`); ``executed=False`` inside a capture."""

    label: str
    stream: int
    tick: int
    clock: Clock = attrs.field(eq=False, repr=False)
    executed: bool = True


class CallLog:
    """The bounded call log: the last ``cap`` entries (tuples), notifying ``listeners`` of each.

    It reads like a list of the entries still held (``len``, iteration, indexing, slicing, and
    equality with a list); ``dropped`` counts entries that fell off the front.
    """

    def __init__(self, cap: int = DEFAULT_LOG_CAP) -> None:
        if int(cap) < 1:
            raise ValueError(f"log cap must be at least 1, got {cap}")
        self._entries: collections.deque[tuple] = collections.deque(maxlen=int(cap))
        self.listeners: list[Callable[[tuple], None]] = []
        self.dropped = 0

    @property
    def maxlen(self) -> int:
        return self._entries.maxlen or 0

    def append(self, entry: tuple) -> None:
        if len(self._entries) == self._entries.maxlen:
            self.dropped += 1
        self._entries.append(entry)

    def emit(self, entry: tuple) -> None:
        self.append(entry)
        for listener in list(self.listeners):
            listener(entry)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._entries)

    @overload
    def __getitem__(self, index: int) -> tuple: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple]: ...

    def __getitem__(self, index: int | slice) -> tuple | list[tuple]:
        if isinstance(index, slice):
            return list(self._entries)[index]
        return self._entries[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, CallLog)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"CallLog({list(self._entries)!r}, dropped={self.dropped})"

    def of(self, kind: str) -> list[tuple]:
        """The entries of one kind, e.g. ``log.of("record")``."""
        return [e for e in self._entries if e[0] == kind]

    def kinds(self) -> list[str]:
        return [e[0] for e in self._entries]


class SimPlatform:
    """`PlatformImpl` of the simulated device: logs every call, models happens-before.

    ``external_events=False`` simulates a platform (or torch) without external events:
    creating an external event raises and the engine demotes ``in_graph``.
    """

    name = "sim"

    def __init__(
        self, external_events: bool = True, *, device: str = "sim", log_cap: int = DEFAULT_LOG_CAP
    ) -> None:
        self.device = device
        self.external_events_supported = bool(external_events)
        self.log = CallLog(log_cap)
        self._ids = itertools.count(1)
        #: what every stream is ordered after: all work the host synchronized with
        self._floor: Clock = {}
        self._issued: Clock = {}  # the latest tick of every stream, dropped streams included
        self.default_stream = SimStream(0)
        self._streams: list[SimStream] = [self.default_stream]  # the current-stream stack
        self._all_streams: weakref.WeakSet[SimStream] = weakref.WeakSet([self.default_stream])
        self._capturing: SimGraph | None = None
        self._replaying: SimGraph | None = None
        #: ``graph_model(graph) -> Graph``: the hand-made graph the walk reads for ``graph``
        self.graph_model: Callable[[SimGraph], Graph] | None = None
        #: graphs by id: a raw handle (``RawGraph(graph.raw_cuda_graph())``) finds its graph
        self._graphs: weakref.WeakValueDictionary[int, SimGraph] = weakref.WeakValueDictionary()

    def __repr__(self) -> str:
        return f"SimPlatform(external_events={self.external_events_supported})"

    # -- state a test may read ---------------------------------------------------------------

    @property
    def listeners(self) -> list[Callable[[tuple], None]]:
        return self.log.listeners

    @property
    def replaying(self) -> bool:
        """True while a callable-captured graph's body re-runs for a replay."""
        return self._replaying is not None

    @property
    def capturing(self) -> bool:
        """True inside a capture (not during a replay's re-run)."""
        return self._capturing is not None

    def _next_id(self) -> int:
        return next(self._ids)

    def _stream(self, stream_id: int | None = None) -> SimStream:
        # a new stream starts after everything the host has synchronized with
        stream = SimStream(self._next_id() if stream_id is None else stream_id, dict(self._floor))
        self._all_streams.add(stream)
        return stream

    # -- happens-before ----------------------------------------------------------------------

    def mark(self, label: str = "") -> Mark:
        """Stamp a point on the current stream (e.g. a read or write of shared state)."""
        stream = self._streams[-1]
        tick = stream.clock.get(stream.id, 0) + 1
        stream.clock[stream.id] = tick
        self._issued[stream.id] = tick
        return Mark(label, stream.id, tick, dict(stream.clock), executed=self._capturing is None)

    @staticmethod
    def happens_before(first: Mark, second: Mark) -> bool:
        """Whether ``first`` is ordered before ``second`` (same stream in order, or through
        records, waits and synchronizes)."""
        return second.clock.get(first.stream, 0) >= first.tick

    # -- events -------------------------------------------------------------------------------

    def create_event(self, external: bool) -> SimEvent:
        if external and not self.external_events_supported:
            raise TypeError("sim platform: external events are disabled")
        event = SimEvent(self._next_id(), bool(external))
        self.log.emit(("create_event", event.id, event.external))
        return event

    def record(self, event: SimEvent, stream: SimStream | None = None) -> None:
        current = self._streams[-1]
        target = current if stream is None else stream
        if self._replaying is not None:
            self._fire_in_replay(self._replaying, event, target)
        elif self._capturing is not None and target is current:
            self._record_in_capture(self._capturing, event, target)
        else:
            event.records += 1
            event.invalid = False
            event.clock = dict(target.clock)
            self.log.emit(("record", event.id, target.id, False))

    def _record_in_capture(self, graph: SimGraph, event: SimEvent, stream: SimStream) -> None:
        if event.external:
            graph.planted.append(event)
            if graph.tape is not None:
                graph.tape.planted(event)
        else:
            event.invalid = True  # CUDA: no node, and the event errors when used later
        self.log.emit(("record", event.id, stream.id, True))

    def _fire_in_replay(self, graph: SimGraph, event: SimEvent, stream: SimStream) -> None:
        node = graph.node_event(event)  # a clone's node may record another event now
        if node is not None:
            node.records += 1
            node.invalid = False
            node.clock = dict(stream.clock)
            self.log.emit(("record", node.id, stream.id, "in_graph"))
        # any other record in the body made no node at capture: nothing fires

    def wait_event(self, stream: SimStream, event: SimEvent) -> None:
        if event.invalid:
            raise RuntimeError(
                "invalid argument (sim: a non-external event was recorded during "
                "capture and then used)"
            )
        if event.clock is not None:  # a never-recorded event: a silent no-op, as on CUDA
            _merge(stream.clock, event.clock)
        self.log.emit(("wait_event", stream.id, event.id))

    def wait_stream(self, stream: SimStream, other: SimStream) -> None:
        _merge(stream.clock, other.clock)
        self.log.emit(("wait_stream", stream.id, other.id))

    # -- streams ------------------------------------------------------------------------------

    def is_capturing(self) -> bool:
        return self._capturing is not None or self._replaying is not None

    def new_stream(self) -> SimStream:
        return self._stream()

    def current_stream(self) -> SimStream:
        return self._streams[-1]

    def use_stream(self, stream: SimStream) -> contextlib.AbstractContextManager[SimStream]:
        return self._use_stream(stream)

    @contextlib.contextmanager
    def _use_stream(self, stream: SimStream) -> Iterator[SimStream]:
        if not isinstance(stream, SimStream):
            raise TypeError(f"sim platform: not a stream: {stream!r}")
        self._streams.append(stream)
        try:
            yield stream
        finally:
            self._streams.pop()

    # -- graphs -------------------------------------------------------------------------------

    def new_graph(self, keep_graph: bool) -> SimGraph:
        graph = SimGraph(self._next_id(), bool(keep_graph))
        self._graphs[graph.id] = graph
        return graph

    def graph_pool(self) -> SimPool:
        return SimPool(self._next_id())

    def capture(
        self, graph: SimGraph, stream: SimStream | None = None, pool: SimPool | None = None
    ) -> contextlib.AbstractContextManager[SimGraph]:
        return self._capture_recorded(graph, stream)

    @contextlib.contextmanager
    def _capture_recorded(self, graph: SimGraph, stream: SimStream | None) -> Iterator[SimGraph]:
        with self._capture(graph, stream):
            graph.tape = Tape()
            with graph.tape.recording():
                yield graph

    def capture_callable(
        self,
        graph: SimGraph,
        fn: Callable[[], Any],
        stream: SimStream | None = None,
        pool: SimPool | None = None,
    ) -> None:
        with self._capture(graph, stream):
            fn()
        graph.fn = fn

    @contextlib.contextmanager
    def _capture(self, graph: SimGraph, stream: SimStream | None) -> Iterator[SimGraph]:
        if self._capturing is not None or self._replaying is not None:
            raise RuntimeError("sim platform: nested graph capture")
        # torch.cuda.graph captures on a side stream unless one is given
        graph.stream = stream if stream is not None else self._stream()
        graph.planted.clear()
        graph.derived.clear()
        graph.derived_after.clear()
        graph.sources.clear()
        graph.instantiated = False
        graph.captured = False
        graph.fn = None
        graph.tape = None
        graph.done_clock = None
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

    def replay(self, graph: SimGraph) -> None:
        if not graph.captured:
            raise RuntimeError(f"sim platform: graph {graph.id} was never captured")
        if self._capturing is not None or self._replaying is not None:
            raise RuntimeError("sim platform: replay inside a capture or replay")
        graph.replays += 1
        self.log.emit(("replay", graph.id))
        launch = self._streams[-1]
        if graph.done_clock is not None:  # serialized after the previous launch of this graph
            _merge(launch.clock, graph.done_clock)
        if graph.tape is not None:
            self._replaying = graph
            try:
                graph.tape.replay(lambda event: self._fire_in_replay(graph, event, launch))
            finally:
                self._replaying = None
        elif graph.fn is None:
            for event in graph.planted:
                self._fire_in_replay(graph, event, launch)
        else:
            self._replaying = graph
            try:
                graph.fn()
            finally:
                self._replaying = None
        for event in graph.derived:  # after the last reader: the end of the body
            event.records += 1
            event.invalid = False
            event.clock = dict(launch.clock)
            self.log.emit(("record", event.id, launch.id, "in_graph"))
        graph.done_clock = dict(launch.clock)

    def synchronize(self) -> None:
        everything = self._floor
        _merge(everything, self._issued)  # every stream's work, even a stream since dropped
        for stream in list(self._all_streams):  # work issued from now on is ordered after it
            _merge(stream.clock, everything)
        self.log.emit(("synchronize",))

    # -- graph walk (on the hand-made graph model) ---------------------------------------------

    def graph_walk_unavailable(self) -> str | None:
        if self.graph_model is None:
            return "the simulated platform has no graph model to walk (SimPlatform.graph_model)"
        return None

    def graph_of(self, graph: Any) -> SimGraph:
        """The `SimGraph` behind ``graph``: itself, or the graph a raw handle (anything with
        ``raw_cuda_graph()``, e.g. a `warpolicy.runtime.graphwalk.RawGraph`) names."""
        if isinstance(graph, SimGraph):
            return graph
        getter = getattr(graph, "raw_cuda_graph", None)
        if getter is None:
            raise PlacementError(f"not a graph of the simulated platform: {graph!r}")
        try:
            found = self._graphs.get(int(getter()))
        except Exception as exc:  # noqa: BLE001 - one line; the caller fails closed
            raise PlacementError(f"the raw graph is not available ({exc})") from None
        if found is None:
            raise PlacementError(f"no graph of this simulated platform has the handle {graph!r}")
        return found

    def _model_of(self, graph: SimGraph) -> Graph:
        if self.graph_model is None:
            raise PlacementError(self.graph_walk_unavailable() or "no graph model")
        if not graph.captured:
            raise PlacementError(f"sim graph {graph.id} was never captured")
        if not graph.keep_graph:  # as on CUDA: only a kept graph can be read
            raise PlacementError(
                f"the raw graph of sim graph {graph.id} was not kept; capture with keep_graph=True"
            )
        model = self.graph_model(graph)
        if not isinstance(model, Graph):
            raise PlacementError(
                f"the graph model of sim graph {graph.id} is "
                f"{type(model).__name__}, not a warpolicy.runtime.graphwalk.Graph"
            )
        return model

    def plant_derived(
        self, graph: Any, shared_buffers: SharedBuffers, event: SimEvent
    ) -> DerivedPlant:
        """Derive the read-done node on the graph model; the node fires after the body."""
        graph = self.graph_of(graph)
        if graph.instantiated:
            raise PlacementError("the graph is already instantiated; plant before instantiate()")
        if not isinstance(event, SimEvent) or event.records == 0:
            raise PlacementError(
                "the read-done event has no handle yet; record it once eagerly before planting"
            )
        if any(e is event for e in graph.planted):
            raise PlacementError(
                "the graph already records the read-done event (a marker was "
                "planted); derived placement captures without one"
            )
        model = self._model_of(graph)
        ranges = ranges_of(shared_buffers)
        if not ranges:
            raise PlacementError("no non-empty shared buffers to look for")
        plan = derive_plan(model, ranges)
        if plan.outcome is Outcome.NO_READERS:
            names = ", ".join(r.name for r in ranges)
            raise PlacementError(
                f"no node of the {plan.nodes}-node graph was seen touching a "
                f"shared buffer ({names}); no release point can be derived",
                no_readers=True,
            )
        graph.derived.append(event)
        graph.derived_after.append(plan.frontier)
        by_index = {r.index: r for r in plan.readers}
        return DerivedPlant(
            plan.readers, tuple(by_index[i] for i in plan.frontier), plan.nodes, 0.0, 0.0, 0.0
        )

    def check_marker(self, graph: Any, shared_buffers: SharedBuffers, event: SimEvent) -> SelfCheck:
        """The marker self-check on the graph model (the marker node records ``event.id``)."""
        if not isinstance(event, SimEvent):
            raise PlacementError("the marker event has no handle; nothing to look for")
        return check_walked(self._walked(self.graph_of(graph)), ranges_of(shared_buffers), event.id)

    def instantiate(self, graph: Any) -> None:
        self.graph_of(graph).instantiated = True

    # -- restoring (clone, find the planted nodes again, rebind) ---------------------------------

    def _walked(self, graph: SimGraph) -> Graph:
        """The graph model with each derived node added after its frontier (as the CUDA walk
        sees a planted derived node)."""
        model = self._model_of(graph)
        if not graph.derived:
            return model
        nodes = list(model.nodes)
        for event, after in zip(graph.derived, graph.derived_after):
            nodes.append(Node(len(nodes), NodeKind.EVENT_RECORD, deps=after, event=event.id))
        return Graph(nodes)

    def save_planted(self, graph: Any, planted: Mapping[str, SimEvent]) -> SavedAnchors:
        """The anchors of the planted nodes of a kept graph, on its graph model."""
        handles = {}
        for label, event in planted.items():
            if not isinstance(event, SimEvent):
                raise PlacementError(f"planted node {label!r}: not an event of this platform")
            handles[label] = event.id
        return save_anchors(self._walked(self.graph_of(graph)), handles)

    def rebind_planted(
        self, graph: Any, saved: SavedAnchors, events: Mapping[str, SimEvent]
    ) -> Rebound:
        """Find the planted nodes of ``saved`` on the restored graph's model by position and
        make each record ``events[label]`` (for future replays, instantiated or not)."""
        target = self.graph_of(graph)
        for label in saved.labels:
            event = events.get(label)
            if not isinstance(event, SimEvent) or event.records == 0:
                raise PlacementError(
                    f"the new event of planted node {label!r} has no handle yet; record it "
                    f"once eagerly before rebinding"
                )
        model = self._walked(target)
        found = find_anchored(model, saved)
        if not target.sources:  # the body's records now name nodes, not events
            target.sources = {e.id: i for i, e in enumerate(target.planted)}
        for item in found:
            recorded = model.nodes[item.index].event
            new = events[item.label]
            slots = [i for i, e in enumerate(target.planted) if e.id == recorded]
            derived = [i for i, e in enumerate(target.derived) if e.id == recorded]
            if slots:
                target.planted[slots[0]] = new
            elif derived:
                target.derived[derived[0]] = new
            else:
                raise PlacementError(
                    f"planted node {item.label!r} (#{item.index}) records no event of the graph"
                )
        self.log.emit(("rebind", target.id, tuple(f.label for f in found)))
        return Rebound(found, len(model), 0.0, 0.0, 0.0, target.instantiated)

    def clone_graph(self, graph: Any, private_events: bool) -> SimGraph:
        """A copy of a kept, captured graph (``cudaGraphClone``), not instantiated; with
        ``private_events`` each node records a fresh event nobody knows (a restore's)."""
        source = self.graph_of(graph)
        if not source.captured or not source.keep_graph:
            raise PlacementError(
                f"sim graph {source.id}: only a kept, captured graph can be cloned"
            )

        def node_event(event: SimEvent) -> SimEvent:
            if not private_events:
                return event
            return self.create_event(external=True)

        # every field copied (what the capture recorded, however it replays), then the copy's own
        clone = attrs.evolve(
            source,
            id=self._next_id(),
            planted=[node_event(e) for e in source.planted],
            derived=[node_event(e) for e in source.derived],
            derived_after=list(source.derived_after),
            sources=dict(source.sources) or {e.id: i for i, e in enumerate(source.planted)},
            origin=source.origin if source.origin is not None else source.id,
            instantiated=False,
            replays=0,
            done_clock=None,
        )
        self._graphs[clone.id] = clone
        self.log.emit(("clone", source.id, clone.id, bool(private_events)))
        return clone


class SimPlugin:
    """The built-in plugin: claims ``sim`` (and its alias ``fake``) devices with a fresh `SimPlatform`
    per `Platform`, so each platform has its own log and clocks."""

    def __init__(self, external_events: bool = True, log_cap: int = DEFAULT_LOG_CAP) -> None:
        self.external_events = external_events
        self.log_cap = log_cap

    @hookimpl
    def warpolicy_platform(self, device: str) -> SimPlatform | None:
        if not is_simulated(device):
            return None
        return SimPlatform(self.external_events, device="sim", log_cap=self.log_cap)
