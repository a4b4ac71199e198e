"""CPU micro-benchmark: what one observer hook call costs with the metrics plugin, against a
no-op observer, measured side by side (interleaved blocks, medians) in one process, called as the
runtime calls observers (`warpolicy.runtime.observers.Reporter`); and what one flush of the
per-step counts costs in multi-process mode (done by a thread, once a second).

Run: ``PYTHONPATH=.:plugins/warpolicy-metrics python -m warpolicy_metrics.bench``; with
``PROMETHEUS_MULTIPROC_DIR=$(mktemp -d)`` the flush writes prometheus_client's files, as in an
engine. The GPU figure, fence and hooks included, is ``warpolicy bench fence --metrics``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from warpolicy.registry.vocabulary import IN_GRAPH
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.observers import Reporter
from warpolicy_metrics import WarpolicyMetrics


class NoOpObserver:
    """The cheapest observer: the cost of pluggy's dispatch itself."""

    @hookimpl
    def warpolicy_on_publish(self, runner: str, step: int, policy: Any, event: Any) -> None:
        pass

    @hookimpl
    def warpolicy_on_barrier(self, runner: str, step: Any, kind: str, reason: str) -> None:
        pass


def _ns_per_call(fn: Callable[[int], None], calls: int) -> float:
    t0 = time.perf_counter_ns()
    for i in range(calls):
        fn(i)
    return (time.perf_counter_ns() - t0) / calls


def per_call_cost(calls: int = 20_000, rounds: int = 7, *, show: bool = True) -> dict[str, float]:
    """Median ns per ``warpolicy_on_publish`` and per ``warpolicy_on_barrier`` call as the
    runtime makes them (a `Reporter` on the manager's observers), with a no-op observer, with
    the metrics plugin and with the metrics plugin in multi-process mode; and ``flush_us``, one
    flush of 16 runners' counts. Prints them unless ``show`` is False. ``step`` = one publish +
    one barrier, the per-step hook work."""
    multiprocess = WarpolicyMetrics(CollectorRegistry(), multiprocess=True, flush_interval=3600)
    reporters = {}
    try:
        for name, observer in (
            ("noop", NoOpObserver()),
            ("metrics", WarpolicyMetrics(CollectorRegistry(), multiprocess=False)),
            ("multiprocess", multiprocess),
        ):
            pm = new_plugin_manager(load_entry_points=False, environ={})
            pm.register(observer, name=f"bench-{name}")
            reporters[name] = Reporter(pm.observers, "bench")
        result = _hook_costs(reporters, calls, rounds)
        result["flush_us"] = _flush_cost(multiprocess, rounds)
    finally:
        multiprocess.unregister()
    if show:
        print(format_cost(result))
    return result


def _hook_costs(reporters: dict[str, Reporter], calls: int, rounds: int) -> dict[str, float]:
    def publish(reporter: Reporter) -> Callable[[int], None]:
        return lambda i: reporter.publish("decode", i, IN_GRAPH, None)

    def barrier(reporter: Reporter) -> Callable[[int], None]:
        return lambda i: reporter.barrier("decode", i, "event", "in_graph")

    samples: dict[str, list[float]] = {
        f"{h}_{n}": [] for h in ("publish", "barrier") for n in reporters
    }
    for fn in (publish, barrier):  # warm-up: label cells, caches
        for reporter in reporters.values():
            _ns_per_call(fn(reporter), 1000)
    for _ in range(rounds):  # interleaved, so drift hits every variant alike
        for name, reporter in reporters.items():
            samples[f"publish_{name}"].append(_ns_per_call(publish(reporter), calls))
            samples[f"barrier_{name}"].append(_ns_per_call(barrier(reporter), calls))
    result = {key: float(statistics.median(xs)) for key, xs in samples.items()}
    for name in reporters:
        result[f"step_{name}"] = result[f"publish_{name}"] + result[f"barrier_{name}"]
    result["step_extra"] = result["step_metrics"] - result["step_noop"]
    result["step_extra_multiprocess"] = result["step_multiprocess"] - result["step_noop"]
    return result


def _flush_cost(metrics: WarpolicyMetrics, rounds: int) -> float:
    """Median microseconds of one flush after every one of 16 runners published and barriered
    (32 counts changed: the worst case of a busy second)."""
    times = []
    for r in range(max(3, rounds)):
        for i in range(16):
            metrics.warpolicy_on_publish(runner=f"r{i}", step=r, policy=IN_GRAPH, event=None)
            metrics.warpolicy_on_barrier(runner=f"r{i}", step=r, kind="event", reason="in_graph")
        t0 = time.perf_counter_ns()
        metrics.flush()
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    return float(statistics.median(times[1:]))  # the first flush creates the label children


def format_cost(result: dict[str, float]) -> str:
    head = f"{'hook call':<10} {'no-op observer':>15} {'metrics plugin':>15} {'ratio':>6}"
    lines = [head + f" {'multi-process':>15}"]
    for what in ("publish", "barrier", "step"):
        noop, met, mp = (result[f"{what}_{n}"] for n in ("noop", "metrics", "multiprocess"))
        lines.append(
            f"{what:<10} {noop:>12.0f} ns {met:>12.0f} ns {met / noop:>6.2f} {mp:>12.0f} ns"
        )
    lines.append(
        f"metrics cost per step (publish + barrier) over a no-op observer: "
        f"{result['step_extra']:.0f} ns (multi-process mode: "
        f"{result['step_extra_multiprocess']:.0f} ns)"
    )
    lines.append(
        f"multi-process mode: one flush of 32 changed counts {result['flush_us']:.1f} us, "
        "by the flusher thread once a second"
    )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    per_call_cost()
