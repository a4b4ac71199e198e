"""Graph analysis: which nodes may read shared state, and where a read-done node may go.

* `find_readers`: kernels whose argument words point into a shared buffer, memcpy / memset
  nodes whose byte ranges overlap one, and every node whose effect the walk cannot see (host,
  child or conditional graph, unknown type, a kernel with unreadable arguments).
* `derive_plan`: the readers a new event-record node must depend on (reduced to the frontier:
  readers that are not ancestors of another reader), or `Outcome.NO_READERS`.
* `late_readers`: the self-check of a planted node: readers that are not its ancestors.

Everything is linear in nodes + edges (+ argument words), so a 1,000-node graph costs a few
milliseconds (``python -m warpolicy.bench.graphwalk``).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence

import attrs

from warpolicy.runtime.graphwalk.errors import PlacementError
from warpolicy.runtime.graphwalk.model import BufferRange, Graph, Node, NodeKind


@attrs.frozen
class Reader:
    """A node that may read (or write) shared state."""

    index: int
    kind: NodeKind
    name: str
    buffers: tuple[str, ...]  # shared buffers it touches; empty when ``opaque``
    opaque: bool = False  # its effect cannot be seen: counted as a reader of everything

    def describe(self) -> str:
        """``indexSelectSmallIndex (kernel #12) reads swa_map`` or ``host node #3 (unseen)``."""
        if self.opaque:
            return f"{self.name} ({self.kind.label} #{self.index}; effect unseen)"
        return f"{self.name} ({self.kind.label} #{self.index}) reads {', '.join(self.buffers)}"

    @property
    def buffer_label(self) -> str:
        return ", ".join(self.buffers) if self.buffers else "any shared buffer (unseen)"


class Outcome(enum.Enum):
    PLANNED = "planned"
    NO_READERS = "no_readers"  # no node was seen touching a shared buffer: suspicious


@attrs.frozen
class DerivedPlan:
    """Where the derived read-done node goes."""

    outcome: Outcome
    readers: tuple[Reader, ...]  # every reader, opaque ones included, in node order
    frontier: tuple[int, ...]  # the readers the new node depends on (no reader after them)
    nodes: int  # nodes in the graph
    #: nodes already after every frontier node that the new node is joined to (see
    #: `joining_successors`); empty when none exists (the new node is then a leaf)
    successors: tuple[int, ...] = ()

    @property
    def seen(self) -> tuple[Reader, ...]:
        """Readers seen touching a shared buffer (not merely opaque)."""
        return tuple(r for r in self.readers if not r.opaque)


# ---------------------------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------------------------


class _Matcher:
    """Matches addresses and byte ranges against shared buffers (few buffers, many words)."""

    def __init__(self, ranges: Sequence[BufferRange]) -> None:
        self.ranges = tuple(r for r in ranges if r.end > r.start)
        self.low = min((r.start for r in self.ranges), default=0)
        self.high = max((r.end for r in self.ranges), default=0)

    def words(self, words: Iterable[int]) -> tuple[str, ...]:
        low, high = self.low, self.high
        hit = {r.name for w in words if low <= w < high for r in self.ranges if r.contains(w)}
        return tuple(sorted(hit))

    def spans(self, spans: Iterable[tuple[int, int]]) -> tuple[str, ...]:
        hit = {r.name for s, e in spans for r in self.ranges if r.overlaps(s, max(e, s + 1))}
        return tuple(sorted(hit))

    def node(self, node: Node) -> tuple[str, ...]:
        if node.kind is NodeKind.KERNEL:
            return self.words(node.words)
        if node.kind in (NodeKind.MEMCPY, NodeKind.MEMSET):
            return self.spans(node.spans)
        return ()


def buffers_touched(node: Node, ranges: Sequence[BufferRange]) -> tuple[str, ...]:
    """The shared buffers ``node``'s arguments point into (sorted; empty for other kinds)."""
    return _Matcher(ranges).node(node)


def find_readers(graph: Graph, ranges: Sequence[BufferRange]) -> tuple[Reader, ...]:
    """Every node that may read shared state, in node order (opaque nodes included)."""
    matcher = _Matcher(ranges)
    readers = []
    for node in graph.nodes:
        if node.opaque:
            readers.append(Reader(node.index, node.kind, node.label, (), opaque=True))
            continue
        hit = matcher.node(node)
        if hit:
            readers.append(Reader(node.index, node.kind, node.label, hit))
    return tuple(readers)


# ---------------------------------------------------------------------------------------------
# Ordering
# ---------------------------------------------------------------------------------------------


def ancestors(graph: Graph, index: int) -> frozenset[int]:
    """Every node with a dependency path to node ``index`` (not the node itself)."""
    nodes = graph.nodes
    seen: set[int] = set()
    todo = deque(nodes[index].deps)
    while todo:
        node = todo.popleft()
        if node not in seen:
            seen.add(node)
            todo.extend(nodes[node].deps)
    return frozenset(seen)


def topological_order(graph: Graph) -> list[int]:
    """Node indices, every node after its dependencies; raises ValueError on a cycle."""
    children = graph.children()
    waiting = [len(set(n.deps)) for n in graph.nodes]
    ready = deque(i for i, count in enumerate(waiting) if count == 0)
    order = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for child in set(children[node]):
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if len(order) != len(graph.nodes):
        raise ValueError("the graph has a dependency cycle")
    return order


def reader_frontier(graph: Graph, readers: Iterable[int]) -> tuple[int, ...]:
    """The readers that are not ancestors of another reader (sorted).

    A node depending on exactly these is ordered after every reader: each other reader is an
    ancestor of one of them.
    """
    is_reader = [False] * len(graph.nodes)
    for index in readers:
        is_reader[index] = True
    children = graph.children()
    reader_below = [False] * len(graph.nodes)  # some descendant is a reader
    for node in reversed(topological_order(graph)):
        reader_below[node] = any(is_reader[c] or reader_below[c] for c in children[node])
    return tuple(i for i, r in enumerate(is_reader) if r and not reader_below[i])


def joining_successors(graph: Graph, frontier: Sequence[int]) -> tuple[int, ...]:
    """The first nodes after every node of ``frontier``: descendants of each frontier node
    none of whose dependencies is one (sorted).

    A read-done node that depends on the frontier is joined to these by new edges, so it is
    not a leaf of the graph. The edges order nothing new (each successor already waits for the
    whole frontier), but they matter for speed: on an H200 a leaf event-record node added to a
    captured decode graph cost about 45 us per replay, the same node joined to its successors
    about 2 us (docs/ARCHITECTURE.md, "Derived placement"). Empty when the frontier has no common
    descendant (a frontier node is a sink).
    """
    if not frontier:
        return ()
    children = graph.children()

    def descendants(start: int) -> set[int]:
        seen: set[int] = set()
        todo = deque(children[start])
        while todo:
            node = todo.popleft()
            if node not in seen:
                seen.add(node)
                todo.extend(children[node])
        return seen

    common = set.intersection(*(descendants(f) for f in frontier))
    nodes = graph.nodes
    return tuple(sorted(c for c in common if not any(d in common for d in nodes[c].deps)))


# ---------------------------------------------------------------------------------------------
# Derived placement and the self-check
# ---------------------------------------------------------------------------------------------


def derive_plan(graph: Graph, ranges: Sequence[BufferRange]) -> DerivedPlan:
    """The readers a new read-done node must depend on, or `Outcome.NO_READERS` when no node
    was seen touching a shared buffer (opaque nodes alone do not make a plan: the shared reads
    are then most likely hidden from the walk, and the release point would be a guess)."""
    readers = find_readers(graph, ranges)
    if not any(not r.opaque for r in readers):
        return DerivedPlan(Outcome.NO_READERS, readers, (), len(graph))
    frontier = reader_frontier(graph, (r.index for r in readers))
    successors = joining_successors(graph, frontier)
    return DerivedPlan(Outcome.PLANNED, readers, frontier, len(graph), successors)


def find_event_record(graph: Graph, event: int) -> int | None:
    """The one event-record node recording ``event``; None when there is none.

    Raises `PlacementError` when several nodes record it: which one releases the scheduler
    would depend on replay timing.
    """
    found = [
        n.index
        for n in graph.nodes
        if n.kind is NodeKind.EVENT_RECORD and n.event is not None and n.event == event
    ]
    if len(found) > 1:
        raise PlacementError(
            f"event {event:#x} is recorded by {len(found)} nodes "
            f"({', '.join(f'#{i}' for i in found)}); the release point is "
            f"ambiguous"
        )
    return found[0] if found else None


def late_readers(
    graph: Graph,
    ranges: Sequence[BufferRange],
    planted: int,
    *,
    readers: Sequence[Reader] | None = None,
) -> tuple[Reader, ...]:
    """Readers that are not ancestors of node ``planted``: the release does not cover them.

    ``readers``: `find_readers`'s answer when the caller already has it.
    """
    before = ancestors(graph, planted)
    found = find_readers(graph, ranges) if readers is None else readers
    return tuple(r for r in found if r.index != planted and r.index not in before)
