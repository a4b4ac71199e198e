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

Steps 2 and 3 are the engine-facing API (`warpolicy.runtime.owned_capture`: `ReadDoneCapture`,
`BucketCapture.mark` / ``finish``), which an engine that captures its own graphs calls the same
way: a doubt (anything that raised or could not be confirmed: the plant, the check, the probe,
the instantiation, the event) makes that bucket publish nothing; a verified refutation (a late
reader, no reader found, no external events) gives it the unplanted policy. Both are reported to
``warpolicy_on_demotion`` every time (one warning per bucket).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs

from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode, Placement
from warpolicy.runtime.batch import NO_PLANS, CellPlans
from warpolicy.runtime.fence import ReadDoneFence
from warpolicy.runtime.graphwalk.launch_sites import recorder_for, run_recorded
from warpolicy.runtime.observers import Reporter
from warpolicy.runtime.owned_capture import (
    SELF_CHECK_MODES,
    CaptureReport,
    CellPolicy,
    ReadDoneCapture,
    SelfCheckError,
    explain,
    notify_decision,
)
from warpolicy.runtime.placement import Verdict, check_bucket_marker, walk_unavailable
from warpolicy.runtime.platforms import Platform, PoolHandle, StreamHandle, is_simulated
from warpolicy.runtime.policy import RunnerPolicy
from warpolicy.runtime.release import (
    BucketFacts,
    BucketRelease,
    ModePolicies,
    decide_bucket,
    decide_classes,
    with_classes,
)
from warpolicy.runtime.runners.protocols import CapturedBucket, ModelAdapter, class_buffers


