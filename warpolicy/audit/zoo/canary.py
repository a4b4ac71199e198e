"""The WAR canary on a zoo variant: does the production check catch the fixture's race?

`canary_trial` runs a freshly built variant as an engine would, overlapped: per step the
scheduler fills the batch's tables (``make_batch``), the step runs on the forward stream and
publishes, the scheduler takes the read-done right after the launch, applies its barrier on the
schedule stream and writes the **next step's** values of every shared table there (each table
moved to other valid values: `warpolicy.audit.poison.half_turn`, sentinels kept), then the canary
checks the step (rate 1: every step; `CanarySession` through its engine API, so eager work after
the replay is part of what it reruns). A violation is a detection; the canary then demotes the
cell, and later steps run coarse.

Where the race comes from: on CUDA the forward stream is held at each launch (a head stall) so
the host enqueues the step and the writes before the GPU starts it, and the race widener, when
on, stretches the reads after the release point; the writes win only when the release is really
early *and* the window is wide enough. On the simulated platform the writes land at the
instant the published release fires (the in-graph node's record, or the fence's host record),
the widest window a GPU could give.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import attrs

from warpolicy.audit.dynamic import HEAD_STALL_MIN_US, scheduler_writes
from warpolicy.audit.poison import half_turn
from warpolicy.audit.subject import make_stall
from warpolicy.audit.zoo.fixture import Built
from warpolicy.registry.vocabulary import IN_GRAPH, NONE
from warpolicy.runtime.canary import Canary, CanaryConfig
from warpolicy.runtime.fence import SchedulerBarrier
from warpolicy.runtime.platforms import is_simulated


@attrs.frozen
class CanaryOutcome:
    """What the canary saw over the trial's steps."""

    steps: int  # steps run
    checked: int  # steps the canary compared
    caught: int  # violations (the first demotes the cell: usually 0 or 1)
    first: str = ""  # the first violation, described
    seconds: float = 0.0

    @property
    def detected(self) -> bool:
        return self.caught > 0


def canary_trial(built: Built, steps: int) -> CanaryOutcome:
    """Run ``steps`` overlapped steps of ``built`` with the canary checking each (see the
    module docstring); the caller builds a fresh variant (a caught cell stays coarse)."""
    start = time.perf_counter()
    subject, model = built.subject, built.model
    platform = subject.platform
    mode = next(iter(subject.runners))
    runner = built.build_runner(model)
    runner.capture()
    canary = Canary(platform, CanaryConfig(rate=1.0, seed=0))
    session = canary.session(
        runner.name,
        mode,
        backend=str(getattr(built.policy, "backend", subject.name)),
        spec="none",
        on_demote=runner.demote,
    )
    forward, schedule = platform.new_stream(), platform.new_stream()
    barrier = SchedulerBarrier(platform, name="zoo-canary")
    head_stall = make_stall(platform, HEAD_STALL_MIN_US)
    race = _SimRace(platform) if is_simulated(platform.name) else None
    post_step = subject.post_step
    shared = dict(model.shared_buffers)
    first: str | None = None
    caught = 0
    try:
        for k in range(steps):
            batch = subject.make_batch(mode, k)  # the scheduler fills this batch's tables
            platform.synchronize()
            writes = {n: half_turn(t) for n, t in shared.items()}  # the next step's values
            bucket = runner.bucket_for(runner.size_of(batch))
            due = session.step()
            with platform.stream(forward):
                if head_stall is not None:
                    head_stall()
                if race is not None:
                    race.arm(runner, bucket, forward, functools.partial(_write_all, shared, writes))
                held: dict[str, Any] = {}
                sample = None
                if due and bucket is not None:
                    sample = session.begin(
                        bucket,
                        k,
                        runner.release_of(bucket),
                        functools.partial(model.canary_spec, mode, bucket, batch),
                        shared,
                        _rerun(platform, runner, bucket, post_step, mode, batch, held),
                    )
                out = held["out"] = runner.run(batch)
                result = post_step(mode, batch, out) if post_step is not None else out
                if sample is not None:
                    session.observe(sample, result)
            read_done = runner.fence.take()
            barrier.apply(schedule, forward, read_done)
            if race is not None:
                race.disarm()  # fired at the release, or the release was coarse
            else:
                scheduler_writes(platform, schedule, shared, writes)
            with platform.stream(schedule):
                violation = session.check()
            if violation is not None:
                caught += 1
                first = first or violation.describe()
        platform.synchronize()
    finally:
        if race is not None:
            race.close()
    return CanaryOutcome(
        steps, canary.stats["checked"], caught, first or "", time.perf_counter() - start
    )


def _write_all(shared: dict[str, Any], values: dict[str, Any]) -> None:
    for name, tensor in shared.items():
        tensor.copy_(values[name])


def _rerun(
    platform: Any,
    runner: Any,
    bucket: int,
    post_step: Callable[[Any, Any, Any], Any] | None,
    mode: Any,
    batch: Any,
    held: dict[str, Any],
) -> Callable[[], Any]:
    """What the canary's check reruns: the bucket's graph, then the step's eager work."""
    graph = runner.captured[bucket].graph

    def rerun() -> Any:
        platform.replay(graph)
        out = held["out"]
        return post_step(mode, batch, out) if post_step is not None else out

    return rerun


class _SimRace:
    """The simulated platform's race: the scheduler's writes run at the instant the step's
    published release fires (its in-graph node's record, or the fence's host record on the
    forward stream). A coarse release fires nothing: the writes then wait for the step."""

    def __init__(self, platform: Any) -> None:
        self.log = platform.log
        self.armed: tuple[Callable[[], None], int | None, int] | None = None
        self.pending: Callable[[], None] | None = None
        self.log.listeners.append(self._on_entry)

    def arm(self, runner: Any, bucket: int | None, stream: Any, write: Callable[[], None]) -> None:
        release = runner.release_of(bucket)
        self.pending = write
        if release.policy is NONE:
            self.armed = None
            return
        event = release.event.id if release.policy is IN_GRAPH else None
        self.armed = (write, event, stream.id)

    def disarm(self) -> None:
        """After the step: writes that never fired (a coarse release) land now, in order."""
        write, self.pending, self.armed = self.pending, None, None
        if write is not None:
            write()

    def close(self) -> None:
        self.log.listeners.remove(self._on_entry)

    def _on_entry(self, entry: tuple) -> None:
        armed = self.armed
        if armed is None or entry[0] != "record":
            return
        write, event, stream = armed
        if (event is not None and entry[1] == event and entry[3] == "in_graph") or (
            event is None and entry[2] == stream and entry[3] is False
        ):
            self.armed = None
            self.pending = None
            write()
