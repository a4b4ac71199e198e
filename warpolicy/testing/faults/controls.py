"""Controls: proof that the matrix can fail (positive) and does not cry wolf (negative).

Each `Control` runs one case of the matrix twice through the same harness and oracle: once
with a deliberately broken part (a platform that misbehaves, a wrong declaration, or a runner
wrapper that carries a known bug), where the oracle **must** report early releases, and once
with that part intact, where it must report none. The broken parts sit outside the runtime
under test (platform hooks, policy and model, wrappers built on the public runner surface), so
the positive controls stay positive whatever the runtime does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from warpolicy.registry.vocabulary import IN_GRAPH
from warpolicy.runtime.platforms.sim import SimPlatform
from warpolicy.runtime.release import BucketRelease
from warpolicy.testing.faults.compat import publish_args
from warpolicy.testing.faults.harness import Harness
from warpolicy.testing.faults.injection import Fault
from warpolicy.testing.faults.matrix import Case, CaseResult, run_case
from warpolicy.testing.faults.owned import EngineWrapper
from warpolicy.testing.faults.restored import TrustsSavedRelease

# -- broken platforms ---------------------------------------------------------------------------


def waits_do_nothing(h: Harness, impl: SimPlatform) -> None:
    """Every stream wait returns without waiting (a barrier that does not wait)."""
    impl.wait_event = lambda stream, event: None  # type: ignore[method-assign]
    impl.wait_stream = lambda stream, other: None  # type: ignore[method-assign]


def event_first_wait_does_nothing(h: Harness, impl: SimPlatform) -> None:
    """The platform's own event-first wait (`EventFirstWait`, the barrier's) returns without
    waiting; its ``wait_event`` still waits."""
    impl.event_wait = lambda event, stream: None  # type: ignore[attr-defined]


def capture_records_swallowed(h: Harness, impl: SimPlatform) -> None:
    """A record during a capture returns as if it planted a node, and plants nothing."""
    record = impl.record

    def swallowing(event: Any, stream: Any = None) -> None:
        if impl.capturing:
            return None
        return record(event, stream)

    impl.record = swallowing  # type: ignore[method-assign]


class _Alias:
    """A distinct handle for an event shared with other handles (the sim sees the inner one)."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_inner"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_inner"), name, value)


def ring_of_two(h: Harness, impl: SimPlatform) -> None:
    """Host-recorded events come from a pool of two behind distinct handles: a ring of four
    re-records each event two steps later (a ring too small for the steps in flight)."""
    create = impl.create_event
    pool: list[Any] = []

    def aliasing(external: bool) -> Any:
        if external:
            return create(external)
        if len(pool) < 2:
            pool.append(create(external))
            return _Alias(pool[-1])
        aliasing.count = getattr(aliasing, "count", 0) + 1  # type: ignore[attr-defined]
        return _Alias(pool[aliasing.count % 2])  # type: ignore[attr-defined]

    impl.create_event = aliasing  # type: ignore[method-assign]


def old_graphs_lose_their_node(h: Harness, impl: SimPlatform) -> None:
    """A failed capture leaves every earlier graph without its planted node (what a kept,
    stale graph may really record is not what its bucket publishes)."""
    new_graph, capture_callable = impl.new_graph, impl.capture_callable
    graphs: list[Any] = []

    def tracking(keep_graph: bool) -> Any:
        graph = new_graph(keep_graph)
        graphs.append(graph)
        return graph

    def failing(graph: Any, fn: Callable[[], Any], stream: Any = None, pool: Any = None) -> None:
        try:
            capture_callable(graph, fn, stream, pool)
        except BaseException:
            for old in graphs:
                if old is not graph:
                    old.planted.clear()
            raise

    impl.new_graph = tracking  # type: ignore[method-assign]
    impl.capture_callable = failing  # type: ignore[method-assign]


# -- runners with a known bug (wrappers on the public runner surface) ---------------------------


class KeepsOldGraphs:
    """A runner that, after a failed re-capture, keeps serving each bucket's previous graph
    and publishing its previous event (0.2.0's failure, issue 17 class 4)."""

    def __init__(self, harness: Harness, runner: Any) -> None:
        self.runner = runner
        self.fence = runner.fence
        self.platform = runner.platform
        self.model = runner.model
        self.old: dict[int, Any] = {}
        self.stale = False

    @property
    def last_step(self) -> Any:
        return self.runner.last_step

    def capture(self) -> None:
        old = dict(self.runner.captured)
        try:
            self.runner.capture()
            self.stale = False
        except BaseException:
            self.old, self.stale = old, True
            raise

    def run(self, batch: Any) -> Any:
        fits = [b for b in sorted(self.old) if b >= len(batch)] if self.stale else []
        if not fits:
            return self.runner.run(batch)
        bucket = self.old[fits[0]]
        before, after = publish_args(bucket)
        self.model.host_prep(batch, bucket.size)
        self.fence.before_replay(*before)
        self.platform.replay(bucket.graph)
        self.fence.after_replay(*after)
        return getattr(bucket, "output", None)


