"""warpolicy plugin: Prometheus metrics of read-done publishes, barriers, fallbacks and policies.

Registered through the entry point ``[project.entry-points.warpolicy] metrics =
"warpolicy_metrics"``. It implements only observer hooks, so it never changes a decision or a
barrier, and it serves nothing: the metrics live in a `prometheus_client.CollectorRegistry`
(the engine's own, given to `configure`, else prometheus_client's default registry) that the
engine already exposes on its ``/metrics``. `start_http_server` is there for engines that
expose none.

Metrics (label values are the runner/fence names, policy labels and barrier reasons):

* ``warpolicy_read_done_publishes_total{runner, policy}``: steps published per policy;
  ``policy="none"`` counts steps that published nothing (the scheduler went coarse).
* ``warpolicy_barriers_total{runner, kind, reason}``: scheduler barriers; ``kind`` is
  ``event`` or ``coarse``; ``reason`` the policy label for ``event``, else why it was coarse
  (``forced``, ``no read-done event``, ``hook failed``).
* ``warpolicy_fallbacks_total{where}``: runtime failures absorbed by failing closed.
* ``warpolicy_resolved_policy{runner, mode, graph}``: the policy a runner resolved at capture,
  as a number (0 pre_replay, 1 in_graph, 2 post_replay, 3 none); ``graph`` is ``captured`` or
  ``eager``. Several buckets of one runner: the latest (most conservative) of them.
* ``warpolicy_release_lead_seconds{runner}`` (histogram, off by default): sampled every N steps
  (``WARPOLICY_METRICS_SAMPLE_EVERY=N`` or ``configure(sample_every=N)``), how long before the
  end of the forward the scheduler was released, timed with CUDA events. Platforms whose events
  have no ``elapsed_time`` turn the sampling off (one log line).

Per step with sampling off, the hooks cost a dict lookup and an integer add each: the two
per-step counters are plain ints in dict cells that a custom collector turns into exposition
text when scraped (a ``prometheus_client.Counter`` child's ``inc`` costs several times more).
The hooks fire on the scheduler's thread; one runner name is expected to publish from one thread.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol

import pluggy
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server as _prometheus_http_server
from prometheus_client.core import CounterMetricFamily, Metric

__version__ = "0.2.0"

hookimpl = pluggy.HookimplMarker("warpolicy")
log = logging.getLogger("warpolicy")

SAMPLE_ENV = "WARPOLICY_METRICS_SAMPLE_EVERY"

#: Histogram buckets of the release lead: 1 us .. 50 ms (a decode forward is 1-50 ms).
LEAD_BUCKETS = (
    1e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
)


def _label(value: Any) -> str:
    """A policy's lowercase label, or its str."""
    return str(getattr(value, "label", value))


def sample_every_from(environ: Mapping[str, str]) -> int:
    """``WARPOLICY_METRICS_SAMPLE_EVERY`` as a step count; 0 (off) when unset or invalid."""
    raw = environ.get(SAMPLE_ENV, "").strip()
    if not raw:
        return 0
    try:
        every = int(raw)
    except ValueError:
        every = -1
    if every < 0:
        log.warning(
            "warpolicy-metrics: %s=%r is not a step count; release sampling is off", SAMPLE_ENV, raw
        )
        return 0
    return every


# -- release timing --------------------------------------------------------------------------------


class ReleaseTiming(Protocol):
    """Times one sample at a time: ``begin`` enqueues it, ``ready`` polls without blocking,
    ``lead_seconds`` reads it once ready."""

    def supports(self, event: Any) -> bool: ...

    def begin(self, read_done_event: Any) -> None: ...

    def ready(self) -> bool: ...

    def lead_seconds(self) -> float: ...


class CudaReleaseTiming:
    """Two timing events of its own: ``end`` on the forward stream right after the replay is
    enqueued (where ``warpolicy_on_publish`` fires), and ``released`` on an idle side stream
    that waits on the published read-done event. The published events themselves are neither
    timing-enabled nor ours to keep (the planted one is re-recorded every replay, ring events
    every few steps); a wait captures the record current at enqueue time, so later re-records
    do not move this sample."""

    def __init__(self) -> None:
        # torch only here: the plugin imports without torch, and only sampling needs it
        import torch  # noqa: PLC0415 - deferred: only release sampling needs torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        self._torch = torch
        self._side = torch.cuda.Stream()
        self._released = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def supports(self, event: Any) -> bool:
        return isinstance(event, self._torch.cuda.Event)

    def begin(self, read_done_event: Any) -> None:
        self._end.record()  # the current stream: the forward stream, the replay just enqueued
        self._side.wait_event(read_done_event)
        self._released.record(self._side)

    def ready(self) -> bool:
        return bool(self._end.query() and self._released.query())

    def lead_seconds(self) -> float:
        # a post_replay release can land a few us after our own end record: that is 0 lead
        return max(0.0, self._released.elapsed_time(self._end) / 1000.0)


