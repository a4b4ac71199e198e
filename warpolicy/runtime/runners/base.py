"""`GraphRunner`: buckets, the capture transaction, and the step path that publishes.

An engine wraps its forward in a runner by supplying a `ModelAdapter`. The runner owns the
`ReadDoneFence`; the scheduler takes from ``runner.fence`` right after each launch (see
`warpolicy.runtime.runners.overlap.OverlapLoop`).

Capture (`capture`) is a transaction (`warpolicy.runtime.runners.capture`): it asks the policy
once for the mode (`resolve_policies`), warms up, captures every bucket and decides each
bucket's `BucketRelease` from verified facts. It replaces every graph and decision at once, or,
when anything raises (``KeyboardInterrupt`` included), leaves the runner with no graph at all
and coarse (every step eager, publishing nothing) until a capture succeeds.

Per step (`run`), on the current (forward) stream, reading only the bucket's release::

    host_prep(batch, bucket)         copy inputs into the bucket's static buffers, pad
    fence.before_replay(release)     PRE_REPLAY records here: the host-side snapshot point
    replay(graph)                    graph = graph_prep -> [planted node] -> forward
    fence.after_replay(release)      IN_GRAPH hands out the event this bucket's graph records,
                                     POST_REPLAY records

Where the read-done node goes is the mode's *placement* (``policy.placement(mode)`` of a
`PlacedPolicy`, else the marker, or ``placement=``): the **marker** is recorded in the capture
body right after ``graph_prep`` and, where the platform can walk its graphs, **self-checked**
(``self_check="warn"``, the default, ``"off"`` or ``"error"``); **derived** captures without a
marker and plants the node after the last shared readers the walk finds. A batch that fits no
bucket runs eagerly with the eager policy (an ``IN_GRAPH`` answer is at least ``POST_REPLAY``).

With ``canary=`` (a `warpolicy.runtime.canary.Canary` with a rate above 0) and a model that is a
`CanaryAdapter`, one step in ``1 / rate`` is checked by the WAR canary: saved before its
release, run overlapped as usual, replayed behind a full barrier after the scheduler's writes
(`check_canary`; `OverlapLoop` calls it) and compared. A difference demotes the bucket to the
coarse barrier for the rest of the process (`demote`, the documented way a bucket's
`BucketRelease` is replaced: never changed in place).

With ``process_group=`` (tensor parallelism) the runner compares its policy and placement across
the group's ranks before its first capture (`warpolicy.runtime.distributed.consistent_policy`);
on any difference every rank runs every cell coarse, or raises with ``consistency_strict=True``.

With ``widen_race_us=`` (else ``WARPOLICY_WIDEN_RACE_US``; resolved once, off by default) the
runner's graphs spin at their release points on CUDA, so a race of microseconds becomes certain
(`warpolicy.runtime.runners.widen`); off, the model is taken as it is.

A runner belongs to one thread (the first that uses it; `WrongThreadError` from any other).
"""

from __future__ import annotations

import bisect
import functools
import logging
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import NONE, ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime.batch import (
    NO_PLANS,
    BucketBatch,
    CellPlans,
    ExplainedBatchPolicy,
    cell_plans,
    lower_policies,
)
from warpolicy.runtime.canary import Canary, CanarySession
from warpolicy.runtime.distributed import ConsistencyResult, consistent_policy
from warpolicy.runtime.fence import ReadDoneFence
from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.observers import NO_OBSERVERS, Observers, Reporter
from warpolicy.runtime.ordering import order_after, synchronize_all
from warpolicy.runtime.owned_capture import SELF_CHECK_MODES, placement_of
from warpolicy.runtime.ownership import ThreadOwner, get_ident
from warpolicy.runtime.platforms import Platform, StreamHandle
from warpolicy.runtime.policy import NamedPolicy, RunnerPolicy, policy_function
from warpolicy.runtime.rebind import RELEASE_LABEL, save_bucket
from warpolicy.runtime.release import (
    BucketFacts,
    BucketRelease,
    ModePolicies,
    coarse_release,
    decide_bucket,
    demote_release,
    resolve_policies,
)
from warpolicy.runtime.runners.adapters import batch_measure
from warpolicy.runtime.runners.capture import (
    CaptureReport,
    CaptureTransaction,
    notify_decision,
)
from warpolicy.runtime.runners.protocols import (
    CanaryAdapter,
    CapturedBucket,
    ModelAdapter,
    StepInfo,
)
from warpolicy.runtime.runners.restoring import RestoreTransaction
from warpolicy.runtime.runners.widen import RaceWidener

