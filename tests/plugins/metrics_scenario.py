"""One engine process's worth of events for the metrics plugin, on the simulated platform.

`drive` makes every series of the plugin appear: overlap steps publishing in the graph, a failing
write-event record (fault injection), a forced coarse barrier, a runner that publishes nothing,
an eager step, a bucket the marker self-check demotes, and a canary violation and release lead
(reported through the runtime's `Reporter`, as the canary does). The single-process tests call it
in-process; the multi-process test runs it in worker processes (``python metrics_scenario.py
RANK MODE``) with ``PROMETHEUS_MULTIPROC_DIR`` set, then scrapes their files.

`EXPECTED` is what one call adds, by (family sample name, labels without identity).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.observers import Reporter
from warpolicy.runtime.platforms.sim import SimGraph
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop
from warpolicy.testing import RecModel, sim_impl, sim_runtime

STEPS = 5  # in-graph steps
FAULTY = 2  # steps whose write-event record raises


def _key(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


PUBLISHES = "warpolicy_read_done_publishes_total"
BARRIERS = "warpolicy_barriers_total"
LEAD = "warpolicy_release_lead_seconds"
RESOLVED = "warpolicy_resolved_policy"
DECODE_CELL = {"runner": "decode", "mode": "decode", "bucket": "1"}

#: (sample name, labels) -> value that one `drive` adds (identity labels not included).
EXPECTED: dict[tuple[str, frozenset], float] = {
    _key(PUBLISHES, runner="decode", policy="in_graph"): STEPS + FAULTY + 1,
    _key(PUBLISHES, runner="decode", policy="post_replay"): 1,
    _key(PUBLISHES, runner="verify", policy="none"): 1,
    _key(PUBLISHES, runner="draft", policy="post_replay"): 1,
    _key(BARRIERS, runner="decode", kind="event", reason="in_graph"): STEPS + FAULTY,
    _key(BARRIERS, runner="decode", kind="event", reason="post_replay"): 1,
    _key(BARRIERS, runner="decode", kind="coarse", reason="forced"): 1,
    _key(BARRIERS, runner="verify", kind="coarse", reason="no_event"): 1,
    _key(BARRIERS, runner="draft", kind="event", reason="post_replay"): 1,
    _key("warpolicy_fallbacks_total", runner="", component="overlap_loop", place="record"): FAULTY,
    _key("warpolicy_demotions_total", runner="draft", bucket="1", reason="late_reader"): 1,
    _key(
        "warpolicy_violations_total",
        runner="decode",
        backend="fa3",
        mode="decode",
        spec="none",
        bucket="4",
    ): 1,
    _key(f"{LEAD}_count", **DECODE_CELL): 1,
    _key(f"{LEAD}_sum", **DECODE_CELL): 250e-6,
    _key(f"{LEAD}_bucket", **DECODE_CELL, le="0.00025"): 1,
    _key(f"{LEAD}_bucket", **DECODE_CELL, le="0.0001"): 0,
    _key(RESOLVED, runner="decode", mode="decode", graph="captured", policy="in_graph"): 1,
    _key(RESOLVED, runner="decode", mode="decode", graph="captured", policy="none"): 0,
    _key(RESOLVED, runner="decode", mode="decode", graph="eager", policy="post_replay"): 1,
    _key(RESOLVED, runner="verify", mode="decode", graph="captured", policy="none"): 1,
    _key(RESOLVED, runner="draft", mode="decode", graph="captured", policy="post_replay"): 1,
}


def late_reader_graph(model: RecModel, graph: SimGraph) -> Graph:
    """The table is read before the marker and again after it: the self-check refutes it."""
    table = model.table.data_ptr()
    event = graph.planted[0].id if graph.planted else 0
    return Graph(
        [
            Node(0, NodeKind.KERNEL, "gather_prep", words=(table,)),
            Node(1, NodeKind.EVENT_RECORD, deps=(0,), event=event),
            Node(2, NodeKind.KERNEL, "late_read", deps=(1,), words=(table,)),
        ]
    )


def drive(rt: Any) -> None:
    """Run the scenario on ``rt`` (a `warpolicy.runtime.manager.Runtime` on the simulated
    platform, the metrics plugin registered on ``rt.pm``)."""
    platform, observers = rt.platform, rt.observers
    impl = sim_impl(platform)
    decode = DecodeRunner(
        RecModel(), fixed_policy("in_graph"), platform, name="decode", observers=observers
    )
    decode.capture()
    loop = OverlapLoop(decode)
    for _ in range(STEPS):
        loop.step([1.0], lambda: None)
    # the write-event record (the first record after write_next) raises; the in-graph node's
    # record, which the simulated replay re-runs, does not
    armed: list[bool] = []
    impl.inject("record", "raise", when=lambda: armed.pop() if armed else False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for _ in range(FAULTY):
            loop.step([1.0], lambda: armed.append(True))
    impl.clear_faults()
    loop.step([1.0] * 9, lambda: None)  # larger than every bucket: eager, post_replay
    OverlapLoop(decode, force_coarse=True).step([1.0], None)

    verify = DecodeRunner(
        RecModel(), fixed_policy("none"), platform, name="verify", observers=observers
    )
    verify.capture()
    OverlapLoop(verify).step([1.0], None)

    draft_model = RecModel(buckets=(1,))
    impl.graph_model = lambda graph: late_reader_graph(draft_model, graph)
    draft = DecodeRunner(
        draft_model, fixed_policy("in_graph"), platform, name="draft", observers=observers
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        draft.capture()  # bucket 1: late reader -> demoted to post_replay
    impl.graph_model = None
    OverlapLoop(draft).step([1.0], None)

    canary = Reporter(observers, "canary")  # what the WAR canary reports
    canary.violation("decode", "fa3", ForwardMode.DECODE, "none", 4, 7, "out[0]: expected 1, got 2")
    canary.release_lead("decode", ForwardMode.DECODE, 1, 8, 250.0)


def main(argv: list[str]) -> int:
    """``RANK MODE``: run the scenario with the plugin in this process's identity
    (``tp_rank=RANK``). MODE ``exit``: exit normally (the at-exit flush writes the counts);
    ``kill``: flush, print ``flushed`` and wait to be killed (no at-exit flush)."""
    import warpolicy_metrics  # the worker's sys.path names the plugin's source tree

    rank, mode = int(argv[0]), argv[1]
    rt = sim_runtime()
    metrics = warpolicy_metrics.WarpolicyMetrics(identity={"engine_id": "e0", "tp_rank": rank})
    if not metrics.multiprocess:
        print("not in multi-process mode", file=sys.stderr)  # noqa: T201
        return 3
    rt.pm.register(metrics)
    drive(rt)
    if mode == "kill":
        metrics.flush()
        print("flushed", flush=True)  # noqa: T201
        sys.stdin.readline()  # killed before this returns
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
