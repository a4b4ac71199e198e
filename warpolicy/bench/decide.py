"""Decision-latency benchmark: the compiled per-step lookup against the anchor's if-chain.

Both run in one process over the same sequence of forward modes. The baseline is a hand-written
equivalent of the anchor engine's (SGLang's) per-step decision: mode predicates as methods, the
spec algorithm's capability method, backend attributes and the runner's planted flag, evaluated
on every step (docs/ARCHITECTURE.md, "Benchmarks"). The per-batch row times
`CompiledPolicy.per_batch` on DeepSeek-V4 with each step's batch facts (query-token count,
sparse-prefill snapshot) beside the same baseline and beside the anchor's per-batch chain
(SGLang 0.5.23's prefill read-end resolution and main's staging gate written out). It also
times loading: a large registry (and a full table over it), and the shapes an adversary would
try (`measure_load`: aliases that amplify a shared list, a long chain of composites, a flood of
unknown names; each generated in memory). Run it with ``warpolicy bench decide``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

from warpolicy.bench.command import Benchmark, Report, option
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.inputs import positive_int_argument
from warpolicy.registry.loader import Fragment, load_registry, validate_sources
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


class _AnchorBatch:
    """What the anchor's per-batch prefill decision reads from a batch."""

    __slots__ = ("num_qo_tokens", "snapshot_built")

    def __init__(self, num_qo_tokens: int, snapshot_built: bool) -> None:
        self.num_qo_tokens = num_qo_tokens
        self.snapshot_built = snapshot_built


class _AnchorSparseBackend(_AnchorBackend):
    """DeepSeek-V4's prefill read end as SGLang 0.5.23 resolves it per batch."""

    threshold = 11673

    def resolve_prefill_shared_read_ends(
        self, batch: _AnchorBatch, *, num_qo_tokens: int
    ) -> WarReadDonePolicy:
        if num_qo_tokens > self.threshold and not batch.snapshot_built:
            return NONE
        return PRE_REPLAY


class AnchorPerBatchRunner(AnchorRunner):
    """The anchor's per-step decision with its per-batch prefill logic (SGLang 0.5.23's
    ``resolve_prefill_shared_read_ends``, main's staging gate) written out."""

    def __init__(self, spec: str = "none", prefill_flag: bool = True) -> None:
        super().__init__(spec, planted=True, prefill_flag=prefill_flag)
        self.prefill_backend = _AnchorSparseBackend()
        self.stager: Callable[[_AnchorBatch], bool] | None = None

    def war_read_done_policy_batch(
        self, forward_mode: _AnchorMode, batch: _AnchorBatch
    ) -> WarReadDonePolicy:
        if self.force_coarse:
            return NONE
        if forward_mode.is_extend_exact():
            if not self.enable_prefill_read_done:
                return NONE
            ends = self.prefill_backend.resolve_prefill_shared_read_ends(
                batch, num_qo_tokens=batch.num_qo_tokens
            )
            if ends is not PRE_REPLAY:
                return NONE
            staging = not (self.spec_algorithm.is_none() or self.spec_algorithm.is_dflash_family())
            if staging and (self.stager is None or not self.stager(batch)):
                return NONE
            return PRE_REPLAY
        return self.war_read_done_policy(forward_mode)


def _sample_ns(fn: Callable, args: Sequence, pairs: bool) -> float:
    """One timed pass of ``fn`` over ``args`` (unpacked into two arguments when ``pairs``), in ns
    per call, minus the bare loop's cost."""
    n = len(args)
    if pairs:
        t0 = time.perf_counter_ns()
        for a, b in args:
            fn(a, b)
        t1 = time.perf_counter_ns()
        for _a, _b in args:  # the bare loop's cost (unpacking included), subtracted below
            pass
        t2 = time.perf_counter_ns()
    else:
        t0 = time.perf_counter_ns()
        for a in args:
            fn(a)
        t1 = time.perf_counter_ns()
        for _ in args:
            pass
        t2 = time.perf_counter_ns()
    return ((t1 - t0) - (t2 - t1)) / n


