"""The capture transaction: warm-up, then one graph per bucket, each with one release decision.

`CaptureTransaction.run` returns every bucket fresh and decided, or raises; the runner keeps
the result only when it returns (otherwise it drops every graph and stays coarse until a
capture succeeds). Inside it:

1. every bucket is prepared, then warmed up eagerly on a side stream; the current stream joins
   the side stream and the host synchronizes in ``finally`` blocks that also run for
   ``KeyboardInterrupt`` (a join that fails makes the host wait for everything instead);
2. the graph-walk probe runs once when a walk is needed (a probe that raises is a doubt);
3. per bucket, largest first: a fresh external event (`ReadDoneFence.prepare`), the capture
   (marker placement: ``graph_prep -> plant -> forward``; derived placement and the draft
   extend's: ``graph_prep -> forward``), then the self-check or the derived plant
   (`warpolicy.runtime.placement`) and the instantiation of a kept graph, gathered as
   `BucketFacts` and decided by `decide_bucket` from the `ModePolicies` resolved once;
4. the host synchronizes (``finally``).

A doubt (anything that raised or could not be confirmed: the plant, the check, the probe, the
instantiation, the event) makes that bucket publish nothing; a verified refutation (a late
reader, no reader found, no external events) gives it the unplanted policy. Both are reported to
``warpolicy_on_demotion`` every time (one warning per bucket).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import attrs

from warpolicy.errors import WarpolicyError
from warpolicy.registry.decision import Context, Decision, Reason
from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime.fence import ReadDoneFence
from warpolicy.runtime.observers import Reporter
from warpolicy.runtime.placement import (
    PlacementOutcome,
    Verdict,
    check_bucket_marker,
    instantiate_kept,
    plant_bucket_derived,
    walk_unavailable,
)
from warpolicy.runtime.platforms import (
    EventHandle,
    GraphHandle,
    Platform,
    PoolHandle,
    StreamHandle,
)
from warpolicy.runtime.policy import ExplainedPolicy, RunnerPolicy
from warpolicy.runtime.release import (
    BucketFacts,
    BucketRelease,
    ModePolicies,
    decide_bucket,
)
from warpolicy.runtime.runners.protocols import CapturedBucket, ModelAdapter

#: Values of the runner's ``self_check`` option.
SELF_CHECK_MODES = ("warn", "off", "error")


class SelfCheckError(WarpolicyError):
    """``self_check="error"``: a captured marker failed the self-check (or it could not run)."""


@attrs.frozen
class CaptureReport:
    """What the capture of one bucket did about its release point.

    ``walked``: a graph walk ran (derived placement, or the marker self-check); ``ok``: it
    succeeded and, for the self-check, found no late reader (None when no walk ran);
    ``walk_ms``: what the walk cost, 0 when none ran; ``detail``: one line (the plant or check
    described, or why it failed or was skipped); ``policy``: what the bucket publishes.
    """

    bucket: int
    placement: Placement
    planted: bool
    walked: bool
    ok: Optional[bool]
    walk_ms: float
    detail: str
    policy: Optional[WarReadDonePolicy] = None


@attrs.frozen
class CaptureResult:
    captured: dict[int, CapturedBucket]
    reports: dict[int, CaptureReport]
    eager: BucketRelease


@attrs.frozen
class _Walk:
    """The walk probe's answer, asked once per capture."""

    needed: bool
    unavailable: Optional[str] = None  # cleanly cannot walk: why
    failed: Optional[str] = None  # the probe raised: a doubt

    @property
    def available(self) -> bool:
        return self.needed and self.unavailable is None and self.failed is None


