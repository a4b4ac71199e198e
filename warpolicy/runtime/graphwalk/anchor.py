"""Find the planted read-done nodes again in a graph that was cloned, re-instantiated or rebuilt.

A restored graph (``cudaGraphClone``, a graph rebuilt from a saved description, a recapture)
has new node handles, and its event-record nodes record fresh private events: nothing of the
old process identifies the read-done node. What survives is the node's *position*: the nodes it
follows and the nodes that follow it. So each planted node is described, when its graph is
saved, by an `Anchor`:

* its **ancestry**: the structural key of each of its dependencies (the metadata prep's last
  kernel for a marker, the readers' frontier for a derived node), where a node's key is a hash
  of its label (the kernel symbol, or the node kind) and, recursively, of its dependencies'
  keys; node handles, event handles and enumeration order take no part;
* its **successors**: the keys of the nodes that depend on it (the forward's first kernel, or
  the frontier's joining successors);
* the graph's **digest**: the multiset of every node's key, so a graph that changed in any way
  (a node moved, added or removed) is known to be another graph.

`find_anchored` matches every anchor of a saved graph against the restored graph's walk
(`Graph`) and returns the node index of each, or raises `PlacementError` on any doubt: another
graph (digest), an anchor matching no event-record node (the node vanished or moved), matching
several (ambiguous), or two anchors matching one node. A graph may hold several planted nodes
(one per buffer class): each is found by its own anchor and named by its ``label``.

`Anchor` and `SavedAnchors` are plain data (`to_json` / `from_json`), saved beside the graph.
Pure Python: tested on CPU with hand-made graphs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from warpolicy.runtime.graphwalk.analysis import find_event_record, topological_order
from warpolicy.runtime.graphwalk.errors import PlacementError
from warpolicy.runtime.graphwalk.model import Graph, Node, NodeKind

#: Version of the saved form (`SavedAnchors.to_json`); another version is refused (a doubt).
FORMAT = 1

_KEY_BYTES = 8


def _label(node: Node) -> str:
    """What identifies a node's work across processes: the kernel symbol (else its short
    name), or the node kind. Event handles, addresses and node handles never take part."""
    if node.kind is NodeKind.KERNEL:
        return f"kernel:{node.symbol or node.name}"
    return node.kind.value


def _hash(*parts: str) -> str:
    digest = hashlib.blake2b(digest_size=_KEY_BYTES)
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def structural_keys(graph: Graph) -> tuple[str, ...]:
    """Each node's key: a hash of its label and of its dependencies' keys (sorted), so equal
    positions in equal graphs get equal keys whatever the node order or handles.

    Raises `PlacementError` on a dependency cycle (no real graph has one).
    """
    try:
        order = topological_order(graph)
    except ValueError as exc:
        raise PlacementError(f"cannot order the graph: {exc}") from None
    keys: list[str] = [""] * len(graph)
    for index in order:
        node = graph.nodes[index]
        keys[index] = _hash(_label(node), *sorted(keys[d] for d in node.deps))
    return tuple(keys)


def graph_digest(keys: Iterable[str]) -> str:
    """The multiset of a graph's node keys, as one hash (order-free)."""
    return _hash("graph", *sorted(keys))


def _sorted_keys(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(str(v) for v in values))


def _strs(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


@attrs.frozen
class Anchor:
    """Where one planted read-done node sits, in terms that survive a clone or a rebuild."""

    #: which planted node this is (``read_done``, or a buffer class's name)
    label: str = attrs.field(validator=attrs.validators.min_len(1))
    #: the structural keys of its dependencies (sorted)
    after: tuple[str, ...] = attrs.field(converter=_sorted_keys)
    #: the structural keys of the nodes that depend on it (sorted)
    before: tuple[str, ...] = attrs.field(converter=_sorted_keys)
    #: the labels of its dependencies, for messages (``kernel:indexSelect...``)
    after_labels: tuple[str, ...] = attrs.field(default=(), converter=_strs)

    def describe(self) -> str:
        after = ", ".join(a.partition(":")[2] or a for a in self.after_labels) or "no node"
        return f"{self.label} (after {after})"


def _anchors(values: Iterable[Anchor]) -> tuple[Anchor, ...]:
    return tuple(values)


@attrs.frozen
class SavedAnchors:
    """The anchors of every planted node of one saved graph, and the graph's digest."""

    anchors: tuple[Anchor, ...] = attrs.field(converter=_anchors)
    digest: str
    nodes: int

    @anchors.validator
    def _distinct(self, _attribute: attrs.Attribute, value: tuple[Anchor, ...]) -> None:
        labels = [a.label for a in value]
        if len(set(labels)) != len(labels):
            raise ValueError(f"planted node labels repeat: {labels}")

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(a.label for a in self.anchors)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "digest": self.digest,
            "nodes": self.nodes,
            "anchors": [attrs.asdict(a) for a in self.anchors],
        }

    @classmethod
    def from_json(cls, data: Any) -> SavedAnchors:
        """The saved form back; anything malformed is a `PlacementError` (one line)."""
        try:
            if isinstance(data, (str, bytes)):
                data = json.loads(data)
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
            anchors = tuple(
                Anchor(
                    str(a["label"]),
                    tuple(str(k) for k in a["after"]),
                    tuple(str(k) for k in a["before"]),
                    tuple(str(k) for k in a.get("after_labels", ())),
                )
                for a in data["anchors"]
            )
            return cls(anchors, str(data["digest"]), int(data["nodes"]))
        except PlacementError:
            raise
        except Exception as exc:  # noqa: BLE001 - a hostile or stale file is a doubt, one line
            raise PlacementError(f"the saved anchors are unreadable ({exc})") from None


