"""The restored rows of ``bench overlap``: a runner's graphs saved, restored, measured again.

``restored``: the runner captures as the ``in_graph`` row does (kept graphs), then
`GraphRunner.save`, each graph cloned with fresh private events and instantiated (what a
persistence library's load hands back: an executable whose read-done node records an event
nobody waits on), and `GraphRunner.restore`: the node found by position and rebound to a fresh
fence event on the executable (``cuGraphExecEventRecordNodeSetEvent``), the self-check run
again. Steps then replay the restored executables. Expected: the gap closed as by ``in_graph``,
0 corrupted steps, the rebind a few microseconds per executable.

``restored_moved`` (the positive control): the same, but in each clone the read-done node is
removed and a node recording a private event is added elsewhere (a root of the graph), so the
graph still has one event-record node, in the wrong place. The restore must refuse it (the
bucket publishes nothing: coarse, ~0% of the gap) and count it (one demotion per bucket).
"""

from __future__ import annotations

from typing import Any

from warpolicy.runtime.graphwalk import NodeKind
from warpolicy.runtime.graphwalk import cuda as graph_cuda
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.platforms.sim import SimGraph
from warpolicy.runtime.runners import GraphRunner

#: The restored rows' names (their runners are captured with kept graphs).
RESTORED = "restored"
RESTORED_MOVED = "restored_moved"
ROWS = (RESTORED, RESTORED_MOVED)


def move_planted_node(platform: Platform, graph: Any) -> None:
    """The control: the clone's read-done node removed (its parents joined to its children, so
    the graph computes the same), one recording a private event added as a root (CUDA:
    ``cuGraphDestroyNode`` + ``cuGraphAddEventRecordNode``; sim: its planted events
    replaced by private ones, which its graph model shows at the same place, so the sim cannot
    move them: the walk there refutes or doubts anyway)."""
    if isinstance(graph, SimGraph):
        graph.planted[:] = [platform.create_event(external=True) for _ in graph.planted]
        graph.sources.clear()
        return
    raw = graph.raw_cuda_graph()
    walked = graph_cuda.read_graph(raw)
    driver = graph_cuda.driver_module()
    children = walked.graph.children()
    for node in walked.graph.nodes:
        if node.kind is NodeKind.EVENT_RECORD:
            # keep the order the node carried (prep before forward): its parents now precede
            # its children directly, so only the release point moved, not the forward's reads
            nodes = walked.graph.nodes
            for parent in node.deps:
                after = [c for c in children[node.index] if parent not in nodes[c].deps]
                if after:  # an edge that exists already is not added twice
                    graph_cuda.add_dependencies(walked, walked.handles[parent], after)
            graph_cuda.call(driver, "cuGraphDestroyNode", walked.handles[node.index])
    graph_cuda.call(
        driver,
        "cuGraphAddEventRecordNode",
        driver.CUgraph(int(raw)),
        [],
        0,
        driver.CUevent(graph_cuda.create_private_event()),
    )


def restore_runner(runner: GraphRunner, platform: Platform, *, moved: bool = False) -> dict:
    """Save, clone (private events), instantiate and restore every bucket of ``runner``; what
    the restore did per bucket (policy, rebind cost, detail) and the demotions it counted."""
    saved = runner.save()
    before = _demotions(runner)
    clones = {}
    for bucket, captured in runner.captured.items():
        clone = platform.clone_graph(captured.graph, private_events=True)
        if moved:
            move_planted_node(platform, clone)
        platform.instantiate(clone)  # a persistence library hands back an executable
        clones[bucket] = clone
    runner.restore(clones, saved)
    return {
        "moved": moved,
        "demotions": _demotions(runner) - before,
        "buckets": {
            str(b): {
                "policy": r.policy.label if r.policy is not None else None,
                "rebind_us": r.rebind_us,
                "detail": r.detail,
            }
            for b, r in sorted(runner.capture_report.items())
        },
    }


def _demotions(runner: GraphRunner) -> int:
    return sum(n for key, n in runner.reporter.counts.items() if key.startswith("demotion:"))


def format_restored(restored: dict) -> list[str]:
    """One line per restored bucket: the policy, the rebind's cost per executable, why."""
    lines = []
    for name, info in restored.items():
        for bucket, b in info["buckets"].items():
            cost = "-" if b["rebind_us"] is None else f"{b['rebind_us']:.1f} us"
            lines.append(
                f"{name} {bucket}-token graph: {b['policy']}, rebind {cost} per executable: "
                f"{b['detail']}"
            )
        lines.append(f"{name}: {info['demotions']} bucket(s) refused and counted (demotions)")
    return lines


def restored_targets(rows: list[dict], restored: dict) -> dict:
    """The done-when of issue 31 on this run."""
    by = {r["name"]: r for r in rows}
    out: dict[str, bool] = {}
    if RESTORED in by:
        row = by[RESTORED]
        costs = [
            b["rebind_us"]
            for b in restored.get(RESTORED, {}).get("buckets", {}).values()
            if b["rebind_us"] is not None
        ]
        out["restored_closes_95pct"] = row["gap_closed"] is not None and row["gap_closed"] >= 0.95
        out["restored_zero_corrupted"] = row["corrupted"] == 0
        out["rebind_under_10us_per_executable"] = bool(costs) and max(costs) < 10.0
    if RESTORED_MOVED in by:
        info = restored.get(RESTORED_MOVED, {})
        out["restored_moved_coarse_and_counted"] = by[RESTORED_MOVED]["resolved"] == "none" and (
            info.get("demotions", 0) >= len(info.get("buckets", {})) > 0
        )
    return out


__all__ = [
    "RESTORED",
    "RESTORED_MOVED",
    "ROWS",
    "format_restored",
    "move_planted_node",
    "restore_runner",
    "restored_targets",
]
