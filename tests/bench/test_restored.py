"""The restored rows of ``bench overlap`` (`warpolicy.bench.restored`) on the simulated platform."""

from __future__ import annotations

import torch

from warpolicy.bench.restored import (
    RESTORED,
    RESTORED_MOVED,
    format_restored,
    restore_runner,
    restored_targets,
)
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.platforms.sim import SimGraph
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing import sim_impl, sim_runtime


class Model:
    def __init__(self) -> None:
        self.table = torch.arange(8)
        self.shared_buffers = {"table": self.table}
        self.out = torch.zeros(4)

    def bucket_sizes(self, mode: ForwardMode):
        return (4,)

    def prepare_bucket(self, bucket: int) -> None:
        pass

    def host_prep(self, batch, bucket: int) -> None:
        pass

    def graph_prep(self, bucket: int) -> None:
        pass

    def forward(self, bucket: int):
        return self.out


def runner_with_model():
    rt = sim_runtime()
    p = rt.platform
    model = Model()

    def graph_model(graph: SimGraph) -> Graph:
        nodes = [Node(0, NodeKind.KERNEL, "prep", words=(model.table.data_ptr(),), symbol="prep")]
        if graph.planted:
            # a clone whose nodes no longer map to the body's events (move_planted_node on the
            # sim) shows its node as a root: moved
            moved = graph.origin is not None and not graph.sources
            deps = () if moved else (0,)
            nodes.append(Node(1, NodeKind.EVENT_RECORD, deps=deps, event=graph.planted[0].id))
        nodes.append(Node(len(nodes), NodeKind.KERNEL, "fwd", deps=(len(nodes) - 1,)))
        return Graph(nodes)

    sim_impl(p).graph_model = graph_model
    runner = DecodeRunner(
        model,
        fixed_policy(WarReadDonePolicy.IN_GRAPH),
        p,
        keep_graphs=True,
        observers=rt.observers,
    )
    runner.capture()
    return runner, p


def test_restored_runner_publishes_in_graph_and_counts_nothing():
    runner, p = runner_with_model()
    info = restore_runner(runner, p)
    assert runner.policy_for(4) is WarReadDonePolicy.IN_GRAPH
    assert info["demotions"] == 0 and info["buckets"]["4"]["policy"] == "in_graph"
    assert info["buckets"]["4"]["rebind_us"] is not None


def test_the_moved_control_is_coarse_and_counted(recwarn):
    runner, p = runner_with_model()
    info = restore_runner(runner, p, moved=True)
    assert runner.policy_for(4) is WarReadDonePolicy.NONE
    assert info["demotions"] == 1 and info["buckets"]["4"]["policy"] == "none"
    lines = format_restored({RESTORED_MOVED: info})
    assert "1 bucket(s) refused and counted" in lines[-1]


def row(name: str, gap: float, corrupted: int = 0, resolved: str = "in_graph") -> dict:
    return {"name": name, "gap_closed": gap, "corrupted": corrupted, "resolved": resolved}


def test_targets_hold_and_fail_on_their_own_numbers():
    good = {
        RESTORED: {"buckets": {"4": {"rebind_us": 3.0}}, "demotions": 0},
        RESTORED_MOVED: {"buckets": {"4": {"rebind_us": None}}, "demotions": 1},
    }
    rows = [row(RESTORED, 0.99), row(RESTORED_MOVED, 0.0, resolved="none")]
    assert all(restored_targets(rows, good).values())
    slow = {**good, RESTORED: {"buckets": {"4": {"rebind_us": 12.0}}, "demotions": 0}}
    assert not restored_targets(rows, slow)["rebind_under_10us_per_executable"]
    bad_rows = [row(RESTORED, 0.5, corrupted=1), row(RESTORED_MOVED, 0.9)]
    failed = restored_targets(bad_rows, good)
    assert not failed["restored_closes_95pct"] and not failed["restored_zero_corrupted"]
    assert not failed["restored_moved_coarse_and_counted"]
