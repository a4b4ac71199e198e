"""The static audit's verdicts: `warpolicy.runtime.graphwalk`'s readers mapped to SAFE / UNSAFE /
INCONCLUSIVE for one captured graph and the policy its bucket publishes.

Reading the graph, matching addresses, opaque nodes and ordering are the graph walk's
(`warpolicy.runtime.graphwalk.analysis`: `find_readers`, `late_readers`, `find_event_record`); this
module only decides which node is the release point and what the late readers mean: a late
reader seen touching a shared buffer is an `Offender` (UNSAFE), a late opaque node (host code,
child or conditional graph, unknown type, a kernel whose arguments cannot be read) blocks SAFE
(INCONCLUSIVE). Pure Python, so the CPU tests drive it on hand-made `Graph` models.
"""

from __future__ import annotations

from collections.abc import Sequence

from warpolicy.audit.report import INCONCLUSIVE, SAFE, UNSAFE, Offender, StaticResult
from warpolicy.registry.vocabulary import NONE, POST_REPLAY, PRE_REPLAY, WarReadDonePolicy
from warpolicy.runtime.graphwalk.analysis import (
    Reader,
    find_event_record,
    find_readers,
    late_readers,
)
from warpolicy.runtime.graphwalk.cuda import NODE_KINDS
from warpolicy.runtime.graphwalk.errors import PlacementError
from warpolicy.runtime.graphwalk.model import BufferRange, Graph, NodeKind

#: Model kinds -> the driver's node type names, for naming opaque nodes in reasons.
_DRIVER_NAMES = {kind: name for name, kind in NODE_KINDS.items()}


def planted_node(graph: Graph, event: int | None) -> int | None:
    """The event-record node recording ``event``; failing that, the graph's only event-record
    node (a graph with several is reported without one). Raises `PlacementError` when several
    nodes record ``event`` itself (the release point would be ambiguous)."""
    if event:
        found = find_event_record(graph, event)
        if found is not None:
            return found
    records = [n.index for n in graph.nodes if n.kind is NodeKind.EVENT_RECORD]
    return records[0] if len(records) == 1 else None


def analyze_graph(
    graph: Graph,
    ranges: Sequence[BufferRange],
    policy: WarReadDonePolicy,
    *,
    event: int | None = None,
    post_step: bool = False,
) -> StaticResult:
    """Which shared-buffer readers does ``policy``'s release point not cover?

    ``PRE_REPLAY`` releases before the graph: every reader in it is late. ``IN_GRAPH``
    releases at the node recording ``event`` (`planted_node`): readers that are not its
    ancestors are late. ``POST_REPLAY`` releases after the whole graph: none is. ``post_step``
    says the step runs eager work after replay, which a graph walk cannot see.
    """
    total = len(graph)
    if policy == NONE:
        return StaticResult(
            INCONCLUSIVE,
            nodes=total,
            reason="policy none: nothing is published (coarse barrier); nothing to audit",
        )
    readers = find_readers(graph, ranges)
    seen = sum(1 for r in readers if not r.opaque)
    late: tuple[Reader, ...]
    if policy == PRE_REPLAY:
        late = readers  # event-record nodes are never readers: the plant is not among them
    elif policy == POST_REPLAY:
        late = ()
    else:
        try:
            planted = planted_node(graph, event)
        except PlacementError as exc:
            return StaticResult(INCONCLUSIVE, nodes=total, readers=seen, reason=str(exc))
        if planted is None:
            return StaticResult(
                INCONCLUSIVE,
                nodes=total,
                readers=seen,
                reason="the planted read-done event-record node is not in the graph",
            )
        late = late_readers(graph, ranges, planted, readers=readers)
    offenders = tuple(
        Offender(r.index, r.kind.value, r.name, r.buffers, graph.nodes[r.index].symbol)
        for r in late
        if not r.opaque
    )
    blind = [r for r in late if r.opaque]
    unread = len(blind)
    if offenders:
        return StaticResult(UNSAFE, offenders, nodes=total, readers=seen, unreadable=unread)
    if blind:
        names = ", ".join(sorted({_opaque_name(graph, r) for r in blind})[:5])
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


def _opaque_name(graph: Graph, reader: Reader) -> str:
    """A kernel's short name ("?" when unknown), else the driver's node type name
    (``CU_GRAPH_NODE_TYPE_GRAPH``), as the audit has always named opaque nodes."""
    node = graph.nodes[reader.index]
    if node.name:
        return node.name
    if node.kind is NodeKind.KERNEL:
        return "?"
    return _DRIVER_NAMES.get(node.kind, node.kind.label)
