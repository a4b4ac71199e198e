"""The WAR canary in an engine that owns its capture (`warpolicy.runtime.owned_capture`): the
engine captures its graph through `ReadDoneCapture`, publishes through its own fence and
barrier, and drives a `CanarySession` by hand. A seeded race (the next step's writes land at the
in-graph release, on the simulated platform) is caught at the first step, the engine's release
is swapped for a coarse one through ``on_demote``, and no later step is corrupted."""

from __future__ import annotations

from typing import Any

import torch
from canary_support import NamedFixed, TableModel

from warpolicy.registry.vocabulary import IN_GRAPH, NONE, ForwardMode
from warpolicy.runtime.canary import Canary, CanaryConfig
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.owned_capture import ReadDoneCapture, cell_policy
from warpolicy.testing import sim_impl, sim_runtime

DECODE = ForwardMode.DECODE
BATCH = [1.0, 2.0]


class Engine:
    """An engine with its own graph of bucket 2 (``race``: the writes land at the release)."""

    def __init__(self, race: bool, canary: bool) -> None:
        rt = sim_runtime()
        self.p = p = rt.platform
        self.model = model = TableModel(late=True, buckets=(2,))
        model.prepare_bucket(2)
        model.graph_prep(2)  # warm-up, eager
        model.forward(2)
        self.fence = ReadDoneFence(p, name="engine", observers=rt.observers)
        capture = ReadDoneCapture(
            p, cell_policy(NamedFixed("in_graph"), DECODE), self.fence, self_check="off"
        )
        bucket = capture.begin(2)
        self.graph = p.new_graph(keep_graph=bucket.keep_graph)
        self.out: dict[int, torch.Tensor] = {}

        def body() -> None:
            model.graph_prep(2)
            bucket.mark()
            self.out[2] = model.forward(2)

        p.capture_callable(self.graph, body)
        self.releases = {2: bucket.finish(self.graph, model.shared_buffers).release}
        self.barrier = SchedulerBarrier(p, observers=rt.observers)
        self.sched, self.fwd = p.new_stream(), p.current_stream()
        self.canary = Canary(p, CanaryConfig(rate=1.0), observers=rt.observers) if canary else None
        self.session = None
        if self.canary is not None:
            self.session = self.canary.session(
                "engine", DECODE, backend="mine", spec="none", on_demote=self.make_coarse
            )
        self.race = race
        self._armed: Any = None  # (event id, the writes) while a seeded race is armed
        sim_impl(p).listeners.append(self._on_entry)
        model.write_rows(0)

    def make_coarse(self, bucket, reason):
        self.releases[bucket] = self.session.release_for(bucket, self.releases[bucket])

    def rerun(self):
        self.p.replay(self.graph)
        return self.out[2]

    def _on_entry(self, entry):
        armed = self._armed
        fired = armed is not None and entry[0] == "record" and entry[1] == armed[0]
        if fired and entry[3] == "in_graph":
            self._armed = None
            armed[1]()

    def step(self, k: int) -> torch.Tensor:
        p, model, session = self.p, self.model, self.session
        written: list[bool] = []

        def write():
            if not written:
                written.append(True)
                model.write_rows(k + 1)

        due = session.step() if session is not None else False
        release = self.releases[2]
        model.host_prep(BATCH, 2)
        sample: Any = None
        if due and session is not None:
            spec = lambda: model.canary_spec(DECODE, 2, BATCH)  # noqa: E731
            sample = session.begin(2, k, release, spec, model.shared_buffers, self.rerun)
        if self.race and release.event is not None:
            self._armed = (release.event.id, write)  # the writes land at the release
        self.fence.before_replay(release)
        p.replay(self.graph)
        self.fence.after_replay(release)
        self._armed = None
        if sample is not None and session is not None:
            session.observe(sample, self.out[2])
        self.barrier.apply(self.sched, self.fwd, self.fence.take())
        with p.stream(self.sched):
            write()
            if session is not None:
                session.check()
        return self.out[2].clone()


def test_an_engine_owning_its_capture_catches_the_race_and_swaps_its_release():
    reference = Engine(race=False, canary=False)
    ref = [reference.step(k) for k in range(5)]
    engine = Engine(race=True, canary=True)
    outs = [engine.step(k) for k in range(5)]
    corrupted = [k for k, (a, b) in enumerate(zip(outs, ref)) if not torch.equal(a, b)]
    assert corrupted == [0]  # the race fired at step 0, was caught, and never again
    (violation,) = engine.canary.violations
    assert violation.step == 0 and violation.cell.backend == "mine"
    assert engine.releases[2].policy is NONE and "canary" in engine.releases[2].reason
    assert engine.canary.stats["checked"] == 1  # a coarse release is never sampled


def test_without_a_race_every_step_is_checked_and_nothing_differs():
    engine = Engine(race=False, canary=True)
    for k in range(6):
        engine.step(k)
    assert engine.canary.stats["checked"] == 6 and not engine.canary.violations
    assert engine.releases[2].policy is IN_GRAPH
