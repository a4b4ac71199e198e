"""Planted read-done nodes found again by position (`warpolicy.runtime.graphwalk.anchor`)."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from warpolicy.runtime.graphwalk import Graph, Node, NodeKind, PlacementError
from warpolicy.runtime.graphwalk.anchor import (
    SavedAnchors,
    find_anchored,
    found_index,
    save_anchors,
)

K, R = NodeKind.KERNEL, NodeKind.EVENT_RECORD


def decode_graph(event: int = 0xE1, class_event: int = 0) -> Graph:
    """spin -> prep -> [marker] -> layer0 -> late read -> [class node] -> layer1 (a chain)."""
    nodes = [
        Node(0, K, "spin", symbol="spin"),
        Node(1, K, "prep", deps=(0,), symbol="prep"),
        Node(2, R, deps=(1,), event=event),
        Node(3, K, "gemm", deps=(2,), symbol="gemm"),
        Node(4, K, "late", deps=(3,), symbol="late"),
    ]
    if class_event:
        nodes.append(Node(5, R, deps=(4,), event=class_event))
        nodes.append(Node(6, K, "gemm", deps=(5,), symbol="gemm"))
    else:
        nodes.append(Node(5, K, "gemm", deps=(4,), symbol="gemm"))
    return Graph(nodes)


def permuted(graph: Graph, order: list[int], events: dict[int, int]) -> Graph:
    """The same graph with nodes renumbered (``order[new] = old``) and fresh event handles."""
    new_of = {old: new for new, old in enumerate(order)}
    nodes = []
    for new, old in enumerate(order):
        n = graph.nodes[old]
        event = events.get(n.event, n.event) if n.event is not None else None
        nodes.append(
            Node(
                new, n.kind, n.name, tuple(new_of[d] for d in n.deps), symbol=n.symbol, event=event
            )
        )
    return Graph(nodes)


def test_clone_with_fresh_event_and_new_order_is_found():
    saved = save_anchors(decode_graph(), {"read_done": 0xE1})
    order = [0, 1, 3, 2, 4, 5]  # the record node enumerated later: not a topological order
    clone = permuted(decode_graph(), order, {0xE1: 0x77})
    assert find_anchored(clone, saved)[0].index == order.index(2)


def test_per_class_nodes_are_each_found_by_label():
    graph = decode_graph(0xE1, 0xE2)
    saved = save_anchors(graph, {"metadata": 0xE1, "kv_pages": 0xE2})
    order = [6, 0, 5, 1, 4, 2, 3]  # order[new] = old
    found = find_anchored(permuted(graph, order, {0xE1: 1, 0xE2: 2}), saved)
    assert found_index(found, "metadata") == order.index(2)
    assert found_index(found, "kv_pages") == order.index(5)


def test_vanished_node_is_a_doubt():
    saved = save_anchors(decode_graph(), {"read_done": 0xE1})
    g = decode_graph()
    vanished = Graph(
        [
            Node(0, K, "spin", symbol="spin"),
            Node(1, K, "prep", deps=(0,), symbol="prep"),
            Node(2, K, "gemm", deps=(1,), symbol="gemm"),
            Node(3, K, "late", deps=(2,), symbol="late"),
            Node(4, K, "gemm", deps=(3,), symbol="gemm"),
        ]
    )
    assert len(vanished) == len(g) - 1
    with pytest.raises(PlacementError, match="not the saved one"):
        find_anchored(vanished, saved)


def test_moved_node_is_a_doubt():
    saved = save_anchors(decode_graph(), {"read_done": 0xE1})
    moved = Graph(
        [
            Node(0, K, "spin", symbol="spin"),
            Node(1, R, deps=(0,), event=0x99),  # before the prep now
            Node(2, K, "prep", deps=(1,), symbol="prep"),
            Node(3, K, "gemm", deps=(2,), symbol="gemm"),
            Node(4, K, "late", deps=(3,), symbol="late"),
            Node(5, K, "gemm", deps=(4,), symbol="gemm"),
        ]
    )
    with pytest.raises(PlacementError):
        find_anchored(moved, saved)


def test_moved_node_with_the_same_digest_is_found_missing():
    """An anchor saved for another position of an otherwise identical graph matches nothing."""
    saved = save_anchors(decode_graph(), {"read_done": 0xE1})
    anchor = saved.anchors[0]
    wrong = SavedAnchors((attrs.evolve(anchor, after=("0" * 16,)),), saved.digest, saved.nodes)
    with pytest.raises(PlacementError, match="moved or vanished"):
        find_anchored(decode_graph(), wrong)


def test_twin_nodes_are_ambiguous():
    twins = Graph(
        [
            Node(0, K, "prep", symbol="prep"),
            Node(1, R, deps=(0,), event=1),
            Node(2, R, deps=(0,), event=2),
        ]
    )
    saved = save_anchors(twins, {"read_done": 1})
    with pytest.raises(PlacementError, match="ambiguous"):
        find_anchored(twins, saved)


def test_saving_an_event_no_node_records_raises():
    with pytest.raises(PlacementError, match="no node"):
        save_anchors(decode_graph(), {"read_done": 0x1234})


def test_saved_form_round_trips_and_refuses_junk():
    saved = save_anchors(decode_graph(0xE1, 0xE2), {"metadata": 0xE1, "kv_pages": 0xE2})
    text = json.dumps(saved.to_json())
    assert SavedAnchors.from_json(text) == saved
    for junk in ("{", "[]", json.dumps({"format": 99}), json.dumps({"format": 1})):
        with pytest.raises(PlacementError, match="unreadable"):
            SavedAnchors.from_json(junk)


def test_nothing_saved_is_a_doubt():
    with pytest.raises(PlacementError, match="nothing to rebind"):
        find_anchored(decode_graph(), SavedAnchors((), "x", 6))


@st.composite
def dags(draw):
    n = draw(st.integers(3, 14))
    nodes = []
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        name = draw(st.sampled_from(["a", "b", "c"]))
        nodes.append((name, tuple(sorted(deps))))
    at = draw(st.integers(1, n - 1))  # the planted record node follows node `at - 1`
    perm = draw(st.permutations(range(n + 1)))
    return nodes, at, perm


@given(dags())
def test_found_again_under_any_renumbering(case):
    """Oracle: the permutation itself says where the planted node went."""
    spec, at, perm = case
    nodes = []
    # insert the record node after spec[at-1]; later nodes that followed at-1 follow it instead
    shift = lambda i: i if i < at else i + 1  # noqa: E731
    for i, (name, deps) in enumerate(spec):
        nodes.append(Node(shift(i), K, name, tuple(shift(d) for d in deps), symbol=name))
    nodes.insert(at, Node(at, R, deps=(shift(at - 1),), event=0xE1))
    graph = Graph(nodes)
    saved = save_anchors(graph, {"read_done": 0xE1})
    order = list(perm)
    renumbered = permuted(graph, order, {0xE1: 0xF00D})
    assert find_anchored(renumbered, saved)[0].index == order.index(at)


def _around(graph: Graph, index: int) -> tuple[list[str], list[str]]:
    """Labels of the node's ancestors and descendants (sorted): an oracle independent of the
    structural keys."""
    children = graph.children()
    up, down, todo = set(), set(), list(graph.nodes[index].deps)
    while todo:
        n = todo.pop()
        if n not in up:
            up.add(n)
            todo.extend(graph.nodes[n].deps)
    todo = list(children[index])
    while todo:
        n = todo.pop()
        if n not in down:
            down.add(n)
            todo.extend(children[n])

    def label(i: int) -> str:
        return graph.nodes[i].kind.value + graph.nodes[i].name

    return sorted(map(label, up)), sorted(map(label, down))


@given(dags(), st.data())
def test_a_moved_node_is_never_found_somewhere_else(case, data):
    """Move the planted node's dependency to another node: either the restore refuses, or the
    node it finds sits among the same ancestors and descendants as the saved one."""
    spec, at, _perm = case
    nodes = [Node(i, K, name, deps, symbol=name) for i, (name, deps) in enumerate(spec)]
    record = len(nodes)
    nodes.append(Node(record, R, deps=(at - 1,), event=0xE1))
    graph = Graph(nodes)
    saved = save_anchors(graph, {"read_done": 0xE1})
    target = data.draw(st.integers(0, record - 1).filter(lambda t: t != at - 1))
    moved = Graph([*nodes[:record], Node(record, R, deps=(target,), event=0x77)])
    try:
        found = find_anchored(moved, saved)
    except PlacementError:
        return
    assert _around(moved, found[0].index) == _around(graph, record)
