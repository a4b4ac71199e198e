"""An engine that owns its capture, as a subject of the fault matrix.

`OwnedCaptureEngine` is ``examples/owned_capture.py``'s ``CudaGraphRunner`` on the harness's
model, written as ``docs/integrating.md`` says: inside `capturing` it warms up through
`warm_up` (a side stream, joined and synchronized on any exit), captures one graph per bucket
itself through the platform, with one `ReadDoneCapture` per capture, ``BucketCapture.mark``
right after the in-graph prep and ``BucketCapture.finish`` after each capture (the bucket's
release decided there), and swaps the complete set in; its steps publish through its own
`ReadDoneFence`, and a batch no graph holds (none captured yet, a capture that failed, a batch
larger than every bucket) is served eagerly under `eager_release`, so the scheduler writes and
the oracle sees every step. Everything on the release path is
`warpolicy.runtime.owned_capture`'s; the engine's own code is only the loop around it, so a
fault the matrix injects into the platform, the policy, the model or an observer lands inside
the engine API, as it would in an engine adopting it.

It is a `Runner` as `OverlapLoop` uses one, so the scenario steps it through the same loop
(and the same scheduler writes) as the runners' scenarios.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.graphwalk import BufferRange
from warpolicy.runtime.observers import NO_OBSERVERS, Observers
from warpolicy.runtime.owned_capture import (
    BucketOutcome,
    ReadDoneCapture,
    ReadDoneFence,
    capturing,
    cell_policy,
    eager_release,
    warm_up,
)
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.release import BucketRelease
from warpolicy.runtime.runners.protocols import CapturedBucket, StepInfo
from warpolicy.testing.faults.harness import Harness
from warpolicy.testing.faults.model import HarnessModel


class OwnedCaptureEngine:
    """Decode graphs captured by the engine; warpolicy decides each bucket's release."""

    mode = ForwardMode.DECODE
    #: capture every graph kept (a subclass that saves and restores them needs the raw graph)
    keep_graphs = False

    def __init__(
        self,
        model: HarnessModel,
        policy: Callable[[ForwardMode, bool, bool], WarReadDonePolicy],
        platform: Platform,
        *,
        placement: str | None = None,
        observers: Observers = NO_OBSERVERS,
    ) -> None:
        self.name = "owned"
        self.model = model
        self.platform = platform
        self.observers = observers
        # resolved once, as `resolve_cell` does for an engine holding a registry
        self.cell = cell_policy(policy, self.mode, placement=placement)
        self.fence = ReadDoneFence(platform, name=self.name, observers=observers)
        # what the engine hands `finish`: the scheduler-shared buffers' address ranges
        self._shared = tuple(
            BufferRange(name, buffer.address, buffer.address + buffer.nbytes)
            for name, buffer in model.shared_buffers.items()
        )
        #: the engine's graphs and what `BucketCapture.finish` decided for each, by bucket
        self.graphs: dict[int, Any] = {}
        self.outcomes: dict[int, BucketOutcome] = {}
        self.last_step: StepInfo | None = None
        self._eager: BucketRelease | None = None

    @property
    def captured(self) -> Mapping[int, CapturedBucket]:
        return {}  # the engine keeps its own graphs: nothing warpolicy captured

    @property
    def is_captured(self) -> bool:
        return bool(self.graphs)

    def policy_for(self, bucket: int | None = None) -> WarReadDonePolicy:
        if bucket is None:
            return self._eager_release().policy
        outcome = self.outcomes.get(bucket)
        return outcome.policy if outcome is not None else WarReadDonePolicy.NONE

    def _body(self, bucket: int, mark: Callable[[], Any] | None) -> Any:
        self.model.graph_prep(bucket)
        if mark is not None:
            mark()
        return self.model.forward(bucket)

    def capture(self) -> None:
        p = self.platform
        buckets = sorted(self.model.bucket_sizes(self.mode))
        graphs: dict[int, Any] = {}
        outcomes: dict[int, BucketOutcome] = {}
        with capturing(p):
            with warm_up(p, observers=self.observers):
                for bucket in buckets:
                    self._body(bucket, None)
            capture = ReadDoneCapture(p, self.cell, self.fence, observers=self.observers)
            pool = p.graph_pool()
            for bucket in reversed(buckets):
                begun = capture.begin(bucket)
                graph = p.new_graph(keep_graph=begun.keep_graph or self.keep_graphs)
                p.capture_callable(
                    graph, functools.partial(self._body, bucket, begun.mark), pool=pool
                )
                outcomes[bucket] = begun.finish(graph, self._shared)
                graphs[bucket] = graph
        self.graphs, self.outcomes = graphs, outcomes  # complete: swap the set in

    def _eager_release(self) -> BucketRelease:
        if self._eager is None:
            self._eager = eager_release(self.cell, self.fence, observers=self.observers)
        return self._eager

    def run(self, batch: Any) -> Any:
        """One step: the smallest captured bucket that holds the batch, else eagerly."""
        size = self.model.batch_size(batch)
        fits = [b for b in self.graphs if b >= size]
        if not fits:  # no graph holds it: served eagerly, as before any capture
            release = self._eager_release()
            self.model.prepare_bucket(size)
            self.model.host_prep(batch, size)
            self.fence.before_replay(release)
            self._body(size, None)
            self.fence.after_replay(release)
            self.last_step = StepInfo(self.fence.step, size, None, self.fence.published)
            return (self.name, None)
        bucket = min(fits)
        self.model.host_prep(batch, bucket)
        release = self.outcomes[bucket].release
        self.fence.launch(release, self.platform.replay, self.graphs[bucket])
        self.last_step = StepInfo(self.fence.step, size, bucket, self.fence.published)
        return (self.name, bucket)


class EngineWrapper:
    """An `OwnedCaptureEngine` behind a wrapper that carries a known bug in its `capture` (a
    positive control's engine, which defines ``capture``): the engine's surface as the scenario
    reads it, its steps delegated unchanged."""

    def __init__(self, harness: Harness, engine: OwnedCaptureEngine) -> None:
        self.engine = engine
        self.name, self.mode = engine.name, engine.mode
        self.fence, self.platform = engine.fence, engine.platform
        self.model, self.observers = engine.model, engine.observers

    @property
    def last_step(self) -> Any:
        return self.engine.last_step

    def run(self, batch: Any) -> Any:
        return self.engine.run(batch)
