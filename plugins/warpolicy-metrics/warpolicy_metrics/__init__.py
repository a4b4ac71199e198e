"""warpolicy plugin: Prometheus metrics of read-done publishes, barriers, fallbacks, demotions,
canary violations, the release lead and the policy each runner resolved.

Registered through the entry point ``[project.entry-points.warpolicy] metrics =
"warpolicy_metrics"``. It implements only observer hooks, so it never changes a decision or a
barrier, and it serves nothing: the metrics go to the engine's own
``prometheus_client.CollectorRegistry`` (given to `configure`, else prometheus_client's default
registry), or, in prometheus_client's multi-process mode (``PROMETHEUS_MULTIPROC_DIR`` set), to
the per-process files the engine's ``MultiProcessCollector`` reads. `start_http_server` is there
for engines that expose no ``/metrics``.

Series (every one also carries the engine's identity labels given to `configure`, e.g.
``model_name``, ``tp_rank``, ``pp_rank``, ``engine_id``):

* ``warpolicy_read_done_publishes_total{runner, policy}``: steps published per policy;
  ``policy="none"``: nothing was published (the scheduler went coarse).
* ``warpolicy_barriers_total{runner, kind, reason}``: scheduler barriers; ``kind`` ``event`` or
  ``coarse``; ``reason`` the policy for ``event``, else ``forced``, ``no_event`` or
  ``wait_failed``. A coarse barrier with nothing taken is counted for the runner that published
  last on the scheduler's thread (the one that published nothing).
* ``warpolicy_fallbacks_total{runner, component, place}``: runtime failures absorbed by failing
  closed, e.g. ``component="overlap_loop", place="record"`` (`vocabulary.FALLBACK_PLACES`).
* ``warpolicy_demotions_total{runner, bucket, reason}``: buckets demoted at capture
  (`vocabulary.DEMOTION_REASONS`).
* ``warpolicy_violations_total{runner, backend, mode, spec, bucket}``: early releases the WAR
  canary caught (each demotes its cell for the rest of the process).
* ``warpolicy_release_lead_seconds{runner, mode, bucket}`` (histogram): sampled by the runtime,
  how long before the end of the forward the scheduler was released.
* ``warpolicy_resolved_policy{runner, mode, graph, policy}``: one series per policy, 1 for the
  policy the runner resolved at capture and 0 for the others; ``graph`` is ``captured`` or
  ``eager``. Several buckets of one runner: the latest (most conservative) of them.
* ``warpolicy_build_info{version, metrics_version, python, platform}``: always 1; what runs
  (warpolicy's version, this plugin's, the interpreter's) and where (``platform``: the
  machine, e.g. ``linux-x86_64``), to join with the other series or spot a mixed fleet.

Label values are identifiers from fixed vocabularies (`warpolicy_metrics.vocabulary`) or names
the engine chose, made identifier-like; never free text.

Per step, the two per-step hooks cost a dict lookup and an integer add each: the per-step
counts are plain ints that a collector turns into exposition text when scraped (single process)
or that a flusher thread adds to prometheus_client counters every second (multi-process mode;
`warpolicy_metrics.flushing`). Rare events use prometheus_client objects directly. The hooks
fire on the scheduler's thread; one scheduler thread per process is expected.
"""

from __future__ import annotations

import logging
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import pluggy
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server as _prometheus_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

import warpolicy
from warpolicy import environment
from warpolicy_metrics import flushing
from warpolicy_metrics.vocabulary import (
    FALLBACK_PLACES,
    OTHER,
    POLICIES,
    barrier_kind,
    barrier_reason,
    bucket_label,
    demotion_reason,
    fallback_labels,
    ident,
    identity_labels,
    mode_label,
)

__version__ = "0.4.0"

hookimpl = pluggy.HookimplMarker("warpolicy")
log = logging.getLogger("warpolicy")
_Key = TypeVar("_Key")  # a raw per-step count key (publishes and barriers differ)

#: Read no more (0.2 sampled the release lead itself; the runtime samples it now).

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