class JoinCatchesException:
    """A runner whose warm-up joins its side stream with ``except Exception``: an interrupt
    in the join skips both the join and the synchronize (0.2.0's failure, issue 17 class 3)."""

    def __init__(self, harness: Harness, runner: Any) -> None:
        self.runner = runner
        self.fence = runner.fence
        self.platform = runner.platform
        self.model = runner.model

    @property
    def last_step(self) -> Any:
        return self.runner.last_step

    def capture(self) -> None:
        p = self.platform
        main = p.current_stream()
        side = p.new_stream()
        p.wait_stream(side, main)
        try:
            with p.stream(side):
                for bucket in self.runner.buckets:
                    self.model.graph_prep(bucket)
                    self.model.forward(bucket)
        finally:
            try:
                p.wait_stream(main, side)
            except Exception:
                p.synchronize()
                raise
        self.runner.capture()

    def run(self, batch: Any) -> Any:
        return self.runner.run(batch)


class PlainWarmUp(EngineWrapper):
    """An engine owning its capture that warms up as 0.3.0's guide and example did: the join
    and the synchronize as plain statements after the side-stream block, so a warm-up that
    raises leaves its shared reads unjoined (issue 26 finding 1)."""

    def capture(self) -> None:
        p = self.platform
        main, side = p.current_stream(), p.new_stream()
        p.wait_stream(side, main)
        with p.stream(side):
            for bucket in sorted(self.model.bucket_sizes(self.mode)):
                self.engine._body(bucket, None)
        p.wait_stream(main, side)
        p.synchronize()
        self.engine.capture()


class TrustsItsMarker(EngineWrapper):
    """An engine owning its capture that publishes its marker's event whatever ``finish``
    decided: it ignores the self-check's demotion of a bucket with a late reader."""

    def capture(self) -> None:
        self.engine.capture()
        trusted = {}
        for bucket, outcome in self.engine.outcomes.items():
            if outcome.recorded is not None:
                release = BucketRelease("owned", bucket, IN_GRAPH, outcome.recorded, "trusted")
                outcome = attrs.evolve(outcome, release=release)
            trusted[bucket] = outcome
        self.engine.outcomes = trusted


# -- the controls -------------------------------------------------------------------------------

Hook = Callable[[Harness, SimPlatform], None]
Wrapper = Callable[[Harness, Any], Any]


@attrs.frozen
class Control:
    """A case and the broken part that must make it release early."""

    name: str
    doc: str
    case: Case
    hook: Hook | None = None
    wrapper: Wrapper | None = None
    options: Mapping[str, Any] = attrs.field(factory=dict)
    #: the same case with the part intact (default: the case without the broken part)
    intact: Case | None = None

    def run(self, broken: bool = True) -> CaseResult:
        if not broken:
            return run_case(self.intact or self.case)
        return run_case(
            self.case, self.hook, runner_options=dict(self.options), wrap_runner=self.wrapper
        )


_RECAPTURE_FAILS = Fault("capture_callable", "raise", nth=1, phase="recapture")
_ACTION_FAILS = Fault("warpolicy_batch_action", "false", phase="run")
_JOIN_INTERRUPTED = Fault("wait_stream", "interrupt", nth=2, phase="capture")
#: the warm-up's first read, then the warm-up fails (the read is enqueued)
_WARM_UP_FAILS = Fault("graph_prep", "act_then_raise", nth=1, phase="capture")
#: the two-fault mode: an interrupt in the next stream wait after the first fault (the join)
_THEN_JOIN_INTERRUPTED = Fault("wait_stream", "interrupt", nth=1)

