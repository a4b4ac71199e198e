"""Fence benchmark: how early the in-graph event releases, and what the fence costs per step.

Measured side by side in one process:

* **release** (CUDA only): a graph of a ~1 ms spin, an ``index_select`` reading a shared index
  buffer, the planted read-done node, then ``matmuls`` 4096x4096 bf16 matmuls. Per replay the
  host waits first for the taken in-graph event, then for the whole replay; we report the
  medians and ``ratio = release / whole``.
* **overhead**: host time per step of ``fence.before_replay + after_replay`` and
  ``barrier.apply_step`` (take and barrier in one call; the step token passed: one owner check
  per step) against the raw calls that do the same device work (``event.record(stream)`` +
  ``stream.wait_event(event)`` on torch; the simulated platform's methods through the facade
  on ``sim``),
  for ``post_replay`` (one record + one wait) and ``in_graph`` (one wait; also against the raw
  ``post_replay`` step, what an engine without an in-graph event pays, against the raw
  event-first wait ``event.wait(stream)``, torch's call, and with cuda-bindings against the
  raw ``cuStreamWaitEvent``, the driver call the barrier then makes), with no observer
  plugin and with one no-op observer registered (called directly, as the runtime calls every
  observer: `warpolicy.runtime.observers`).
* **stand-in** (every device): the same comparison on a platform whose operations are C
  builtins that do nothing (``dict.get``), so ``extra_us`` is the fence's own Python cost per
  step on this CPU, with no device call to hide it.

It uses a fresh plugin manager without entry points so installed observer plugins do not skew
it. On ``device="sim"`` the release part is skipped and the overhead ratios are indicative only
(the raw calls are Python there, not driver calls). The CLI runs it as ``warpolicy bench fence``
(`BENCHMARK`).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from warpolicy.bench.command import Benchmark, Report, device_option, option
from warpolicy.bench.rig import device_name, torch_version
from warpolicy.errors import CudaUnavailableError, InputError
from warpolicy.registry.inputs import positive_int_argument
from warpolicy.registry.vocabulary import WarReadDonePolicy as P
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.graphwalk.cuda import driver_module
from warpolicy.runtime.graphwalk.errors import BindingsMissingError
from warpolicy.runtime.manager import WarpolicyPluginManager, new_plugin_manager, open_platform
from warpolicy.runtime.markers import hookimpl
from warpolicy.runtime.nvtx import NvtxPlugin
from warpolicy.runtime.observers import Reporter
from warpolicy.runtime.platforms import (
    EventHandle,
    Platform,
    StreamHandle,
    cuda_available,
    is_simulated,
)
from warpolicy.runtime.release import BucketRelease

BLOCK = 100  # steps per timed block (fewer when iters is small); medians are over blocks


class _NoOpObserver:
    """The cheapest possible observer: measures the cost of observer dispatch itself."""

    @hookimpl
    def warpolicy_on_publish(
        self, runner: str, step: int, policy: P, event: EventHandle | None
    ) -> None:
        pass

    @hookimpl
    def warpolicy_on_barrier(self, runner: str, step: int | None, kind: str, reason: str) -> None:
        pass


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def _per_step_us(fn: Callable[[], Any], iters: int, sync: Callable[[], Any]) -> list[float]:
    """Host microseconds per call of ``fn``, one sample per block of `BLOCK` calls."""
    block = max(10, min(BLOCK, iters // 10))
    samples = []
    for _ in range(max(1, iters // block)):
        sync()  # drain the GPU queue so a full queue never blocks the host inside a block
        t0 = time.perf_counter_ns()
        for _ in range(block):
            fn()
        samples.append((time.perf_counter_ns() - t0) / 1000.0 / block)
    return samples


# -- overhead ------------------------------------------------------------------------------------


class _StandIn:
    """A platform whose per-step operations are C builtins doing nothing: the fence's own
    Python cost is then all that separates the fence from the raw calls."""

    name = "stand-in"
    device = "cpu"
    external_events_supported = True

    def __init__(self) -> None:
        nothing: dict[Any, Any] = {}
        stream = object()
        self.record = nothing.get  # (event, stream=None): C, no frame
        self.wait_event = nothing.get  # (stream, event)
        self.event_wait = nothing.get  # (event, stream)
        self.wait_stream = nothing.get  # (stream, other)
        self.replay = nothing.get  # (graph)
        self.is_capturing = bool  # () -> False
        self._stream = stream

    def create_event(self, external: bool) -> Any:
        return object()

    def new_stream(self) -> Any:
        return object()

    def current_stream(self) -> Any:
        return self._stream

    def use_stream(self, stream: Any) -> Any:
        return contextlib.nullcontext(stream)

    def new_graph(self, keep_graph: bool) -> Any:
        return object()

    def graph_pool(self) -> Any:
        return object()

    def capture(self, graph: Any, stream: Any, pool: Any) -> Any:
        return contextlib.nullcontext(graph)

    def capture_callable(self, graph: Any, fn: Callable[[], Any], stream: Any, pool: Any) -> None:
        fn()

    def synchronize(self) -> None:
        pass


_Record = Callable[[EventHandle, StreamHandle], None]
_Wait = Callable[[StreamHandle, EventHandle], None]
_EventWait = Callable[[EventHandle, StreamHandle], None]


def _raw_ops(platform: Platform) -> tuple[_Record, _Wait, _EventWait]:
    """(record(event, stream), wait(stream, event), event-first wait(event, stream)) without
    fence or facade: on CUDA torch's own functions, called with no wrapper frame of ours (a
    lambda around them would add a Python call to the baseline and flatter the ratio)."""
    if platform.name == "cuda":
        import torch  # noqa: PLC0415 - deferred: the CUDA part only

        return torch.cuda.Event.record, torch.cuda.Stream.wait_event, torch.cuda.Event.wait
    return platform.record, platform.wait_event, platform.event_wait


def _raw_driver_wait(platform: Platform, stream: Any, event: Any) -> Callable[[], None] | None:
    """On CUDA with cuda-bindings: ``cuStreamWaitEvent`` on ``stream`` and ``event`` with the
    handles wrapped beforehand, from cuda-bindings directly (the oracle for the driver route of
    `warpolicy.runtime.platforms.driver_wait`); else None."""
    if platform.name != "cuda":
        return None
    try:
        driver = driver_module()
    except BindingsMissingError:
        return None
    wait = driver.cuStreamWaitEvent
    cu_stream, cu_event = driver.CUstream(stream.cuda_stream), driver.CUevent(event.cuda_event)

    def raw_driver_wait() -> None:
        wait(cu_stream, cu_event, 0)

    return raw_driver_wait


def _wait_route(platform: Platform) -> str:
    """Which call the barrier's wait makes: torch's ``Event.wait`` or the driver's."""
    if platform.name != "cuda":
        return f"the {platform.name} platform's"
    import torch  # noqa: PLC0415 - deferred: the CUDA part only

    if platform.event_wait is torch.cuda.Event.wait:
        return "torch.cuda.Event.wait"
    return "cuStreamWaitEvent (cuda-bindings)"