#: Each metric: (name without ``_total``, help, its own labels).
PUBLISHES = (
    "warpolicy_read_done_publishes",
    "Steps published, by runner and policy (none: nothing published, the scheduler went coarse).",
    ("runner", "policy"),
)
BARRIERS = (
    "warpolicy_barriers",
    "Scheduler barriers by runner, kind (event or coarse) and reason.",
    ("runner", "kind", "reason"),
)
FALLBACKS = (
    "warpolicy_fallbacks",
    "Runtime failures absorbed by failing closed, by runner, component and place.",
    ("runner", "component", "place"),
)
DEMOTIONS = (
    "warpolicy_demotions",
    "Buckets demoted at capture (they publish later, or nothing), by runner, bucket and reason.",
    ("runner", "bucket", "reason"),
)
VIOLATIONS = (
    "warpolicy_violations",
    "Early releases caught by the WAR canary (each demotes its cell to the coarse barrier).",
    ("runner", "backend", "mode", "spec", "bucket"),
)
RELEASE_LEAD = (
    "warpolicy_release_lead_seconds",
    "Sampled: how long before the end of the forward the scheduler was released.",
    ("runner", "mode", "bucket"),
)
BUILD_INFO = (
    "warpolicy_build_info",
    "Always 1: the warpolicy version, this plugin's version, the Python version and the "
    "machine platform of this process.",
    ("version", "metrics_version", "python", "platform"),
)
RESOLVED = (
    "warpolicy_resolved_policy",
    "1 for the policy a runner resolved at capture per mode and graph (the latest of its "
    "buckets), 0 for the other policies.",
    ("runner", "mode", "graph", "policy"),
)

#: Every family the plugin exposes, as scraped (counters with ``_total``).
FAMILIES = (
    "warpolicy_read_done_publishes_total",
    "warpolicy_barriers_total",
    "warpolicy_fallbacks_total",
    "warpolicy_demotions_total",
    "warpolicy_violations_total",
    "warpolicy_release_lead_seconds",
    "warpolicy_resolved_policy",
    "warpolicy_build_info",
)

_ALL_LABELS = frozenset(
    label
    for _, _, labels in (
        PUBLISHES,
        BARRIERS,
        FALLBACKS,
        DEMOTIONS,
        VIOLATIONS,
        RELEASE_LEAD,
        RESOLVED,
        BUILD_INFO,
    )
    for label in labels
) | {"le", "quantile", "pid"}

DEFAULT_FLUSH_INTERVAL = 1.0


