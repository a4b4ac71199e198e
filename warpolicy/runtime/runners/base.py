"""Shared CUDA-graph runner logic: buckets, warm-up, capture with the planted node, padding,
eager fallback, and publishing the read-done event per policy.

An engine wraps its forward in a runner by supplying a `ModelAdapter` (duck-typed). The runner
owns the `ReadDoneFence`; the scheduler takes from ``runner.fence`` right after each launch
(see `warpolicy.runtime.runners.overlap.OverlapLoop`).

Per step (docs/ARCHITECTURE.md, "Runner API"), on the current (forward) stream::

    host_prep(batch, bucket)       copy inputs into the bucket's static buffers, pad
    fence.before_replay(policy)    PRE_REPLAY records here: the host-side snapshot point
    replay(graph)                  graph = graph_prep -> planted node -> forward
    fence.after_replay(policy, planted=bucket.event)
                                   IN_GRAPH hands out the event this bucket's graph records,
                                   POST_REPLAY records

Where the read-done node goes is the mode's *placement* (``policy.placement(mode)`` of a
`CompiledPolicy`, else the marker):

* **marker**: the capture body is ``graph_prep -> plant -> forward``. Where the platform can
  walk its graphs (CUDA with cuda-bindings; the simulated platform with a graph model), an
  in_graph bucket's capture is **self-checked** before its first replay (``self_check=``
  ``"warn"``, the default, ``"off"`` or ``"error"``): a shared reader that is not an ancestor
  of the marker, or a check that cannot be done, leaves the bucket unplanted (so it publishes
  as ``POST_REPLAY``), with one warning naming kernel, buffer and bucket, and a
  ``warpolicy_on_demotion`` notification; ``"error"`` raises `SelfCheckError` instead.
* **derived**: the body is ``graph_prep -> forward`` with no marker, captured into a kept
  graph; `Platform.plant_derived` adds the node after the last shared readers it finds, then
  the graph is instantiated. The bucket is planted only if that worked; otherwise it publishes
  as ``POST_REPLAY``, with one warning saying why, and a ``warpolicy_on_demotion``.

``runner.capture_report`` keeps per bucket what was done and what the walk cost.

The policy of each bucket is resolved once, at capture time, from ``policy(mode, eager,
planted)`` with what the capture really did (was the node planted?), and the bucket keeps the
event its own graph records: a publish never hands out another graph's event. A batch that fits no
bucket runs eagerly with the eager policy (``eager=True, planted=False``), so a declared
``IN_GRAPH`` is soundly demoted to ``POST_REPLAY`` there.

With ``process_group=`` (tensor parallelism) the runner compares its policy across the group's
ranks before its first capture (`warpolicy.runtime.distributed.consistent_policy`); on any difference
every rank runs every cell coarse, or raises with ``consistency_strict=True``.

Over 400 lines: capture has three placements (marker, derived, self-checked marker) and every
step path must fail closed; they share the bucket state, so they stay in one class.
"""

from __future__ import annotations

import bisect
import warnings
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

import attrs

from warpolicy.errors import InputError, WarpolicyError
from warpolicy.registry.engine import Context, Decision, Reason
from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)
from warpolicy.runtime.distributed import ConsistencyResult, consistent_policy
from warpolicy.runtime.fence import ReadDoneFence
from warpolicy.runtime.graphwalk import PlacementError
from warpolicy.runtime.manager import observers_of
from warpolicy.runtime.platform import Platform
from warpolicy.runtime.platforms import EventHandle, GraphHandle, PoolHandle, StreamHandle

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


#: Values of the runner's ``self_check`` option.
SELF_CHECK_MODES = ("warn", "off", "error")


class SelfCheckError(WarpolicyError):
    """``self_check="error"``: a captured marker failed the self-check (or it could not run)."""


