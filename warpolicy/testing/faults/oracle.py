"""The fault matrix's happens-before oracle: vector clocks computed from the call log alone.

The oracle is deliberately *not* the simulated platform's own model (`SimPlatform.mark`,
`SimPlatform.happens_before` and the clocks on its streams and events are code under test).
It subscribes to the platform's call log (`CallLog.listeners`) and replays every entry, in the
order the host issued them, against its own model of CUDA (docs/background.md §3):

* every stream carries a vector clock; each operation enqueued on a stream is one tick of it;
* ``record`` snapshots the stream's clock into the event: a wait binds to the **most recently
  enqueued** record (``("record", ..., False)`` eager, ``"in_graph"`` a graph node firing at
  its place in a replay); a record made during a capture (``True``) executes nothing;
* ``wait_event`` merges the event's snapshot; a wait on a never-recorded event is a no-op;
* ``wait_stream`` merges the other stream's clock as it is now;
* ``synchronize`` orders everything enqueued later (on any stream, new ones too) after all
  work enqueued so far (the host clock);
* launches of one graph are serialized, across streams: a replay starts after the previous
  replay of the same graph has finished (so an in-graph event waited on after a later launch
  of its graph only over-waits, as on the H200);
* work logged between ``capture_begin`` and ``capture_end`` is captured, not executed.

The harness adds its own entries to the same log, in program order with the platform's:

* ``("launch", graph_id, stream_id)`` just before a ``replay`` call and ``("landed", graph_id,
  stream_id)`` after it returns or raises (a replay that logged nothing is ignored);
* ``("read", stream_id, lane, step, label)``: the forward read shared state for ``step``;
* ``("write", stream_id, lane, through, label)``: the scheduler wrote shared state, released
  for every step up to ``through`` of ``lane`` (one lane per scheduler thread);
* ``("work", stream_id, label)``: private work (a tick, no shared access).

A write not ordered after a read of its lane with ``step <= through`` is an **early
release**; a read not ordered after the last write of its lane before it is a **stale read**.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import attrs

Clock = dict[int, int]  # stream id -> ticks of that stream


def _merged(into: Clock, other: Clock | None) -> None:
    if other:
        for key, value in other.items():
            if value > into.get(key, 0):
                into[key] = value


@attrs.frozen
class Point:
    """One executed access: stream, its tick there, and everything ordered before it."""

    stream: int
    tick: int
    clock: Clock = attrs.field(eq=False, repr=False)
    lane: int = 0
    step: int = 0
    label: str = ""

    def before(self, other: Point) -> bool:
        """Whether this point happens before ``other``."""
        return other.clock.get(self.stream, 0) >= self.tick


@attrs.define
class Verdict:
    """What the oracle found so far."""

    reads: int = 0
    writes: int = 0
    early_writes: int = 0  # writes not ordered after some read they were released for
    early_pairs: int = 0  # (read, write) pairs out of order
    stale_reads: int = 0
    first_early: str | None = None  # the first offending pair, described


@attrs.define
class _Launch:
    graph: int
    stream: int
    started: bool = False


class Oracle:
    """Vector clocks over the call log; feed it entries (or `attach` it to a log)."""

    def __init__(self, *, check_stale: bool = True) -> None:
        self.check_stale = check_stale
        self.verdict = Verdict()
        self._lock = threading.Lock()
        self._clocks: dict[int, Clock] = {}
        self._host: Clock = {}  # what the host has synchronized with
        self._events: dict[int, Clock] = {}  # event id -> snapshot of its latest record
        self._graph_done: dict[int, Clock] = {}  # graph id -> end of its last launch
        self._launches: list[_Launch] = []
        self._capturing: int | None = None
        self._reads: dict[int, list[Point]] = {}  # lane -> every executed read
        self._last_write: dict[int, Point] = {}
        #: every entry captured into each graph, in order (the harness builds graph models)
        self.captured: dict[int, list[tuple]] = {}
        #: called with each early write (harness bookkeeping: silent or after an error)
        self.on_early: Callable[[Point], None] | None = None

    def attach(self, listeners: list[Callable[[tuple], None]]) -> None:
        """Subscribe to a call log (``SimPlatform.log.listeners``)."""
        listeners.append(self.feed)

    # -- the model ------------------------------------------------------------------------------

    def _tick(self, stream: int) -> Clock:
        clock = self._clocks.setdefault(stream, {})
        _merged(clock, self._host)
        clock[stream] = clock.get(stream, 0) + 1
        return clock

    def feed(self, entry: tuple) -> None:
        with self._lock:
            self._feed(entry)

    def _feed(self, entry: tuple) -> None:
        kind = entry[0]
        if self._capturing is not None and kind not in ("capture_end", "capture_begin"):
            self.captured.setdefault(self._capturing, []).append(entry)
            if kind in ("read", "write", "work"):
                return  # the body's work is captured, not run (records: see _record)
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, entry)

    def _record(self, entry: tuple) -> None:
        _, event, stream, phase = entry
        if phase is True:  # recorded during a capture: a node (or nothing), not a record
            return
        self._events[event] = dict(self._tick(stream))

    def _wait_event(self, entry: tuple) -> None:
        _, stream, event = entry
        clock = self._tick(stream)
        _merged(clock, self._events.get(event))  # never recorded: a no-op

    def _wait_stream(self, entry: tuple) -> None:
        _, stream, other = entry
        snapshot = dict(self._clocks.get(other, {}))
        _merged(self._tick(stream), snapshot)

    def _synchronize(self, entry: tuple) -> None:
        for clock in self._clocks.values():
            _merged(self._host, clock)

    def _capture_begin(self, entry: tuple) -> None:
        self._capturing = entry[1]
        self.captured[entry[1]] = []

    def _capture_end(self, entry: tuple) -> None:
        self._capturing = None

    def _launch(self, entry: tuple) -> None:
        self._launches.append(_Launch(entry[1], entry[2]))

    def _replay(self, entry: tuple) -> None:
        graph = entry[1]
        launch = self._launches[-1] if self._launches else None
        if launch is None or launch.graph != graph:
            return  # a replay the harness did not announce (not through the platform)
        launch.started = True
        # one graph's launches run one after the other, whatever stream launches them
        _merged(self._tick(launch.stream), self._graph_done.get(graph))

    def _landed(self, entry: tuple) -> None:
        while self._launches:
            launch = self._launches.pop()
            if launch.graph == entry[1]:
                if launch.started:
                    self._graph_done[launch.graph] = dict(self._tick(launch.stream))
                return

    def _point(self, stream: int, lane: int, step: int, label: str) -> Point:
        clock = self._tick(stream)
        return Point(stream, clock[stream], dict(clock), lane, step, label)

    def _read(self, entry: tuple) -> None:
        _, stream, lane, step, label = entry
        point = self._point(stream, lane, step, label)
        self.verdict.reads += 1
        last = self._last_write.get(lane)
        if self.check_stale and last is not None and not last.before(point):
            self.verdict.stale_reads += 1
        self._reads.setdefault(lane, []).append(point)

    def _write(self, entry: tuple) -> None:
        _, stream, lane, through, label = entry
        point = self._point(stream, lane, through, label)
        self.verdict.writes += 1
        late = [r for r in self._reads.get(lane, ()) if r.step <= through and not r.before(point)]
        if late:
            self.verdict.early_writes += 1
            self.verdict.early_pairs += len(late)
            if self.verdict.first_early is None:
                first = late[0]
                self.verdict.first_early = (
                    f"write {label!r} (stream {stream}, through step {through}) not ordered "
                    f"after read {first.label!r} of step {first.step} (stream {first.stream})"
                )
            if self.on_early is not None:
                self.on_early(point)
        self._last_write[lane] = point

    def _work(self, entry: tuple) -> None:
        self._tick(entry[1])


_HANDLERS: dict[str, Callable[[Oracle, tuple], None]] = {
    "record": Oracle._record,
    "wait_event": Oracle._wait_event,
    "wait_stream": Oracle._wait_stream,
    "synchronize": Oracle._synchronize,
    "capture_begin": Oracle._capture_begin,
    "capture_end": Oracle._capture_end,
    "launch": Oracle._launch,
    "replay": Oracle._replay,
    "landed": Oracle._landed,
    "read": Oracle._read,
    "write": Oracle._write,
    "work": Oracle._work,
}