class WarpolicyMetrics:
    """The metrics and the observer hooks that update them. Register an instance on a plugin
    manager, or use the module (the entry point), which forwards to `configure`'s instance.

    ``identity``: constant labels naming this engine process (``{"model_name": "llama-8b",
    "tp_rank": 0}``), on every series. ``multiprocess``: None follows prometheus_client
    (``PROMETHEUS_MULTIPROC_DIR`` set); then nothing is registered on ``registry`` (the engine's
    ``MultiProcessCollector`` reads the files) and the per-step counts reach the files every
    ``flush_interval`` seconds, at exit and on `flush`.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        identity: Mapping[str, Any] | None = None,
        multiprocess: bool | None = None,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    ) -> None:
        self.identity = identity_labels(identity, _ALL_LABELS)
        self._id = tuple(self.identity.values())
        self.multiprocess = (
            flushing.multiprocess_from(environment.PROCESS)
            if multiprocess is None
            else bool(multiprocess)
        )
        if not flush_interval > 0:
            raise ValueError(
                f"warpolicy-metrics: flush_interval must be positive, not {flush_interval!r}"
            )
        self.registry = registry if registry is not None else DEFAULT_REGISTRY
        names = tuple(self.identity)
        # per-step counts, labelled at scrape / flush time: per runner, a count per policy
        # (indexed by the policy, an IntEnum: hashing an enum member costs a Python call), the
        # last slot for anything else; per raw (runner, kind, reason), a one-item list
        self._publishes: dict[str, list[int]] = {}
        self._barriers: dict[tuple[str, str, str], list[int]] = {}
        self._last_runner: str | None = None  # the runner that published last
        self._label_cache: dict[Any, tuple[str, ...]] = {}
        self.fallbacks = Counter(*FALLBACKS[:2], names + FALLBACKS[2], registry=None)
        self.demotions = Counter(*DEMOTIONS[:2], names + DEMOTIONS[2], registry=None)
        self.violations = Counter(*VIOLATIONS[:2], names + VIOLATIONS[2], registry=None)
        self.release_lead = Histogram(
            *RELEASE_LEAD[:2], names + RELEASE_LEAD[2], buckets=LEAD_BUCKETS, registry=None
        )
        # "max" across processes: a policy any process of this identity resolved shows as 1
        self.resolved = Gauge(
            *RESOLVED[:2], names + RESOLVED[2], multiprocess_mode="max", registry=None
        )
        self.build_info = Gauge(
            *BUILD_INFO[:2], names + BUILD_INFO[2], multiprocess_mode="max", registry=None
        )
        self.build_info.labels(*self._id, *build_labels()).set(1)
        self._resolved_max: dict[tuple[str, str, str], int] = {}
        self._runners_seen: set[str] = set()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._flushed: dict[tuple[Any, ...], int] = {}
        self._flush_failed = False
        self.flusher: flushing.Flusher | None = None
        self.flush_interval = float(flush_interval)
        self.publishes_counter: Counter | None = None
        self.barriers_counter: Counter | None = None
        if self.multiprocess:
            self.publishes_counter = Counter(*PUBLISHES[:2], names + PUBLISHES[2], registry=None)
            self.barriers_counter = Counter(*BARRIERS[:2], names + BARRIERS[2], registry=None)
            self.flusher = flushing.Flusher(self.flush, self.flush_interval)
            flushing.track(self)
            return
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
        """What is registered on the registry (nothing in multi-process mode)."""
        if self.multiprocess:
            return ()
        return (
            self,
            self.fallbacks,
            self.demotions,
            self.violations,
            self.release_lead,
            self.resolved,
            self.build_info,
        )

    def unregister(self) -> None:
        """Remove these metrics from their registry (before building new ones on it); in
        multi-process mode, flush and stop the flusher."""
        if self.flusher is not None:
            self.flusher.stop()
            self.flusher = None
            flushing.untrack(self)
            self.flush()
        for collector in self.collectors():
            self.registry.unregister(collector)

    # -- labels ----------------------------------------------------------------------------------

    def _publish_labels(self, key: tuple[str, int]) -> tuple[str, ...]:
        labels = self._label_cache.get(key)
        if labels is None:
            runner, index = key
            policy = POLICIES[index] if index < len(POLICIES) else OTHER
            labels = self._label_cache[key] = (*self._id, ident(runner), policy)
        return labels

    def _barrier_labels(self, key: tuple[str, str, str]) -> tuple[str, ...]:
        labels = self._label_cache.get(key)
        if labels is None:
            runner, kind, reason = key
            labels = self._label_cache[key] = (
                *self._id,
                ident(runner),
                barrier_kind(kind),
                barrier_reason(kind, reason),
            )
        return labels

    # -- single process: the collector of the per-step counts ---------------------------------

    def describe(self) -> Iterator[Metric]:
        """The families without samples (so registering does not call `collect`)."""
        names = tuple(self.identity)
        for name, doc, labels in (PUBLISHES, BARRIERS):
            yield CounterMetricFamily(name, doc, labels=names + labels)

    def _publish_counts(self) -> Iterator[tuple[tuple[str, int], int]]:
        """(raw key, count) of every publish count (the scheduler's thread may be adding)."""
        for runner, cells in list(self._publishes.items()):
            for index, count in enumerate(list(cells)):
                if count:
                    yield (runner, index), count

    def _barrier_counts(self) -> Iterator[tuple[tuple[str, str, str], int]]:
        for key, cell in list(self._barriers.items()):
            yield key, cell[0]

    def collect(self) -> Iterator[Metric]:
        yield self._family(PUBLISHES, self._publish_counts(), self._publish_labels)
        yield self._family(BARRIERS, self._barrier_counts(), self._barrier_labels)

    def _family(
        self,
        spec: tuple[str, str, tuple[str, ...]],
        counts: Iterable[tuple[_Key, int]],
        make: Callable[[_Key], tuple[str, ...]],
    ) -> CounterMetricFamily:
        name, doc, labels = spec
        totals: dict[tuple[str, ...], int] = {}
        for key, count in counts:  # two raw keys may make one label set: add them up
            label_values = make(key)
            totals[label_values] = totals.get(label_values, 0) + count
        family = CounterMetricFamily(name, doc, labels=tuple(self.identity) + labels)
        for label_values, count in totals.items():
            family.add_metric(list(label_values), count)
        return family

    # -- multi-process: flushing the per-step counts into the files ---------------------------

    def flush(self) -> None:
        """Add the per-step counts gained since the last flush to the prometheus_client counters
        (multi-process mode: they write the files the engine's collector reads). Never raises:
        a failure is logged once and retried at the next flush."""
        publishes, barriers = self.publishes_counter, self.barriers_counter
        if publishes is None or barriers is None:
            return
        with self._flush_lock:
            try:
                self._flush_counts(publishes, self._publish_counts(), self._publish_labels)
                self._flush_counts(barriers, self._barrier_counts(), self._barrier_labels)
            except Exception as exc:  # noqa: BLE001 - metrics never stop the engine
                if not self._flush_failed:
                    self._flush_failed = True
                    log.warning(
                        "warpolicy-metrics: writing the multi-process metrics failed "
                        "(%s: %s); retrying at every flush",
                        type(exc).__name__,
                        exc,
                    )

    def _flush_counts(
        self, counter: Counter, counts: Iterable[tuple[Any, int]], make: Callable[[Any], Any]
    ) -> None:
        for key, count in counts:
            done = self._flushed.get(key, 0)
            if count != done:
                counter.labels(*make(key)).inc(count - done)
                self._flushed[key] = count

    def forget_in_child(self) -> None:
        """In a forked child: the parent flushes what it counted, the child only its own steps;
        fresh locks (a parent's thread may have held them) and a flusher thread of its own."""
        self._flush_lock = threading.Lock()
        self._lock = threading.Lock()
        self._flushed = dict(self._publish_counts())
        self._flushed.update(self._barrier_counts())
        if self.flusher is not None:
            self.flusher = flushing.Flusher(self.flush, self.flush_interval)

    # -- observer hooks ------------------------------------------------------------------------

    @hookimpl
    def warpolicy_on_publish(self, runner: str, step: int, policy: Any, event: Any) -> None:
        self._last_runner = runner
        cells = self._publishes.get(runner)
        if cells is None:
            cells = self._publishes.setdefault(runner, [0] * (len(POLICIES) + 1))
        try:
            cells[policy] += 1
        except (TypeError, IndexError):  # not a WarReadDonePolicy: counted as policy="other"
            cells[-1] += 1

    @hookimpl
    def warpolicy_on_barrier(self, runner: str, step: int | None, kind: str, reason: str) -> None:
        if step is None:  # nothing was taken: the barrier's own name; count it for the runner
            runner = self._last_runner or runner  # that just published nothing
        cell = self._barriers.get((runner, kind, reason))
        if cell is None:
            cell = self._barriers.setdefault((runner, kind, reason), [0])
        cell[0] += 1

    @hookimpl
    def warpolicy_on_fallback(self, where: str, error: BaseException) -> None:
        runner, component, place = fallback_labels(where)
        if component == "barrier" and self._last_runner is not None:
            runner = ident(self._last_runner)  # the scheduler's barrier: the step's runner
        self.fallbacks.labels(*self._id, runner, component, place).inc()

    @hookimpl
    def warpolicy_on_demotion(self, runner: str, bucket: int, reason: str) -> None:
        self.demotions.labels(
            *self._id, ident(runner), bucket_label(bucket), demotion_reason(reason)
        ).inc()

    @hookimpl
    def warpolicy_on_violation(
        self, runner: str, backend: str, mode: Any, spec: str, bucket: int | None
    ) -> None:
        self.violations.labels(
            *self._id,
            ident(runner),
            ident(backend) if backend else "",
            mode_label(mode),
            ident(spec) if spec else "",
            bucket_label(bucket),
        ).inc()

    @hookimpl
    def warpolicy_on_release_lead(
        self, runner: str, mode: Any, bucket: int | None, lead_us: float
    ) -> None:
        self.release_lead.labels(
            *self._id, ident(runner), mode_label(mode), bucket_label(bucket)
        ).observe(max(0.0, float(lead_us)) / 1e6)

    @hookimpl
    def warpolicy_on_decision(self, decision: Any, where: str) -> None:
        context = getattr(decision, "context", None)
        if context is None:  # a bare policy: nothing says which mode
            return
        policy = int(getattr(decision, "policy", decision))
        runner = ident(where.split(":", 1)[1] if where.startswith("runner:") else where)
        mode = mode_label(context.mode)
        key = (runner, mode, "eager" if getattr(context, "eager", False) else "captured")
        with self._lock:  # capture time only
            value = max(policy, self._resolved_max.get(key, policy))
            self._resolved_max[key] = value
            first = runner not in self._runners_seen
            self._runners_seen.add(runner)
        for index, label in enumerate(POLICIES):
            self.resolved.labels(*self._id, *key, label).set(1 if index == value else 0)
        if first:
            self._zero_fallbacks(runner)

    def _zero_fallbacks(self, runner: str) -> None:
        """Every fallback series of a runner (the canary's aside), at 0 from its first capture,
        so that ``increase(warpolicy_fallbacks_total[10m]) > 0`` sees the first fallback too."""
        for component, places in FALLBACK_PLACES.items():
            if component == "canary":  # only where a canary runs: at its first count
                continue
            for place in sorted(places):
                self.fallbacks.labels(*self._id, runner, component, place)


def build_labels() -> tuple[str, str, str, str]:
    """`BUILD_INFO`'s values: warpolicy's version, this plugin's, Python's, the machine."""
    python = ".".join(str(part) for part in sys.version_info[:3])
    return (
        ident(warpolicy.__version__),
        ident(__version__),
        ident(python),
        ident(sysconfig.get_platform()),
    )


# -- the module as a plugin (entry point) ----------------------------------------------------------

_ACTIVE: WarpolicyMetrics | None = None
_CONFIG_LOCK = threading.Lock()


def configure(
    registry: CollectorRegistry | None = None,
    *,
    identity: Mapping[str, Any] | None = None,
    multiprocess: bool | None = None,
    flush_interval: float = DEFAULT_FLUSH_INTERVAL,
) -> WarpolicyMetrics:
    """Put the entry-point plugin's metrics on ``registry`` (None: prometheus_client's default),
    labelled with the engine's ``identity`` (e.g. ``{"model_name": ..., "tp_rank": 0}``).

    Call it before the runners capture; metrics already made move (their counts start over in
    a single process; in multi-process mode the files keep them). Raises ValueError for an
    identity label that is not a label name or whose value is not identifier-like.
    """
    with _CONFIG_LOCK:
        return _configure_locked(registry, identity, multiprocess, flush_interval)


def _configure_locked(
    registry: CollectorRegistry | None,
    identity: Mapping[str, Any] | None,
    multiprocess: bool | None,
    flush_interval: float,
) -> WarpolicyMetrics:
    global _ACTIVE
    if environment.METRICS_SAMPLE_EVERY.is_set():
        log.warning(
            "warpolicy-metrics: %s is no longer read; the release lead comes from the runtime's "
            "sampling (warpolicy_on_release_lead)",
            environment.METRICS_SAMPLE_EVERY.name,
        )
    identity_labels(identity, _ALL_LABELS)  # a bad identity leaves the active metrics alone
    if _ACTIVE is not None:
        _ACTIVE.unregister()
        _ACTIVE = None
    _ACTIVE = WarpolicyMetrics(
        registry, identity=identity, multiprocess=multiprocess, flush_interval=flush_interval
    )
    return _ACTIVE


def metrics() -> WarpolicyMetrics:
    """The entry-point plugin's metrics (made on the default registry on first use)."""
    active = _ACTIVE
    if active is not None:
        return active
    with _CONFIG_LOCK:
        if _ACTIVE is not None:
            return _ACTIVE
        return _configure_locked(None, None, None, DEFAULT_FLUSH_INTERVAL)


def reset() -> None:
    """Drop the entry-point plugin's metrics from their registry (tests, reconfiguration)."""
    global _ACTIVE
    with _CONFIG_LOCK:
        if _ACTIVE is not None:
            _ACTIVE.unregister()
            _ACTIVE = None


def start_http_server(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve the metrics on ``addr:port`` (for engines that serve no ``/metrics``): the
    registry given to `configure`, or in multi-process mode every process's files through a
    ``MultiProcessCollector``."""
    active = metrics()
    if active.multiprocess:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return _prometheus_http_server(port, addr=addr, registry=registry)
    return _prometheus_http_server(port, addr=addr, registry=active.registry)


@hookimpl
def warpolicy_on_publish(runner: str, step: int, policy: Any, event: Any) -> None:
    (_ACTIVE or metrics()).warpolicy_on_publish(runner, step, policy, event)


@hookimpl
def warpolicy_on_barrier(runner: str, step: int | None, kind: str, reason: str) -> None:
    (_ACTIVE or metrics()).warpolicy_on_barrier(runner, step, kind, reason)


@hookimpl
def warpolicy_on_fallback(where: str, error: BaseException) -> None:
    (_ACTIVE or metrics()).warpolicy_on_fallback(where, error)


@hookimpl
def warpolicy_on_demotion(runner: str, bucket: int, reason: str) -> None:
    (_ACTIVE or metrics()).warpolicy_on_demotion(runner, bucket, reason)


@hookimpl
def warpolicy_on_violation(
    runner: str, backend: str, mode: Any, spec: str, bucket: int | None
) -> None:
    (_ACTIVE or metrics()).warpolicy_on_violation(runner, backend, mode, spec, bucket)


@hookimpl
def warpolicy_on_release_lead(runner: str, mode: Any, bucket: int | None, lead_us: float) -> None:
    (_ACTIVE or metrics()).warpolicy_on_release_lead(runner, mode, bucket, lead_us)


@hookimpl
def warpolicy_on_decision(decision: Any, where: str) -> None:
    (_ACTIVE or metrics()).warpolicy_on_decision(decision, where)
