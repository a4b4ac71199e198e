"""Decision-latency benchmark: the compiled per-step lookup against the anchor's if-chain.

Both run in one process over the same sequence of forward modes. The baseline is a hand-written
equivalent of the anchor engine's (SGLang's) per-step decision: mode predicates as methods, the
spec algorithm's capability method, backend attributes and the runner's planted flag, evaluated
on every step (docs/ARCHITECTURE.md, "Benchmarks"). Run it with ``warpolicy bench decide``.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

from warpolicy.registry.report import json_document
from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    PRE_REPLAY,
    ForwardMode,
    WarReadDonePolicy,
)


class _AnchorMode:
    """SGLang's ForwardMode style: an enum value with predicate methods."""

    __slots__ = ("value",)

    def __init__(self, mode: ForwardMode) -> None:
        self.value = mode

    def is_decode(self) -> bool:
        return self.value is ForwardMode.DECODE

    def is_target_verify(self) -> bool:
        return self.value is ForwardMode.TARGET_VERIFY

    def is_extend_exact(self) -> bool:
        return self.value is ForwardMode.EXTEND


class _AnchorSpec:
    def __init__(self, name: str) -> None:
        self.name = name

    def is_none(self) -> bool:
        return self.name == "none"

    def is_dflash_family(self) -> bool:
        return self.name in ("dflash", "dspark")

    def supports_target_verify_read_done(self) -> bool:
        return self.is_dflash_family()


class _AnchorBackend:
    rereads_shared_metadata_across_segments = False
    prefill_shared_reads_end_at_metadata_init = False


class AnchorRunner:
    """The baseline: the anchor's per-step decision, written out as an if-chain."""

    def __init__(
        self,
        spec: str = "none",
        planted: bool = True,
        prefill_flag: bool = False,
        force_coarse: bool = False,
    ) -> None:
        self.spec_algorithm = _AnchorSpec(spec)
        self.attn_backend = _AnchorBackend()
        self.read_done_planted = planted
        self.enable_prefill_read_done = prefill_flag
        self.force_coarse = force_coarse

    def war_read_done_policy(self, forward_mode: _AnchorMode) -> WarReadDonePolicy:
        if self.force_coarse:
            return NONE
        if forward_mode.is_decode():
            return IN_GRAPH if self.read_done_planted else POST_REPLAY
        if forward_mode.is_target_verify():
            if not self.spec_algorithm.supports_target_verify_read_done():
                return NONE
            if self.attn_backend.rereads_shared_metadata_across_segments:
                return POST_REPLAY
            return IN_GRAPH if self.read_done_planted else POST_REPLAY
        if (
            forward_mode.is_extend_exact()
            and self.enable_prefill_read_done
            and self.spec_algorithm.is_none()
            and self.attn_backend.prefill_shared_reads_end_at_metadata_init
        ):
            return PRE_REPLAY
        return NONE


def _median_ns_per_call(fn: Callable, args: Sequence, repeats: int) -> float:
    """Median over ``repeats`` of the per-call time, minus the bare loop's cost."""
    samples = []
    n = len(args)
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for a in args:
            fn(a)
        t1 = time.perf_counter_ns()
        for _ in args:  # the bare loop's cost, subtracted below
            pass
        t2 = time.perf_counter_ns()
        samples.append(((t1 - t0) - (t2 - t1)) / n)
    return statistics.median(samples)


def _mode_mix(count: int) -> list[ForwardMode]:
    """Mostly decode, some verify and extend: a serving engine's step mix."""
    pattern = [ForwardMode.DECODE] * 6 + [ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND]
    return [pattern[i % len(pattern)] for i in range(count)]