def save_anchors(graph: Graph, planted: Mapping[str, int]) -> SavedAnchors:
    """The anchors of the planted nodes of ``graph``: ``planted`` maps each label to the event
    handle its node records in this (the saving) process.

    Raises `PlacementError` when an event is recorded by no node or by several.
    """
    keys = structural_keys(graph)
    children = graph.children()
    anchors = []
    for label, event in planted.items():
        index = find_event_record(graph, event)
        if index is None:
            raise PlacementError(
                f"planted node {label!r}: no node of the {len(graph)}-node graph records its "
                f"event; nothing to anchor"
            )
        node = graph.nodes[index]
        anchors.append(
            Anchor(
                label,
                [keys[d] for d in node.deps],
                [keys[c] for c in children[index]],
                tuple(_label(graph.nodes[d]) for d in sorted(node.deps)),
            )
        )
    return SavedAnchors(tuple(anchors), graph_digest(keys), len(graph))


@attrs.frozen
class Found:
    """A planted node found again: its index in the restored graph's walk."""

    label: str
    index: int


def find_anchored(graph: Graph, saved: SavedAnchors) -> tuple[Found, ...]:
    """Every anchored node of ``saved`` in the restored ``graph``, in the anchors' order.

    Raises `PlacementError` (one line, a doubt: the bucket publishes nothing) when the graph is
    not the saved one, or an anchor matches no event-record node or several, or two anchors
    match the same node.
    """
    if not saved.anchors:
        raise PlacementError("no planted node was saved with this graph; nothing to rebind")
    keys = structural_keys(graph)
    if len(graph) != saved.nodes or graph_digest(keys) != saved.digest:
        raise PlacementError(
            f"the restored graph is not the saved one ({len(graph)} nodes, saved {saved.nodes}; "
            f"a node was added, removed or moved)"
        )
    children = graph.children()
    records = [n.index for n in graph.nodes if n.kind is NodeKind.EVENT_RECORD]
    found: list[Found] = []
    taken: dict[int, str] = {}
    for anchor in saved.anchors:
        matches = [
            i
            for i in records
            if tuple(sorted(keys[d] for d in graph.nodes[i].deps)) == anchor.after
            and tuple(sorted(keys[c] for c in children[i])) == anchor.before
        ]
        if not matches:
            raise PlacementError(
                f"planted node {anchor.describe()} is not in the restored graph (it moved or "
                f"vanished)"
            )
        if len(matches) > 1:
            where = ", ".join(f"#{i}" for i in matches)
            raise PlacementError(
                f"planted node {anchor.describe()} matches {len(matches)} event-record nodes "
                f"({where}) of the restored graph; which one releases is ambiguous"
            )
        index = matches[0]
        if index in taken:
            raise PlacementError(
                f"planted nodes {taken[index]!r} and {anchor.label!r} match the same node "
                f"#{index} of the restored graph"
            )
        taken[index] = anchor.label
        found.append(Found(anchor.label, index))
    return tuple(found)


def found_index(found: Iterable[Found], label: str) -> int | None:
    """The restored index of the planted node ``label`` (None when it was not found)."""
    return next((f.index for f in found if f.label == label), None)


__all__ = [
    "FORMAT",
    "Anchor",
    "Found",
    "SavedAnchors",
    "find_anchored",
    "found_index",
    "graph_digest",
    "save_anchors",
    "structural_keys",
]