def _overhead(
    platform: Platform,
    pm: WarpolicyPluginManager,
    iters: int,
    observers: Sequence[tuple[str, object]] = (),
) -> dict[str, Any]:
    fence = ReadDoneFence(platform, ring_size=4, name="bench", observers=pm.observers)
    planted = fence.prepare()
    fwd = platform.current_stream()
    sched = platform.new_stream()
    barrier = SchedulerBarrier(platform, observers=pm.observers)
    record, wait, event_wait = _raw_ops(platform)
    ring = [platform.create_event() for _ in range(fence.ring_size)]
    sync = platform.synchronize if platform.name == "cuda" else (lambda: None)
    state = {"i": 0}
    releases = {P.POST_REPLAY: BucketRelease("bench", 1, P.POST_REPLAY)}
    if planted is not None:
        releases[P.IN_GRAPH] = BucketRelease("bench", 1, P.IN_GRAPH, planted)

    def hooks_step(policy: P) -> Callable[[], None]:
        release = releases[policy]
        before, after, apply_step = fence.before_replay, fence.after_replay, barrier.apply_step

        def run() -> None:  # the forward stream is passed, as the raw path does
            step = before(release, fwd)  # the owner check, once per step
            after(release, fwd, step)
            apply_step(sched, fwd, fence, step)

        return run

    def raw_post() -> None:
        i = state["i"] = (state["i"] + 1) % len(ring)
        record(ring[i], fwd)
        wait(sched, ring[i])

    def raw_in_graph() -> None:
        wait(sched, planted)

    def raw_event_first() -> None:
        event_wait(planted, sched)

    result: dict[str, Any] = {}
    # (name, the fence's step, its raw calls, the other raw forms it is compared with)
    rows: list[tuple[str, Callable[[], None], Callable[[], None], dict[str, Callable[[], None]]]]
    rows = [("post_replay", hooks_step(P.POST_REPLAY), raw_post, {})]
    if P.IN_GRAPH in releases:
        in_graph_others = {"event_first": raw_event_first}
        raw_driver = _raw_driver_wait(platform, sched, planted)
        if raw_driver is not None:
            in_graph_others["driver_wait"] = raw_driver
        rows.append(("in_graph", hooks_step(P.IN_GRAPH), raw_in_graph, in_graph_others))
    for name, hooked, raw, others in rows:
        for fn in (hooked, raw, *others.values()):  # warm every path (allocations, caches)
            for _ in range(BLOCK):
                fn()
        hooks_s, raw_s, obs_s = [], [], []
        other_s: dict[str, list[float]] = {label: [] for label in others}
        plugin_s: dict[str, list[float]] = {label: [] for label, _ in observers}
        observer = _NoOpObserver()
        for _ in range(3):  # interleave so drift hits all variants alike
            hooks_s += _per_step_us(hooked, iters // 3, sync)
            raw_s += _per_step_us(raw, iters // 3, sync)
            for label, other in others.items():
                other_s[label] += _per_step_us(other, iters // 3, sync)
            obs_s += _observed(pm, observer, hooked, iters // 3, sync)
            for label, plugin in observers:
                plugin_s[label] += _observed(pm, plugin, hooked, iters // 3, sync)
        h, r, o = _median(hooks_s), _median(raw_s), _median(obs_s)
        result[name] = {
            "hooks_us_median": h,
            "raw_us_median": r,
            "ratio": h / r if r else None,
            "with_observer_us_median": o,
            "extra_us": h - r,
            "observer_extra_us": o - h,
            # a real observer plugin, against the no-op observer row
            "plugins": {
                label: {"us_median": _median(xs), "extra_over_noop_us": _median(xs) - o}
                for label, xs in plugin_s.items()
            },
        }
        for label, xs in other_s.items():  # in_graph: the raw event-first wait
            other_us = _median(xs)
            result[name][f"raw_{label}_us_median"] = other_us
            result[name][f"ratio_vs_raw_{label}"] = h / other_us if other_us else None
    sync()
    policy = "in_graph" if "in_graph" in result else "post_replay"
    if policy == "in_graph":  # against what an engine without an in-graph event pays per step
        in_graph, post_raw_us = result["in_graph"], result["post_replay"]["raw_us_median"]
        in_graph["ratio_vs_raw_post_replay"] = (
            in_graph["hooks_us_median"] / post_raw_us if post_raw_us else None
        )
    out = dict(result[policy])
    out["policy"] = policy
    out["wait_route"] = _wait_route(platform)
    out["per_policy"] = result
    return out


def _observed(
    pm: WarpolicyPluginManager,
    plugin: object,
    fn: Callable[[], None],
    iters: int,
    sync: Callable[[], Any],
) -> list[float]:
    """`_per_step_us` of ``fn`` with ``plugin`` registered (the manager refreshes its
    observers on register and unregister)."""
    pm.register(plugin)
    try:
        return _per_step_us(fn, iters, sync)
    finally:
        pm.unregister(plugin)


# -- release (CUDA) --------------------------------------------------------------------------------


def _release(
    platform: Platform,
    fence: ReadDoneFence,
    replays: int,
    spin_cycles: int,
    matmuls: int,
    size: int,
) -> tuple[dict[str, Any], Any]:
    import torch  # noqa: PLC0415 - deferred: the CUDA part only

    dev = platform.device
    shared = torch.randperm(4096, device=dev)
    table = torch.randn(4096, 256, device=dev)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    static: dict[str, Any] = {}
    event = fence.prepare()

    def body() -> None:
        torch.cuda._sleep(spin_cycles)  # long work before the read: the node fires after it
        static["gathered"] = table.index_select(0, shared)
        planted = fence.plant(event)  # None in the eager warm-up (not capturing)
        if planted is not None:
            static["planted"] = planted
        c = a
        for _ in range(matmuls):
            c = a @ a
        static["out"] = c

    body()  # eager warm-up: cuBLAS handles and the allocator, before capture
    platform.synchronize()
    graph = platform.new_graph()
    with platform.capture(graph):
        body()
    platform.synchronize()
    planted = static.get("planted")
    if planted is None:
        return {"skipped": "the node was not planted (no external events)"}, graph
    release = BucketRelease("bench", 1, P.IN_GRAPH, planted)
    release_us, whole_us = [], []
    for i in range(replays + 3):
        platform.synchronize()
        t0 = time.perf_counter_ns()
        step = fence.before_replay(release)
        platform.replay(graph)
        fence.after_replay(release, step=step)
        read_done = fence.take(step)
        if read_done is None:
            return {"skipped": "the in-graph publish failed (see the warning)"}, graph
        read_done.event.synchronize()
        read_done.slot.taken = False  # the host waited on it: no barrier will
        t1 = time.perf_counter_ns()
        platform.synchronize()
        t2 = time.perf_counter_ns()
        if i >= 3:  # the first replays pay instantiation and clock ramp-up
            release_us.append((t1 - t0) / 1000.0)
            whole_us.append((t2 - t0) / 1000.0)
    rel, whole = _median(release_us), _median(whole_us)
    return {
        "release_us_median": rel,
        "whole_replay_us_median": whole,
        "ratio": rel / whole if whole else None,
        "replays": replays,
        "graph": (
            f"spin {spin_cycles} cycles, index_select, node, {matmuls} matmuls {size}x{size} bf16"
        ),
    }, graph


# -- entry points ----------------------------------------------------------------------------------


def run_fence_bench(
    iters: int = 3000,
    device: str | None = None,
    *,
    replays: int = 50,
    spin_cycles: int = 2_000_000,
    matmuls: int = 20,
    size: int = 4096,
    observers: Sequence[tuple[str, object]] = (),
) -> dict[str, Any]:
    """Run the measurements on ``device``: None or ``"cuda[:N]"`` needs CUDA (else
    `CudaUnavailableError`); ``"sim"`` runs the overhead part on the simulated platform.

    ``observers`` are (label, plugin) pairs, e.g. the metrics plugin or `NvtxPlugin`: each is
    timed registered alone, and reported as extra microseconds over the no-op observer row."""
    if iters <= 0 or replays <= 0:
        raise InputError("fence bench: iterations and replays must be positive")
    wanted = "cuda" if device is None else str(device)
    simulated = is_simulated(wanted)
    if not simulated and not cuda_available():
        raise CudaUnavailableError(
            "bench fence needs a CUDA device (torch.cuda.is_available() is "
            "False); --device sim runs it on the simulated platform"
        )
    pm = new_plugin_manager(load_entry_points=False, environ={})
    platform = open_platform(pm, wanted)
    result: dict[str, Any] = {
        "device": str(platform.device),
        "platform": platform.name,
        "iters": iters,
        "external_events": platform.external_events_supported(),
    }
    if platform.name == "cuda":
        result["torch"] = torch_version()
        result["gpu"] = device_name(platform)
        fence = ReadDoneFence(platform, ring_size=4, name="bench")
        result["release"], _graph = _release(platform, fence, replays, spin_cycles, matmuls, size)
    else:
        result["release"] = {"skipped": "needs CUDA"}
    result["overhead"] = _overhead(platform, pm, iters, observers)
    standin_pm = new_plugin_manager(load_entry_points=False, environ={})
    result["standin"] = _overhead(Platform(_StandIn()), standin_pm, iters)
    result["observer_call"] = _observer_call(iters)
    return result


def _observer_call(iters: int) -> dict[str, float]:
    """Per hook call with one no-op observer: pluggy's own ``HookCaller``, and the runtime's
    call (`Reporter`, which calls the implementation directly)."""
    pm = new_plugin_manager(load_entry_points=False, environ={})
    pm.register(_NoOpObserver())
    hook = pm.hook.warpolicy_on_publish
    reporter = Reporter(pm.observers, "bench")

    def pluggy_call() -> None:
        hook(runner="bench", step=1, policy=P.IN_GRAPH, event=None)

    def runtime_call() -> None:
        reporter.publish("bench", 1, P.IN_GRAPH, None)

    pluggy_s: list[float] = []
    runtime_s: list[float] = []
    nothing = lambda: None  # noqa: E731 - the host-only sync of _per_step_us
    for _ in range(3):  # interleaved
        pluggy_s += _per_step_us(pluggy_call, iters // 3, nothing)
        runtime_s += _per_step_us(runtime_call, iters // 3, nothing)
    return {"pluggy_us_median": _median(pluggy_s), "runtime_us_median": _median(runtime_s)}


def format_fence_bench(result: dict[str, Any]) -> str:
    """The result as text (`warpolicy.bench.command.render` gives JSON too)."""
    lines = [
        f"fence benchmark on {result['device']} (platform {result['platform']}, "
        f"external events: {result['external_events']})"
    ]
    rel = result["release"]
    if "skipped" in rel:
        lines.append(f"release: skipped ({rel['skipped']})")
    else:
        lines.append(
            f"release: in-graph event {rel['release_us_median']:.1f} us vs whole replay "
            f"{rel['whole_replay_us_median']:.1f} us after launch: ratio {rel['ratio']:.3f} "
            f"({rel['replays']} replays; {rel['graph']})"
        )
    route = result["overhead"].get("wait_route")
    if route:
        lines.append(f"the barrier's wait: {route}")
    for name, row in result["overhead"]["per_policy"].items():
        lines.append(
            f"overhead per step ({name}): fence+hooks {row['hooks_us_median']:.2f} us, "
            f"raw {row['raw_us_median']:.2f} us, ratio {row['ratio']:.2f}, "
            f"extra {row['extra_us']:.2f} us; with a no-op observer "
            f"{row['with_observer_us_median']:.2f} us (+{row['observer_extra_us']:.2f} us)"
        )
        if row.get("ratio_vs_raw_post_replay") is not None:
            lines.append(
                f"  in_graph (fence) vs a raw post_replay step (record + wait): ratio "
                f"{row['ratio_vs_raw_post_replay']:.2f}"
            )
        if row.get("ratio_vs_raw_event_first") is not None:
            lines.append(
                f"  in_graph (fence) vs the raw event-first wait (event.wait(stream), "
                f"{row['raw_event_first_us_median']:.2f} us): ratio "
                f"{row['ratio_vs_raw_event_first']:.2f}"
            )
        if row.get("ratio_vs_raw_driver_wait") is not None:
            lines.append(
                f"  in_graph (fence) vs the raw driver wait (cuStreamWaitEvent, "
                f"{row['raw_driver_wait_us_median']:.2f} us): ratio "
                f"{row['ratio_vs_raw_driver_wait']:.2f}"
            )
        for label, plugin in row.get("plugins", {}).items():
            lines.append(
                f"  with {label}: {plugin['us_median']:.2f} us per step, "
                f"{plugin['extra_over_noop_us']:+.2f} us over the no-op observer"
            )
    for name, row in result.get("standin", {}).get("per_policy", {}).items():
        lines.append(
            f"fence's own cost per step ({name}, C-builtin stand-in platform): "
            f"{row['extra_us']:.2f} us (fence+hooks {row['hooks_us_median']:.2f} us, raw "
            f"{row['raw_us_median']:.2f} us); no-op observer +{row['observer_extra_us']:.2f} us"
        )
    call = result.get("observer_call")
    if call:
        lines.append(
            f"one no-op observer, per hook call (a step makes two): pluggy's own HookCaller "
            f"{call['pluggy_us_median']:.2f} us, through the runtime "
            f"{call['runtime_us_median']:.2f} us"
        )
    if result["platform"] != "cuda":
        lines.append(
            "(simulated platform: raw = its own methods called directly; ratios are "
            "indicative only)"
        )
    return "\n".join(lines)


# -- the command line ------------------------------------------------------------------------------


def observer_plugins(metrics: bool, nvtx: bool) -> list[tuple[str, object]]:
    """The observer plugins timed besides the no-op one: the warpolicy-metrics plugin (a
    separate distribution: an `InputError` naming it when absent) and the NVTX ranges."""
    observers: list[tuple[str, object]] = []
    if metrics:
        try:  # a separate distribution (plugins/warpolicy-metrics); optional
            import prometheus_client  # noqa: PLC0415 - optional: the metrics plugin's dependency

            import warpolicy_metrics  # noqa: PLC0415 - optional plugin
        except ImportError as exc:
            raise InputError(
                f"bench fence --metrics needs the warpolicy-metrics plugin "
                f"(pip install plugins/warpolicy-metrics): {exc}"
            ) from None
        observers.append(
            ("metrics", warpolicy_metrics.WarpolicyMetrics(prometheus_client.CollectorRegistry()))
        )
    if nvtx:
        observers.append(("nvtx", NvtxPlugin()))
    return observers


def _measure(args: argparse.Namespace) -> Report:
    observers = observer_plugins(args.metrics, args.nvtx)
    result = run_fence_bench(iters=args.iterations, device=args.device, observers=observers)
    return Report(result, format_fence_bench)


#: ``warpolicy bench fence``.
BENCHMARK = Benchmark(
    "fence",
    "in-graph release time and fence host overhead (GPU)",
    (
        option("--iterations", default=3000, type=positive_int_argument),
        device_option("cuda (default) or sim: the overhead part on the simulated platform"),
        option(
            "--metrics",
            default=False,
            action="store_true",
            help="also time a step with the warpolicy-metrics plugin registered",
        ),
        option(
            "--nvtx",
            default=False,
            action="store_true",
            help="also time a step with the NVTX range observer registered",
        ),
    ),
    _measure,
)