class CaptureTransaction:
    """One capture of every bucket of a runner (see the module docstring); `run` once."""

    def __init__(
        self,
        *,
        name: str,
        mode: ForwardMode,
        platform: Platform,
        model: ModelAdapter,
        fence: ReadDoneFence,
        reporter: Reporter,
        policy: RunnerPolicy,
        policies: ModePolicies,
        buckets: tuple[int, ...],
        placement: Placement,
        marker: bool,
        self_check: str,
        keep_graphs: bool,
        outputs: dict[int, Any],
    ) -> None:
        self.name = name
        self.mode = mode
        self.platform = platform
        self.model = model
        self.fence = fence
        self.reporter = reporter
        self.policy = policy
        self.policies = policies
        self.buckets = buckets
        self.placement = placement
        self.marker = marker
        self.self_check = self_check
        self.keep_graphs = keep_graphs
        self.outputs = outputs
        self.derived = placement is Placement.DERIVED
        #: streams with capture-time work (the warm-up's) the host has not yet waited for: a
        #: runner whose transaction failed orders every later step after them
        self.unsettled: tuple[StreamHandle, ...] = ()

    # -- the transaction -----------------------------------------------------------------------

    def run(self) -> CaptureResult:
        """Warm up and capture every bucket; raises (leaving nothing usable) on any failure."""
        p = self.platform
        try:
            for bucket in self.buckets:
                self.model.prepare_bucket(bucket)
            self._warm_up()
            walk = self._probe()
            pool = p.graph_pool()
            captured: dict[int, CapturedBucket] = {}
            reports: dict[int, CaptureReport] = {}
            for bucket in reversed(self.buckets):  # largest first: smaller graphs reuse its pool
                captured[bucket], reports[bucket] = self._capture_bucket(bucket, pool, walk)
        finally:
            p.synchronize()  # what the captures enqueued (and the warm-up) is done
            self.unsettled = ()
        eager = decide_bucket(self.policies, BucketFacts(None), self.name)
        self.notify_decision(eager, eager=True, planted=False)
        return CaptureResult(captured, reports, eager)

    def _warm_up(self) -> None:
        """One eager pass per bucket on a side stream (cuBLAS, the allocator), as torch asks.

        The current stream joins the side stream in ``finally`` (for ``KeyboardInterrupt`` too),
        so later work (an eager step, the scheduler's barrier on it) is ordered after what the
        warm-up read; if the join fails, the host waits for everything instead.
        """
        p = self.platform
        main = p.current_stream()
        side = p.new_stream()
        self.unsettled = (main, side)
        p.wait_stream(side, main)
        try:
            with p.stream(side):
                for bucket in self.buckets:
                    self.model.graph_prep(bucket)
                    self.model.forward(bucket)
        finally:
            try:
                p.wait_stream(main, side)
            except BaseException:
                p.synchronize()  # the host waits for everything instead
                raise
        p.synchronize()

    def _probe(self) -> _Walk:
        """Ask once whether the platform can walk its graphs, when a walk is needed: an
        ``in_graph`` answer for planted graphs with derived placement, or with the marker and
        the self-check on."""
        wants_in_graph = self.policies.planted is IN_GRAPH
        if self.derived:
            needed = wants_in_graph
        else:
            needed = self.marker and wants_in_graph and self.self_check != "off"
        if not needed:
            return _Walk(False)
        unavailable, failed = walk_unavailable(self.platform)
        walk = _Walk(True, unavailable, failed)
        if not self.derived and walk.unavailable is not None and self.self_check == "error":
            raise SelfCheckError(
                f"{self.name} runner: self_check='error' but the marker self-check cannot "
                f"run: {walk.unavailable}"
            )
        return walk

    # -- one bucket -------------------------------------------------------------------------------

    def _capture_bucket(
        self, bucket: int, pool: PoolHandle, walk: _Walk
    ) -> tuple[CapturedBucket, CaptureReport]:
        event, doubt = self._new_event()
        planted: list[Optional[EventHandle]] = []
        fence, model, outputs = self.fence, self.model, self.outputs
        plants = self.marker and not self.derived and event is not None

        def body() -> None:
            model.graph_prep(bucket)
            if plants:
                node = fence.plant(event)
                if not planted:  # what the real capture did, not a replay's re-run
                    planted.append(node)
            outputs[bucket] = model.forward(bucket)

        kept = self.keep_graphs or walk.available
        graph = self.platform.new_graph(keep_graph=kept)
        self.platform.capture_callable(graph, body, pool=pool)

        facts, outcome = self._facts(bucket, graph, event, doubt, planted, walk)
        if kept and facts.doubt is None:
            failed = instantiate_kept(self.platform, graph)
            if failed is not None:
                facts = BucketFacts(bucket, doubt=f"bucket {bucket}: {failed}")
        elif kept:
            instantiate_kept(self.platform, graph)  # the graph must still replay
        release = decide_bucket(self.policies, facts, self.name)
        report = self._report(bucket, release, facts, outcome)
        if facts.doubt is not None or (facts.refuted is not None and outcome is not None):
            self.reporter.demotion(self.name, bucket, self._demotion_text(bucket, release, facts))
        self.notify_decision(release, eager=False, planted=facts.event is not None)
        return CapturedBucket(bucket, graph, release, recorded=event), report

    def _new_event(self) -> tuple[Optional[EventHandle], Optional[str]]:
        """A fresh external event for this bucket, or (None, why it is a doubt)."""
        if not self.platform.external_events_supported():
            return None, None
        if not self.derived and not self.marker:
            return None, None  # no node on this path (the draft extend's marker placement)
        event = self.fence.prepare()
        if event is None:
            return None, "creating or seeding the read-done event failed"
        return event, None

    def _facts(
        self,
        bucket: int,
        graph: GraphHandle,
        event: Optional[EventHandle],
        doubt: Optional[str],
        planted: list[Optional[EventHandle]],
        walk: _Walk,
    ) -> tuple[BucketFacts, Optional[PlacementOutcome]]:
        """What the capture of ``bucket`` verifiably did (and the walk's outcome, if any)."""
        where = f"bucket {bucket}: "
        if doubt is not None:
            return BucketFacts(bucket, doubt=where + doubt), None
        if event is None:
            why = (
                "no in-graph marker on this path"
                if self.platform.external_events_supported()
                else f"platform {self.platform.name!r} has no external events"
            )
            return BucketFacts(bucket, refuted=why), None
        if self.derived:
            return self._derived_facts(bucket, graph, event, walk)
        node = planted[0] if planted else None
        if node is None:
            return BucketFacts(bucket, doubt=where + "the plant failed (no confirmed node)"), None
        if not walk.needed:
            return BucketFacts(bucket, event=node), None
        if walk.failed is not None:
            return BucketFacts(bucket, doubt=where + walk.failed), None
        if walk.unavailable is not None:
            self._skipped_check(walk.unavailable)
            return BucketFacts(bucket, event=node), None
        outcome = check_bucket_marker(self.platform, graph, self.model.shared_buffers, node)
        if outcome.verdict is Verdict.CONFIRMED:
            return BucketFacts(bucket, event=node), outcome
        if self.self_check == "error":
            raise SelfCheckError(f"{self.name} runner: bucket {bucket}: {outcome.detail}")
        if outcome.verdict is Verdict.REFUTED:
            return BucketFacts(bucket, refuted=where + outcome.detail), outcome
        return BucketFacts(bucket, doubt=where + outcome.detail), outcome

    def _derived_facts(
        self, bucket: int, graph: GraphHandle, event: EventHandle, walk: _Walk
    ) -> tuple[BucketFacts, Optional[PlacementOutcome]]:
        where = f"bucket {bucket}: "
        if not walk.needed:  # the planted answer is not in_graph: no node wanted
            return BucketFacts(bucket, refuted="derived placement not needed"), None
        if walk.failed is not None:
            return BucketFacts(bucket, doubt=where + walk.failed), None
        if walk.unavailable is not None:
            outcome = PlacementOutcome(Verdict.REFUTED, walk.unavailable)
            return BucketFacts(bucket, refuted=where + walk.unavailable), outcome
        outcome = plant_bucket_derived(self.platform, graph, self.model.shared_buffers, event)
        if outcome.verdict is Verdict.CONFIRMED:
            return BucketFacts(bucket, event=event), outcome
        if outcome.verdict is Verdict.REFUTED:
            return BucketFacts(bucket, refuted=where + outcome.detail), outcome
        return BucketFacts(bucket, doubt=where + outcome.detail), outcome

    def _skipped_check(self, reason: str) -> None:
        """The self-check cannot run here: on CUDA say so once (elsewhere there is no raw
        graph, so nothing is lost)."""
        if self.platform.name == "cuda":
            self.reporter.warn("self-check-unavailable", f"marker self-check skipped: {reason}")

    # -- reporting --------------------------------------------------------------------------------

    def _report(
        self,
        bucket: int,
        release: BucketRelease,
        facts: BucketFacts,
        outcome: Optional[PlacementOutcome],
    ) -> CaptureReport:
        walked = outcome is not None and outcome.walked
        ok = None if outcome is None else outcome.confirmed
        if facts.doubt is not None:
            detail = facts.doubt
        elif facts.refuted is not None:
            detail = facts.refuted
        elif outcome is not None:
            detail = outcome.detail
        else:
            detail = "derived" if self.derived else "marker after graph_prep"
        return CaptureReport(
            bucket,
            self.placement,
            release.planted,
            walked,
            ok,
            outcome.walk_ms if outcome is not None else 0.0,
            detail,
            release.policy,
        )

    def _demotion_text(self, bucket: int, release: BucketRelease, facts: BucketFacts) -> str:
        if facts.doubt is not None:
            return f"{facts.doubt}; bucket {bucket} publishes nothing (the coarse barrier)"
        if self.derived:
            return (
                f"bucket {bucket}: derived placement left the bucket unplanted "
                f"({facts.refuted}); it publishes no earlier than {release.policy.label}"
            )
        return f"{facts.refuted}; bucket {bucket} demoted to {release.policy.label}"

    def notify_decision(self, release: BucketRelease, *, eager: bool, planted: bool) -> None:
        notify_decision(self.reporter, self.policy, self.mode, release, eager, planted)


