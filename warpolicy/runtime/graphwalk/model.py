"""A plain-Python model of a captured CUDA graph, reduced to what placement needs.

Each node has a kind, a name (the short kernel name, or the kind), its dependencies, and what
it may touch: for a kernel, every pointer-sized value of its arguments (``words``); for a
memcpy or memset, the device byte ranges it reads or writes (``spans``). The CUDA adapter
(`warpolicy.runtime.graphwalk.cuda`) fills it from a real ``cudaGraph_t``; tests build it by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import attrs


class NodeKind(str, enum.Enum):
    """What a graph node does, as far as the walk can tell."""

    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    EVENT_RECORD = "event_record"
    EVENT_WAIT = "event_wait"
    EMPTY = "empty"
    MEM_ALLOC = "mem_alloc"
    MEM_FREE = "mem_free"
    SEMAPHORE = "semaphore"  # external semaphore signal / wait
    HOST = "host"
    CHILD_GRAPH = "child_graph"
    CONDITIONAL = "conditional"
    UNKNOWN = "unknown"

    @property
    def label(self) -> str:
        return self.value


#: Kinds whose arguments say which memory they touch (matched against the shared buffers).
ACCESS_KINDS = frozenset({NodeKind.KERNEL, NodeKind.MEMCPY, NodeKind.MEMSET})
#: Kinds that touch no memory the scheduler shares: never readers.
INERT_KINDS = frozenset(
    {
        NodeKind.EVENT_RECORD,
        NodeKind.EVENT_WAIT,
        NodeKind.EMPTY,
        NodeKind.MEM_ALLOC,
        NodeKind.MEM_FREE,
        NodeKind.SEMAPHORE,
    }
)
#: Kinds whose effect the walk cannot see (host code, nested graphs, anything unknown):
#: conservatively readers of every shared buffer.
OPAQUE_KINDS = frozenset(NodeKind) - ACCESS_KINDS - INERT_KINDS


def _non_negative(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


def _spans_valid(
    _instance: object, _attribute: attrs.Attribute, value: tuple[tuple[int, int], ...]
) -> None:
    for start, end in value:
        if start < 0 or end < start:
            raise ValueError(f"span [{start:#x}, {end:#x}) is not a byte range")


def _ints(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _spans(values: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(s), int(e)) for s, e in values)


@attrs.frozen
class BufferRange:
    """A shared buffer's device bytes ``[start, end)``; ``end`` itself is outside."""

    name: str = attrs.field(validator=attrs.validators.min_len(1))
    start: int = attrs.field(validator=_non_negative)
    end: int = attrs.field()

    @end.validator
    def _end_after_start(self, _attribute: attrs.Attribute, value: int) -> None:
        if value < self.start:
            raise ValueError(f"buffer {self.name!r}: end {value:#x} before start {self.start:#x}")

    def contains(self, address: int) -> bool:
        return self.start <= address < self.end

    def overlaps(self, start: int, end: int) -> bool:
        return start < self.end and self.start < end


@attrs.frozen
class Node:
    """One graph node. ``index`` is its position in `Graph.nodes`; ``deps`` are indices."""

    index: int = attrs.field(validator=_non_negative)
    kind: NodeKind = attrs.field(converter=NodeKind)
    name: str = ""  # short kernel name; empty means "use the kind"
    deps: tuple[int, ...] = attrs.field(default=(), converter=_ints)
    words: tuple[int, ...] = attrs.field(default=(), converter=_ints)  # kernel argument words
    spans: tuple[tuple[int, int], ...] = attrs.field(
        default=(), converter=_spans, validator=_spans_valid
    )  # memcpy / memset byte ranges
    readable: bool = True  # False: a kernel whose arguments could not be read
    event: int | None = None  # the event handle of an event-record node
    symbol: str = ""  # the full (demangled) kernel symbol, for reports

    @property
    def label(self) -> str:
        return self.name or self.kind.label

    @property
    def opaque(self) -> bool:
        """The walk cannot see what this node touches (counts as a reader of everything)."""
        return self.kind in OPAQUE_KINDS or (self.kind is NodeKind.KERNEL and not self.readable)


def _node_tuple(nodes: Iterable[Node]) -> tuple[Node, ...]:
    return tuple(nodes)


@attrs.frozen
class Graph:
    """Nodes in index order; every dependency names an existing, different node."""

    nodes: tuple[Node, ...] = attrs.field(converter=_node_tuple)

    @nodes.validator
    def _consistent(self, _attribute: attrs.Attribute, value: tuple[Node, ...]) -> None:
        count = len(value)
        for position, node in enumerate(value):
            if node.index != position:
                raise ValueError(f"node at position {position} has index {node.index}")
            for dep in node.deps:
                if not 0 <= dep < count or dep == position:
                    raise ValueError(f"node {position} depends on {dep}, not another node")

    def __len__(self) -> int:
        return len(self.nodes)

    def children(self) -> list[list[int]]:
        """For each node, the nodes that depend on it."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for node in self.nodes:
            for dep in node.deps:
                out[dep].append(node.index)
        return out


def chain(kinds: Sequence[NodeKind | str]) -> Graph:
    """A straight-line graph ``0 -> 1 -> ...`` of nodes of the given kinds (tests, benchmarks)."""
    return Graph(tuple(Node(i, k, deps=(i - 1,) if i else ()) for i, k in enumerate(kinds)))


class TensorLike(Protocol):
    """What `tensor_range` reads from a tensor (torch's names; no torch import needed)."""

    @property
    def shape(self) -> Sequence[int]: ...  # an attribute or a property (torch's Size) both fit
    def data_ptr(self) -> int: ...
    def numel(self) -> int: ...
    def stride(self) -> Sequence[int]: ...
    def element_size(self) -> int: ...


def tensor_range(name: str, tensor: TensorLike) -> BufferRange:
    """The bytes a (possibly strided) tensor spans on its device."""
    start = int(tensor.data_ptr())
    if tensor.numel() == 0:
        return BufferRange(name, start, start)
    last = sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 0
    )
    return BufferRange(name, start, start + (last + 1) * tensor.element_size())


def buffer_ranges(shared: Mapping[str, TensorLike]) -> tuple[BufferRange, ...]:
    """Address ranges of every non-empty shared buffer, sorted by name."""
    ranges = (tensor_range(name, t) for name, t in sorted(shared.items()))
    return tuple(r for r in ranges if r.end > r.start)