#: A timed run: the callable, its arguments, and whether each argument is a (mode, facts) pair.
_Run = tuple[Callable, Sequence, bool]


def _interleaved(runs: dict[str, _Run], repeats: int) -> dict[str, list[float]]:
    """``repeats`` passes of every run, interleaved (run a, b, c, then a, b, c again), so a
    load that drifts on a shared machine hits every run alike."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (fn, args, pairs) in runs.items():
            samples[name].append(_sample_ns(fn, args, pairs))
    return samples


def _median_ratio(top: Sequence[float], bottom: Sequence[float]) -> float | None:
    """The median of the per-pass ratios (each pass measured side by side)."""
    ratios = [t / b for t, b in zip(top, bottom) if b > 0]
    return round(statistics.median(ratios), 3) if ratios else None


def _mode_mix(count: int) -> list[ForwardMode]:
    """Mostly decode, some verify and extend: a serving engine's step mix."""
    pattern = [ForwardMode.DECODE] * 6 + [ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND]
    return [pattern[i % len(pattern)] for i in range(count)]


def bench_lookup(iterations: int = 200_000, repeats: int = 7) -> dict:
    """Engine lookup vs anchor if-chain on the default registry (backend fa3, spec none), and
    the per-batch lookup with facts (`per_batch_runs`), every run interleaved with the others;
    ratios are medians of per-pass ratios."""
    engine = PolicyEngine.load(environ={})
    compiled = engine.compile("fa3", "none", strict=True)
    lookup = compiled.per_step(eager=False, planted=True)  # resolved once, as a runner does
    anchor = AnchorRunner("none")
    modes = _mode_mix(iterations)
    anchor_modes = [_AnchorMode(m) for m in modes]
    for m, am in zip(modes[:64], anchor_modes[:64]):  # the two must agree before we time them
        assert lookup(m) is anchor.war_read_done_policy(am), m
    runs: dict[str, _Run] = {
        "engine": (lookup, modes, False),
        "lookup": (compiled.lookup, modes, False),
        "baseline": (anchor.war_read_done_policy, anchor_modes, False),
        **per_batch_runs(engine, modes, anchor_modes),
    }
    samples = _interleaved(runs, repeats)
    ns = {name: round(statistics.median(values), 1) for name, values in samples.items()}
    return {
        "engine_ns": ns["engine"],
        "baseline_ns": ns["baseline"],
        "lookup_ns": ns["lookup"],
        "ratio": _median_ratio(samples["engine"], samples["baseline"]),
        "per_batch_ns": ns["per_batch"],
        "per_batch_anchor_ns": ns["per_batch_anchor"],
        "per_batch_ratio": _median_ratio(samples["per_batch"], samples["baseline"]),
        "per_batch_vs_anchor_per_batch": _median_ratio(
            samples["per_batch"], samples["per_batch_anchor"]
        ),
        "iterations": iterations,
        "repeats": repeats,
    }


def _batches(count: int) -> list[tuple[int, bool]]:
    """Each step's (query-token count, snapshot built): counts on both sides of DeepSeek-V4's
    sparse-prefill threshold, the snapshot built for some of the batches."""
    return [((4096, 16384, 16384, 512)[i % 4], i % 3 == 0) for i in range(count)]


