"""What loading costs, for the decide benchmark (`warpolicy.bench.decide`) and the README.

`measure_load` times the loader on a large registry and on the shapes an adversary would try:
aliases that amplify a shared list, a long chain of composites, and a flood of unknown names.
Each case is generated in memory; times are medians of a few runs in this process.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from warpolicy.registry.loader import Fragment, validate_sources


def large_registry(backends: int = 1000, gates: int = 100) -> str:
    """``backends`` backends over an abstract base and ``gates`` global gates."""
    lines = [
        "version: 1",
        "flags:",
        "  f0: {default: false, env: [BENCH_SYNTHETIC_F0], doc: a flag}",
        "spec_algorithms:",
        "  none: {capabilities: {prefill_read_done: true}, doc: plain}",
        "backends:",
        "  base: {abstract: true, reads_end: {decode: in_graph}, doc: base}",
    ]
    lines += [
        f"  be{i}: {{inherits: base, reads_end: {{extend: pre_replay}}, doc: backend {i}}}"
        for i in range(backends)
    ]
    lines.append("gates:")
    lines += [
        f"  - {{id: gate-{i}, when: {{mode: decode, backend: be{i % backends}, "
        f"flags: {{f0: true}}}}, at_least: post_replay, because: synthetic}}"
        for i in range(gates)
    ]
    return "\n".join(lines) + "\n"


def alias_fanout(width: int, copies: int) -> str:
    """One ``latest_of`` list of ``width`` children aliased into ``copies`` composites."""
    lines = ["version: 1", "backends:"]
    lines += [f"  b{i}: {{reads_end: {{decode: in_graph}}}}" for i in range(width)]
    lines.append("  c0: {latest_of: &kids [" + ", ".join(f"b{i}" for i in range(width)) + "]}")
    lines += [f"  c{i}: {{latest_of: *kids}}" for i in range(1, copies)]
    return "\n".join(lines) + "\n"


def shared_gate_list(gates: int, backends: int) -> str:
    """One list of ``gates`` gates aliased into the ``gates:`` of ``backends`` backends."""
    lines = ["version: 1", "backends:", "  b0:", "    gates: &shared"]
    lines += [
        f"      - {{id: g{i}, when: {{mode: decode}}, at_least: none, because: x}}"
        for i in range(gates)
    ]
    lines += [f"  b{i}: {{gates: *shared}}" for i in range(1, backends)]
    return "\n".join(lines) + "\n"


def composite_chain(length: int) -> str:
    """``length`` composites, each the latest of the previous one."""
    lines = ["version: 1", "backends:", "  c0: {reads_end: {decode: in_graph}}"]
    lines += [f"  c{i}: {{latest_of: [c{i - 1}]}}" for i in range(1, length)]
    return "\n".join(lines) + "\n"


def unknown_names(backends: int, unknown: int) -> str:
    """``backends`` backends, and ``unknown`` composites naming backends that do not exist."""
    lines = ["version: 1", "backends:"]
    lines += [f"  known_backend_{i}: {{}}" for i in range(backends)]
    lines += [f"  w{i}: {{latest_of: [missing_backend_{i}]}}" for i in range(unknown)]
    return "\n".join(lines) + "\n"


def _median_s(text: str, repeats: int) -> tuple[float, int]:
    times, problems = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        problems = len(validate_sources([Fragment("bench.yaml", text)]))
        times.append(time.perf_counter() - start)
    return statistics.median(times), problems


def measure_load(backends: int = 1000, gates: int = 100, repeats: int = 3) -> dict[str, dict]:
    """Seconds to load (and validate) each case, with its size and problem count.

    Keys: ``large`` (``backends`` backends, ``gates`` gates), ``alias_fanout`` and
    ``shared_gates`` (refused: they expand past `MAX_NODES`), ``alias_within_limit`` (a shared
    list below the limit, loaded), ``composite_chain`` and ``unknown_names``.
    """
    cases: dict[str, Callable[[], str]] = {
        "large": lambda: large_registry(backends, gates),
        "alias_fanout": lambda: alias_fanout(1000, 1000),
        "shared_gates": lambda: shared_gate_list(100, 1000),
        "alias_within_limit": lambda: alias_fanout(100, 1000),
        "composite_chain": lambda: composite_chain(backends),
        "unknown_names": lambda: unknown_names(backends, 5000),
    }
    out = {}
    for name, make in cases.items():
        text = make()
        seconds, problems = _median_s(text, repeats)
        out[name] = {"seconds": round(seconds, 4), "bytes": len(text), "problems": problems}
    return out


def format_load_cost(result: dict[str, dict]) -> str:
    """One line per case, for the decide benchmark's text output."""
    return "\n".join(
        f"  load {name:<20} {r['seconds'] * 1000:9.1f} ms  {r['bytes']:>9} bytes"
        f"  {r['problems']:>5} problem(s)"
        for name, r in result.items()
    )