POSITIVE_CONTROLS: tuple[Control, ...] = (
    Control(
        "deferred_free_does_not_wait",
        "the platform's waits return without waiting: a reclaimed item is reused while the "
        "step that freed it still reads it",
        Case("deferred_frees", "post_replay"),
        hook=waits_do_nothing,
    ),
    Control(
        "deferred_free_early_event",
        "items freed with a read-done earlier than their last read (a marker after the prep "
        "while the forward still reads, self-check off)",
        Case("deferred_frees", "in_graph_late"),
        options={"self_check": "off"},
    ),
    Control(
        "barrier_does_not_wait",
        "the platform's waits return without waiting",
        Case("decode", "in_graph"),
        hook=waits_do_nothing,
    ),
    Control(
        "apply_step_does_not_wait",
        "the platform's waits return without waiting; the scheduler takes and waits in one "
        "call (SchedulerBarrier.apply_step)",
        Case("apply_step", "in_graph"),
        hook=waits_do_nothing,
    ),
    Control(
        "event_first_wait_does_not_wait",
        "the platform's own event-first wait (EventFirstWait) returns without waiting while "
        "its wait_event waits",
        Case("apply_step", "post_replay"),
        hook=event_first_wait_does_nothing,
    ),
    Control(
        "pre_replay_reads_in_graph",
        "pre_replay declared for a graph whose in-graph prep reads shared state",
        Case("decode", "pre_replay_misdeclared"),
        intact=Case("decode", "pre_replay"),
    ),
    Control(
        "plant_swallowed",
        "a record during capture plants nothing but returns as success (self-check off)",
        Case("decode", "in_graph"),
        hook=capture_records_swallowed,
        options={"self_check": "off"},
    ),
    Control(
        "ring_too_small",
        "host events re-recorded two steps later (pool of two), scheduler two steps behind "
        "on three unordered forward streams",
        Case("lag_within", "post_replay"),
        hook=ring_of_two,
    ),
    Control(
        "keeps_old_graph",
        "after a failed re-capture the runner keeps each bucket's old graph and event",
        Case("decode", "in_graph", _RECAPTURE_FAILS),
        hook=old_graphs_lose_their_node,
        wrapper=KeepsOldGraphs,
        intact=Case("decode", "in_graph"),
    ),
    Control(
        "trusts_failed_action",
        "the engine's per-batch rule takes the snapshot action as succeeded while the action "
        "hook answers False (nothing was copied)",
        Case("per_batch", "trusting", _ACTION_FAILS),
        intact=Case("per_batch", "snapshot", _ACTION_FAILS),
    ),
    Control(
        "staging_lies",
        "the action plugin answers True for draft_extend_staged without staging: the step "
        "hands verify's event while the draft extend still reads shared state",
        Case("spec_staged", "staged", Fault("warpolicy_batch_action", "lie", phase="run")),
        intact=Case("spec_staged", "staged", _ACTION_FAILS),
    ),
    Control(
        "stager_copies_one_fewer",
        "a Stager that leaves one of the draft extend's reads out (the draft extend then reads "
        "it live, after verify's release) and still reports the batch staged",
        Case("spec_stager", "lying"),
        intact=Case("spec_stager", "staged"),
    ),
    Control(
        "join_catches_exception",
        "the warm-up join catches Exception only: KeyboardInterrupt skips join and synchronize",
        Case("decode", "post_replay", _JOIN_INTERRUPTED),
        wrapper=JoinCatchesException,
        intact=Case("decode", "post_replay"),
    ),
    Control(
        "two_faults_join_catches_exception",
        "two faults: the warm-up fails after a shared read, then an interrupt hits the join, "
        "which catches Exception only (skips the synchronize)",
        Case("decode", "post_replay", _WARM_UP_FAILS, second=_THEN_JOIN_INTERRUPTED),
        wrapper=JoinCatchesException,
    ),
    Control(
        "owned_plain_warm_up",
        "an engine owning its capture joins its warm-up in plain statements after the block "
        "(0.3.0's guide): a warm-up that fails after a shared read leaves it unjoined",
        Case("owned_capture", "post_replay", _WARM_UP_FAILS),
        wrapper=PlainWarmUp,
    ),
    Control(
        "owned_ignores_self_check",
        "an engine owning its capture publishes its marker's event after the self-check "
        "demoted the bucket (a reader after the marker)",
        Case("owned_capture", "in_graph_late"),
        wrapper=TrustsItsMarker,
    ),
    Control(
        "restore_keeps_saved_release",
        "an engine that restores its saved graphs publishes each bucket's capture-time event "
        "(the restored clone records a fresh private event)",
        Case("restored", "in_graph"),
        wrapper=TrustsSavedRelease,
    ),
)

#: Correct configurations: the matrix must report no early release and no stale read.
NEGATIVE_CONTROLS: tuple[Case, ...] = (
    Case("decode", "in_graph"),
    Case("decode", "in_graph_late"),
    Case("decode_derived", "in_graph_late"),
    Case("decode", "pre_replay"),
    Case("prefill", "pre_replay"),
    Case("verify", "in_graph"),
    Case("draft_extend", "post_replay"),
    Case("spec", "in_graph"),
    Case("spec_stager", "staged"),
    Case("streams", "post_replay"),
    Case("lag_within", "post_replay"),
    Case("owned_capture", "in_graph_late"),
    Case("owned_capture_derived", "in_graph_late"),
    Case("restored", "in_graph"),
    Case("restored", "in_graph_late"),
    Case("restored_derived", "in_graph_late"),
    Case("restored_runner", "in_graph"),
)


def run_controls() -> list[tuple[str, CaseResult, CaseResult]]:
    """Every positive control: (name, broken run, intact run)."""
    return [(c.name, c.run(broken=True), c.run(broken=False)) for c in POSITIVE_CONTROLS]


def format_controls(runs: list[tuple[str, CaseResult, CaseResult]]) -> str:
    """One line per positive control: early writes broken (must be > 0) and intact (0)."""
    width = max(len(name) for name, _, _ in runs)
    lines = [f"{'control'.ljust(width)}  broken: early writes (how)  intact: early, stale"]
    for name, broken, intact in runs:
        how = broken.early_kind or "-"
        lines.append(
            f"{name.ljust(width)}  {broken.outcome.early_writes:>5} ({how})"
            f"{'':<14}{intact.outcome.early_writes}, {intact.outcome.stale_reads}"
        )
    return "\n".join(lines)


def controls_hold(runs: list[tuple[str, CaseResult, CaseResult]]) -> bool:
    """Whether every broken run released early and every intact one did not."""
    return all(b.early and not (i.early or i.outcome.stale_reads) for _, b, i in runs)
