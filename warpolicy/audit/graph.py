"""The static audit's classification: which nodes of a captured graph touch shared buffers,
and which of those the release point does not cover.

Pure Python over `GraphNode` lists and ``(from, to)`` edges, so the CPU tests exercise it on
hand-made graphs; `warpolicy.audit.cuda_graph` builds those lists from a real ``cudaGraph_t``.
Everything that decides "is this node a late reader" lives here (address matching in
`buffers_hit` / `buffers_overlapping`, ordering in `ancestors`, the verdict in
`analyze_graph`), so another graph analysis can replace it in one place.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Iterable, Mapping, Optional, Sequence

import attrs

from warpolicy.audit.report import INCONCLUSIVE, SAFE, UNSAFE, Offender, StaticResult
from warpolicy.policy import NONE, POST_REPLAY, PRE_REPLAY, WarReadDonePolicy

#: Node kinds whose arguments are matched against the shared buffers.
ACCESS_KINDS = ("kernel", "memcpy", "memset")
#: Node types that touch no memory (any other non-access type after the release is opaque).
INERT_NODE_TYPES = frozenset(
    {
        "CU_GRAPH_NODE_TYPE_EMPTY",
        "CU_GRAPH_NODE_TYPE_WAIT_EVENT",
        "CU_GRAPH_NODE_TYPE_EVENT_RECORD",
        "CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL",
        "CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT",
        "CU_GRAPH_NODE_TYPE_MEM_ALLOC",
        "CU_GRAPH_NODE_TYPE_MEM_FREE",
    }
)


@attrs.frozen
class BufferRange:
    """A shared buffer's device address range ``[start, end)``."""

    name: str
    start: int
    end: int

    def contains(self, address: int) -> bool:
        return self.start <= address < self.end

    def overlaps(self, start: int, end: int) -> bool:
        return start < self.end and self.start < end


@attrs.frozen
class GraphNode:
    """One node of a captured graph, reduced to what the audit needs."""

    index: int
    kind: str  # "kernel", "memcpy", "memset", "event_record", "other"
    name: str = ""
    symbol: str = ""
    buffers: tuple[str, ...] = ()  # shared buffers its arguments point into
    readable: bool = True  # False: its arguments could not be read
    planted: bool = False  # the planted read-done event-record node


def tensor_range(name: str, tensor: Any) -> BufferRange:
    """The bytes a (possibly strided) tensor spans on its device."""
    start = int(tensor.data_ptr())
    if tensor.numel() == 0:
        return BufferRange(name, start, start)
    last = sum(
        (size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 0
    )
    return BufferRange(name, start, start + (last + 1) * tensor.element_size())


def buffer_ranges(shared: Mapping[str, Any]) -> tuple[BufferRange, ...]:
    """Address ranges of every non-empty shared buffer, sorted by name."""
    ranges = (tensor_range(n, t) for n, t in sorted(shared.items()))
    return tuple(r for r in ranges if r.end > r.start)


def words(blob: bytes) -> list[int]:
    """Every aligned little-endian 8-byte word of ``blob`` (a kernel argument's bytes)."""
    return [int.from_bytes(blob[i : i + 8], "little") for i in range(0, len(blob) - 7, 8)]


def buffers_hit(addresses: Iterable[int], ranges: Sequence[BufferRange]) -> tuple[str, ...]:
    """Names of the buffers any address points into (sorted, unique)."""
    hit = {r.name for a in addresses for r in ranges if r.contains(a)}
    return tuple(sorted(hit))


def buffers_overlapping(start: int, end: int, ranges: Sequence[BufferRange]) -> tuple[str, ...]:
    """Names of the buffers the byte range ``[start, end)`` overlaps (memcpy / memset)."""
    return tuple(sorted({r.name for r in ranges if r.overlaps(start, end)}))


_ANON = "(anonymous namespace)"


def short_kernel_name(symbol: str) -> str:
    """``void at::native::(anonymous namespace)::indexSelectSmallIndex<float, ...>(...)`` ->
    ``indexSelectSmallIndex``; mangled names keep their longest identifier-looking part."""
    text = symbol.strip()
    if not text:
        return "?"
    if text.startswith("_Z"):  # still mangled: pick the longest source name in it
        parts = _mangled_identifiers(text)
        return max(parts, key=len) if parts else text
    text = text.replace(_ANON, "anon")
    if text.startswith("void "):
        text = text[len("void ") :]
    cut = min((i for i in (text.find("<"), text.find("(")) if i >= 0), default=len(text))
    return text[:cut].split("::")[-1] or symbol


def _mangled_identifiers(text: str) -> list[str]:
    """The length-prefixed identifiers of an Itanium-mangled name (``6native`` -> native)."""
    parts = []
    for match in re.finditer(r"(\d+)", text):
        n = int(match.group(1))
        ident = text[match.end() : match.end() + n]
        if n and len(ident) == n and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident):
            parts.append(ident)
    return parts


