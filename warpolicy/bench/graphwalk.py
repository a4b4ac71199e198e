"""CPU benchmark of the graph analysis on a hand-made forward-shaped graph.

``python -m warpolicy.bench.graphwalk [--nodes 1000] [--repeat 20]`` prints the median
milliseconds of finding readers, deriving the plan and self-checking a marker, against the
50 ms budget for a 1,000-node graph, and the reader frontier (linear) next to a naive baseline
(one ancestor search per reader) on the same readers, in the same process. The CUDA walk
itself is timed on the GPU (``tests/gpu/test_derived_cuda.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from warpolicy.runtime.graphwalk.analysis import (
    ancestors,
    derive_plan,
    find_event_record,
    find_readers,
    late_readers,
    reader_frontier,
)
from warpolicy.runtime.graphwalk.model import BufferRange, Graph, Node, NodeKind

BUDGET_MS = 50.0
TABLE = BufferRange("req_to_token", 0x7F00_0000_0000, 0x7F00_0010_0000)
MAP = BufferRange("swa_map", 0x7F00_0100_0000, 0x7F00_0100_4000)
INDEX = BufferRange("req_pool_indices", 0x7F00_0200_0000, 0x7F00_0200_0100)
RANGES = (TABLE, MAP, INDEX)
EVENT = 0x5EED


def forward_graph(nodes: int = 1000, words: int = 40) -> Graph:
    """A decode-shaped graph: prep kernels gather the shared table, then a chain of layers of
    kernels (each with ``words`` argument words, like torch's by-value tensor structs) and the
    odd memset; a side branch reads the shared mapping after the fourth layer; a marker
    event-record node right after the prep."""
    out: list[Node] = []

    def add(
        kind: NodeKind,
        deps: Sequence[int],
        hit: BufferRange | None = None,
        name: str = "",
        event: int | None = None,
    ) -> int:
        i = len(out)
        if kind is NodeKind.KERNEL:
            private = [0x7F10_0000_0000 + (i * 4096 + k * 64) for k in range(words - 4)]
            scalars = [k for k in range(3)] + [hit.start + 64 if hit else 0x7F20_0000_0000]
            out.append(Node(i, kind, name or f"layer_kernel_{i}", deps, tuple(private + scalars)))
        elif kind is NodeKind.MEMSET:
            out.append(
                Node(
                    i,
                    kind,
                    deps=deps,
                    spans=((0x7F30_0000_0000 + i * 256, 0x7F30_0000_0000 + i * 256 + 128),),
                )
            )
        else:
            out.append(Node(i, kind, name, deps, event=event))
        return i

    last = add(NodeKind.KERNEL, (), INDEX, "copy_indices")
    last = add(NodeKind.KERNEL, (last,), TABLE, "gather_table")
    add(NodeKind.EVENT_RECORD, (last,), event=EVENT)
    per_layer = 24
    layer = 0
    while len(out) < nodes:
        for k in range(per_layer):
            if len(out) >= nodes:
                break
            kind = NodeKind.MEMSET if k % 8 == 7 else NodeKind.KERNEL
            last = add(kind, (last,))
        layer += 1
        if layer == 4 and len(out) < nodes:
            add(NodeKind.KERNEL, (last,), MAP, "swa_index")  # a side branch, read late
    return Graph(tuple(out))


def naive_frontier(graph: Graph, readers: Sequence[int]) -> tuple[int, ...]:
    """Baseline: one ancestor search per reader (quadratic when most nodes are readers)."""
    covered: set[int] = set()
    for r in readers:
        covered |= ancestors(graph, r)
    return tuple(sorted(r for r in readers if r not in covered))


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def run(nodes: int = 1000, repeat: int = 20) -> dict[str, float]:
    graph = forward_graph(nodes)
    marker = find_event_record(graph, EVENT)
    assert marker is not None
    plan = derive_plan(graph, RANGES)
    readers = [r.index for r in plan.readers]
    everyone = list(range(0, len(graph), 2))  # worst case for the frontier: half are readers
    for chosen in (readers, everyone):  # same answer, or the figures mean nothing
        if naive_frontier(graph, chosen) != reader_frontier(graph, chosen):
            raise AssertionError("frontier differs from the naive baseline")
    return {
        "nodes": float(len(graph)),
        "readers": float(len(readers)),
        "find_readers_ms": _median_ms(lambda: find_readers(graph, RANGES), repeat),
        "derive_plan_ms": _median_ms(lambda: derive_plan(graph, RANGES), repeat),
        "self_check_ms": _median_ms(lambda: late_readers(graph, RANGES, marker), repeat),
        "frontier_half_ms": _median_ms(lambda: reader_frontier(graph, everyone), repeat),
        "naive_half_ms": _median_ms(lambda: naive_frontier(graph, everyone), repeat),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warpolicy.bench.graphwalk")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    if args.nodes < 8 or args.repeat < 1:
        print("--nodes must be >= 8 and --repeat >= 1", file=sys.stderr)
        return 2
    r = run(args.nodes, args.repeat)
    print(
        f"graph analysis on a hand-made {int(r['nodes'])}-node graph "
        f"({int(r['readers'])} readers), median of {args.repeat}:"
    )
    print(f"  find readers        {r['find_readers_ms']:8.3f} ms")
    print(
        f"  derive plan         {r['derive_plan_ms']:8.3f} ms  "
        f"({r['derive_plan_ms'] / BUDGET_MS:.1%} of the {BUDGET_MS:.0f} ms budget)"
    )
    print(
        f"  marker self-check   {r['self_check_ms']:8.3f} ms  "
        f"({r['self_check_ms'] / BUDGET_MS:.1%} of the budget)"
    )
    print(f"  frontier, half the nodes readers  {r['frontier_half_ms']:8.3f} ms")
    print(
        f"  naive baseline, same readers      {r['naive_half_ms']:8.3f} ms  (frontier / naive "
        f"= {r['frontier_half_ms'] / max(r['naive_half_ms'], 1e-9):.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