@attrs.frozen
class CaptureResult:
    captured: dict[int, CapturedBucket]
    reports: dict[int, CaptureReport]
    eager: BucketRelease


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
        plans: CellPlans = NO_PLANS,
        class_policies: Mapping[str, ModePolicies] | None = None,
    ) -> None:
        self.name = name
        #: per buffer class, its policies: each bucket publishes one read-done per class
        self.class_policies = dict(class_policies or {})
        #: the class self-check's walk: (why it cannot run, why its probe failed), probed in
        #: `run` when some class answers in_graph for a marker capture
        self._class_walk: tuple[str | None, str | None] | None = None
        self.platform = platform
        self.model = model
        self.fence = fence
        self.reporter = reporter
        self.cell = CellPolicy(mode, policies, placement, policy, plans=plans)
        self.buckets = buckets
        self.marker = marker
        self.self_check = self_check
        self.keep_graphs = keep_graphs
        self.outputs = outputs
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
            capture = ReadDoneCapture(  # the walk probe runs here, once
                p,
                self.cell,
                self.fence,
                marker=self.marker,
                self_check=self.self_check,
                reporter=self.reporter,
            )
            self._class_walk = self._probe_class_walk(capture)
            pool = p.graph_pool()
            captured: dict[int, CapturedBucket] = {}
            reports: dict[int, CaptureReport] = {}
            for bucket in reversed(self.buckets):  # largest first: smaller graphs reuse its pool
                captured[bucket], reports[bucket] = self._capture_bucket(capture, bucket, pool)
        finally:
            p.synchronize()  # what the captures enqueued (and the warm-up) is done
            self.unsettled = ()
        eager = capture.eager()
        if self.class_policies:
            eager = with_classes(
                eager, decide_classes(self.class_policies, BucketFacts(None), self.name)
            )
        return CaptureResult(captured, reports, eager)

    def _probe_class_walk(self, capture: ReadDoneCapture) -> tuple[str | None, str | None] | None:
        """Whether a class's ``in_graph`` will need the marker self-check (a marker capture,
        the check not off, some class answering in_graph): then the walk's probe."""
        wanted = any(p.planted is IN_GRAPH for p in self.class_policies.values())
        if not wanted or not self.marker or capture.derived or self.self_check == "off":
            return None
        probe = walk_unavailable(self.platform)
        if probe[0] is not None and self.self_check == "error":
            raise SelfCheckError(
                f"{self.name}: self_check='error' but the class self-check cannot run: {probe[0]}"
            )
        return probe

    def _check_classes(
        self,
        graph: Any,
        release: BucketRelease,
        classes: Mapping[str, BucketRelease],
        facts: BucketFacts,
    ) -> dict[str, BucketRelease]:
        """The marker self-check per buffer class: a class released ``in_graph`` while the
        bucket's latest is later (whose own check, over every shared buffer, did not run) is
        confirmed by a walk over that class's buffers only (`ClassedModel`; a model that does
        not say which buffer is which: every shared buffer). Refuted: the class gets the
        unplanted answer; a doubt (or a failed probe): the class is coarse; the walk unavailable:
        kept, as the bucket's own check does (on CUDA said once)."""
        out = dict(classes)
        probe = self._class_walk
        if probe is None or release.policy is IN_GRAPH or facts.event is None:
            return out
        unavailable, failed = probe
        for name, class_release in classes.items():
            if class_release.policy is not IN_GRAPH:
                continue
            where = f"bucket {facts.bucket}: class {name}"
            if failed is not None:
                out[name] = decide_bucket(
                    self.class_policies[name],
                    attrs.evolve(facts, doubt=f"{where}: {failed}"),
                    self.name,
                )
                continue
            if unavailable is not None:
                if is_simulated(self.platform.device):  # its graphs re-run Python: nothing lost
                    continue
                self.reporter.warn(
                    "class self-check",
                    f"the class self-check cannot run ({unavailable}); {where} in_graph is "
                    "not checked",
                )
                continue
            outcome = check_bucket_marker(
                self.platform, graph, class_buffers(self.model, name), facts.event
            )
            if outcome.verdict is Verdict.CONFIRMED:
                continue
            if outcome.verdict is Verdict.REFUTED:
                if self.self_check == "error":
                    raise SelfCheckError(f"{self.name}: {where}: {outcome.detail}")
                refuted = attrs.evolve(facts, event=None, refuted=f"{where}: {outcome.detail}")
            else:
                refuted = attrs.evolve(facts, doubt=f"{where}: {outcome.detail}")
            out[name] = decide_bucket(self.class_policies[name], refuted, self.name)
            self.reporter.demotion(self.name, facts.bucket or 0, f"{where}: {outcome.detail}")
        return out

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

    def _capture_bucket(
        self, capture: ReadDoneCapture, bucket: int, pool: PoolHandle
    ) -> tuple[CapturedBucket, CaptureReport]:
        """Capture ``graph_prep -> marker -> forward`` (the marker only for marker placement)
        into a fresh graph, then let the engine API finish the bucket."""
        point = capture.begin(bucket)
        model, outputs = self.model, self.outputs

        def body() -> None:
            model.graph_prep(bucket)
            point.mark()  # nothing for derived placement or a body without a marker
            outputs[bucket] = model.forward(bucket)

        class_walk = self._class_walk is not None and self._class_walk == (None, None)
        kept = self.keep_graphs or capture.keep_graphs or class_walk
        graph = self.platform.new_graph(keep_graph=kept)
        # a walk will run: note which Python line launched each node, so the self-check and the
        # derived plant name their readers as kernel (file.py:line)
        recorder = recorder_for(self.platform.name) if capture.keep_graphs else None
        self.platform.capture_callable(
            graph, functools.partial(run_recorded, recorder, body), pool=pool
        )
        sites = recorder.sites if recorder is not None else None
        outcome = point.finish(graph, model.shared_buffers, instantiate=kept, sites=sites)
        release = outcome.release
        if self.class_policies:  # the same verified facts decide every class
            classes = decide_classes(self.class_policies, outcome.facts, self.name)
            classes = self._check_classes(graph, release, classes, outcome.facts)
            release = with_classes(release, classes)
        captured = CapturedBucket(
            bucket, graph, release, recorded=outcome.recorded, batch=outcome.batch
        )
        return captured, outcome.report


__all__ = [
    "SELF_CHECK_MODES",
    "CaptureReport",
    "CaptureResult",
    "CaptureTransaction",
    "SelfCheckError",
    "explain",
    "notify_decision",
]