def per_batch_runs(
    engine: PolicyEngine,
    modes: Sequence[ForwardMode],
    anchor_modes: Sequence[_AnchorMode],
) -> dict[str, _Run]:
    """``per_batch(eager, planted)(mode, facts)`` on DeepSeek-V4 (prefill opted in) with each
    step's batch facts, and the anchor's per-batch chain on the same steps (checked to agree)."""
    compiled = engine.compile("dsv4", "dspark", {"prefill_read_done": True}, strict=True)
    step = compiled.per_batch(eager=False, planted=True)
    steps = _batches(len(modes))
    facts = [{"num_qo_tokens": n, "sparse_prefill_snapshot": built} for n, built in steps]
    batches = [_AnchorBatch(n, built) for n, built in steps]
    anchor = AnchorPerBatchRunner("dspark")
    for m, am, f, b in zip(modes[:64], anchor_modes[:64], facts[:64], batches[:64]):
        assert step(m, f) is anchor.war_read_done_policy_batch(am, b), (m, f)
    return {
        "per_batch": (step, list(zip(modes, facts)), True),
        "per_batch_anchor": (
            anchor.war_read_done_policy_batch,
            list(zip(anchor_modes, batches)),
            True,
        ),
    }


# -- loading: a large registry, and the shapes an adversary would try ------------------------------


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


def bench_load(backends: int = 1000, gates: int = 100, repeats: int = 3) -> dict:
    """Time loading + validating a synthetic registry, and a full table over it."""
    text = large_registry(backends, gates)
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
    """The lookup rows, the large registry's load and table (``load``) and every loading case
    once (``load_cases``, `measure_load`)."""
    result = bench_lookup(iterations, repeats)
    result["load"] = bench_load()
    result["load_cases"] = measure_load(repeats=1)
    return result


def _show_ratio(value: float | None) -> str:
    return f"{value:8.3f}" if value is not None else "     n/a"


def format_load_cost(result: dict[str, dict]) -> str:
    """One line per case, for the decide benchmark's text output."""
    return "\n".join(
        f"  load {name:<20} {r['seconds'] * 1000:9.1f} ms  {r['bytes']:>9} bytes"
        f"  {r['problems']:>5} problem(s)"
        for name, r in result.items()
    )


def format_decide(result: dict) -> str:
    """The result as text (`warpolicy.bench.command.render` gives JSON too)."""
    load = result["load"]
    lines = [
        "decision latency (median ns per call, same process, same mode sequence)",
        f"  engine  CompiledPolicy.per_step() {result['engine_ns']:8.1f} ns",
        f"          CompiledPolicy.lookup()   {result['lookup_ns']:8.1f} ns  (facts passed per call)",
        f"  anchor  if-chain baseline         {result['baseline_ns']:8.1f} ns",
        "  ratio   engine / baseline         " + _show_ratio(result["ratio"]),
    ]
    if "per_batch_ns" in result:
        lines += [
            "per-batch lookup with facts (dsv4, dspark, prefill on: query count, snapshot)",
            f"  engine  CompiledPolicy.per_batch() {result['per_batch_ns']:7.1f} ns"
            "  (mode, facts) per call",
            f"  anchor  per-batch if-chain        {result['per_batch_anchor_ns']:8.1f} ns"
            "  (0.5.23 resolve + main staging)",
            "  ratio   per_batch / baseline      " + _show_ratio(result.get("per_batch_ratio")),
            "  ratio   per_batch / per-batch anchor "
            + _show_ratio(result.get("per_batch_vs_anchor_per_batch")).strip(),
        ]
    lines += [
        f"registry load+validate ({load['backends']} backends, {load['gates']} gates): "
        f"{load['load_s']:.3f} s",
        f"full table over it ({load['table_rows']} cells): {load['table_s']:.3f} s",
    ]
    if "load_cases" in result:
        lines.append(format_load_cost(result["load_cases"]))
    return "\n".join(lines)


def _measure(args: argparse.Namespace) -> Report:
    return Report(run_decide_bench(args.iterations), format_decide)


#: ``warpolicy bench decide`` (CPU: no torch).
BENCHMARK = Benchmark(
    "decide",
    "per-step lookup vs the anchor's if-chain (CPU)",
    (option("--iterations", default=200_000, type=positive_int_argument),),
    _measure,
    torch=False,
)
