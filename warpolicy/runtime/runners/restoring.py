"""The restore transaction: a runner's buckets from restored graphs, each decided again.

`GraphRunner.save` describes where each captured bucket's read-done node sits
(`ReadDoneCapture.save`); `GraphRunner.restore(graphs, saved)` installs graphs that were cloned,
restored from a saved description or recaptured elsewhere, through `RestoreTransaction.run`:

1. the policy (resolved once, as for a capture) and one `ReadDoneCapture` (the walk probe);
2. per bucket, largest first: `ReadDoneCapture.restore` (a fresh fence event, the node found
   again by position and rebound, the self-check on the restored graph, the instantiation when
   needed, `decide_bucket`), reported like a capture (`CaptureReport.restored`);
3. the host synchronizes (``finally``).

Like a capture it is a transaction: the runner drops every graph and is coarse before it runs,
and installs the buckets only when it returns; anything raised (``KeyboardInterrupt``
included) leaves the runner coarse until a capture or a restore succeeds. A bucket with no
restored graph is not captured (its batches run eagerly); a bucket whose node cannot be found
publishes nothing (a doubt), as at capture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.owned_capture import CaptureReport, ReadDoneCapture
from warpolicy.runtime.platforms import GraphHandle
from warpolicy.runtime.release import BucketFacts, decide_classes, with_classes
from warpolicy.runtime.runners.capture import CaptureResult, CaptureTransaction
from warpolicy.runtime.runners.protocols import CapturedBucket


class RestoreTransaction:
    """One restore of a runner's buckets from ``graphs`` (by bucket) and what was ``saved``
    about each (`GraphRunner.save`; None for a bucket: nothing known, it is coarse)."""

    def __init__(
        self,
        capture: CaptureTransaction,
        graphs: Mapping[int, GraphHandle],
        saved: Mapping[int, SavedAnchors | None],
    ) -> None:
        # the capture transaction the runner would run: the same cell, fence, reporter, model
        self.like = capture
        self.graphs = dict(graphs)
        self.saved = dict(saved)

    def run(self) -> CaptureResult:
        t = self.like
        p = t.platform
        try:
            capture = ReadDoneCapture(
                p,
                t.cell,
                t.fence,
                marker=t.marker,
                self_check=t.self_check,
                reporter=t.reporter,
            )
            t._class_walk = t._probe_class_walk(capture)  # per-class checks, as at capture
            captured: dict[int, CapturedBucket] = {}
            reports: dict[int, CaptureReport] = {}
            shared = t.model.shared_buffers
            for bucket in sorted(self.graphs, reverse=True):
                graph: Any = self.graphs[bucket]
                outcome = capture.restore(bucket, graph, self.saved.get(bucket), shared)
                release = outcome.release
                if t.class_policies:  # the same verified facts decide every class
                    classes = decide_classes(t.class_policies, outcome.facts, t.name)
                    classes = t._check_classes(graph, release, classes, outcome.facts)
                    release = with_classes(release, classes)
                captured[bucket] = CapturedBucket(
                    bucket, graph, release, recorded=outcome.recorded, batch=outcome.batch
                )
                reports[bucket] = outcome.report
        finally:
            p.synchronize()
        eager = capture.eager()
        if t.class_policies:
            eager = with_classes(eager, decide_classes(t.class_policies, BucketFacts(None), t.name))
        return CaptureResult(captured, reports, eager)


__all__ = ["RestoreTransaction"]