def cuda_release_timing() -> Optional[ReleaseTiming]:
    """CUDA event timing, or None (one log line) where there is no CUDA torch."""
    try:
        return CudaReleaseTiming()
    except Exception as exc:  # noqa: BLE001 - no torch, no CUDA, no device: sampling is off
        log.warning("warpolicy-metrics: release sampling is off (%s: %s)", type(exc).__name__, exc)
        return None


# -- the metrics -----------------------------------------------------------------------------------

PUBLISHES = (
    "warpolicy_read_done_publishes",
    ("Steps published, by runner and policy (none: nothing published, the scheduler went coarse)."),
    ("runner", "policy"),
)
BARRIERS = (
    "warpolicy_barriers",
    "Scheduler barriers by runner, kind (event or coarse) and reason.",
    ("runner", "kind", "reason"),
)


class WarpolicyMetrics:
    """The metrics and the observer hooks that update them. Register an instance on a plugin
    manager, or use the module (the entry point), which forwards to `configure`'s instance.

    It is itself the collector of the two per-step counters (``collect``/``describe``).
    """

    def __init__(
        self,
        registry: Optional[CollectorRegistry] = None,
        *,
        sample_every: int = 0,
        timing: Optional[Callable[[], Optional[ReleaseTiming]]] = None,
    ) -> None:
        self.registry = registry if registry is not None else DEFAULT_REGISTRY
        # per-step counters: key -> [count]; read by collect() at scrape time
        self._publishes: dict[tuple[str, Any], list[int]] = {}
        self._barriers: dict[tuple[str, str, str], list[int]] = {}
        self.fallbacks = Counter(
            "warpolicy_fallbacks",
            "Runtime failures absorbed by failing closed (coarse barrier), by place.",
            ["where"],
            registry=None,
        )
        self.resolved = Gauge(
            "warpolicy_resolved_policy",
            "Policy a runner resolved per mode "
            "(0 pre_replay, 1 in_graph, 2 post_replay, 3 none); the latest of "
            "its buckets.",
            ["runner", "mode", "graph"],
            registry=None,
        )
        self.release_lead = Histogram(
            "warpolicy_release_lead_seconds",
            "Sampled: how long before the end of the forward the scheduler was released.",
            ["runner"],
            buckets=LEAD_BUCKETS,
            registry=None,
        )
        self._resolved_max: dict[tuple[str, str, str], int] = {}
        self.sample_every = max(0, int(sample_every))
        self._timing_factory = timing if timing is not None else cuda_release_timing
        self._timing: Optional[ReleaseTiming] = None
        self._pending: Optional[str] = None  # runner of the sample in flight
        self._lock = threading.Lock()
        registered: list[Any] = []
        try:  # all or nothing: a name clash leaves the registry as it was
            for collector in self.collectors():
                self.registry.register(collector)
                registered.append(collector)
        except ValueError:
            for collector in registered:
                self.registry.unregister(collector)
            raise

    def collectors(self) -> tuple[Any, ...]:
        return (self, self.fallbacks, self.resolved, self.release_lead)

    def unregister(self) -> None:
        """Remove these metrics from their registry (before building new ones on it)."""
        for collector in self.collectors():
            self.registry.unregister(collector)

    # -- collector of the per-step counters ----------------------------------------------------

    def describe(self) -> Iterator[Metric]:
        """The families without samples (so registering does not call `collect`)."""
        for name, doc, labels in (PUBLISHES, BARRIERS):
            yield CounterMetricFamily(name, doc, labels=labels)

    def collect(self) -> Iterator[Metric]:
        publishes = CounterMetricFamily(*PUBLISHES[:2], labels=PUBLISHES[2])
        for (runner, policy), cell in list(self._publishes.items()):
            publishes.add_metric([runner, _label(policy)], cell[0])
        yield publishes
        barriers = CounterMetricFamily(*BARRIERS[:2], labels=BARRIERS[2])
        for (runner, kind, reason), cell in list(self._barriers.items()):
            barriers.add_metric([runner, kind, reason], cell[0])
        yield barriers

    # -- observer hooks ------------------------------------------------------------------------

    @hookimpl
    def warpolicy_on_publish(self, runner: str, step: int, policy: Any, event: Any) -> None:
        cell = self._publishes.get((runner, policy))
        if cell is None:
            cell = self._publishes.setdefault((runner, policy), [0])
        cell[0] += 1
        if self.sample_every and step % self.sample_every == 0:
            self._sample(runner, event)

    @hookimpl
    def warpolicy_on_barrier(
        self, runner: str, step: Optional[int], kind: str, reason: str
    ) -> None:
        cell = self._barriers.get((runner, kind, reason))
        if cell is None:
            cell = self._barriers.setdefault((runner, kind, reason), [0])
        cell[0] += 1

    @hookimpl
    def warpolicy_on_fallback(self, where: str, error: BaseException) -> None:
        self.fallbacks.labels(where).inc()  # rare: a prometheus_client counter is fine

    @hookimpl
    def warpolicy_on_decision(self, decision: Any, where: str) -> None:
        context = getattr(decision, "context", None)
        if context is None:  # a bare policy: nothing says which mode
            return
        policy = int(getattr(decision, "policy", decision))
        runner = where.split(":", 1)[1] if where.startswith("runner:") else where
        mode = str(getattr(context.mode, "value", context.mode))
        key = (runner, mode, "eager" if getattr(context, "eager", False) else "captured")
        with self._lock:  # capture time only
            value = max(policy, self._resolved_max.get(key, policy))
            self._resolved_max[key] = value
        self.resolved.labels(*key).set(value)

    # -- release sampling ----------------------------------------------------------------------

    def _sample(self, runner: str, event: Any) -> None:
        """Finish the sample in flight if it is ready, then start one on ``event``. Never blocks;
        any failure turns sampling off (an observer must not raise)."""
        try:
            with self._lock:
                timing = self._timing
                if timing is None:
                    timing = self._timing = self._timing_factory()
                    if timing is None:
                        self.sample_every = 0
                        return
                if self._pending is not None:
                    if not timing.ready():
                        return  # the last sample is still in flight: skip this one
                    self.release_lead.labels(self._pending).observe(timing.lead_seconds())
                    self._pending = None
                if event is None:
                    return
                if not timing.supports(event):
                    log.warning(
                        "warpolicy-metrics: release sampling is off (%s has no GPU timing)",
                        type(event).__name__,
                    )
                    self.sample_every = 0
                    return
                timing.begin(event)
                self._pending = runner
        except Exception as exc:  # noqa: BLE001 - metrics never change a step; stop sampling
            log.warning(
                "warpolicy-metrics: release sampling is off (%s: %s)", type(exc).__name__, exc
            )
            self.sample_every = 0


