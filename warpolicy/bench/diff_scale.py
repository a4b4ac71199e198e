"""The diff at scale (issue 26 finding 9): 1,000 backends, 100 global gates each on its own
platform, one gate changed. Times `diff_engines` as the review gates run it against the same
diff evaluating every setting (``prune_gates=False``), side by side in one process, and checks
both find the same cells. Prints; asserts nothing about time.

    python -m warpolicy.bench.diff_scale [BACKENDS] [GATES]
"""

from __future__ import annotations

import sys
import time

from warpolicy.registry.cells import cell_space
from warpolicy.registry.compare import diff_engines
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import Fragment, load_registry


def registry(backends: int, gates: int, changed: bool) -> str:
    lines = [
        "version: 1",
        "backends:",
        "  base: {abstract: true, reads_end: {decode: in_graph, target_verify: in_graph}, doc: x}",
    ]
    lines += [f"  be_{i:04d}: {{inherits: base, doc: x}}" for i in range(backends)]
    lines.append("gates:")
    for g in range(gates):
        at_least = "in_graph" if g == 0 and changed else "post_replay"  # gate 0: earlier
        lines.append(
            f"  - {{id: g{g}, when: {{platform: p{g}, mode: decode}}, at_least: {at_least}, "
            "because: x}"
        )
    return "\n".join(lines) + "\n"


def run(backends: int = 1000, gates: int = 100) -> str:
    """The line the benchmark prints (both timings, their ratio, whether the cells agree)."""
    old = PolicyEngine(load_registry([Fragment("old", registry(backends, gates, False))]), {})
    new = PolicyEngine(load_registry([Fragment("new", registry(backends, gates, True))]), {})
    space = cell_space([old.registry, new.registry])
    timings = {}
    found = {}
    for prune in (False, True):
        start = time.perf_counter()
        diff = diff_engines(old, new, space, prune_gates=prune)
        timings[prune] = time.perf_counter() - start
        found[prune] = sorted((c.backend, c.mode, c.spec, c.change) for c in diff.cells)
    same = "same cells" if found[True] == found[False] else "DIFFERENT CELLS"
    return (
        f"diff of {backends} backends x {gates} gates, one gate changed: every setting "
        f"{timings[False]:.2f} s, changed gates only {timings[True]:.2f} s "
        f"({timings[False] / max(timings[True], 1e-9):.0f}x), {len(found[True])} cells, {same}"
    )


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:3]]
    print(run(*sizes))