log = logging.getLogger("warpolicy")


def check_buckets(name: str, sizes: Sequence[Any]) -> tuple[int, ...]:
    """Bucket sizes as sorted, distinct positive ints; anything else (``'x'``, ``inf``,
    ``nan``, ``None``, ``2.5``, ``0``) is an `InputError` naming it, one line."""
    try:
        values = list(sizes)
    except TypeError:
        raise InputError(f"{name} runner: bucket sizes must be a sequence, not {sizes!r}") from None
    out: set[int] = set()
    for size in values:
        try:
            if isinstance(size, bool):  # an int to Python, never a size
                raise TypeError
            value = operator.index(size)
        except TypeError:
            raise InputError(
                f"{name} runner: bucket sizes must be positive integers, got {size!r}"
            ) from None
        if value <= 0:
            raise InputError(f"{name} runner: bucket sizes must be positive, got {value}")
        out.add(value)
    return tuple(sorted(out))


class GraphRunner:
    """Captures one graph per bucket of one forward mode and publishes per policy.

    Subclasses fix the mode and how a batch is measured (`DecodeRunner`, `PrefillRunner`,
    `VerifyRunner`, `DraftExtendRunner`). Run a step with `run`; before `capture` every step
    runs eagerly.
    """

    mode: ForwardMode = ForwardMode.DECODE  # the class default; a runner may take another
    #: whether the capture body records the marker (the draft extend's graph has none)
    plants_marker: bool = True

    def __init__(
        self,
        model: ModelAdapter,
        policy: RunnerPolicy,
        platform: Platform,
        name: str | None = None,
        *,
        mode: ForwardMode | str | None = None,
        observers: Observers = NO_OBSERVERS,
        ring_size: int = 4,
        keep_graphs: bool = False,
        process_group: Any = None,
        consistency_strict: bool = False,
        placement: Placement | str | None = None,
        self_check: str = "warn",
        canary: Canary | None = None,
        widen_race_us: float | None = None,
        class_policies: Mapping[str, RunnerPolicy] | None = None,
    ) -> None:
        if not isinstance(platform, Platform):
            raise InputError(
                "a runner needs a Platform (build one with warpolicy.runtime.manager."
                f"open_runtime or open_platform), not {type(platform).__name__}"
            )
        if mode is not None:
            self.mode = ForwardMode.parse(mode)
        if self_check not in SELF_CHECK_MODES:
            raise InputError(
                f"self_check must be one of {', '.join(SELF_CHECK_MODES)}, not {self_check!r}"
            )
        self.name = name or self.mode.label
        self.self_check = self_check
        # the race widener, resolved once (the argument, else WARPOLICY_WIDEN_RACE_US): off, the
        # model itself, so the step path is the unwidened one
        self.widener = RaceWidener.resolve(widen_race_us)
        widened = self.widener.wrap(model, platform)
        if widened is not model:
            log.warning(
                "warpolicy %s runner: race widener on (%s): every replay spins at its release "
                "points; for audits and race hunts, never for serving",
                name or self.mode.label,
                self.widener.describe(),
            )
        model = widened
        self.model = model
        self._measure = batch_measure(model)  # its batch_size, when it has one, else len
        self.platform = platform
        self.observers = observers
        self.reporter = Reporter(observers, f"{self.name} runner")
        self._owner = ThreadOwner(f"{self.name} runner")
        self.fence = ReadDoneFence(
            platform, ring_size, self.name, observers=observers, owner=self._owner
        )
        self._set_policy(policy)
        #: per buffer class, its policy (each no later than ``policy``, the cell's): the fence
        #: then publishes one read-done per class (`ReadDoneFence.take_class`)
        self._class_policy_fns = {
            str(name): policy_function(fn) for name, fn in (class_policies or {}).items()
        }
        # the cross-rank check (tensor parallelism): off unless a process group is given
        self.process_group = process_group
        self.consistency_strict = consistency_strict
        self.consistency: ConsistencyResult | None = None
        self.keep_graphs = keep_graphs  # keep the raw graphs for the static audit
        self.buckets: tuple[int, ...] = check_buckets(self.name, model.bucket_sizes(self.mode))
        self.placement = self._placement_of(policy, placement)
        self._captured: dict[int, CapturedBucket] = {}
        #: per bucket, the captured bucket a restore replaced (`restore`)
        self._restored_from: dict[int, CapturedBucket] = {}
        self._reports: dict[int, CaptureReport] = {}
        self._outputs: dict[int, Any] = {}  # latest output per bucket
        self._eager_sizes: set[int] = set()
        self._eager: BucketRelease | None = None  # decided on first need, and per capture
        self._eager_batch: BucketBatch | None = None  # the eager path's per-batch plan
        # (bucket, policy) pairs whose per-batch decision the decision observers were told
        self._batch_noted: set[tuple[int | None, WarReadDonePolicy]] = set()
        self._coarse: str | None = None  # why the runner is coarse (a failed capture)
        # streams a failed capture left with work the host never waited for: every later step
        # waits for them first (so the scheduler's barrier on that step covers them)
        self._unsettled: tuple[StreamHandle, ...] = ()
        self._step_index = 0
        self._fence_step = (
            0  # the token of the fence's current step (`ReadDoneFence.before_replay`)
        )
        self.last_step: StepInfo | None = None
        # the WAR canary: buckets it demoted (None: the eager path), re-applied after a capture
        self._demoted: dict[int | None, str] = {}
        #: the process's canary (None: none); `canary_session` is this runner's, when it samples
        self.canary = canary
        self.canary_session = self._open_canary(canary, policy)

    def _open_canary(self, canary: Canary | None, policy: RunnerPolicy) -> CanarySession | None:
        """This runner's canary session, or None: no canary, a canary that samples nothing,
        or a model that cannot be checked (said once)."""
        if canary is None or not canary.enabled:
            return None
        model = self.model
        if not isinstance(model, CanaryAdapter):
            self.reporter.warn(
                "canary-unsupported",
                f"the model ({type(model).__name__}) has no canary_spec (CanaryAdapter), so "
                "the WAR canary never samples this runner",
            )
            return None
        self._canary_model: CanaryAdapter = model
        backend = spec = ""
        if isinstance(policy, NamedPolicy):
            backend, spec = str(policy.backend), str(policy.spec)
        return canary.session(
            self.name, self.mode, backend=backend, spec=spec, on_demote=self.demote
        )

    def _set_policy(self, policy: RunnerPolicy) -> None:
        self._policy = policy
        self._policy_fn = policy_function(policy)
        self._policies: ModePolicies | None = None  # asked once, when first needed
        self._plans: CellPlans = NO_PLANS  # the cells' per-batch plans, with the policies

    def _placement_of(self, policy: RunnerPolicy, given: Placement | str | None) -> Placement:
        """The explicit ``placement=``, else the policy's ``placement(mode)``, else the marker;
        a failing lookup is the marker (which the self-check then guards)."""
        placement, note = placement_of(policy, self.mode, given)
        if note is not None:
            self.reporter.warn("placement", note)
        return placement

    def release_thread(self) -> None:
        """Hand the runner (and its fence) to another thread: the next thread that uses it owns
        it. Call it from the owning thread, between steps."""
        self._owner.release()

    # -- buckets -------------------------------------------------------------------------------

    def size_of(self, batch: Any) -> int:
        """The batch's size in bucket units (``model.batch_size(batch)``, else ``len(batch)``)."""
        size = int(self._measure(batch))
        if size <= 0:
            raise InputError(f"{self.name} runner: empty batch (size {size})")
        return size

    def bucket_for(self, size: int) -> int | None:
        """The smallest captured bucket that holds ``size``, or None (eager)."""
        i = bisect.bisect_left(self.buckets, size)
        if i == len(self.buckets) or self.buckets[i] not in self._captured:
            return None
        return self.buckets[i]

    @property
    def captured(self) -> Mapping[int, CapturedBucket]:
        """Captured buckets by size (a copy)."""
        return dict(self._captured)

    @property
    def is_captured(self) -> bool:
        return bool(self._captured)

    @property
    def coarse(self) -> str | None:
        """Why the runner publishes nothing at all (its last capture failed), else None."""
        return self._coarse

    @property
    def capture_report(self) -> Mapping[int, CaptureReport]:
        """Per captured bucket: placement, planted, the walk's outcome and cost, the policy."""
        return dict(self._reports)

    # -- policy --------------------------------------------------------------------------------

    def mode_policies(self) -> ModePolicies:
        """The policy's answers for this runner's mode, asked once (never again: a re-capture
        reuses them)."""
        return self._mode_policies()

    def _mode_policies(self) -> ModePolicies:
        """The policy for this runner's mode, asked once (a failure is reported once). A cell
        whose policy reads per-batch facts answers the earliest any batch can get
        (`warpolicy.runtime.batch.lower_policies`): its buckets are decided for that, and each
        batch publishes the same or later (`CapturedBucket.batch`)."""
        policies = self._policies
        if policies is None:
            policies = resolve_policies(self._policy_fn, self.mode)
            if policies.failure is not None:  # every failure reaches the fallback observers
                error = policies.error or RuntimeError(policies.failure)
                self.reporter.fallback(
                    "policy", error, f"{policies.failure}; using the coarse barrier"
                )
                self._plans = NO_PLANS
            else:
                self._plans = cell_plans(self._policy, self.mode, self.reporter)
                policies = lower_policies(policies, self._plans)
            self._policies = policies
        return policies

    def _eager_release(self) -> BucketRelease:
        release = self._eager
        if release is None:
            if self._coarse is not None:
                release = coarse_release(self.name, self._coarse)
            else:
                release = decide_bucket(self._mode_policies(), BucketFacts(None), self.name)
                notify_decision(self.reporter, self._policy, self.mode, release, True, False)
            if None in self._demoted:
                release = demote_release(release, self._demoted[None])
            self._set_eager(release)
        return release

    def _set_eager(self, release: BucketRelease) -> None:
        self._eager = release
        self._eager_batch = BucketBatch.bind(self._plans.eager, release)

    def policy_for(self, bucket: int | None = None) -> WarReadDonePolicy:
        """What a step of a captured bucket publishes, or the eager policy (None/uncaptured).
        For a cell that reads per-batch facts it is the earliest any batch may publish there;
        a batch publishes it or later (``last_step.decided`` says what a step decided)."""
        if bucket is not None and bucket in self._captured:
            return self._captured[bucket].release.policy
        return self._eager_release().policy

    def release_of(self, bucket: int | None = None) -> BucketRelease:
        """The `BucketRelease` of a captured bucket, or of the eager path (None/uncaptured)."""
        if bucket is not None and bucket in self._captured:
            return self._captured[bucket].release
        return self._eager_release()

    # -- capture -------------------------------------------------------------------------------

    def capture(self) -> None:
        """Warm up every bucket eagerly, then capture one graph per bucket and decide each
        bucket's release (a transaction: all buckets fresh, or none and the runner coarse).

        Capture before the scheduler's loop starts or after it drained: a capture's warm-up
        reads shared state. Raises what the capture raised, after making the runner coarse.
        """
        self._owner.check()
        if self.canary_session is not None:  # a sample of an old graph is never replayed
            self.canary_session.discard()
        # No bucket keeps an old graph or an old event past this point: until the transaction
        # returns, the runner is coarse.
        self._captured = {}
        self._reports = {}
        self._coarse = "a capture is in progress or failed; every step is eager and coarse"
        self._eager = None
        self._eager_batch = None
        if self.process_group is not None and self.consistency is None:
            self._check_consistency()
        transaction = self._transaction(self._mode_policies())
        try:
            result = transaction.run()
        finally:
            self._unsettled = transaction.unsettled  # () once its synchronize succeeded
        self._captured = result.captured
        self._reports = result.reports
        self._set_eager(result.eager)
        self._coarse = None
        for bucket, reason in self._demoted.items():  # for the rest of the process
            self._apply_demotion(bucket, reason)

    # -- persistence: save, restore -------------------------------------------------------------

    def save(self) -> dict[int, SavedAnchors | None]:
        """Where each captured bucket's read-done node sits, as plain data to persist beside its
        graph (``saved[bucket].to_json()``) for `restore`: None for a bucket whose node cannot be
        described (one warning; its restore is coarse). Needs kept graphs (``keep_graphs=True``,
        or a placement that walks them)."""
        self._owner.check()
        out: dict[int, SavedAnchors | None] = {}
        for bucket, captured in self._captured.items():
            planted = {RELEASE_LABEL: captured.recorded} if captured.recorded is not None else {}
            saved, why = save_bucket(self.platform, captured.graph, planted)
            if saved is None:
                self.reporter.warn("save", f"bucket {bucket}: {why}")
            out[bucket] = saved
        return out

    def restore(
        self,
        graphs: Mapping[int, Any],
        saved: Mapping[int, SavedAnchors | None],
        outputs: Mapping[int, Any] | None = None,
    ) -> None:
        """Install graphs that were cloned, restored from a saved description or recaptured
        (``graphs``: by bucket; ``saved``: what `save` returned for them): each bucket's planted
        node is found again by position, rebound to a fresh event of this runner's fence,
        self-checked on the restored graph and decided as at capture
        (`warpolicy.runtime.runners.restoring`). A transaction like `capture`: every graph is
        dropped first, and anything raised leaves the runner coarse. ``outputs``: each restored
        graph's static output (default: the captured ones, for graphs restored from this
        runner's own, which write the same memory)."""
        self._owner.check()
        if self.canary_session is not None:  # a sample of an old graph is never replayed
            self.canary_session.discard()
        # the graphs restored from these may use their memory pool, and each still records
        # its event (a graph whose event was destroyed is undefined behaviour): kept alive
        self._restored_from.update(self._captured)
        self._captured = {}
        self._reports = {}
        self._coarse = "a restore is in progress or failed; every step is eager and coarse"
        self._eager = None
        self._eager_batch = None
        transaction = RestoreTransaction(self._transaction(self._mode_policies()), graphs, saved)
        result = transaction.run()
        if outputs is not None:
            self._outputs.update(outputs)
        self._captured = result.captured
        self._reports = result.reports
        self._set_eager(result.eager)
        self._coarse = None
        for bucket, reason in self._demoted.items():  # for the rest of the process
            self._apply_demotion(bucket, reason)

    # -- the WAR canary ------------------------------------------------------------------------

    def demote(self, bucket: int | None, reason: str) -> None:
        """Make ``bucket`` (None: the eager path) publish nothing from now on, for the rest of
        the process (re-captures too): its `BucketRelease` is replaced by a coarse one
        (`warpolicy.runtime.release.demote_release`), never changed in place. The canary calls
        it when it catches an early release there."""
        self._demoted[bucket] = reason
        self._apply_demotion(bucket, reason)

    def _apply_demotion(self, bucket: int | None, reason: str) -> None:
        if bucket is None:
            if self._eager is not None and self._eager.policy is not NONE:
                self._set_eager(demote_release(self._eager, reason))
            return
        captured = self._captured.get(bucket)
        if captured is not None and captured.release.policy is not NONE:
            release = demote_release(captured.release, reason)
            self._captured[bucket] = attrs.evolve(captured, release=release, batch=None)

    @property
    def demoted(self) -> Mapping[int | None, str]:
        """Buckets demoted for the rest of the process (None: the eager path), and why."""
        return dict(self._demoted)

    def check_canary(self) -> None:
        """Check this runner's pending sampled step, if any (`CanarySession.check`): after the
        scheduler's writes for the next step, with their stream current. `OverlapLoop` calls
        it; a runner whose check was not called checks at its next `run`, before that step."""
        session = self.canary_session
        if session is not None:
            self._owner.check()
            session.check()

    def _transaction(self, policies: ModePolicies) -> CaptureTransaction:
        return CaptureTransaction(
            name=self.name,
            mode=self.mode,
            platform=self.platform,
            model=self.model,
            fence=self.fence,
            reporter=self.reporter,
            policy=self._policy,
            policies=policies,
            buckets=self.buckets,
            placement=self.placement,
            marker=self.plants_marker,
            self_check=self.self_check,
            keep_graphs=self.keep_graphs,
            outputs=self._outputs,
            plans=self._plans,
            class_policies={
                name: resolve_policies(fn, self.mode) for name, fn in self._class_policy_fns.items()
            },
        )

    def _check_consistency(self) -> None:
        """Before the first capture, with a process group: compare this runner's policy and
        placement across the group's ranks; on any difference every rank runs coarse
        (``consistency_strict``: every rank raises). A collective: every rank captures its
        runner in the same order."""
        p = self.platform
        policy, self.consistency = consistent_policy(
            self._policy,
            platform=p.name,
            external_events=p.external_events_supported(),
            placements={self.mode: self.placement},
            group=self.process_group,
            strict=self.consistency_strict,
            observers=self.observers,
            where=f"runner:{self.name}",
        )
        self._set_policy(policy)

    # -- per step ------------------------------------------------------------------------------

    def run(self, batch: Any) -> Any:
        """Run one step on the current (forward) stream and publish its read-done event.

        Returns the bucket's static output (padded to the bucket; valid until the next run of
        this runner on the same stream), or the eager output.
        """
        if self._owner.ident != get_ident():
            self._owner.claim()
        if self._unsettled:
            self._settle()
        session = self.canary_session
        due = session.step() if session is not None else False  # may demote (swap releases)
        size = self.size_of(batch)
        i = bisect.bisect_left(self.buckets, size)
        captured = self._captured.get(self.buckets[i]) if i < len(self.buckets) else None
        if captured is not None:
            return self._step(
                batch, size, captured.size, captured.release, captured.batch, captured.graph, due
            )
        # no bucket fits: the same step without a graph, under the eager release
        release = self._eager_release()
        if size not in self._eager_sizes:
            self.model.prepare_bucket(size)
            self._eager_sizes.add(size)
        return self._step(batch, size, None, release, self._eager_batch, None, due)

    def _step(
        self,
        batch: Any,
        size: int,
        bucket: int | None,
        release: BucketRelease,
        per: BucketBatch | None,
        graph: Any,
        due: bool,
    ) -> Any:
        """The one step sequence: host prep, this batch's release, the canary's sample, begin,
        forward (the bucket's ``graph`` replayed, or eagerly without one), publish or discard,
        the sample's observation, the step's record. ``bucket`` None: the eager path (its
        static buffers are the batch's own size)."""
        static = size if bucket is None else bucket
        self.model.host_prep(batch, static)
        facts = None
        if per is not None:  # the cell reads per-batch facts: this batch's release, same or later
            release, facts = self._per_batch(per, size, bucket, batch)
        session = self.canary_session
        sample = None
        if due and session is not None:  # saved after the host prep, before any release
            sample = session.begin(
                bucket,
                self._step_index,
                release,
                functools.partial(self._canary_model.canary_spec, self.mode, static, batch),
                self.model.shared_buffers,
                functools.partial(self._forward, graph, static),
            )
        began = self._before_replay(release)
        output = self._forward(graph, static)
        if began:
            published = self._after_replay(release)
        else:
            self._discard()
            published = NONE
        if sample is not None and session is not None:  # what the overlapped step produced
            session.observe(sample, output)
        self._done(size, bucket, published, facts, release.policy)
        return output

    def _forward(self, graph: Any, static: int) -> Any:
        """The forward of one step: ``graph`` replayed (its output is the bucket's static one),
        or, without a graph, the metadata prep and forward run eagerly."""
        if graph is not None:
            self.platform.replay(graph)
            return self._outputs[static]
        self.model.graph_prep(static)
        return self.model.forward(static)

    def _per_batch(
        self, per: BucketBatch, size: int, bucket: int | None, batch: Any
    ) -> tuple[BucketRelease, dict[str, object] | None]:
        """This batch's facts and release (`BucketBatch.step`): the bucket's, or a later one.
        Anything that raises makes the batch publish nothing; a ``BaseException`` then
        propagates, with this step's mailbox empty (coarse)."""
        try:
            release, facts = per.step(
                size,
                bucket,
                batch,
                self.name,
                self.model,
                self.observers.batch_action,
                self.reporter,
            )
        except Exception as exc:  # noqa: BLE001 - this batch is coarse, never earlier
            self.reporter.fallback("per_batch", exc)
            return per.later.get(NONE, per.release), None
        except BaseException:
            self._discard()  # this step's scheduler read finds nothing: coarse
            self._done(size, bucket, NONE, None, NONE)
            raise
        if release is not per.release and self.observers.on_decision:
            self._note_batch(per, release, facts)
        return release, facts

    def _note_batch(
        self, per: BucketBatch, release: BucketRelease, facts: dict[str, object]
    ) -> None:
        """Tell the decision observers about a per-batch decision later than its bucket's,
        once per (bucket, policy): the first batch that moves it (explaining is no per-step
        work)."""
        key = (release.bucket, release.policy)
        if key in self._batch_noted:
            return
        self._batch_noted.add(key)
        policy = self._policy
        if not isinstance(policy, ExplainedBatchPolicy):
            return
        plan = per.plan
        try:
            decision = policy.decision(self.mode, plan.eager, plan.planted, facts)
        except Exception as exc:  # noqa: BLE001 - explaining never changes the release
            self.reporter.warn("explain-batch", f"explaining a per-batch decision failed ({exc!r})")
            return
        self.reporter.decision(decision, f"runner:{self.name}:batch")

    def _settle(self) -> None:
        """After a capture that failed before its host synchronize: order this step (on the
        current stream) after the capture's unfinished work, or make the host wait for it.
        Interrupted (a ``BaseException``), the host waits first, then the interrupt propagates:
        the engine's coarse barrier on this stream must still cover the capture's reads."""
        p = self.platform
        failed: Exception | None
        try:
            current = p.current_stream()
        except Exception as exc:  # noqa: BLE001 - no stream to order: the host waits instead
            synchronize_all(p)
            failed = exc
        except BaseException:  # KeyboardInterrupt: order first, then re-raise
            synchronize_all(p)
            raise
        else:  # a wait that raises makes the host wait; a BaseException after it did
            failed = order_after(p, current, self._unsettled)
        if failed is not None:  # the host waited for everything
            self._unsettled = ()
            self.reporter.fallback("settle", failed)

    # Publishing through the fence. The fence fails closed on its own; these guard a fence that
    # raises anyway: the step then publishes nothing, and ``last_step.policy`` says so.

    def _before_replay(self, release: BucketRelease) -> bool:
        """Whether the fence began the step: False when it raised (reported; the mailbox is
        empty and the step must publish nothing)."""
        try:
            self._fence_step = self.fence.before_replay(release)
        except Exception as exc:  # noqa: BLE001 - fail closed, never an earlier release
            self._publish_failed(exc)
            return False
        return True

    def _after_replay(self, release: BucketRelease) -> WarReadDonePolicy:
        try:  # the step's token: the fence checked the owner thread in before_replay
            self.fence.after_replay(release, step=self._fence_step)
        except Exception as exc:  # noqa: BLE001 - fail closed, never an earlier release
            return self._publish_failed(exc)
        return self.fence.published

    def _publish_failed(self, exc: Exception) -> WarReadDonePolicy:
        self._discard()  # before the report: under ``-W error`` the warning raises
        self.reporter.fallback(
            "publish",
            exc,
            f"publishing the read-done event failed ({exc!r}); using the coarse barrier",
        )
        return NONE

    def _discard(self) -> None:
        """Empty the mailbox so this step's scheduler read finds nothing (coarse)."""
        try:
            read_done = self.fence.take()
        except Exception:  # noqa: BLE001 - take() failing leaves nothing to take: coarse too
            return
        if read_done is not None:
            read_done.slot.taken = False  # never handed to a barrier

    def _done(
        self,
        size: int,
        bucket: int | None,
        policy: WarReadDonePolicy,
        facts: dict[str, object] | None = None,
        decided: WarReadDonePolicy | None = None,
    ) -> None:
        self.last_step = StepInfo(self._step_index, size, bucket, policy, facts, decided)
        self._step_index += 1

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} mode={self.mode.label} "
            f"buckets={list(self.buckets)} captured={sorted(self._captured)}>"
        )
