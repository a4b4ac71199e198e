"""Shared CUDA-graph runner logic: buckets, warm-up, capture with the planted node, padding,
eager fallback, and publishing the read-done event per policy.

An engine wraps its forward in a runner by supplying a `ModelAdapter` (duck-typed). The runner
owns the `ReadDoneFence`; the scheduler takes from ``runner.fence`` right after each launch
(see `warpolicy.runners.overlap.OverlapLoop`).

Per step (DESIGN.md §5), on the current (forward) stream::

    host_prep(batch, bucket)       copy inputs into the bucket's static buffers, pad
    fence.before_replay(policy)    PRE_REPLAY records here: the host-side snapshot point
    replay(graph)                  graph = graph_prep -> planted node -> forward
    fence.after_replay(policy, planted=bucket.event)
                                   IN_GRAPH hands out the event this bucket's graph records,
                                   POST_REPLAY records

The policy of each bucket is resolved once, at capture time, from ``policy(mode, eager,
planted)`` with what the capture really did (was the node planted?), and the bucket keeps the
event its own graph records: a publish never hands out another graph's event. A batch that fits no
bucket runs eagerly with the eager policy (``eager=True, planted=False``), so a declared
``IN_GRAPH`` is soundly demoted to ``POST_REPLAY`` there.

With ``process_group=`` (tensor parallelism) the runner compares its policy across the group's
ranks before its first capture (`warpolicy.distributed.consistent_policy`); on any difference
every rank runs every cell coarse, or raises with ``consistency_strict=True``.
"""

from __future__ import annotations

import bisect
import warnings
from typing import Any, Callable, ClassVar, Mapping, Optional, Protocol, Sequence, Union

import attrs

from warpolicy.distributed import ConsistencyResult, consistent_policy
from warpolicy.engine import Context, Decision, Reason
from warpolicy.errors import InputError
from warpolicy.fence import ReadDoneFence
from warpolicy.platform import Platform
from warpolicy.platforms import EventHandle, GraphHandle, PoolHandle, StreamHandle
from warpolicy.plugins import observers_of
from warpolicy.policy import IN_GRAPH, NONE, POST_REPLAY, ForwardMode, WarReadDonePolicy

#: ``policy(mode, eager, planted) -> WarReadDonePolicy``; a `CompiledPolicy` is one (``lookup``).
PolicyFn = Callable[[ForwardMode, bool, bool], WarReadDonePolicy]


class ModelAdapter(Protocol):
    """What an engine supplies to a runner. Duck-typed: any object with these members.

    A *bucket* is an int: the batch size (decode), the token count (prefill) or
    ``batch_size * draft_tokens`` (verify). The runner also calls ``prepare_bucket`` with an
    exact, uncaptured size before running such a batch eagerly, so the adapter must accept
    any positive size there (it may allocate lazily and cache).
    """

    #: scheduler-shared state the forward reads (the audit poisons these)
    shared_buffers: Mapping[str, Any]

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        """The capture buckets for ``mode``; empty means always eager."""

    def prepare_bucket(self, bucket: int) -> None:
        """Allocate the bucket's static inputs/outputs (valid padding values: warm-up runs them)."""

    def host_prep(self, batch: Any, bucket: int) -> None:
        """Out of graph, on the forward stream: copy ``batch`` into the static inputs and pad."""

    def graph_prep(self, bucket: int) -> None:
        """In-graph metadata prep: the forward's reads of scheduler-shared buffers."""

    def forward(self, bucket: int) -> Any:
        """The model forward after the prep; returns the bucket's static output."""

    # Optional: ``batch_size(batch) -> int`` (the size in bucket units); default ``len(batch)``.


@attrs.frozen
class CapturedBucket:
    """One captured graph and what the runner decided for it at capture time. ``event`` is the
    read-done event this graph records (None: no confirmed node), the only event an
    ``IN_GRAPH`` publish of this bucket may hand out."""

    size: int
    graph: GraphHandle
    output: Any
    event: Optional[EventHandle]
    policy: WarReadDonePolicy

    @property
    def planted(self) -> bool:
        return self.event is not None


@attrs.frozen
class StepInfo:
    """What the runner did for one step (``bucket`` None = eager)."""

    step: int
    size: int
    bucket: Optional[int]
    policy: WarReadDonePolicy


