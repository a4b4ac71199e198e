"""Overlap benchmark: how much of the scheduler's GPU work each read-done policy hides.

A synthetic decode model (`warpolicy.testing.models.SyntheticDecodeModel`): an in-graph
metadata prep that gathers request-to-token rows by a shared request index, then ``layers``
matmul layers of about ``layer_us`` each. A scheduler (`OverlapLoop`) that, after the barrier,
rewrites the request index and table rows for the next step and does about ``sched_us`` of
GPU bookkeeping on the schedule stream; the forward waits for those writes before the next
launch. Everything goes through the real `DecodeRunner`, fence, hooks and `OverlapLoop`, so
the runner and hooks cannot give back what the bare mechanism gains (REFERENCE.md §4).

Variants, in one run: ``coarse`` (policy none), ``post_replay``, ``in_graph``, ``pre_replay``
(unsound here: the graph reads shared state; run and flagged unsafe) and ``no_barrier`` (the
unsafe upper bound). All GPU times come from CUDA timing events recorded by a `StepProbe` at
four points of each step (forward: launch, end; schedule stream: released, written):

* hold: schedule stream released minus forward launch (median over steady-state steps);
* step: launch to next launch; idle gap: forward end to next launch;
* gap closed: (coarse step - step) / (coarse step - no_barrier step);
* release vs ideal: hold minus the ideal point, the end of the in-graph prep after launch
  (measured by replaying a prep-only graph the same way);
* corrupted: steps whose output differs (bitwise) from a sequential, single-stream reference.

With ``device="fake"`` it runs a tiny config on the fake platform (numbers are host times
and meaningless); otherwise it needs CUDA and raises `CudaUnavailableError` without it.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable, Optional, Sequence

from warpolicy.errors import CudaUnavailableError, InputError
from warpolicy.policy import WarReadDonePolicy

P = WarReadDonePolicy
POINTS = ("launch", "launched", "released", "written")

#: (name, policy, sound for this model, skip the barrier entirely)
VARIANTS: tuple[tuple[str, WarReadDonePolicy, bool, bool], ...] = (
    ("coarse", P.NONE, True, False),
    ("post_replay", P.POST_REPLAY, True, False),
    ("in_graph", P.IN_GRAPH, True, False),
    ("pre_replay", P.PRE_REPLAY, False, False),  # the graph reads shared state: unsound here
    ("no_barrier", P.NONE, False, True),  # the unsafe upper bound
)


# -- timing probes -------------------------------------------------------------------------------

class CudaProbe:
    """Records a timing event on the given stream at each mark (GPU time)."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.base = torch.cuda.Event(enable_timing=True)
        self.base.record()
        self.events: dict[str, list[Any]] = {p: [] for p in POINTS}

    def mark(self, point: str, stream: Any) -> None:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        self.events[point].append(ev)

    def times_us(self) -> dict[str, list[float]]:
        """Microseconds since the probe was made (call after a synchronize)."""
        return {p: [self.base.elapsed_time(e) * 1000.0 for e in evs]
                for p, evs in self.events.items()}


class HostProbe:
    """Host timestamps at each mark: the fake platform's stand-in (meaningless as GPU time)."""

    def __init__(self) -> None:
        self.base = time.perf_counter()
        self.stamps: dict[str, list[float]] = {p: [] for p in POINTS}

    def mark(self, point: str, stream: Any) -> None:
        self.stamps[point].append((time.perf_counter() - self.base) * 1e6)

    def times_us(self) -> dict[str, list[float]]:
        return {p: list(v) for p, v in self.stamps.items()}


# -- calibration (CUDA) --------------------------------------------------------------------------