# -- the module as a plugin (entry point) ----------------------------------------------------------

_ACTIVE: Optional[WarpolicyMetrics] = None
_CONFIG_LOCK = threading.Lock()


def configure(
    registry: Optional[CollectorRegistry] = None,
    *,
    sample_every: Optional[int] = None,
    timing: Optional[Callable[[], Optional[ReleaseTiming]]] = None,
) -> WarpolicyMetrics:
    """Put the entry-point plugin's metrics on ``registry`` (None: prometheus_client's default).

    Call it before the runners capture; metrics already made move (their counts start over).
    ``sample_every`` None reads ``WARPOLICY_METRICS_SAMPLE_EVERY`` (unset: off).
    """
    with _CONFIG_LOCK:
        return _configure_locked(registry, sample_every, timing)


def _configure_locked(
    registry: Optional[CollectorRegistry],
    sample_every: Optional[int],
    timing: Optional[Callable[[], Optional[ReleaseTiming]]],
) -> WarpolicyMetrics:
    global _ACTIVE
    every = sample_every_from(os.environ) if sample_every is None else sample_every
    if _ACTIVE is not None:
        _ACTIVE.unregister()
        _ACTIVE = None
    _ACTIVE = WarpolicyMetrics(registry, sample_every=every, timing=timing)
    return _ACTIVE


def metrics() -> WarpolicyMetrics:
    """The entry-point plugin's metrics (made on the default registry on first use)."""
    active = _ACTIVE
    if active is not None:
        return active
    with _CONFIG_LOCK:
        return _ACTIVE if _ACTIVE is not None else _configure_locked(None, None, None)


def reset() -> None:
    """Drop the entry-point plugin's metrics from their registry (tests, reconfiguration)."""
    global _ACTIVE
    with _CONFIG_LOCK:
        if _ACTIVE is not None:
            _ACTIVE.unregister()
            _ACTIVE = None


def start_http_server(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve the metrics' registry on ``addr:port`` (for engines that serve no ``/metrics``)."""
    return _prometheus_http_server(port, addr=addr, registry=metrics().registry)


@hookimpl
def warpolicy_on_publish(runner: str, step: int, policy: Any, event: Any) -> None:
    (_ACTIVE or metrics()).warpolicy_on_publish(runner, step, policy, event)


@hookimpl
def warpolicy_on_barrier(runner: str, step: Optional[int], kind: str, reason: str) -> None:
    (_ACTIVE or metrics()).warpolicy_on_barrier(runner, step, kind, reason)


@hookimpl
def warpolicy_on_fallback(where: str, error: BaseException) -> None:
    (_ACTIVE or metrics()).warpolicy_on_fallback(where, error)


@hookimpl
def warpolicy_on_decision(decision: Any, where: str) -> None:
    (_ACTIVE or metrics()).warpolicy_on_decision(decision, where)
