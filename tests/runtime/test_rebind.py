"""Restored graphs on the simulated platform: save, clone with private events, restore.

`warpolicy.runtime.rebind` through the engine API (`ReadDoneCapture.save` / ``restore``). The
oracle is the simulated platform's call log and clocks: after a restore, the event the bucket
publishes must be recorded by the restored graph's replay (so the scheduler's wait really covers
the prep's read), and a restore that cannot find the node must publish nothing.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable

import pytest
import torch

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.owned_capture import (
    RELEASE_LABEL,
    ReadDoneCapture,
    ReadDoneFence,
    SelfCheckError,
    cell_policy,
)
from warpolicy.runtime.platforms.sim import SimGraph
from warpolicy.runtime.policy import fixed_policy
from warpolicy.testing import sim_impl, sim_runtime

P = WarReadDonePolicy
DECODE = ForwardMode.DECODE


class Demotions:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []

    @hookimpl
    def warpolicy_on_demotion(self, runner: str, bucket: int, reason: str) -> None:
        self.seen.append((runner, bucket, reason))


class Engine:
    """prep (reads the shared ``table``) -> [marker] -> forward (reads ``weight``), one bucket;
    ``shape`` changes what the graph model shows for clones (a control)."""

    def __init__(self, placement: str = "marker", self_check: str = "warn") -> None:
        self.rt = sim_runtime()
        self.demotions = Demotions()
        self.rt.pm.register(self.demotions, name="demotions")
        self.p = self.rt.platform
        self.table = torch.arange(8, dtype=torch.float32)
        self.weight = torch.ones(8)
        self.late = torch.zeros(4)
        self.shared = {"table": self.table}
        self.placement = placement
        self.self_check = self_check
        self.shape: Callable[[SimGraph, list[Node]], list[Node]] = lambda g, nodes: nodes
        sim_impl(self.p).graph_model = self.model
        self.fence = ReadDoneFence(self.p, name="decode", observers=self.rt.observers)

    def model(self, graph: SimGraph) -> Graph:
        nodes = [Node(0, NodeKind.KERNEL, "prep", words=(self.table.data_ptr(),), symbol="prep")]
        deps: tuple[int, ...] = (0,)
        if graph.planted:
            nodes.append(Node(1, NodeKind.EVENT_RECORD, deps=deps, event=graph.planted[0].id))
            deps = (1,)
        nodes.append(
            Node(
                len(nodes),
                NodeKind.KERNEL,
                "matmul",
                deps=deps,
                words=(self.weight.data_ptr(), self.late.data_ptr()),
                symbol="matmul",
            )
        )
        if graph.origin is not None:
            nodes = self.shape(graph, nodes)
        return Graph(nodes)

    def capture(self, policy: P = P.IN_GRAPH):
        cell = cell_policy(fixed_policy(policy), DECODE, placement=self.placement)
        capture = ReadDoneCapture(
            self.p, cell, self.fence, self_check=self.self_check, observers=self.rt.observers
        )
        bucket = capture.begin(4)
        graph = self.p.new_graph(keep_graph=True)

        def body() -> None:
            sim_impl(self.p).mark("prep reads table")
            bucket.mark()

        self.p.capture_callable(graph, body)
        outcome = bucket.finish(graph, self.shared)
        return capture, graph, outcome

    def restore(self, capture, graph, saved, shared=None, **kw):
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            return capture.restore(4, graph, saved, shared or self.shared, **kw)

    def fired(self, event) -> int:
        return sum(1 for e in self.p.log.of("record") if e[1] == event.id and e[3] == "in_graph")


def saved_and_clone(engine: Engine, policy: P = P.IN_GRAPH):
    capture, graph, outcome = engine.capture(policy)
    saved = capture.save(graph, outcome)
    assert saved is not None
    saved = SavedAnchors.from_json(json.dumps(saved.to_json()))  # what a file would hold
    clone = engine.p.clone_graph(graph, private_events=True)
    return capture, graph, outcome, saved, clone


@pytest.mark.parametrize("placement", ["marker", "derived"])
def test_restored_clone_publishes_in_graph_and_its_replay_records_the_new_event(placement):
    engine = Engine(placement)
    capture, graph, outcome, saved, clone = saved_and_clone(engine)
    assert outcome.policy is P.IN_GRAPH
    private = (clone.planted or clone.derived)[0]
    restored = engine.restore(capture, clone, saved)
    assert restored.policy is P.IN_GRAPH
    assert restored.report.restored and restored.report.ok
    new = restored.release.event
    assert new is not outcome.release.event and new is not private
    before = engine.fired(new)
    engine.p.replay(clone)
    assert engine.fired(new) == before + 1  # the restored graph records the published event
    assert engine.fired(private) == 0
    assert not engine.demotions.seen


def test_a_clone_that_is_not_restored_never_records_the_published_event():
    """The control the restore exists for: a persistence library's private event."""
    engine = Engine()
    _capture, _graph, outcome, _saved, clone = saved_and_clone(engine)
    published = outcome.release.event
    before = engine.fired(published)
    engine.p.replay(clone)
    assert engine.fired(published) == before
    assert engine.fired(clone.planted[0]) == 1


def test_a_clone_without_private_events_is_found_too():
    engine = Engine()
    capture, graph, outcome = engine.capture()
    saved = capture.save(graph, outcome)
    clone = engine.p.clone_graph(graph)
    assert engine.restore(capture, clone, saved).policy is P.IN_GRAPH