def _time_us(fn: Callable[[], Any], reps: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / reps


def calibrate_rows(target_us: float, hidden: int, device: Any, *, tanh: bool = False) -> int:
    """Rows of a ``rows x hidden @ hidden x hidden`` bf16 matmul taking about ``target_us``."""
    import torch

    if target_us <= 0:
        return 0
    w = torch.randn(hidden, hidden, device=device, dtype=torch.bfloat16)
    rows = 1024
    for _ in range(3):  # matmul time is close to linear in rows at these sizes
        a = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
        fn = (lambda a=a: torch.tanh(a @ w)) if tanh else (lambda a=a: a @ w)
        took = _time_us(fn)
        rows = int(min(max(round(rows * target_us / max(took, 1e-3) / 64) * 64, 64), 1 << 17))
    return rows


SCHED_KINDS = ("copy", "latency", "matmul")


def spin_work(target_us: float, device: Any) -> Callable[[], None]:
    """Latency-bound scheduler bookkeeping: one single-thread spin kernel of ``target_us``.

    A real scheduler's GPU bookkeeping is a chain of tiny kernels (index writes, copies) that
    occupy a few SMs for their latency; a spin models that without competing with the forward
    for the whole GPU (a big matmul would, and then no barrier can recover its time).
    """
    import torch

    if target_us <= 0:
        return lambda: None
    cycles = 200_000
    for _ in range(3):  # spin time is linear in cycles
        took = _time_us(lambda c=cycles: torch.cuda._sleep(c))
        cycles = max(int(cycles * target_us / max(took, 1e-3)), 1000)
    return lambda: torch.cuda._sleep(cycles)


def copy_work(target_us: float, device: Any) -> Callable[[], None]:
    """Copy-engine scheduler bookkeeping: a pinned host-to-device upload of about ``target_us``.

    A scheduler uploads the next batch's metadata from pinned host memory; the DMA engines do
    it, so it overlaps the forward without taking SMs (a kernel on the schedule stream would
    hold SMs that persistent forward kernels wait for, which no barrier can give back).
    """
    import torch

    if target_us <= 0:
        return lambda: None
    nbytes = 4 << 20
    for _ in range(3):  # copy time is linear in bytes at these sizes
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
        took = _time_us(lambda: dst.copy_(src, non_blocking=True))
        nbytes = max(int(nbytes * target_us / max(took, 1e-3)) // 4096 * 4096, 4096)
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return lambda: dst.copy_(src, non_blocking=True)


# -- the runs ------------------------------------------------------------------------------------

def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _metrics(t: dict[str, list[float]], warmup: int) -> dict[str, float]:
    """Steady-state medians from one run's marks (microseconds)."""
    n = len(t["launch"])
    ks = range(min(warmup, max(n - 2, 0)), n - 1)
    L, D, R = t["launch"], t["launched"], t["released"]
    return {
        "hold_us": _median([max(0.0, R[k] - L[k]) for k in ks]),
        "step_us": _median([L[k + 1] - L[k] for k in ks]),
        "idle_gap_us": _median([max(0.0, L[k + 1] - D[k]) for k in ks]),
    }


class _PrepOnly:
    """The model with its forward cut after the in-graph prep: times the ideal release point."""

    def __init__(self, model: Any) -> None:
        self.m = model
        self.shared_buffers = model.shared_buffers

    def bucket_sizes(self, mode: Any) -> Sequence[int]:
        return self.m.bucket_sizes(mode)

    def batch_size(self, batch: Any) -> int:
        return self.m.batch_size(batch)

    def prepare_bucket(self, bucket: int) -> None:
        self.m.prepare_bucket(bucket)

    def host_prep(self, batch: Any, bucket: int) -> None:
        self.m.host_prep(batch, bucket)

    def graph_prep(self, bucket: int) -> None:
        self.m.graph_prep(bucket)

    def forward(self, bucket: int) -> Any:
        return self.m.tokens


class _Bench:
    """One configured benchmark: model, bookkeeping work, platform, probe factory."""

    def __init__(self, platform: Any, model: Any, bookkeeping: Callable[[], None], steps: int,
                 warmup: int, probe_factory: Callable[[], Any]) -> None:
        self.platform, self.model, self.bookkeeping = platform, model, bookkeeping
        self.steps, self.warmup, self.probe_factory = steps, warmup, probe_factory

    def runner(self, policy: WarReadDonePolicy, name: str, model: Any = None) -> Any:
        from warpolicy.runners import DecodeRunner
        from warpolicy.testing.models import fixed_policy

        runner = DecodeRunner(model or self.model, fixed_policy(policy), self.platform, name=name)
        runner.capture()
        return runner

    def reference(self, runner: Any) -> list[Any]:
        """Sequential: writes, then the step, on one stream: no overlap, no race."""
        outs = []
        for k in range(self.steps):
            self.model.write_step(k)
            self.bookkeeping()
            outs.append(runner.run(k).clone())
            runner.fence.take()
        self.platform.synchronize()
        return outs

    def overlapped(self, runner: Any, skip_barrier: bool) -> tuple[list[Any], dict[str, list[float]]]:
        from warpolicy.runners import OverlapLoop

        p, m = self.platform, self.model
        m.write_step(0)
        p.synchronize()
        probe = self.probe_factory()
        loop = OverlapLoop(runner, p, probe=probe, unsafe_skip_barrier=skip_barrier)
        outs = []
        for k in range(self.steps):
            def write_next(k: int = k) -> None:
                if k + 1 < self.steps:
                    m.write_step(k + 1)
                self.bookkeeping()
            outs.append(loop.step(k, write_next).clone())  # on the forward stream
        loop.drain()
        return outs, probe.times_us()

    def ideal_us(self) -> float:
        """Launch to end of the in-graph prep, replaying a prep-only graph back to back."""
        runner = self.runner(P.NONE, "prep_only", _PrepOnly(self.model))
        p = self.platform
        probe = self.probe_factory()
        fwd = p.current_stream()
        for k in range(self.steps):
            probe.mark("launch", fwd)
            runner.run(k)
            runner.fence.take()
            probe.mark("launched", fwd)
        p.synchronize()
        t = probe.times_us()
        ks = range(min(self.warmup, self.steps - 1), self.steps)
        return _median([t["launched"][k] - t["launch"][k] for k in ks])


def run_overlap_bench(layers: int = 32, batch: int = 64, steps: int = 150,
                      trace: Optional[str] = None, device: Any = None, *, repeats: int = 3,
                      layer_us: float = 100.0, sched_us: float = 300.0, window_us: float = 0.0,
                      hidden: int = 2048, warmup: int = 10, pm: Any = None,
                      sched_kind: str = "copy") -> dict:
    """Run every variant ``repeats`` times; return the result dict (see `format_overlap`).

    ``window_us`` puts that much work before the prep's read inside the graph (widens the race
    window, as REFERENCE.md §4's second experiment). ``trace`` writes a Chrome/Perfetto JSON
    of the first run of each variant. ``sched_kind`` is ``copy`` (the scheduler's GPU
    bookkeeping is a pinned host-to-device upload on the copy engines; the default),
    ``latency`` (a single-thread spin kernel: it holds one SM, which delays persistent forward
    kernels) or ``matmul`` (throughput-bound work that competes with the forward for every SM).
    """
    import torch

    from warpolicy.platform import Platform
    from warpolicy.testing.models import SyntheticDecodeModel, matmul_work

    if sched_kind not in SCHED_KINDS:
        raise InputError(f"overlap bench: sched_kind must be one of {', '.join(SCHED_KINDS)}, "
                         f"not {sched_kind!r}")
    if min(layers, batch, steps, repeats) <= 0:
        raise InputError("overlap bench: layers, batch, steps and repeats must be positive")
    fake = str(device) == "fake"
    if not fake and not torch.cuda.is_available():
        raise CudaUnavailableError("the overlap benchmark needs a CUDA device "
                                   "(torch.cuda.is_available() is False)")
    platform = Platform.for_device("fake" if fake else (device or "cuda"), pm=pm)
    if fake:  # tiny and host-timed: exercises the code path, numbers meaningless
        layers, batch, steps, repeats, hidden = min(layers, 2), min(batch, 4), min(steps, 12), 1, 16
        warmup = 2
        tdev, layer_rows, sched_rows, window_rows = torch.device("cpu"), 8, 8, 0
        probe_factory: Callable[[], Any] = HostProbe
    else:
        tdev = torch.device(device or "cuda")
        layer_rows = calibrate_rows(layer_us, hidden, tdev, tanh=True)
        sched_rows = calibrate_rows(sched_us, hidden, tdev) if sched_kind == "matmul" else 0
        window_rows = calibrate_rows(window_us, hidden, tdev, tanh=True)
        probe_factory = CudaProbe
    warmup = min(warmup, max(steps - 2, 0))
    model = SyntheticDecodeModel(layers=layers, batch=batch, steps=steps, hidden=hidden,
                                 layer_rows=layer_rows, window_rows=window_rows, device=tdev)
    if fake or sched_kind == "matmul":
        bookkeeping = matmul_work(sched_rows, hidden, tdev)
    elif sched_kind == "latency":
        bookkeeping = spin_work(sched_us, tdev)
    else:
        bookkeeping = copy_work(sched_us, tdev)
    bench = _Bench(platform, model, bookkeeping, steps, warmup,
                   probe_factory)
    ideal = bench.ideal_us()

    rows, traces = [], {}
    for name, policy, is_sound, skip in VARIANTS:
        runner = bench.runner(policy, name)
        per_run, corrupted = [], 0
        for r in range(repeats):
            ref = bench.reference(runner)
            outs, t = bench.overlapped(runner, skip)
            corrupted += sum(not torch.equal(a, b) for a, b in zip(outs, ref))
            per_run.append(_metrics(t, warmup))
            if r == 0:
                traces[name] = t
        row = {k: _median([m[k] for m in per_run]) for k in per_run[0]}
        row.update(name=name, policy=policy.label, resolved=runner.policy_for(batch).label,
                   sound=is_sound, barrier=not skip, corrupted=corrupted,
                   checked=steps * repeats)
        rows.append(row)

    _gap_closed(rows)
    ig = next(r for r in rows if r["name"] == "in_graph")
    ig["release_minus_ideal_us"] = ig["hold_us"] - ideal
    result = {
        "config": {"layers": layers, "batch": batch, "steps": steps, "repeats": repeats,
                   "warmup": warmup, "hidden": hidden, "layer_rows": layer_rows,
                   "sched_rows": sched_rows, "sched_kind": sched_kind,
                   "window_rows": window_rows,
                   "layer_us_target": layer_us, "sched_us_target": sched_us,
                   "window_us_target": window_us, "platform": platform.name,
                   "device": _device_name(platform, tdev), "torch": torch.__version__},
        "ideal_release_us": ideal,
        "rows": rows,
        "targets": _targets(rows, ideal),
    }
    if trace:
        write_trace(trace, traces)
        result["trace"] = str(trace)
    return result


def _gap_closed(rows: list[dict]) -> None:
    """Share of the coarse-to-no-barrier step-time gap each variant closes (None if no gap)."""
    by = {r["name"]: r for r in rows}
    coarse, bound = by["coarse"]["step_us"], by["no_barrier"]["step_us"]
    gap = coarse - bound
    for r in rows:
        # a gap under 0.5% of the step is noise: the scheduler's work was already hidden
        r["gap_closed"] = (coarse - r["step_us"]) / gap if gap > 0.005 * coarse else None


def _targets(rows: list[dict], ideal: float) -> dict:
    by = {r["name"]: r for r in rows}
    ig = by["in_graph"]
    off = abs(ig["hold_us"] - ideal)
    return {
        "in_graph_closes_95pct": ig["gap_closed"] is not None and ig["gap_closed"] >= 0.95,
        # "within 5% of the ideal point", read as 5% of the step: the prep is a few us long
        "in_graph_release_within_5pct_of_step": off <= 0.05 * ig["step_us"],
        "sound_policies_zero_corrupted": all(r["corrupted"] == 0 for r in rows if r["sound"]),
    }


def _device_name(platform: Any, tdev: Any) -> str:
    if platform.name != "cuda":
        return platform.name
    import torch

    return torch.cuda.get_device_name(tdev)


# -- output ----------------------------------------------------------------------------------------

def write_trace(path: str, traces: dict[str, dict[str, list[float]]]) -> None:
    """Chrome/Perfetto trace: one process per variant, a forward and a schedule-stream track.

    Times are GPU times from the probe's events (us from the run's start): on the forward
    track each step spans launch to end; on the schedule track "held" spans launch to the
    release (the barrier wait) and "writes" spans release to the end of the next-step writes
    and bookkeeping.
    """
    events: list[dict] = []
    for pid, (name, t) in enumerate(traces.items(), start=1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        for tid, track in ((1, "forward stream"), (2, "schedule stream")):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": track}})
        for k, (launch, end, rel, wr) in enumerate(zip(t["launch"], t["launched"],
                                                       t["released"], t["written"])):
            events.append(_span(f"forward {k}", pid, 1, launch, end))
            events.append(_span(f"held {k}", pid, 2, launch, max(launch, rel)))
            events.append(_span(f"writes {k + 1}", pid, 2, max(launch, rel), wr))
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)


def _span(name: str, pid: int, tid: int, start: float, end: float) -> dict:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": round(start, 3),
            "dur": round(max(0.0, end - start), 3)}


def format_overlap(result: dict, fmt: str = "text") -> str:
    """The result as a table (``text``) or JSON (``json``)."""
    if fmt == "json":
        return json.dumps(result, indent=2)
    if fmt != "text":
        raise InputError(f"unknown format {fmt!r}; use text or json")
    c = result["config"]
    lines = [
        f"overlap benchmark on {c['device']} (torch {c['torch']}): {c['layers']} layers x "
        f"~{c['layer_us_target']:g} us, batch {c['batch']}, scheduler "
        f"~{c['sched_us_target']:g} us ({c['sched_kind']}), {c['steps']} steps x "
        f"{c['repeats']} runs",
        f"ideal release (end of in-graph prep): {result['ideal_release_us']:.1f} us after launch",
        "",
        f"{'variant':12s} {'resolved':12s} {'hold us':>9s} {'step us':>9s} {'idle us':>9s} "
        f"{'gap closed':>10s} {'corrupted':>10s}  note",
    ]
    for r in result["rows"]:
        gap = "-" if r["gap_closed"] is None else f"{100 * r['gap_closed']:.1f}%"
        note = "" if r["sound"] else ("unsafe bound" if not r["barrier"] else "UNSOUND here")
        if "release_minus_ideal_us" in r:
            note = f"release - ideal = {r['release_minus_ideal_us']:+.1f} us"
        lines.append(f"{r['name']:12s} {r['resolved']:12s} {r['hold_us']:9.1f} {r['step_us']:9.1f} "
                     f"{r['idle_gap_us']:9.1f} {gap:>10s} {r['corrupted']:>4d}/{r['checked']:<5d}  {note}")
    lines.append("")
    lines.append("targets: " + ", ".join(f"{k}={'yes' if v else 'NO'}"
                                         for k, v in result["targets"].items()))
    if c["platform"] != "cuda":
        lines.append("(fake platform: host timestamps, numbers are meaningless)")
    if "trace" in result:
        lines.append(f"trace written to {result['trace']}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - the CLI is `warpolicy bench overlap`
    import sys

    print(format_overlap(run_overlap_bench(device="fake" if "--fake" in sys.argv else None),
                         "json" if "--json" in sys.argv else "text"))
