"""A runner's buckets from restored graphs (`GraphRunner.save` / ``restore``) on the sim.

The oracle is the simulated platform's call log: after a restore, the event a step hands the
scheduler must be recorded by the restored graph's own replay.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.platforms.sim import SimGraph
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing import sim_impl, sim_runtime

P = WarReadDonePolicy
BUCKETS = (1, 2)


class Model:
    def __init__(self) -> None:
        self.table = torch.arange(8, dtype=torch.float32)
        self.weight = torch.ones(8)
        self.shared_buffers = {"table": self.table}
        self.out: dict[int, torch.Tensor] = {}

    def bucket_sizes(self, mode: ForwardMode):
        return BUCKETS

    def prepare_bucket(self, bucket: int) -> None:
        self.out.setdefault(bucket, torch.zeros(bucket))

    def host_prep(self, batch, bucket: int) -> None:
        pass

    def graph_prep(self, bucket: int) -> None:
        pass

    def forward(self, bucket: int):
        return self.out[bucket]


class Demotions:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []

    @hookimpl
    def warpolicy_on_demotion(self, runner: str, bucket: int, reason: str) -> None:
        self.seen.append((runner, bucket, reason))


def setup(placement: str = "marker", policy: P = P.IN_GRAPH):
    rt = sim_runtime()
    p = rt.platform
    model = Model()
    moved: list[bool] = [False]

    def graph_model(graph: SimGraph) -> Graph:
        table, weight = model.table.data_ptr(), model.weight.data_ptr()
        nodes = [Node(0, NodeKind.KERNEL, "prep", words=(table,), symbol="prep")]
        last = 0
        if graph.planted:
            record = Node(1, NodeKind.EVENT_RECORD, deps=(0,), event=graph.planted[0].id)
            if moved[0] and graph.origin is not None:  # the control: the node now a root
                record = Node(1, NodeKind.EVENT_RECORD, event=graph.planted[0].id)
            nodes.append(record)
            last = 1 if not moved[0] or graph.origin is None else 0
        nodes.append(Node(len(nodes), NodeKind.KERNEL, "fwd", deps=(last,), words=(weight,)))
        return Graph(nodes)

    sim_impl(p).graph_model = graph_model
    demotions = Demotions()
    rt.pm.register(demotions, name="demotions")
    runner = DecodeRunner(
        model,
        fixed_policy(policy),
        p,
        placement=placement,
        observers=rt.observers,
        keep_graphs=True,
    )
    runner.capture()
    return runner, p, demotions, moved


def restore(runner, p, *, private: bool = True, json_round_trip: bool = True):
    saved = runner.save()
    if json_round_trip:
        saved = {
            b: SavedAnchors.from_json(s.to_json()) if s is not None else None
            for b, s in saved.items()
        }
    clones = {b: p.clone_graph(c.graph, private_events=private) for b, c in runner.captured.items()}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        runner.restore(clones, saved)
    return clones


def in_graph_records(p, event) -> int:
    return sum(1 for e in p.log.of("record") if e[1] == event.id and e[3] == "in_graph")


@pytest.mark.parametrize("placement", ["marker", "derived"])
def test_restored_buckets_publish_the_event_their_own_graph_records(placement):
    runner, p, demotions, _ = setup(placement)
    old = {b: c.release.event for b, c in runner.captured.items()}
    clones = restore(runner, p)
    for bucket, captured in runner.captured.items():
        assert captured.graph is clones[bucket]
        assert captured.release.policy is P.IN_GRAPH
        assert captured.release.event is not old[bucket]
        assert runner.capture_report[bucket].restored
    runner.run([0, 0])
    read_done = runner.fence.take()
    assert read_done.event is runner.captured[2].release.event
    assert in_graph_records(p, read_done.event) == 1  # recorded by the clone's replay
    assert not demotions.seen


def test_the_control_a_clone_not_restored_records_a_private_event():
    runner, p, _, _ = setup()
    published = runner.captured[2].release.event
    clone = p.clone_graph(runner.captured[2].graph, private_events=True)
    before = in_graph_records(p, published)
    p.replay(clone)
    assert in_graph_records(p, published) == before


def test_a_moved_node_makes_the_bucket_coarse_and_is_counted():
    runner, p, demotions, moved = setup()
    moved[0] = True
    restore(runner, p)
    assert all(c.release.policy is P.NONE for c in runner.captured.values())
    assert len(demotions.seen) == len(BUCKETS)
    assert sum(v for k, v in runner.reporter.counts.items() if k.startswith("demotion:")) == 2
    runner.run([0])
    assert runner.fence.take() is None  # nothing published: the scheduler goes coarse


def test_nothing_saved_for_a_bucket_is_coarse():
    runner, p, _, _ = setup()
    clones = {b: p.clone_graph(c.graph, private_events=True) for b, c in runner.captured.items()}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        runner.restore(clones, {1: None})
    assert runner.policy_for(1) is P.NONE and runner.policy_for(2) is P.NONE


def test_only_the_restored_buckets_are_captured():
    runner, p, _, _ = setup()
    saved = runner.save()
    clone = p.clone_graph(runner.captured[1].graph, private_events=True)
    runner.restore({1: clone}, saved)
    assert sorted(runner.captured) == [1]
    assert runner.bucket_for(2) is None  # eager


def test_a_restore_interrupted_leaves_the_runner_coarse():
    runner, p, _, _ = setup()
    saved = runner.save()
    clones = {b: p.clone_graph(c.graph, private_events=True) for b, c in runner.captured.items()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    sim_impl(p).rebind_planted = interrupted
    with pytest.raises(KeyboardInterrupt):
        runner.restore(clones, saved)
    assert runner.coarse is not None and not runner.captured
    assert p.log[-1] == ("synchronize",)  # the host synchronized in `finally`


def test_the_same_decision_as_a_capture_for_every_policy():
    for policy in (P.PRE_REPLAY, P.IN_GRAPH, P.POST_REPLAY, P.NONE):
        runner, p, _, _ = setup(policy=policy)
        captured = {b: c.release.policy for b, c in runner.captured.items()}
        restore(runner, p, private=False)
        assert {b: c.release.policy for b, c in runner.captured.items()} == captured
