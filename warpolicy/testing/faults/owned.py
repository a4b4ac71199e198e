"""An engine that owns its capture, as a subject of the fault matrix.

`OwnedCaptureEngine` is ``examples/owned_capture.py``'s ``CudaGraphRunner`` on the harness's
model: it warms up, captures one graph per bucket itself through the platform, with one
`ReadDoneCapture` per capture, ``BucketCapture.mark`` right after the in-graph prep and
``BucketCapture.finish`` after each capture (the bucket's release decided there), and its
steps publish through its own `ReadDoneFence`. Everything on the release path is
`warpolicy.runtime.owned_capture`'s; the engine's own code is only the loop around it, so a
fault the matrix injects into the platform, the policy, the model or an observer lands inside
the engine API, as it would in an engine adopting it.

It is a `Runner` as `OverlapLoop` uses one, so the scenario steps it through the same loop
(and the same scheduler writes) as the runners' scenarios.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.graphwalk import BufferRange
from warpolicy.runtime.observers import NO_OBSERVERS, Observers
from warpolicy.runtime.owned_capture import (
    BucketOutcome,
    ReadDoneCapture,
    ReadDoneFence,
    cell_policy,
)
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.runners.protocols import CapturedBucket, StepInfo
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
        placement: Optional[str] = None,
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
        self.last_step: Optional[StepInfo] = None

    @property
    def captured(self) -> Mapping[int, CapturedBucket]:
        return {}  # the engine keeps its own graphs: nothing warpolicy captured

    @property
    def is_captured(self) -> bool:
        return bool(self.graphs)

    def policy_for(self, bucket: Optional[int] = None) -> WarReadDonePolicy:
        outcome = self.outcomes.get(bucket) if bucket is not None else None
        return outcome.policy if outcome is not None else WarReadDonePolicy.NONE

    def _body(self, bucket: int, mark: Optional[Callable[[], Any]]) -> Any:
        self.model.graph_prep(bucket)
        if mark is not None:
            mark()
        return self.model.forward(bucket)

    def capture(self) -> None:
        p = self.platform
        # a capture that fails part-way leaves no bucket of the last one behind
        self.graphs, self.outcomes = {}, {}
        buckets = sorted(self.model.bucket_sizes(self.mode))
        main, side = p.current_stream(), p.new_stream()
        p.wait_stream(side, main)
        with p.stream(side):
            for bucket in buckets:
                self._body(bucket, None)
        p.wait_stream(main, side)
        p.synchronize()
        capture = ReadDoneCapture(p, self.cell, self.fence, observers=self.observers)
        pool = p.graph_pool()
        graphs: dict[int, Any] = {}
        outcomes: dict[int, BucketOutcome] = {}
        for bucket in reversed(buckets):
            begun = capture.begin(bucket)
            graph = p.new_graph(keep_graph=begun.keep_graph or self.keep_graphs)
            p.capture_callable(graph, functools.partial(self._body, bucket, begun.mark), pool=pool)
            outcomes[bucket] = begun.finish(graph, self._shared)
            graphs[bucket] = graph
        p.synchronize()
        self.graphs, self.outcomes = graphs, outcomes

    def run(self, batch: Any) -> Any:
        """One captured step (a batch larger than every bucket raises: the engine's choice)."""
        size = self.model.batch_size(batch)
        bucket = min(b for b in self.graphs if b >= size)
        self.model.host_prep(batch, bucket)
        release = self.outcomes[bucket].release
        self.fence.before_replay(release)
        self.platform.replay(self.graphs[bucket])
        self.fence.after_replay(release)
        return (self.name, bucket)
