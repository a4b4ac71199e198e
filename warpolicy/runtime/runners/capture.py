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
from typing import Any

import attrs

from warpolicy.registry.vocabulary import ForwardMode, Placement
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
from warpolicy.runtime.platforms import Platform, PoolHandle, StreamHandle
from warpolicy.runtime.policy import RunnerPolicy
from warpolicy.runtime.release import BucketRelease, ModePolicies
from warpolicy.runtime.runners.protocols import CapturedBucket, ModelAdapter


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
    ) -> None:
        self.name = name
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
            pool = p.graph_pool()
            captured: dict[int, CapturedBucket] = {}
            reports: dict[int, CaptureReport] = {}
            for bucket in reversed(self.buckets):  # largest first: smaller graphs reuse its pool
                captured[bucket], reports[bucket] = self._capture_bucket(capture, bucket, pool)
        finally:
            p.synchronize()  # what the captures enqueued (and the warm-up) is done
            self.unsettled = ()
        return CaptureResult(captured, reports, capture.eager())

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

        kept = self.keep_graphs or capture.keep_graphs
        graph = self.platform.new_graph(keep_graph=kept)
        # a walk will run: note which Python line launched each node, so the self-check and the
        # derived plant name their readers as kernel (file.py:line)
        recorder = recorder_for(self.platform.name) if capture.keep_graphs else None
        self.platform.capture_callable(
            graph, functools.partial(run_recorded, recorder, body), pool=pool
        )
        sites = recorder.sites if recorder is not None else None
        outcome = point.finish(graph, model.shared_buffers, instantiate=kept, sites=sites)
        captured = CapturedBucket(
            bucket, graph, outcome.release, recorded=outcome.recorded, batch=outcome.batch
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