def notify_decision(
    reporter: Reporter,
    policy: RunnerPolicy,
    mode: ForwardMode,
    release: BucketRelease,
    eager: bool,
    planted: bool,
) -> None:
    """Tell the decision observers what a bucket (or the eager path) publishes, with the
    reasons (``where="runner:<name>"``; explaining never changes the release)."""
    if not reporter.observers.on_decision:
        return
    decision = explain(policy, release.source, mode, release, eager, planted, reporter.warn)
    if decision is not None:
        reporter.decision(decision, f"runner:{release.source}")


def explain(
    policy: RunnerPolicy,
    name: str,
    mode: ForwardMode,
    release: BucketRelease,
    eager: bool,
    planted: bool,
    warn: Callable[[str, str], None],
) -> Optional[Decision]:
    """The `Decision` behind ``release``: the policy's own explanation when it has one, with
    the runtime's override added when the release differs (a doubt, a failed lookup)."""
    try:
        if isinstance(policy, ExplainedPolicy):
            decision = policy.decision(mode, eager, planted)
        else:
            ctx = Context(name, mode, eager=eager, planted=planted)
            reason = Reason(
                "policy-callable", "given by the engine's policy callable", release.policy
            )
            decision = Decision(release.policy, ctx, (reason,))
        if decision.policy != release.policy:  # the runtime moved it (later, never earlier)
            why = Reason("runtime-capture", release.reason or "capture-time facts", release.policy)
            decision = attrs.evolve(
                decision, policy=release.policy, reasons=(*decision.reasons, why)
            )
    except Exception as exc:  # noqa: BLE001 - explaining never changes the policy
        warn("explain", f"explaining the decision failed ({exc!r})")
        return None
    return decision


__all__ = [
    "SELF_CHECK_MODES",
    "CaptureReport",
    "CaptureResult",
    "CaptureTransaction",
    "SelfCheckError",
    "explain",
    "notify_decision",
]