def resolve_policy_fn(policy: Union[PolicyFn, Any]) -> PolicyFn:
    """Accept a `CompiledPolicy` (``.lookup``) or a plain ``(mode, eager, planted)`` callable."""
    fn = getattr(policy, "lookup", policy)
    if not callable(fn):
        raise InputError(f"policy must be a CompiledPolicy or a callable, not {type(policy).__name__}")
    return fn


def sound(policy: WarReadDonePolicy, eager: bool, planted: bool) -> WarReadDonePolicy:
    """The runner's own safety net: ``IN_GRAPH`` without a planted node in a replayed graph
    is at least ``POST_REPLAY`` (never ``PRE_REPLAY``: that is only sound for snapshotting
    backends). The engine already does this; a hand-written policy callable might not."""
    if policy == IN_GRAPH and (eager or not planted):
        return POST_REPLAY
    return policy


class GraphRunner:
    """Captures one graph per bucket of one forward mode and publishes per policy.

    Subclasses fix the mode and how a batch is measured (`DecodeRunner`, `PrefillRunner`,
    `VerifyRunner`). Run a step with `run`; before `capture` every step runs eagerly.
    """

    mode: ClassVar[ForwardMode] = ForwardMode.DECODE

    def __init__(self, model: ModelAdapter, policy: Union[PolicyFn, Any],
                 platform: Optional[Platform] = None, name: Optional[str] = None, *,
                 mode: Optional[ForwardMode] = None, ring_size: int = 4,
                 keep_graphs: bool = False, process_group: Any = None,
                 consistency_strict: bool = False) -> None:
        if mode is not None:
            self.mode = ForwardMode.parse(mode)
        self.model = model
        self.name = name or self.mode.label
        self.platform = platform if platform is not None else Platform.for_device(None)
        self.fence = ReadDoneFence(self.platform, ring_size=ring_size, name=self.name)
        self._observers = observers_of(self.platform.pm)
        self._set_policy(policy)
        # the cross-rank check (tensor parallelism): off unless a process group is given
        self.process_group = process_group
        self.consistency_strict = consistency_strict
        self.consistency: Optional[ConsistencyResult] = None
        self.keep_graphs = keep_graphs  # keep the raw graphs for the static audit
        self.buckets: tuple[int, ...] = self._check_buckets(model.bucket_sizes(self.mode))
        self._captured: dict[int, CapturedBucket] = {}
        self._outputs: dict[int, Any] = {}  # latest output per bucket
        self._eager_sizes: set[int] = set()
        self._eager_policy: Optional[WarReadDonePolicy] = None
        self._step = 0
        self._warned = False
        self.last_step: Optional[StepInfo] = None

    def _set_policy(self, policy: Union[PolicyFn, Any]) -> None:
        self._policy = policy
        self._policy_fn = resolve_policy_fn(policy)
        self._explain = getattr(policy, "decision", None)  # a CompiledPolicy explains itself

    def _check_consistency(self) -> None:
        """Before the first capture, with a process group: compare this runner's policy across
        the group's ranks; on any difference every rank runs coarse (``consistency_strict``:
        every rank raises). A collective: every rank captures its runner in the same order."""
        p = self.platform
        policy, self.consistency = consistent_policy(
            self._policy, platform=p.name, external_events=p.external_events_supported(),
            group=self.process_group, strict=self.consistency_strict, pm=p.pm,
            where=f"runner:{self.name}")
        self._set_policy(policy)
        self._eager_policy = None  # resolved again from the checked policy

    # -- buckets -------------------------------------------------------------------------------

    def _check_buckets(self, sizes: Sequence[int]) -> tuple[int, ...]:
        out = sorted({int(s) for s in sizes})
        if any(s <= 0 for s in out):
            raise InputError(f"{self.name} runner: bucket sizes must be positive, got {list(sizes)}")
        return tuple(out)

    def size_of(self, batch: Any) -> int:
        """The batch's size in bucket units (``model.batch_size(batch)``, else ``len(batch)``)."""
        fn = getattr(self.model, "batch_size", None)
        size = int(fn(batch)) if fn is not None else len(batch)
        if size <= 0:
            raise InputError(f"{self.name} runner: empty batch (size {size})")
        return size

    def bucket_for(self, size: int) -> Optional[int]:
        """The smallest captured bucket that holds ``size``, or None (eager)."""
        i = bisect.bisect_left(self.buckets, size)
        if i == len(self.buckets) or self.buckets[i] not in self._captured:
            return None
        return self.buckets[i]

    @property
    def captured(self) -> Mapping[int, CapturedBucket]:
        """Captured buckets by size (read-only view for the audit)."""
        return dict(self._captured)

    @property
    def is_captured(self) -> bool:
        return bool(self._captured)

    # -- policy --------------------------------------------------------------------------------

    def _resolve(self, eager: bool, planted: bool) -> WarReadDonePolicy:
        """Ask the engine once; fail closed (NONE, one warning) on any error."""
        try:
            policy = WarReadDonePolicy(self._policy_fn(self.mode, eager, planted))
        except Exception as exc:  # noqa: BLE001 - any failure means coarse, never earlier
            self._warn(f"policy lookup failed ({exc!r}); using the coarse barrier")
            return NONE
        resolved = sound(policy, eager, planted)
        self._notify_decision(resolved, eager, planted)
        return resolved

    def _notify_decision(self, policy: WarReadDonePolicy, eager: bool, planted: bool) -> None:
        """Tell observers (tracing, metrics) what this runner resolved; capture time only."""
        observers = self._observers.on_decision
        if not observers:
            return
        try:
            if self._explain is not None:
                decision = self._explain(self.mode, eager, planted)
            else:
                ctx = Context(self.name, self.mode, eager=eager, planted=planted)
                decision = Decision(policy, ctx, (Reason("policy-callable", "given by the engine's "
                                                         "policy callable", policy),))
            if decision.policy != policy:  # the runner's own safety net moved it later
                decision = attrs.evolve(decision, policy=policy)
        except Exception as exc:  # noqa: BLE001 - explaining never changes the policy
            self._warn(f"explaining the decision failed ({exc!r})")
            return
        where = f"runner:{self.name}"
        for call in observers:
            try:
                call(decision, where)
            except Exception as exc:  # noqa: BLE001 - an observer never changes the policy
                plugin = self._observers.plugin_of.get(call, "?")
                self._warn(f"observer plugin {plugin!r} raised in warpolicy_on_decision ({exc!r})")

    def policy_for(self, bucket: Optional[int] = None) -> WarReadDonePolicy:
        """The resolved policy of a captured bucket, or the eager policy for None/uncaptured."""
        if bucket is not None and bucket in self._captured:
            return self._captured[bucket].policy
        if self._eager_policy is None:
            self._eager_policy = self._resolve(eager=True, planted=False)
        return self._eager_policy

    # -- capture -------------------------------------------------------------------------------

    def capture(self) -> None:
        """Warm up every bucket eagerly (cuBLAS, allocator), then capture one graph per bucket.

        Capture body: in-graph prep, plant the read-done node, model forward. ``plant()`` is
        inside the capture with the capture stream current (REFERENCE.md §3).
        """
        p = self.platform
        if self.process_group is not None and self.consistency is None:
            self._check_consistency()
        for b in self.buckets:
            self.model.prepare_bucket(b)
        self._warm_up()
        self.fence.prepare()  # persistent external event + one eager record, before capture
        pool = p.graph_pool()
        for b in reversed(self.buckets):  # largest first, so smaller graphs reuse its pool
            self._captured.pop(b, None)  # a failed re-capture leaves the bucket eager, not stale
            self._captured[b] = self._capture_bucket(b, pool)
        p.synchronize()

    def _capture_bucket(self, bucket: int, pool: PoolHandle) -> CapturedBucket:
        """Capture ``graph_prep -> plant -> forward`` for one bucket.

        The callable form lets the simulated platform re-run the body at each replay; the body
        keeps its latest output in ``self._outputs`` (the capture-time tensor on CUDA).
        """
        planted: list[Optional[EventHandle]] = []

        def body() -> None:
            self.model.graph_prep(bucket)
            event = self.fence.plant()
            if not planted:  # what the real capture did, not a replay's re-run
                planted.append(event)
            self._outputs[bucket] = self.model.forward(bucket)

        graph = self.platform.new_graph(keep_graph=self.keep_graphs)
        self.platform.capture_callable(graph, body, pool=pool)
        event = planted[0] if planted else None
        return CapturedBucket(bucket, graph, self._outputs[bucket], event,
                              self._resolve(eager=False, planted=event is not None))

    def _warm_up(self) -> None:
        """One eager pass per bucket on a side stream (as torch recommends before capture).

        The current stream joins the side stream even when the warm-up fails, so later work
        (an eager step, the scheduler's barrier on it) is ordered after what the warm-up read.
        """
        p = self.platform
        main = p.current_stream()
        side = p.new_stream()
        p.wait_stream(side, main)
        try:
            with p.stream(side):
                for b in self.buckets:
                    self.model.graph_prep(b)
                    self.model.forward(b)
        finally:
            self._join(main, side)
        p.synchronize()

    def _join(self, main: StreamHandle, side: StreamHandle) -> None:
        try:
            self.platform.wait_stream(main, side)
        except Exception:
            self.platform.synchronize()  # the host waits for everything instead
            raise

    # -- per step ------------------------------------------------------------------------------

    def run(self, batch: Any) -> Any:
        """Run one step on the current (forward) stream and publish its read-done event.

        Returns the bucket's static output (padded to the bucket; valid until the next run of
        this runner on the same stream), or the eager output.
        """
        size = self.size_of(batch)
        bucket = self.bucket_for(size)
        if bucket is None:
            return self._run_eager(batch, size)
        cb = self._captured[bucket]
        self.model.host_prep(batch, bucket)
        policy = self._before_replay(cb.policy)
        self.platform.replay(cb.graph)
        policy = self._after_replay(policy, cb.event)
        self._done(size, bucket, policy)
        return self._outputs[bucket]

    def _run_eager(self, batch: Any, size: int) -> Any:
        """No bucket fits: same sequence without a graph, under the (demoted) eager policy."""
        policy = self.policy_for(None)
        if size not in self._eager_sizes:
            self.model.prepare_bucket(size)
            self._eager_sizes.add(size)
        self.model.host_prep(batch, size)
        policy = self._before_replay(policy)
        self.model.graph_prep(size)
        output = self.model.forward(size)
        policy = self._after_replay(policy, None)  # no graph: never a planted event
        self._done(size, None, policy)
        return output

    # Publishing through the fence; on failure publish nothing (the scheduler goes coarse).
    # The fence already fails closed on its own; these guard a fence that raises anyway. Each
    # returns the policy the step continues with: NONE after a failure, so a failed
    # ``before_replay`` is not followed by a half-published ``after_replay``, and
    # ``last_step.policy`` says what was really published.

    def _before_replay(self, policy: WarReadDonePolicy) -> WarReadDonePolicy:
        try:
            self.fence.before_replay(policy)
        except Exception as exc:  # noqa: BLE001 - fail closed, never an earlier release
            return self._publish_failed(exc)
        return policy

    def _after_replay(self, policy: WarReadDonePolicy, planted: Optional[EventHandle]) -> WarReadDonePolicy:
        try:
            self.fence.after_replay(policy, planted)
        except Exception as exc:  # noqa: BLE001 - fail closed, never an earlier release
            return self._publish_failed(exc)
        return self.fence.published

    def _publish_failed(self, exc: Exception) -> WarReadDonePolicy:
        self._discard()  # before the warning: under ``-W error`` it raises
        self._warn(f"publishing the read-done event failed ({exc!r}); using the coarse barrier")
        return NONE

    def _discard(self) -> None:
        """Empty the mailbox so this step's scheduler read finds nothing (coarse)."""
        try:
            self.fence.take()
        except Exception:  # noqa: BLE001 - nothing more we can do; take() failing is coarse too
            pass

    def _done(self, size: int, bucket: Optional[int], policy: WarReadDonePolicy) -> None:
        self.last_step = StepInfo(self._step, size, bucket, policy)
        self._step += 1

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"warpolicy {self.name} runner: {message}", RuntimeWarning, stacklevel=3)

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.name!r} mode={self.mode.label} "
                f"buckets={list(self.buckets)} captured={sorted(self._captured)}>")
