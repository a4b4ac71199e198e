"""CPU micro-benchmark: what one observer hook call costs with the metrics plugin, against a
no-op observer, measured side by side (interleaved blocks, medians) in one process.

Run: ``PYTHONPATH=.:plugins/warpolicy-metrics python -m warpolicy_metrics.bench``. The GPU
figure, fence and hooks included, is ``warpolicy bench fence``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from prometheus_client import CollectorRegistry

from warpolicy.registry.vocabulary import IN_GRAPH
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.manager import new_plugin_manager
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
    """Median ns per ``warpolicy_on_publish`` and per ``warpolicy_on_barrier`` call through the
    plugin manager, with a no-op observer and with the metrics plugin; prints them side by side
    unless ``show`` is False. ``step`` = one publish + one barrier, the per-step hook work."""
    managers = {}
    for name, observer in (
        ("noop", NoOpObserver()),
        ("metrics", WarpolicyMetrics(CollectorRegistry())),
    ):
        pm = new_plugin_manager(load_entry_points=False, environ={})
        pm.register(observer, name=f"bench-{name}")
        managers[name] = pm.hook

    def publish(hook: Any) -> Callable[[int], None]:
        return lambda i: hook.warpolicy_on_publish(
            runner="decode", step=i, policy=IN_GRAPH, event=None
        )

    def barrier(hook: Any) -> Callable[[int], None]:
        return lambda i: hook.warpolicy_on_barrier(
            runner="decode", step=i, kind="event", reason="in_graph"
        )

    samples: dict[str, list[float]] = {
        f"{h}_{n}": [] for h in ("publish", "barrier") for n in managers
    }
    for fn in (publish, barrier):  # warm-up: label children, caches
        for hook in managers.values():
            _ns_per_call(fn(hook), 1000)
    for _ in range(rounds):  # interleaved, so drift hits both variants alike
        for name, hook in managers.items():
            samples[f"publish_{name}"].append(_ns_per_call(publish(hook), calls))
            samples[f"barrier_{name}"].append(_ns_per_call(barrier(hook), calls))
    result = {key: float(statistics.median(xs)) for key, xs in samples.items()}
    for name in managers:
        result[f"step_{name}"] = result[f"publish_{name}"] + result[f"barrier_{name}"]
    result["step_extra"] = result["step_metrics"] - result["step_noop"]
    if show:
        print(format_cost(result))
    return result


def format_cost(result: dict[str, float]) -> str:
    lines = [f"{'hook call':<10} {'no-op observer':>15} {'metrics plugin':>15} {'ratio':>6}"]
    for what in ("publish", "barrier", "step"):
        noop, met = result[f"{what}_noop"], result[f"{what}_metrics"]
        lines.append(f"{what:<10} {noop:>12.0f} ns {met:>12.0f} ns {met / noop:>6.2f}")
    lines.append(
        f"metrics cost per step (publish + barrier) over a no-op observer: "
        f"{result['step_extra']:.0f} ns"
    )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    per_call_cost()