def ancestors(target: int, edges: Iterable[tuple[int, int]]) -> set[int]:
    """Every node with a dependency path to ``target`` (``edges`` are ``(from, to)``)."""
    parents: dict[int, list[int]] = {}
    for src, dst in edges:
        parents.setdefault(dst, []).append(src)
    seen: set[int] = set()
    todo = deque(parents.get(target, ()))
    while todo:
        node = todo.popleft()
        if node not in seen:
            seen.add(node)
            todo.extend(parents.get(node, ()))
    return seen


def analyze_graph(
    nodes: Sequence[GraphNode],
    edges: Iterable[tuple[int, int]],
    policy: WarReadDonePolicy,
    *,
    post_step: bool = False,
) -> StaticResult:
    """Which shared-buffer readers does ``policy``'s release point not cover?

    ``PRE_REPLAY`` releases before the graph: every reader in it is late. ``IN_GRAPH``
    releases at the planted node: readers that are not its ancestors are late.
    ``POST_REPLAY`` releases after the whole graph: none is. ``post_step`` says the step runs
    eager work after replay, which a graph walk cannot see.
    """
    if policy == NONE:
        return StaticResult(
            INCONCLUSIVE,
            nodes=len(nodes),
            reason="policy none: nothing is published (coarse barrier); nothing to audit",
        )
    readers = [n for n in nodes if n.kind in ACCESS_KINDS and n.buffers]
    late_pool = _late_nodes(nodes, edges, policy)
    if late_pool is None:
        return StaticResult(
            INCONCLUSIVE,
            nodes=len(nodes),
            readers=len(readers),
            reason="the planted read-done event-record node is not in the graph",
        )
    offenders = tuple(
        Offender(n.index, n.kind, n.name or n.kind, n.buffers, n.symbol)
        for n in readers
        if n.index in late_pool
    )
    blind = [n for n in nodes if not n.readable and n.index in late_pool]
    total, seen, unread = len(nodes), len(readers), len(blind)
    if offenders:
        return StaticResult(UNSAFE, offenders, nodes=total, readers=seen, unreadable=unread)
    if blind:
        names = ", ".join(sorted({n.name or "?" for n in blind})[:5])
        return StaticResult(
            INCONCLUSIVE,
            reason=f"could not read the arguments of {len(blind)} "
            f"node(s) after the release point ({names})",
            nodes=total,
            readers=seen,
            unreadable=unread,
        )
    if post_step:
        return StaticResult(
            INCONCLUSIVE,
            reason="no graph node after the release point touches "
            "shared state, but the step runs eager work after replay that a "
            "graph audit cannot see",
            nodes=total,
            readers=seen,
            unreadable=unread,
        )
    return StaticResult(SAFE, nodes=total, readers=seen, unreadable=unread)


def _late_nodes(
    nodes: Sequence[GraphNode], edges: Iterable[tuple[int, int]], policy: WarReadDonePolicy
) -> Optional[set[int]]:
    """Indices of nodes not ordered before the release point (None: no planted node)."""
    everything = {n.index for n in nodes if not n.planted}
    if policy == PRE_REPLAY:
        return everything
    if policy == POST_REPLAY:
        return set()
    planted = [n.index for n in nodes if n.planted]
    if not planted:
        return None
    before = ancestors(planted[0], list(edges))
    return everything - before
