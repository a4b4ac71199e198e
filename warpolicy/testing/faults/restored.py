"""An engine that saves its graphs and steps restored copies of them, as a fault-matrix subject.

`RestoredCaptureEngine` is `OwnedCaptureEngine` plus graph persistence: after capturing each
bucket through the engine API it saves where the read-done node sits (`ReadDoneCapture.save`,
through its JSON form, as a file would hold it), clones each graph with fresh private events
(``Platform.clone_graph(private_events=True)``: what a persistence library's load leaves, the
node recording an event nobody waits on) and restores each clone through
`ReadDoneCapture.restore`; every step then replays the restored clone and publishes what the
restore decided. So every fault the matrix injects into the platform (the clone, the walk, the
rebind, the self-check, the instantiation), the policy or an observer lands inside the
restore path, and the oracle judges the restored graphs' releases.

`TrustsSavedRelease` is its positive control: an engine that keeps publishing each bucket's
capture-time release (the original graph's event) for the restored clone, as an engine does
when nothing carries the release point across a restore: the clone never records that event.
"""

from __future__ import annotations

import json
from typing import Any

from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.owned_capture import BucketOutcome, ReadDoneCapture
from warpolicy.testing.faults.owned import EngineWrapper, OwnedCaptureEngine


class RestoredCaptureEngine(OwnedCaptureEngine):
    """Captures, saves, clones with private events, restores; steps replay the clones."""

    keep_graphs = True  # a graph is saved and cloned from its raw graph

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.name = "restored"
        #: the captured graphs (the clones use their memory) and their capture-time outcomes
        self.originals: dict[int, Any] = {}
        self.captured_outcomes: dict[int, BucketOutcome] = {}

    def capture(self) -> None:
        super().capture()  # the engine's own capture; every bucket decided by `finish`
        p = self.platform
        originals, captured = self.graphs, self.outcomes
        # nothing publishes until a bucket is restored: a failure below leaves it coarse
        self.graphs, self.outcomes = {}, {}
        self.originals, self.captured_outcomes = originals, captured
        capture = ReadDoneCapture(p, self.cell, self.fence, observers=self.observers)
        saved = {
            bucket: _persisted(capture.save(g, captured[bucket])) for bucket, g in originals.items()
        }
        graphs: dict[int, Any] = {}
        outcomes: dict[int, BucketOutcome] = {}
        for bucket in sorted(originals, reverse=True):
            clone = p.clone_graph(originals[bucket], private_events=True)
            outcomes[bucket] = capture.restore(bucket, clone, saved[bucket], self._shared)
            graphs[bucket] = clone
        p.synchronize()
        self.graphs, self.outcomes = graphs, outcomes


def _persisted(saved: SavedAnchors | None) -> SavedAnchors | None:
    """What a file round trip gives back."""
    if saved is None:
        return None
    return SavedAnchors.from_json(json.dumps(saved.to_json()))


class TrustsSavedRelease(EngineWrapper):
    """An engine that publishes each bucket's capture-time release for its restored clone."""

    engine: RestoredCaptureEngine

    def capture(self) -> None:
        self.engine.capture()
        kept = self.engine.captured_outcomes
        self.engine.outcomes = {b: kept[b] for b in self.engine.outcomes if b in kept}


class RestoringRunner:
    """A warpolicy runner whose every capture is followed by a save and a restore: each captured
    graph cloned with private events and installed through `GraphRunner.restore`, so its steps
    replay the restored clones (the runners' restore transaction under the matrix's faults)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.fence = runner.fence
        self.platform = runner.platform
        self.model = runner.model
        self.name, self.mode = runner.name, runner.mode

    @property
    def last_step(self) -> Any:
        return self.runner.last_step

    def capture(self) -> None:
        self.runner.capture()
        saved = {b: _persisted(s) for b, s in self.runner.save().items()}
        clones = {
            bucket: self.platform.clone_graph(captured.graph, private_events=True)
            for bucket, captured in self.runner.captured.items()
        }
        self.runner.restore(clones, saved)

    def run(self, batch: Any) -> Any:
        return self.runner.run(batch)


__all__ = ["RestoredCaptureEngine", "RestoringRunner", "TrustsSavedRelease"]