def bench_lookup(iterations: int = 200_000, repeats: int = 7) -> dict:
    """Engine lookup vs anchor if-chain on the default registry (backend fa3, spec none)."""
    from warpolicy.registry.engine import PolicyEngine

    engine = PolicyEngine.load(files=None, plugins=False, environ={})
    compiled = engine.compile("fa3", "none", strict=True)
    lookup = compiled.per_step(eager=False, planted=True)  # resolved once, as a runner does
    anchor = AnchorRunner("none")
    modes = _mode_mix(iterations)
    anchor_modes = [_AnchorMode(m) for m in modes]
    for m, am in zip(modes[:64], anchor_modes[:64]):  # the two must agree before we time them
        assert lookup(m) is anchor.war_read_done_policy(am), m
    engine_ns = _median_ns_per_call(lookup, modes, repeats)
    general_ns = _median_ns_per_call(compiled.lookup, modes, repeats)
    baseline_ns = _median_ns_per_call(anchor.war_read_done_policy, anchor_modes, repeats)
    return {
        "engine_ns": round(engine_ns, 1),
        "baseline_ns": round(baseline_ns, 1),
        "lookup_ns": round(general_ns, 1),
        "ratio": round(engine_ns / baseline_ns, 3) if baseline_ns > 0 else None,
        "iterations": iterations,
        "repeats": repeats,
    }


def synthetic_registry_yaml(backends: int = 1000, gates: int = 100) -> str:
    """A large registry text: ``backends`` backends over a base, ``gates`` global gates."""
    lines = [
        "version: 1",
        "flags:",
        "  f0: {default: false, env: [WARPOLICY_F0], doc: a flag}",
        "spec_algorithms:",
        "  none: {capabilities: {prefill_read_done: true, target_verify_read_done: false},"
        " doc: plain}",
        "  dflash: {family: dflash, capabilities: {prefill_read_done: true,"
        " target_verify_read_done: true}, doc: dflash}",
        "backends:",
        "  base: {abstract: true, reads_end: {decode: in_graph, target_verify: in_graph},"
        " doc: base}",
    ]
    for i in range(backends):
        extra = ", reads_end: {extend: pre_replay}" if i % 7 == 0 else ""
        lines.append(f"  be{i}: {{inherits: base{extra}, doc: synthetic backend {i}}}")
    lines.append("gates:")
    for i in range(gates):
        mode = ("decode", "extend", "target_verify")[i % 3]
        lines.append(
            f"  - {{id: gate-{i}, when: {{mode: {mode}, backend: be{i * 7 % backends},"
            f" flags: {{f0: true}}}}, at_least: post_replay, because: synthetic gate}}"
        )
    return "\n".join(lines) + "\n"


def bench_load(backends: int = 1000, gates: int = 100, repeats: int = 3) -> dict:
    """Time loading + validating a synthetic registry, and a full table over it."""
    from warpolicy.registry.engine import PolicyEngine
    from warpolicy.registry.loader import Fragment, load_registry

    text = synthetic_registry_yaml(backends, gates)
    load_s = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        registry = load_registry([Fragment("synthetic.yaml", text)])
        load_s.append(time.perf_counter() - t0)
    engine = PolicyEngine(registry, environ={})
    t0 = time.perf_counter()
    rows = engine.table()
    table_s = time.perf_counter() - t0
    return {
        "backends": backends,
        "gates": gates,
        "load_s": round(statistics.median(load_s), 4),
        "table_s": round(table_s, 4),
        "table_rows": len(rows),
    }


def run_decide_bench(iterations: int = 200_000, repeats: int = 7) -> dict:
    result = bench_lookup(iterations, repeats)
    result["load"] = bench_load()
    return result


def format_decide(result: dict, fmt: str = "text") -> str:
    if fmt == "json":
        return json_document(result)  # schema_version first, like every JSON output
    load = result["load"]
    return "\n".join(
        [
            "decision latency (median ns per call, same process, same mode sequence)",
            f"  engine  CompiledPolicy.per_step() {result['engine_ns']:8.1f} ns",
            f"          CompiledPolicy.lookup()   {result['lookup_ns']:8.1f} ns  (facts passed per call)",
            f"  anchor  if-chain baseline         {result['baseline_ns']:8.1f} ns",
            "  ratio   engine / baseline         "
            + (f"{result['ratio']:8.3f}" if result["ratio"] is not None else "     n/a"),
            f"registry load+validate ({load['backends']} backends, {load['gates']} gates): "
            f"{load['load_s']:.3f} s",
            f"full table over it ({load['table_rows']} cells): {load['table_s']:.3f} s",
        ]
    )