def _vanish(graph: SimGraph, nodes: list[Node]) -> list[Node]:
    return [
        Node(0, NodeKind.KERNEL, "prep", words=nodes[0].words, symbol="prep"),
        Node(1, NodeKind.KERNEL, "matmul", deps=(0,), words=nodes[-1].words, symbol="matmul"),
    ]


def _move(graph: SimGraph, nodes: list[Node]) -> list[Node]:
    record = nodes[1]
    return [
        Node(0, NodeKind.EVENT_RECORD, event=record.event),
        Node(1, NodeKind.KERNEL, "prep", deps=(0,), words=nodes[0].words, symbol="prep"),
        Node(2, NodeKind.KERNEL, "matmul", deps=(1,), words=nodes[-1].words, symbol="matmul"),
    ]


def _twin(graph: SimGraph, nodes: list[Node]) -> list[Node]:
    twin = Node(len(nodes), NodeKind.EVENT_RECORD, deps=(0,), event=graph.planted[0].id + 10**6)
    return [*nodes, twin]


@pytest.mark.parametrize("shape", [_vanish, _move, _twin], ids=["vanished", "moved", "extra"])
def test_a_node_that_moved_or_vanished_publishes_nothing_and_is_counted(shape):
    engine = Engine()
    capture, _graph, _outcome, saved, clone = saved_and_clone(engine)
    engine.shape = shape
    restored = engine.restore(capture, clone, saved)
    assert restored.policy is P.NONE
    assert restored.release.event is None
    assert "restored" in restored.report.detail
    assert len(engine.demotions.seen) == 1


def test_a_late_reader_seen_after_the_restore_refutes():
    """The self-check runs again on the restored graph: here the engine now shares a buffer
    the forward reads after the node."""
    engine = Engine()
    capture, _graph, _outcome, saved, clone = saved_and_clone(engine)
    restored = engine.restore(capture, clone, saved, {**engine.shared, "late": engine.late})
    assert restored.policy is P.POST_REPLAY
    assert "matmul" in restored.report.detail


def test_nothing_saved_is_a_doubt_and_nothing_planted_is_the_unplanted_answer():
    engine = Engine()
    capture, graph, outcome, _saved, clone = saved_and_clone(engine)
    assert engine.restore(capture, clone, None).policy is P.NONE
    empty = SavedAnchors((), "digest", 3)
    assert engine.restore(capture, clone, empty).policy is P.POST_REPLAY


def test_the_policy_lookup_still_decides():
    """A restored bucket goes through the same decision: a planted post_replay stays so."""
    engine = Engine()
    capture, graph, outcome = engine.capture(P.POST_REPLAY)
    saved = capture.save(graph, outcome)
    clone = engine.p.clone_graph(graph, private_events=True)
    assert engine.restore(capture, clone, saved).policy is outcome.policy


def test_a_platform_that_cannot_walk_refutes():
    engine = Engine()
    capture, _graph, _outcome, saved, clone = saved_and_clone(engine)
    sim_impl(engine.p).graph_model = None
    assert engine.restore(capture, clone, saved).policy is P.POST_REPLAY


def test_self_check_error_raises():
    engine = Engine(self_check="error")
    capture, _graph, _outcome, saved, clone = saved_and_clone(engine)
    engine.shape = _vanish
    with pytest.raises(SelfCheckError, match="moved or vanished|not the saved one"):
        engine.restore(capture, clone, saved)


def test_save_on_a_platform_that_cannot_walk_warns_and_returns_none():
    engine = Engine()
    capture, graph, outcome = engine.capture()
    sim_impl(engine.p).graph_model = None
    with pytest.warns(RuntimeWarning, match="saving the planted nodes failed"):
        assert capture.save(graph, outcome) is None


def test_per_class_labels_are_rebound_too():
    """A graph with a second planted node (a buffer class's) rebinds both; the bucket
    publishes the read_done node's event."""
    engine = Engine()
    capture, graph, outcome = engine.capture()
    assert RELEASE_LABEL == "read_done"
    model = engine.model(graph)
    extra = engine.p.create_event(external=True)
    engine.p.record(extra)
    graph.planted.append(extra)
    inner = engine.model

    def two_nodes(g: SimGraph) -> Graph:
        base = list(inner(g).nodes)
        if len(g.planted) > 1:
            base.append(
                Node(len(base), NodeKind.EVENT_RECORD, deps=(len(base) - 1,), event=g.planted[1].id)
            )
        return Graph(base)

    sim_impl(engine.p).graph_model = two_nodes
    saved = engine.p.save_planted(graph, {"read_done": outcome.recorded, "kv_pages": extra})
    assert len(model) == 3 and saved.labels == ("read_done", "kv_pages")
    clone = engine.p.clone_graph(graph, private_events=True)
    kv = engine.p.create_event(external=True)
    engine.p.record(kv)
    restored = engine.restore(capture, clone, saved, events={"kv_pages": kv})
    assert restored.policy is P.IN_GRAPH
    assert [e.id for e in clone.planted] == [restored.release.event.id, kv.id]


def test_hostile_saved_text_is_one_line():
    from warpolicy.runtime.graphwalk import PlacementError

    with pytest.raises(PlacementError) as info:
        SavedAnchors.from_json('{"format": 1, "anchors": [{"label": 3}]}')
    assert "\n" not in str(info.value)


def test_the_after_a_restore_block_of_the_guide_runs_as_written():
    """docs/integrating.md's "After a restore" block (on the simulated platform) runs."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "integrating.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if ".restore(" in b]
    assert "clone_graph(graph, private_events=True)" in block
    exec(compile(block, "docs/integrating.md", "exec"), {"__name__": "guide"})