@attrs.frozen
class CaptureReport:
    """What the capture of one bucket did about its release point.

    ``walked``: a graph walk ran (derived placement, or the marker self-check); ``ok``: it
    succeeded and, for the self-check, found no late reader (None when no walk ran);
    ``walk_ms``: what the walk cost (read + analysis + plant), 0 when none ran; ``detail``:
    one line (the plant or check described, or why it failed or was skipped).
    """

    bucket: int
    placement: Placement
    planted: bool
    walked: bool
    ok: Optional[bool]
    walk_ms: float
    detail: str


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
        raise InputError(
            f"policy must be a CompiledPolicy or a callable, not {type(policy).__name__}"
        )
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

    mode: ForwardMode = ForwardMode.DECODE  # the class default; a runner may take another

    def __init__(
        self,
        model: ModelAdapter,
        policy: Union[PolicyFn, Any],
        platform: Optional[Platform] = None,
        name: Optional[str] = None,
        *,
        mode: Optional[ForwardMode] = None,
        ring_size: int = 4,
        keep_graphs: bool = False,
        process_group: Any = None,
        consistency_strict: bool = False,
        placement: Optional[Union[Placement, str]] = None,
        self_check: str = "warn",
    ) -> None:
        if mode is not None:
            self.mode = ForwardMode.parse(mode)
        if self_check not in SELF_CHECK_MODES:
            raise InputError(
                f"self_check must be one of {', '.join(SELF_CHECK_MODES)}, not {self_check!r}"
            )
        self.self_check = self_check
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
        self._warned_keys: set[tuple[str, int]] = set()
        self.last_step: Optional[StepInfo] = None
        self.placement = self._placement_of(policy, placement)
        self._reports: dict[int, CaptureReport] = {}
        self._walk_unavailable: Optional[str] = None

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
            self._policy,
            platform=p.name,
            external_events=p.external_events_supported(),
            group=self.process_group,
            strict=self.consistency_strict,
            pm=p.pm,
            where=f"runner:{self.name}",
        )
        self._set_policy(policy)
        self._eager_policy = None  # resolved again from the checked policy

    # -- buckets -------------------------------------------------------------------------------

    def _check_buckets(self, sizes: Sequence[int]) -> tuple[int, ...]:
        out = sorted({int(s) for s in sizes})
        if any(s <= 0 for s in out):
            raise InputError(
                f"{self.name} runner: bucket sizes must be positive, got {list(sizes)}"
            )
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

    @property
    def capture_report(self) -> Mapping[int, CaptureReport]:
        """Per captured bucket: placement, planted, the walk's outcome and cost."""
        return dict(self._reports)

    def _placement_of(self, policy: Any, given: Optional[Union[Placement, str]]) -> Placement:
        """The explicit ``placement=``, else the policy's ``placement(mode)``, else the marker;
        a failing lookup is the marker (which the self-check then guards)."""
        if given is not None:
            return Placement(given)
        lookup = getattr(policy, "placement", None)
        if not callable(lookup):
            return Placement.MARKER
        try:
            return Placement(lookup(self.mode))
        except Exception as exc:  # noqa: BLE001 - the marker is the conservative default
            self._warn(f"placement lookup failed ({exc!r}); planting the marker")
            return Placement.MARKER

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
                decision = Decision(
                    policy,
                    ctx,
                    (Reason("policy-callable", "given by the engine's policy callable", policy),),
                )
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
        inside the capture with the capture stream current (docs/background.md §3).
        """
        p = self.platform
        if self.process_group is not None and self.consistency is None:
            self._check_consistency()
        for b in self.buckets:
            self.model.prepare_bucket(b)
        self._warm_up()
        self.fence.prepare()  # persistent external event + one eager record, before capture
        self._walk_unavailable = p.graph_walk_unavailable()
        pool = p.graph_pool()
        for b in reversed(self.buckets):  # largest first, so smaller graphs reuse its pool
            self._captured.pop(b, None)  # a failed re-capture leaves the bucket eager, not stale
            self._reports.pop(b, None)
            self._captured[b] = self._capture_bucket(b, pool)
        p.synchronize()

    def _capture_bucket(self, bucket: int, pool: PoolHandle) -> CapturedBucket:
        """Capture one bucket with the mode's placement (marker or derived)."""
        if self.placement is Placement.DERIVED:
            return self._capture_derived(bucket, pool)
        return self._capture_marker(bucket, pool)

    def _capture_marker(self, bucket: int, pool: PoolHandle) -> CapturedBucket:
        """Capture ``graph_prep -> plant -> forward``; self-check an in_graph bucket.

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

        check = self._wants_self_check()
        kept = self.keep_graphs or check
        graph = self.platform.new_graph(keep_graph=kept)
        self.platform.capture_callable(graph, body, pool=pool)
        event = planted[0] if planted else None
        if event is not None and check and self._peek(planted=True) == IN_GRAPH:
            event = self._self_check(bucket, graph, event)
        else:
            self._report(
                bucket,
                event is not None,
                False,
                None,
                0.0,
                "marker after graph_prep" + ("" if event is not None else " (not planted)"),
            )
        if kept:
            self._instantiate(bucket, graph)
        return CapturedBucket(
            bucket,
            graph,
            self._outputs[bucket],
            event,
            self._resolve(eager=False, planted=event is not None),
        )

    def _wants_self_check(self) -> bool:
        """Whether this capture self-checks its markers; reports once when it cannot on CUDA."""
        if self.self_check == "off":
            return False
        reason = self._walk_unavailable
        if reason is None:
            return True
        if self.self_check == "error":
            raise SelfCheckError(
                f"{self.name} runner: self_check='error' but the marker "
                f"self-check cannot run: {reason}"
            )
        if self.platform.name == "cuda":  # elsewhere no raw graph exists: skipped silently
            self._warn_once_per("self-check-unavailable", 0, f"marker self-check skipped: {reason}")
        return False

    def _peek(self, planted: bool) -> Optional[WarReadDonePolicy]:
        """The policy a captured bucket would get (no observers told); None on failure."""
        try:
            return sound(
                WarReadDonePolicy(self._policy_fn(self.mode, False, planted)), False, planted
            )
        except Exception:  # noqa: BLE001 - _resolve reports the failure and goes coarse
            return None

    def _self_check(
        self, bucket: int, graph: GraphHandle, event: EventHandle
    ) -> Optional[EventHandle]:
        """Check the marker of ``bucket``; the event it keeps, or None (demoted)."""
        try:
            check = self.platform.check_marker(graph, self.model.shared_buffers, event)
        except PlacementError as exc:
            reason = f"bucket {bucket}: marker self-check could not run ({exc.reason})"
            self._report(bucket, False, True, False, 0.0, reason)
            self._fail_check(bucket, reason)
            return None
        detail = check.describe(bucket)
        self._report(bucket, check.ok, True, check.ok, check.total_ms, detail)
        if check.ok:
            return event
        self._fail_check(bucket, detail)
        return None

    def _fail_check(self, bucket: int, reason: str) -> None:
        if self.self_check == "error":
            raise SelfCheckError(f"{self.name} runner: {reason}")
        self._demoted(bucket, f"{reason}; bucket {bucket} demoted to post_replay")

    def _capture_derived(self, bucket: int, pool: PoolHandle) -> CapturedBucket:
        """Capture ``graph_prep -> forward`` (no marker) into a kept graph, plant the read-done
        node after the shared readers the walk finds, instantiate. Planted iff that worked."""

        def body() -> None:
            self.model.graph_prep(bucket)
            self._outputs[bucket] = self.model.forward(bucket)

        walkable = self._walk_unavailable is None
        kept = walkable or self.keep_graphs  # an old torch cannot keep graphs: do not ask it
        graph = self.platform.new_graph(keep_graph=kept)
        self.platform.capture_callable(graph, body, pool=pool)
        event = self.fence.event
        planted: Optional[EventHandle] = None
        try:
            if event is None:
                raise PlacementError(
                    "no read-done event (external events unavailable, or creating it failed)"
                )
            if self._walk_unavailable is not None:
                raise PlacementError(self._walk_unavailable)
            plant = self.platform.plant_derived(graph, self.model.shared_buffers, event)
        except PlacementError as exc:
            why = (
                "suspicious: no shared reader found in the captured graph, "
                if exc.no_readers
                else ""
            )
            reason = (
                f"bucket {bucket}: derived placement left the bucket unplanted "
                f"({why}{exc.reason}); it publishes no earlier than post_replay"
            )
            self._report(bucket, False, True, False, 0.0, reason)
            self._demoted(bucket, reason)
        else:
            planted = event
            self._report(bucket, True, True, True, plant.total_ms, plant.describe())
        if kept and not self._instantiate(bucket, graph):
            planted = None
        return CapturedBucket(
            bucket,
            graph,
            self._outputs[bucket],
            planted,
            self._resolve(eager=False, planted=planted is not None),
        )

    def _instantiate(self, bucket: int, graph: GraphHandle) -> bool:
        """Instantiate a kept graph before its first replay; False (one warning) on failure."""
        try:
            self.platform.instantiate(graph)
        except Exception as exc:  # noqa: BLE001 - the node cannot be trusted: unplanted
            self._demoted(
                bucket,
                f"bucket {bucket}: instantiating the graph failed ({exc!r}); "
                f"the bucket is treated as unplanted",
            )
            return False
        return True

    def _report(
        self,
        bucket: int,
        planted: bool,
        walked: bool,
        ok: Optional[bool],
        walk_ms: float,
        detail: str,
    ) -> None:
        self._reports[bucket] = CaptureReport(
            bucket, self.placement, planted, walked, ok, walk_ms, detail
        )

    def _demoted(self, bucket: int, reason: str) -> None:
        """One warning per bucket, and the ``warpolicy_on_demotion`` observers."""
        self._warn_once_per("demotion", bucket, reason)
        for call in self._observers.on_demotion:
            try:
                call(self.name, bucket, reason)
            except Exception as exc:  # noqa: BLE001 - an observer never changes the policy
                plugin = self._observers.plugin_of.get(call, "?")
                self._warn_once_per(
                    "observer",
                    0,
                    f"observer plugin {plugin!r} raised in warpolicy_on_demotion ({exc!r})",
                )

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

    def _after_replay(
        self, policy: WarReadDonePolicy, planted: Optional[EventHandle]
    ) -> WarReadDonePolicy:
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

    def _warn_once_per(self, kind: str, bucket: int, message: str) -> None:
        """One warning per (kind, bucket) for the runner's lifetime."""
        if (kind, bucket) not in self._warned_keys:
            self._warned_keys.add((kind, bucket))
            warnings.warn(f"warpolicy {self.name} runner: {message}", RuntimeWarning, stacklevel=4)

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"warpolicy {self.name} runner: {message}", RuntimeWarning, stacklevel=3)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} mode={self.mode.label} "
            f"buckets={list(self.buckets)} captured={sorted(self._captured)}>"
        )
