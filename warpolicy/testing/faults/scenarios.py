"""Scenarios: the engine side of the matrix (runners, streams, scheduler) for one variant.

Every scenario builds its runner(s) on the harness's platform with a `HarnessModel` and a
policy callable, captures, steps, and writes through the runtime's public surface: the
runners' ``capture`` / ``run`` / ``fence.take()``, `OverlapLoop` (``step``, ``drain``) and
`SchedulerBarrier` for a scheduler that drives its own streams. Each exception the runtime lets
out is handed to `Harness.guard` and the engine carries on.

A *variant* pairs the policy the engine declares with where the model really reads:

==============  ============  =============================================================
variant         policy        shared reads
==============  ============  =============================================================
pre_replay      pre_replay    host prep only (a snapshotting backend)
in_graph        in_graph      in-graph prep only
in_graph_late   in_graph      in-graph prep and the forward (a late reader after the marker:
                              the self-check must demote, derived placement must cover it)
post_replay     post_replay   in-graph prep and the forward
none            none          in-graph prep and the forward
==============  ============  =============================================================
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import attrs

from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    PRE_REPLAY,
    ForwardMode,
    WarReadDonePolicy,
)
from warpolicy.runtime.canary import Canary, CanaryConfig
from warpolicy.runtime.fence import SchedulerBarrier
from warpolicy.runtime.runners import (
    DecodeRunner,
    DraftExtendRunner,
    GraphRunner,
    OverlapLoop,
    Phase,
    PrefillRunner,
    SpecStep,
    VerifyRunner,
)
from warpolicy.testing.faults.harness import Harness
from warpolicy.testing.faults.lifetimes import deferred_frees
from warpolicy.testing.faults.model import (
    PER_BATCH_THRESHOLD,
    READ_PLANS,
    BatchPolicyTable,
    HarnessModel,
    PerBatchModel,
    ResettingModel,
    StagedModel,
    eagle_compiled,
    policy_table,
)
from warpolicy.testing.faults.owned import OwnedCaptureEngine
from warpolicy.testing.faults.restored import RestoredCaptureEngine, RestoringRunner
from warpolicy.testing.faults.staging import spec_stager_scenario

#: variant -> (declared policy, read plan)
VARIANTS: Mapping[str, tuple[WarReadDonePolicy, str]] = {
    "pre_replay": (PRE_REPLAY, "host"),
    "in_graph": (IN_GRAPH, "prep"),
    "in_graph_late": (IN_GRAPH, "late"),
    "post_replay": (POST_REPLAY, "late"),
    "none": (NONE, "late"),
    # a wrong declaration (a positive control): pre_replay for a graph that reads in-graph
    "pre_replay_misdeclared": (PRE_REPLAY, "prep"),
}

DECODE, EXTEND = ForwardMode.DECODE, ForwardMode.EXTEND
VERIFY, DRAFT = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND
BUCKETS: Mapping[ForwardMode, Sequence[int]] = {
    DECODE: (2, 4),
    EXTEND: (4, 8),
    VERIFY: (4, 8),
    DRAFT: (4, 8),
}
DRAFT_TOKENS = 2
#: Batch sizes per step (a bucket, the other, an eager one, ...); the runner is captured again
#: (after draining) before step `RECAPTURE_AT`.
STEPS: Mapping[str, tuple[int, ...]] = {
    "decode": (2, 4, 8, 2, 4, 3),
    "tokens": (4, 8, 16, 4, 8, 6),
    "owned": (2, 4, 8, 2, 4, 3),  # as decode: 8 fits no bucket (the engine serves it eagerly)
}
RECAPTURE_AT = 3
LAG_STEPS = 12  # steps of the lagging scheduler
RING = 4  # the runner's ring_size in the lagging scenarios
THREAD_STEPS = 60  # steps per thread


def _runner(
    h: Harness, cls: type[GraphRunner], reads: str, table: Mapping[ForwardMode, Any], **kw: Any
) -> GraphRunner | None:
    model = HarnessModel(h, READ_PLANS[reads], BUCKETS, name=cls.mode.label)
    if cls is VerifyRunner:
        kw.setdefault("draft_tokens", DRAFT_TOKENS)
    kw = {**h.kw, **kw, **h.runner_options}
    built: GraphRunner | None = h.guard(
        lambda: cls(model, policy_table(h, table), h.platform, **kw)
    )
    return built


class _Probe:
    """`StepProbe`: the phases of `OverlapLoop.step` for phase-armed faults."""

    _NEXT: ClassVar[Mapping[str, str]] = {
        "launch": "run",
        "launched": "barrier",
        "released": "write",
        "written": "wait",
    }

    def __init__(self, harness: Harness) -> None:
        self.harness = harness

    def mark(self, point: str, stream: Any) -> None:
        self.harness.phase(self._NEXT.get(point, "wait"))
        self.harness.pause()


def _write_next(h: Harness, through: int | None = None) -> Callable[[], None]:
    def write_next() -> None:
        h.injector.call("write_next", lambda: h.write("scheduler", through))

    return write_next


@contextlib.contextmanager
def _on(h: Harness, stream: Any) -> Any:
    """Make ``stream`` current (the engine's call: not faulted); None keeps the current one."""
    with contextlib.ExitStack() as stack:
        if stream is not None:
            with h.quiet():
                stack.enter_context(h.platform.stream(stream))
        yield


def _streams(h: Harness, count: int) -> list[Any]:
    with h.quiet():
        return [h.platform.new_stream() for _ in range(count)]


def overlap(
    h: Harness,
    runner: Any,
    sizes: Sequence[int],
    *,
    forward_streams: int = 1,
    recapture_at: int | None = RECAPTURE_AT,
    canary: Canary | None = None,
) -> None:
    """Capture, then step through `OverlapLoop` (re-capturing once after a drain); with
    ``canary``, the loop measures the release lead through it."""
    if h.wrap_runner is not None:
        runner = h.wrap_runner(h, runner)
    loop: OverlapLoop | None = h.guard(
        lambda: OverlapLoop(platform=h.platform, probe=_Probe(h), canary=canary, **h.kw)
    )
    if loop is None:
        return
    streams = _streams(h, forward_streams) if forward_streams > 1 else [None]
    h.phase("capture")
    h.guard(runner.capture)
    for index, size in enumerate(sizes):
        if index == recapture_at:
            h.phase("drain")
            before = len(h.errors)
            h.guard(loop.drain)
            if len(h.errors) == before:  # no capture unless drained
                h.phase("recapture")
                h.guard(runner.capture)
        h.phase("wait")
        h.begin_step()
        with _on(h, streams[index % len(streams)]):
            h.guard(functools.partial(loop.step, [0] * size, _write_next(h), runner=runner))


def lagging(h: Harness, runner: Any, sizes: Sequence[int], *, streams: int, lag: int) -> None:
    """A scheduler ``lag`` launches behind: it takes each step's event right after the launch
    (forward streams round-robin, unordered) and waits on it ``lag`` launches later. With
    ``lag=0`` it takes and waits in one call right after the launch
    (`SchedulerBarrier.apply_step`, with the fence's step as the token on every other step)."""
    forward = _streams(h, streams)
    (schedule,) = _streams(h, 1)
    barrier: SchedulerBarrier | None = h.guard(lambda: SchedulerBarrier(h.platform, **h.kw))
    if barrier is None:
        return
    h.phase("capture")
    h.guard(runner.capture)
    in_flight: collections.deque[tuple[int, Any, Any]] = collections.deque()

    def release(step: int, stream: Any, read_done: Any) -> None:
        h.phase("barrier")
        if lag:
            applied = h.guard(lambda: barrier.apply(schedule, stream, read_done))
        else:  # the fence's step as the token, every other step none (the owner check)
            fence = runner.fence
            token = fence.step if step % 2 else None
            applied = h.guard(lambda: barrier.apply_step(schedule, stream, fence, token))
        if applied is None:
            return  # the barrier raised: the engine does not write
        h.phase("write")
        with _on(h, schedule):
            h.guard(_write_next(h, step))

    for index, size in enumerate(sizes):
        h.phase("run")
        step = h.begin_step()
        stream = forward[index % streams]
        with _on(h, stream):
            h.guard(functools.partial(runner.run, [0] * size))
        in_flight.append((step, stream, h.guard(runner.fence.take) if lag else None))
        while len(in_flight) > lag:
            release(*in_flight.popleft())
    while in_flight:
        release(*in_flight.popleft())


def two_threads(h: Harness, runner: Any, sizes: Sequence[int], steps: int) -> None:
    """The main thread and a second thread step one runner (``sizes[lane]``: each its own
    bucket, so their graphs are not serialized), each with its own loop and forward stream."""
    h.phase("capture")
    h.guard(runner.capture)
    forward = _streams(h, 2)
    loops = [
        h.guard(
            functools.partial(OverlapLoop, runner, h.platform, forward_stream=f, probe=_Probe(h))
        )
        for f in forward
    ]
    h.phase("run")

    baton = h.baton

    def worker(lane: int) -> None:
        h.lane = lane
        loop = loops[lane]
        if baton is not None:
            baton.start(lane)
        try:
            for _ in range(steps if loop is not None else 0):
                h.begin_step()
                h.guard(lambda: loop.step([0] * sizes[lane], _write_next(h)))
        finally:
            if baton is not None:
                baton.done(lane)

    other = threading.Thread(target=worker, args=(1,), name="faults-second-thread")
    other.start()
    worker(0)
    other.join()


# -- the scenarios ----------------------------------------------------------------------------------


def _single(cls: type[GraphRunner], sizes: str, **kw: Any) -> Callable[[Harness, str], None]:
    def run(h: Harness, variant: str) -> None:
        policy, reads = VARIANTS[variant]
        runner = _runner(h, cls, reads, dict.fromkeys(BUCKETS, policy), **kw)
        if runner is not None:
            overlap(h, runner, STEPS[sizes])

    return run


def _canary_scenario(h: Harness, variant: str) -> None:
    """DecodeRunner with the WAR canary checking every step (its saves, restores, replay and
    put-back are logged reads and writes: the oracle judges them too) and timing every step's
    release lead (its observer hook is a fault target)."""
    policy, reads = VARIANTS[variant]
    config = CanaryConfig(rate=1.0, lead_rate=1.0, seed=0)
    canary = h.guard(lambda: Canary(h.platform, config, **h.kw))
    if canary is None:
        return
    runner = _runner(h, DecodeRunner, reads, dict.fromkeys(BUCKETS, policy), canary=canary)
    if runner is not None:
        overlap(h, runner, STEPS["decode"], canary=canary)


def _owned(
    placement: str | None, engine_class: type[OwnedCaptureEngine] = OwnedCaptureEngine
) -> Callable[[Harness, str], None]:
    def run(h: Harness, variant: str) -> None:
        policy, reads = VARIANTS[variant]
        model = HarnessModel(h, READ_PLANS[reads], BUCKETS, name="owned")
        engine = h.guard(
            lambda: engine_class(
                model,
                policy_table(h, dict.fromkeys(BUCKETS, policy)),
                h.platform,
                placement=placement,
                **h.kw,
            )
        )
        if engine is not None:
            overlap(h, engine, STEPS["owned"])

    return run


def _restoring_runner(h: Harness, variant: str) -> None:
    """DecodeRunner (kept graphs) whose every capture is followed by save, clone with private
    events and `GraphRunner.restore`; OverlapLoop steps the restored clones."""
    policy, reads = VARIANTS[variant]
    runner = _runner(h, DecodeRunner, reads, dict.fromkeys(BUCKETS, policy), keep_graphs=True)
    if runner is not None:
        overlap(h, RestoringRunner(runner), STEPS["decode"])


def _streams_scenario(h: Harness, variant: str) -> None:
    policy, reads = VARIANTS[variant]
    runner = _runner(h, DecodeRunner, reads, dict.fromkeys(BUCKETS, policy))
    if runner is not None:
        overlap(h, runner, STEPS["decode"], forward_streams=3)


def _lag(lag: int) -> Callable[[Harness, str], None]:
    def run(h: Harness, variant: str) -> None:
        policy, reads = VARIANTS[variant]
        runner = _runner(h, DecodeRunner, reads, dict.fromkeys(BUCKETS, policy), ring_size=RING)
        if runner is not None:
            sizes = STEPS["decode"] * (LAG_STEPS // len(STEPS["decode"]))
            lagging(h, runner, sizes, streams=3, lag=lag)

    return run


def _spec_scenario(h: Harness, variant: str) -> None:
    policy, reads = VARIANTS[variant]
    table = dict.fromkeys(BUCKETS, policy)
    verify = _runner(h, VerifyRunner, reads, table)
    draft = _runner(h, DraftExtendRunner, reads, table)
    if verify is None or draft is None:
        return
    step = h.guard(lambda: SpecStep((Phase(verify), Phase(draft)), last_reader=DRAFT, **h.kw))
    if step is not None:
        overlap(h, step, STEPS["tokens"])


def _spec_late_phase(h: Harness, variant: str) -> None:
    """Issue 17 class 12: verify (none), draft extend (pre_replay), decode (in_graph), the
    declared last reader draft extend; every phase reads where its policy says it may."""
    phases = []
    for cls, policy in (
        (VerifyRunner, NONE),
        (DraftExtendRunner, PRE_REPLAY),
        (DecodeRunner, IN_GRAPH),
    ):
        reads = {NONE: "late", PRE_REPLAY: "host", IN_GRAPH: "prep"}[policy]
        runner = _runner(h, cls, reads, dict.fromkeys(BUCKETS, policy))
        if runner is None:
            return
        phases.append(Phase(runner))
    step = h.guard(lambda: SpecStep(phases, last_reader=DRAFT, **h.kw))
    if step is not None:
        overlap(h, step, STEPS["tokens"])


def _per_batch_scenario(h: Harness, variant: str) -> None:
    """PrefillRunner on a fact-dependent cell (`PerBatchModel`, `BatchPolicyTable`): buckets
    of 4 and 8 tokens on both sides of the threshold (4), eager batches above it; the batches
    above need the snapshot action (the harness's ``warpolicy_batch_action``) to publish
    ``pre_replay``. ``trusting``: the engine's rule trusts the action (a positive control)."""
    model = PerBatchModel(h, PER_BATCH_THRESHOLD, BUCKETS)
    h.snapshot_model = model
    policy = BatchPolicyTable(h, PER_BATCH_THRESHOLD, trusting=variant == "trusting")
    kw = {**h.kw, **h.runner_options}
    runner = h.guard(lambda: PrefillRunner(model, policy, h.platform, **kw))
    if runner is not None:
        overlap(h, runner, STEPS["tokens"])


def _spec_staged_scenario(h: Harness, variant: str) -> None:
    """SpecStep verify -> draft extend under the default registry's fa3 + EAGLE: verify
    publishes ``in_graph`` only after ``draft_extend_staged`` (the harness's action copies the
    draft extend's shared reads), the draft extend reads shared state (late) unless staged and
    decides ``none``; the step hands verify's event when staged."""
    draft = StagedModel(h, READ_PLANS["late"], BUCKETS, name="draft_extend")
    verify = ResettingModel(h, READ_PLANS["prep"], BUCKETS, name="target_verify", staged=draft)
    h.snapshot_model = draft
    policy = BatchPolicyTable(h, compiled=eagle_compiled())
    kw = {**h.kw, **h.runner_options}
    runners = h.guard(
        lambda: (
            VerifyRunner(verify, policy, h.platform, draft_tokens=DRAFT_TOKENS, **kw),
            DraftExtendRunner(draft, policy, h.platform, **kw),
        )
    )
    if runners is None:
        return
    step = h.guard(lambda: SpecStep([Phase(r) for r in runners], last_reader=DRAFT, **h.kw))
    if step is not None:
        overlap(h, step, STEPS["tokens"])


def _spec_stager_scenario(h: Harness, variant: str) -> None:
    spec_stager_scenario(h, variant, overlap, BUCKETS, STEPS["tokens"], DRAFT_TOKENS)


def _threads_scenario(h: Harness, variant: str) -> None:
    policy, reads = VARIANTS[variant]
    runner = _runner(h, DecodeRunner, reads, dict.fromkeys(BUCKETS, policy))
    if runner is not None:
        two_threads(h, runner, (2, 4), THREAD_STEPS)


@attrs.frozen
class Scenario:
    name: str
    variants: tuple[str, ...]
    run: Callable[[Harness, str], None]
    doc: str
    check_stale: bool = True  # the forward waits for the scheduler's writes
    yield_points: bool = False  # let the other thread run at each pause (threads)


SCENARIOS: Mapping[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "decode",
            ("pre_replay", "in_graph", "in_graph_late", "post_replay", "none"),
            _single(DecodeRunner, "decode"),
            "DecodeRunner, marker placement, self-checked; OverlapLoop; re-capture",
        ),
        Scenario(
            "decode_derived",
            ("in_graph", "in_graph_late"),
            _single(DecodeRunner, "decode", placement="derived"),
            "DecodeRunner with derived placement (node after the last shared reader)",
        ),
        Scenario(
            "prefill",
            ("pre_replay", "post_replay", "none"),
            _single(PrefillRunner, "tokens"),
            "PrefillRunner (extend), token buckets",
        ),
        Scenario(
            "verify",
            ("in_graph", "in_graph_late", "none"),
            _single(VerifyRunner, "tokens"),
            "VerifyRunner (target verify), draft_tokens=2",
        ),
        Scenario(
            "draft_extend",
            ("pre_replay", "in_graph_late", "post_replay"),
            _single(DraftExtendRunner, "tokens"),
            "DraftExtendRunner (no marker: in_graph publishes after the replay)",
        ),
        Scenario(
            "per_batch",
            ("snapshot",),
            _per_batch_scenario,
            "PrefillRunner on a per-batch cell: pre_replay above the threshold only after the "
            "snapshot action (warpolicy_batch_action, a fault target)",
        ),
        Scenario(
            "spec_staged",
            ("staged",),
            _spec_staged_scenario,
            "SpecStep verify -> draft extend (fa3 + EAGLE): verify's event only after "
            "draft_extend_staged (warpolicy_batch_action, a fault target)",
        ),
        Scenario(
            "spec_stager",
            ("staged",),
            _spec_stager_scenario,
            "SpecStep verify -> draft extend (trtllm_mha + EAGLE) with a real Stager on the "
            "plugin manager: its copies (stager_copy, a fault target) before verify's release",
        ),
        Scenario(
            "spec",
            ("pre_replay", "in_graph", "in_graph_late"),
            _spec_scenario,
            "SpecStep: verify -> draft extend, last reader draft extend",
        ),
        Scenario(
            "spec_late_phase",
            ("declared",),
            _spec_late_phase,
            "SpecStep whose phase after the last reader publishes (issue 17 class 12)",
        ),
        Scenario(
            "canary",
            ("pre_replay", "in_graph"),
            _canary_scenario,
            "DecodeRunner with the WAR canary checking every step; OverlapLoop; re-capture",
        ),
        Scenario(
            "owned_capture",
            ("pre_replay", "in_graph", "in_graph_late", "post_replay", "none"),
            _owned(None),
            "an engine capturing its own graphs through the engine API (ReadDoneCapture, "
            "mark, finish; its own ReadDoneFence), marker placement; OverlapLoop; re-capture",
        ),
        Scenario(
            "owned_capture_derived",
            ("in_graph", "in_graph_late"),
            _owned("derived"),
            "the engine-owned capture with derived placement",
        ),
        Scenario(
            "restored",
            ("in_graph", "in_graph_late", "post_replay"),
            _owned(None, RestoredCaptureEngine),
            "an engine that saves its graphs and steps restored clones (fresh private events, "
            "as a persistence library's load leaves them) through ReadDoneCapture.save / "
            "restore: the node found by position, rebound, self-checked again; re-capture",
        ),
        Scenario(
            "restored_derived",
            ("in_graph", "in_graph_late"),
            _owned("derived", RestoredCaptureEngine),
            "the restoring engine with derived placement",
        ),
        Scenario(
            "restored_runner",
            ("in_graph", "in_graph_late"),
            _restoring_runner,
            "DecodeRunner whose captures are saved, cloned with private events and restored "
            "(GraphRunner.save / restore); OverlapLoop steps the clones; re-capture",
        ),
        Scenario(
            "streams",
            ("pre_replay", "in_graph", "post_replay"),
            _streams_scenario,
            "DecodeRunner on three forward streams in turn, OverlapLoop",
        ),
        Scenario(
            "lag",
            ("pre_replay", "in_graph", "post_replay"),
            _lag(RING),
            "a scheduler 4 launches behind, three unordered forward streams, ring_size=4",
            check_stale=False,
        ),
        Scenario(
            "lag_within",
            ("in_graph", "post_replay"),
            _lag(RING // 2),
            "a scheduler 2 launches behind (within the ring), three unordered forward streams",
            check_stale=False,
        ),
        Scenario(
            "apply_step",
            ("pre_replay", "in_graph", "post_replay"),
            _lag(0),
            "a scheduler that takes and waits in one call right after each launch "
            "(SchedulerBarrier.apply_step), three unordered forward streams",
            check_stale=False,
        ),
        Scenario(
            "deferred_frees",
            ("in_graph", "in_graph_late", "post_replay", "none"),
            functools.partial(
                deferred_frees, variants=VARIANTS, read_plans=READ_PLANS, buckets=BUCKETS
            ),
            "DeferredFrees: each step frees what it read with its read-done, reused right "
            "after reclaim on the schedule stream with no barrier; settle at a host sync",
            check_stale=False,
        ),
        Scenario(
            "threads",
            ("in_graph", "post_replay"),
            _threads_scenario,
            "two threads step one runner, each with its own OverlapLoop",
            check_stale=False,
            yield_points=True,
        ),
    )
}
