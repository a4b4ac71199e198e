"""The engine-facing API (`warpolicy.runtime.owned_capture`) on the simulated platform.

An engine that captures its own graphs: `Engine` below captures ``prep -> [marker] -> forward``
per bucket with the platform's own capture, then finishes each bucket through the API, replays
and publishes through the fence, and its scheduler waits through the barrier: no runner. The
simulated platform's graph model (`SimPlatform.graph_model`) stands in for the CUDA graph walk;
its call log and happens-before clocks show what the scheduler's barrier really waits for.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

from warpolicy.errors import InputError, UnknownNameError
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.owned_capture import (
    BucketCapture,
    CellPolicy,
    RawGraph,
    ReadDoneCapture,
    ReadDoneFence,
    SchedulerBarrier,
    SelfCheckError,
    cell_policy,
    resolve_cell,
)
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.platforms.sim import SimGraph, SimPlatform
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing import sim_impl, sim_runtime
from warpolicy.testing.sim import FaultySimPlatform

P = WarReadDonePolicy
DECODE = ForwardMode.DECODE
BUCKETS = (2, 4)


class Engine:
    """A tiny engine with its own capture: a shared ``table`` read by the metadata prep, a
    private ``weight`` read by the forward (and, with ``late=True``, the table again)."""

    def __init__(self, platform, *, late: bool = False, engine_marker: bool = False) -> None:
        self.platform = platform
        self.table = torch.arange(8, dtype=torch.float32)
        self.weight = torch.ones(8)
        self.shared_buffers = {"table": self.table}
        self.late = late
        self.engine_marker = engine_marker
        self.reads: list = []  # happens-before marks of the prep's reads, per replay
        self.graphs: dict[int, SimGraph] = {}
        self.own_events: dict[int, object] = {}

    def capture(self, capture: ReadDoneCapture, *, kept: bool = True, raw: bool = False):
        p = self.platform
        outcomes = {}
        for bs in reversed(BUCKETS):
            bucket = capture.begin(bs)
            own = p.create_event(external=True) if self.engine_marker else None
            if own is not None:
                p.record(own)  # seeded once eagerly, as the fence seeds its own
                self.own_events[bs] = own

            def body(bucket: BucketCapture = bucket, own=own) -> None:
                self.reads.append(sim_impl(p).mark("prep reads table"))
                if own is not None:
                    p.record(own)  # the engine records its own marker (stream None: capture's)
                else:
                    bucket.mark()
                if self.late:
                    self.reads.append(sim_impl(p).mark("late read of table"))

            graph = p.new_graph(keep_graph=kept)
            p.capture_callable(graph, body)
            self.graphs[bs] = graph
            handle = RawGraph(graph.raw_cuda_graph()) if raw else graph
            outcomes[bs] = bucket.finish(handle, self.shared_buffers, marker=own)
        return outcomes


def graph_model(engine: Engine, *, late: bool = False) -> Callable[[SimGraph], Graph]:
    """prep (reads table) -> [marker] -> forward (reads weight) [-> late read of table]."""

    def model(graph: SimGraph) -> Graph:
        table, weight = engine.table.data_ptr(), engine.weight.data_ptr()
        nodes = [Node(0, NodeKind.KERNEL, "gather_prep", words=(table,))]
        deps: tuple[int, ...] = (0,)
        planted = graph.planted[0].id if graph.planted else 0
        if planted:
            nodes.append(Node(1, NodeKind.EVENT_RECORD, deps=deps, event=planted))
            deps = (1,)
        nodes.append(Node(len(nodes), NodeKind.KERNEL, "matmul", deps=deps, words=(weight,)))
        if late:
            last = len(nodes) - 1
            nodes.append(Node(len(nodes), NodeKind.KERNEL, "late", deps=(last,), words=(table,)))
        return Graph(nodes)

    return model


class Seen:
    """Observer: demotions and decisions."""

    def __init__(self) -> None:
        self.demotions: list[tuple[str, int, str]] = []
        self.decisions: list[tuple[str, str]] = []

    @hookimpl
    def warpolicy_on_demotion(self, runner: str, bucket: int, reason: str) -> None:
        self.demotions.append((runner, bucket, reason))

    @hookimpl
    def warpolicy_on_decision(self, decision, where: str) -> None:
        self.decisions.append((where, decision.policy.label))


def setup(
    policy: P = P.IN_GRAPH,
    *,
    placement: str = "marker",
    walk: bool = True,
    late: bool = False,
    engine_marker: bool = False,
    external_events: bool = True,
    self_check: str = "warn",
):
    rt = sim_runtime(external_events=external_events)
    seen = Seen()
    rt.pm.register(seen, name="seen")
    engine = Engine(rt.platform, late=late, engine_marker=engine_marker)
    if walk:
        sim_impl(rt.platform).graph_model = graph_model(engine, late=late)
    cell = cell_policy(fixed_policy(policy), DECODE, placement=placement)
    fence = ReadDoneFence(rt.platform, name="decode", observers=rt.observers)
    capture = ReadDoneCapture(
        rt.platform, cell, fence, self_check=self_check, observers=rt.observers
    )
    return rt, engine, fence, capture, seen


def finish_all(engine: Engine, capture: ReadDoneCapture, **kw) -> tuple[dict, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcomes = engine.capture(capture, **kw)
    return outcomes, [str(w.message) for w in caught]


# -- resolving the policy once -------------------------------------------------------------------


class TestResolve:
    def test_the_registry_answers_once_per_fact_set_with_its_placement(self):
        rt = sim_runtime()
        cell = resolve_cell(PolicyEngine.load(), "triton", "decode", "none", platform=rt.platform)
        assert cell.mode is DECODE and cell.failure is None
        assert (cell.policies.planted, cell.policies.unplanted, cell.policies.eager) == (
            P.IN_GRAPH,
            P.POST_REPLAY,
            P.POST_REPLAY,
        )
        assert cell.placement is Placement.MARKER

    def test_without_external_events_the_planted_answer_is_never_in_graph(self):
        rt = sim_runtime(external_events=False)
        cell = resolve_cell(PolicyEngine.load(), "triton", "decode", platform=rt.platform)
        assert cell.policies.planted is not P.IN_GRAPH

    def test_an_unknown_backend_is_coarse_saying_why_loudly(self):
        """Issue 27 item 8: a backend declared in a layer the engine did not load used to give
        every bucket `none` without a word; now one warning names it and says to load the
        layer."""
        rt = sim_runtime()
        with pytest.warns(RuntimeWarning, match=r"unknown backend 'no_such_backend'.*file loaded"):
            cell = resolve_cell(
                PolicyEngine.load(), "no_such_backend", DECODE, platform=rt.platform
            )
        assert {cell.policies.planted, cell.policies.unplanted, cell.policies.eager} == {P.NONE}
        assert "no_such_backend" in cell.failure

    def test_a_known_backend_resolves_without_a_warning(self):
        """The control: the warning is for the failure only (warnings are errors here)."""
        rt = sim_runtime()
        cell = resolve_cell(PolicyEngine.load(), "triton", DECODE, platform=rt.platform)
        assert cell.failure is None and cell.policies.planted is P.IN_GRAPH

    def test_an_unknown_mode_or_placement_is_an_error_at_once(self):
        rt = sim_runtime()
        with pytest.raises(UnknownNameError):
            resolve_cell(PolicyEngine.load(), "triton", "decodee", platform=rt.platform)
        with pytest.raises(InputError, match="placement"):
            cell_policy(fixed_policy(P.IN_GRAPH), DECODE, placement="inside")

    def test_a_policy_that_raises_is_asked_once_and_is_coarse(self):
        calls = []

        def policy(mode, eager, planted):
            calls.append((eager, planted))
            raise RuntimeError("registry down")

        cell = cell_policy(policy, DECODE)
        assert calls == [(False, True)]  # never asked again
        assert cell.policies.planted is P.NONE and "registry down" in cell.failure

    def test_a_failed_placement_lookup_plants_the_marker_and_warns_at_capture(self):
        class Placed:
            def lookup(self, mode, eager=False, planted=True):
                return P.IN_GRAPH

            def placement(self, mode):
                raise KeyError(mode)

        cell = cell_policy(Placed(), DECODE)
        assert cell.placement is Placement.MARKER and "placement lookup failed" in cell.note
        rt = sim_runtime()
        fence = ReadDoneFence(rt.platform)
        with pytest.warns(RuntimeWarning, match="placement lookup failed"):
            ReadDoneCapture(rt.platform, cell, fence)


# -- the marker ----------------------------------------------------------------------------------


class TestMarker:
    def test_a_checked_marker_publishes_the_bucket_s_own_event_in_graph(self):
        rt, engine, fence, capture, seen = setup()
        outcomes, messages = finish_all(engine, capture)
        assert messages == [] and seen.demotions == []
        events = set()
        for bs, outcome in outcomes.items():
            assert outcome.policy is P.IN_GRAPH and outcome.report.ok and outcome.report.walked
            assert outcome.event is engine.graphs[bs].planted[0]  # this graph's own event
            assert engine.graphs[bs].instantiated
            events.add(id(outcome.event))
        assert len(events) == len(BUCKETS)
        assert [d for d in seen.decisions] == [("runner:decode", "in_graph")] * len(BUCKETS)

    def test_a_late_reader_demotes_to_the_unplanted_answer_naming_it(self):
        rt, engine, fence, capture, seen = setup(late=True)
        outcomes, messages = finish_all(engine, capture)
        for outcome in outcomes.values():
            assert outcome.policy is P.POST_REPLAY and outcome.event is None
            assert outcome.report.ok is False and "late" in outcome.report.detail
        assert sorted(b for _, b, _ in seen.demotions) == sorted(BUCKETS)
        assert len(messages) == len(BUCKETS) and all(
            "demoted to post_replay" in m for m in messages
        )

    def test_self_check_error_raises_instead(self):
        _, engine, _, capture, _ = setup(late=True, self_check="error")
        with pytest.raises(SelfCheckError, match="late"):
            engine.capture(capture)

    def test_self_check_error_without_a_walk_refuses_to_start(self):
        rt = sim_runtime()  # no graph model: the walk is unavailable
        cell = cell_policy(fixed_policy(P.IN_GRAPH), DECODE)
        with pytest.raises(SelfCheckError, match="cannot run"):
            ReadDoneCapture(rt.platform, cell, ReadDoneFence(rt.platform), self_check="error")

    def test_without_a_walk_the_confirmed_plant_is_trusted_as_in_the_runners(self):
        _, engine, _, capture, seen = setup(walk=False)
        outcomes, messages = finish_all(engine, capture)
        assert messages == [] and seen.demotions == []
        assert {o.policy for o in outcomes.values()} == {P.IN_GRAPH}
        assert not any(o.report.walked for o in outcomes.values())

    @pytest.mark.parametrize("device, said", [("sim", False), ("rocm", True)])
    def test_without_a_walk_a_real_platform_says_the_check_was_skipped(self, device, said):
        """A platform plugin without a graph walk (here the simulated implementation claiming
        another device type) is told once that its markers go unchecked; the simulated
        platform, whose graphs re-run their Python body, is not."""
        platform = Platform(FaultySimPlatform(device=device))
        engine = Engine(platform)
        cell = cell_policy(fixed_policy(P.IN_GRAPH), DECODE)
        capture = ReadDoneCapture(platform, cell, ReadDoneFence(platform))
        outcomes, messages = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.IN_GRAPH}
        skipped = [m for m in messages if "marker self-check skipped" in m]
        assert len(skipped) == (1 if said else 0)
        assert not said or "no graph model to walk" in skipped[0]

    def test_a_marker_never_recorded_is_a_doubt(self):
        _, engine, fence, capture, seen = setup()
        bucket = capture.begin(2)
        graph = engine.platform.new_graph(keep_graph=True)
        engine.platform.capture_callable(graph, lambda: None)  # mark() forgotten
        with pytest.warns(RuntimeWarning, match="mark\\(\\) not called"):
            outcome = bucket.finish(graph, engine.shared_buffers)
        assert outcome.policy is P.NONE and "coarse" in seen.demotions[0][2]

    def test_a_failed_plant_is_a_doubt(self):
        rt, engine, _, capture, _ = setup()
        sim_impl(rt.platform).inject("is_capturing", mode="raise")
        outcomes, messages = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.NONE}
        assert any("plant failed" in m for m in messages)

    def test_a_failed_event_is_a_doubt(self):
        rt, engine, _, capture, _ = setup()
        sim_impl(rt.platform).inject("create_event")
        outcomes, _ = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.NONE}
        assert all("read-done event failed" in o.release.reason for o in outcomes.values())

    def test_a_failed_instantiation_is_a_doubt(self):
        rt, engine, _, capture, _ = setup()
        sim_impl(rt.platform).inject("instantiate")
        outcomes, _ = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.NONE}
        assert all("instantiating" in o.release.reason for o in outcomes.values())

    def test_a_probe_that_raises_is_a_doubt_for_every_bucket(self):
        rt = sim_runtime()
        engine = Engine(rt.platform)
        sim_impl(rt.platform).graph_model = graph_model(engine)
        sim_impl(rt.platform).inject("graph_walk_unavailable")
        cell = cell_policy(fixed_policy(P.IN_GRAPH), DECODE)
        capture = ReadDoneCapture(rt.platform, cell, ReadDoneFence(rt.platform))
        assert capture.walk.failed is not None
        outcomes, _ = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.NONE}

    def test_no_external_events_gives_the_unplanted_answer(self):
        _, engine, _, capture, _ = setup(external_events=False)
        outcomes, messages = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.POST_REPLAY}
        assert all("no external events" in o.report.detail for o in outcomes.values())
        assert messages == []

    def test_a_graph_not_kept_cannot_be_checked_and_is_a_doubt(self):
        _, engine, _, capture, _ = setup()
        outcomes, _ = finish_all(engine, capture, kept=False)
        assert {o.policy for o in outcomes.values()} == {P.NONE}


class TestEngineMarker:
    """A marker the engine recorded itself: only a walk confirms it."""

    def test_checked_it_publishes_the_engine_s_own_event(self):
        _, engine, _, capture, seen = setup(engine_marker=True)
        outcomes, messages = finish_all(engine, capture)
        assert messages == []
        for bs, outcome in outcomes.items():
            assert outcome.policy is P.IN_GRAPH and outcome.event is engine.own_events[bs]

    def test_with_a_late_reader_it_is_refuted(self):
        _, engine, _, capture, _ = setup(engine_marker=True, late=True)
        outcomes, _ = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.POST_REPLAY}

    @pytest.mark.parametrize("how", ["no walk", "self-check off"])
    def test_unconfirmed_it_is_never_in_graph(self, how):
        kw = {"walk": False} if how == "no walk" else {"self_check": "off"}
        _, engine, _, capture, seen = setup(engine_marker=True, **kw)
        outcomes, messages = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.POST_REPLAY}
        assert all("cannot be confirmed" in o.release.reason for o in outcomes.values())
        assert len(seen.demotions) == len(BUCKETS)


# -- derived placement ---------------------------------------------------------------------------


class TestDerived:
    def test_the_node_is_planted_after_the_last_shared_reader(self):
        _, engine, _, capture, _ = setup(placement="derived", late=True)
        outcomes, messages = finish_all(engine, capture)
        assert messages == []
        for bs, outcome in outcomes.items():
            assert outcome.policy is P.IN_GRAPH
            assert outcome.event in engine.graphs[bs].derived
            assert not engine.graphs[bs].planted  # mark() plants nothing under derived
            assert "late #" in outcome.report.detail

    def test_without_a_walk_it_is_unplanted(self):
        _, engine, _, capture, seen = setup(placement="derived", walk=False)
        outcomes, messages = finish_all(engine, capture)
        assert {o.policy for o in outcomes.values()} == {P.POST_REPLAY}
        assert len(messages) == len(BUCKETS) and all("no earlier than" in m for m in messages)

    def test_an_already_instantiated_graph_is_a_doubt(self):
        rt, engine, _, capture, _ = setup(placement="derived")
        bucket = capture.begin(2)
        graph = rt.platform.new_graph(keep_graph=True)
        rt.platform.capture_callable(graph, lambda: None)
        rt.platform.instantiate(graph)
        with pytest.warns(RuntimeWarning, match="already instantiated"):
            outcome = bucket.finish(graph, engine.shared_buffers)
        assert outcome.policy is P.NONE


class TestRawGraph:
    """A raw graph handle the engine holds (`RawGraph`), through the sim's graph model."""

    @pytest.mark.parametrize("placement", ["marker", "derived"])
    def test_the_raw_handle_is_walked_and_left_for_the_engine_to_instantiate(self, placement):
        _, engine, _, capture, _ = setup(placement=placement, late=placement == "derived")
        outcomes, messages = finish_all(engine, capture, raw=True)
        assert messages == []
        for bs, outcome in outcomes.items():
            assert outcome.policy is P.IN_GRAPH and outcome.report.walked
            assert not engine.graphs[bs].instantiated  # the engine's job, after finish

    def test_a_handle_of_no_graph_is_a_doubt(self):
        rt, engine, _, capture, _ = setup(placement="derived")
        bucket = capture.begin(2)
        with pytest.warns(RuntimeWarning, match="no graph of this simulated platform"):
            outcome = bucket.finish(RawGraph(10_000), engine.shared_buffers)
        assert outcome.policy is P.NONE

    @pytest.mark.parametrize("bad", [0, -3, True, "graph", None])
    def test_a_handle_must_be_a_positive_integer(self, bad):
        with pytest.raises((TypeError, ValueError), match="cudaGraph_t"):
            RawGraph(bad)

    def test_a_graph_not_kept_has_no_raw_handle(self):
        rt = sim_runtime()
        graph = rt.platform.new_graph(keep_graph=False)
        rt.platform.capture_callable(graph, lambda: None)
        with pytest.raises(RuntimeError, match="keep_graph=True"):
            graph.raw_cuda_graph()


# -- publishing and the barrier without runners --------------------------------------------------


class TestPublish:
    def _run(self, policy: P, *, barrier: bool = True, late: bool = False):
        rt, engine, fence, capture, _ = setup(policy, late=late)
        outcomes, _ = finish_all(engine, capture)
        p = rt.platform
        impl: SimPlatform = sim_impl(p)
        schedule = p.new_stream()
        forward = p.current_stream()
        release = outcomes[4].release
        engine.reads.clear()
        fence.before_replay(release)
        p.replay(engine.graphs[4])
        fence.after_replay(release)
        read_done = fence.take()
        kind = None
        if barrier:
            kind = SchedulerBarrier(p, observers=rt.observers).apply(schedule, forward, read_done)
        with p.stream(schedule):
            write = impl.mark("scheduler writes table")
        return read_done, kind, [impl.happens_before(r, write) for r in engine.reads]

    def test_in_graph_hands_out_the_event_and_the_writes_follow_the_prep(self):
        read_done, kind, ordered = self._run(P.IN_GRAPH)
        assert read_done.policy is P.IN_GRAPH and kind == "event"
        assert ordered == [True]

    def test_post_replay_records_after_the_replay(self):
        read_done, kind, ordered = self._run(P.POST_REPLAY)
        assert read_done.policy is P.POST_REPLAY and kind == "event" and ordered == [True]

    def test_positive_control_no_barrier_leaves_the_writes_unordered(self):
        _, _, ordered = self._run(P.IN_GRAPH, barrier=False)
        assert ordered == [False]

    def test_a_demoted_late_reader_is_covered_by_the_post_replay_event(self):
        read_done, _, ordered = self._run(P.IN_GRAPH, late=True)
        assert read_done.policy is P.POST_REPLAY and ordered == [True, True]

    def test_the_eager_release_follows_the_policy(self):
        _, _, _, capture, seen = setup(P.IN_GRAPH)
        release = capture.eager()
        assert release.bucket is None and release.policy is P.POST_REPLAY
        assert seen.decisions == [("runner:decode", "post_replay")]


# -- the runners stand on the same surface -------------------------------------------------------


class RunnerModel:
    """The `Engine`'s graph as a `ModelAdapter` (for the same runner)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.shared_buffers = engine.shared_buffers

    def bucket_sizes(self, mode):
        return BUCKETS

    def prepare_bucket(self, bucket: int) -> None:
        pass

    def host_prep(self, batch, bucket: int) -> None:
        pass

    def graph_prep(self, bucket: int) -> None:
        pass

    def forward(self, bucket: int) -> torch.Tensor | None:
        return None


@pytest.mark.parametrize(
    "case",
    [
        {},
        {"late": True},
        {"walk": False},
        {"placement": "derived"},
        {"placement": "derived", "walk": False},
        {"external_events": False},
        {"policy": P.POST_REPLAY},
        {"policy": P.NONE},
    ],
    ids=str,
)
def test_the_runner_and_an_engine_with_its_own_capture_decide_alike(case):
    policy = case.get("policy", P.IN_GRAPH)
    kw = {k: v for k, v in case.items() if k != "policy"}
    _, engine, _, capture, _ = setup(policy, **kw)
    outcomes, _ = finish_all(engine, capture)

    rt = sim_runtime(external_events=kw.get("external_events", True))
    runner_engine = Engine(rt.platform, late=kw.get("late", False))
    if kw.get("walk", True):
        sim_impl(rt.platform).graph_model = graph_model(runner_engine, late=kw.get("late", False))
    runner = DecodeRunner(
        RunnerModel(runner_engine),
        fixed_policy(policy),
        rt.platform,
        placement=kw.get("placement", "marker"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner.capture()
    assert {bs: o.policy for bs, o in outcomes.items()} == {
        bs: runner.policy_for(bs) for bs in BUCKETS
    }
    assert {bs: o.report.detail for bs, o in outcomes.items()} == {
        bs: r.detail for bs, r in runner.capture_report.items()
    }


def test_a_cell_policy_is_a_plain_record():
    cell = cell_policy(fixed_policy(P.IN_GRAPH), "decode")
    assert isinstance(cell, CellPolicy) and cell.placement is Placement.MARKER


# -- issue 26 finding 1: the orderings around the engine's own code ----------------------------


class _Interrupt(BaseException):
    """A custom BaseException, as a plugin or a signal handler might raise."""


@pytest.mark.parametrize("fault", [RuntimeError, KeyboardInterrupt, SystemExit, _Interrupt])
def test_a_warm_up_that_raises_is_joined_before_anything_after_it(fault):
    """0.3.0's guide and example joined the warm-up stream in plain statements after the block:
    a warm-up that raised left its shared reads unjoined, and the coarse barrier (the current
    stream) then released the scheduler before them: 445 cases in the fault matrix."""
    from warpolicy.runtime.owned_capture import warm_up
    from warpolicy.testing import sim_platform

    platform = sim_platform()
    impl = sim_impl(platform)
    main = platform.current_stream()
    reads = []

    def engine_warm_up():
        with warm_up(platform) as side:
            assert platform.current_stream() is side and side is not main
            reads.append(impl.mark("warm-up read of a shared buffer"))
            raise fault("the warm-up failed")

    with pytest.raises(fault):
        engine_warm_up()
    assert platform.current_stream() is main
    after = impl.mark("the coarse barrier's view: the current stream")
    assert impl.happens_before(reads[0], after)
    assert impl.log[-1] == ("synchronize",)


def test_without_the_helper_the_failed_warm_up_is_unordered():
    """The positive control: the 0.3.0 shape (join after the block) leaves the read unordered
    when the warm-up raises, so the test above can fail."""
    from warpolicy.testing import sim_platform

    platform = sim_platform()
    impl = sim_impl(platform)
    main, side = platform.current_stream(), platform.new_stream()
    platform.wait_stream(side, main)
    reads = []

    def engine_warm_up():
        with platform.stream(side):
            reads.append(impl.mark("warm-up read"))
            raise RuntimeError("the warm-up failed")
        platform.wait_stream(main, side)  # never reached

    with pytest.raises(RuntimeError):
        engine_warm_up()
    assert not impl.happens_before(reads[0], impl.mark("after"))


def test_a_second_interrupt_in_the_warm_up_join_still_waits():
    from warpolicy.runtime.owned_capture import warm_up
    from warpolicy.testing import sim_platform

    platform = sim_platform()
    impl = sim_impl(platform)
    real = platform.wait_stream
    main = platform.current_stream()

    def interrupted(stream, other):
        if stream is main:
            raise KeyboardInterrupt("second")
        real(stream, other)

    platform.wait_stream = interrupted

    def engine_warm_up():
        with warm_up(platform):
            impl.mark("warm-up read")
            raise RuntimeError("first")

    with pytest.raises(KeyboardInterrupt, match="second"):
        engine_warm_up()
    assert ("synchronize",) in impl.log[-2:]


def test_the_warm_up_starts_after_the_streams_it_is_given():
    from warpolicy.runtime.owned_capture import warm_up
    from warpolicy.testing import sim_platform

    platform = sim_platform()
    impl = sim_impl(platform)
    schedule = platform.new_stream()
    with platform.stream(schedule):
        write = impl.mark("the scheduler's write")
    with warm_up(platform, after=[schedule]):
        read = impl.mark("warm-up read")
    assert impl.happens_before(write, read)


@pytest.mark.parametrize("fault", [None, RuntimeError, KeyboardInterrupt])
def test_capturing_waits_before_and_after_on_any_exit(fault):
    from warpolicy.runtime.owned_capture import capturing
    from warpolicy.testing import sim_platform

    platform = sim_platform()
    impl = sim_impl(platform)
    start = len(impl.log)
    if fault is None:
        with capturing(platform):
            impl.log.append(("body",))
    else:

        def engine_capture():
            with capturing(platform):
                impl.log.append(("body",))
                raise fault("capture failed")

        with pytest.raises(fault):
            engine_capture()
    assert impl.log[start:] == [("synchronize",), ("body",), ("synchronize",)]


def test_eager_release_before_any_capture_and_shutdown():
    from warpolicy.runtime.owned_capture import eager_release, shutdown
    from warpolicy.testing import sim_platform

    platform = sim_platform()
    impl = sim_impl(platform)
    cell = cell_policy(fixed_policy("in_graph"), "decode")
    fence = ReadDoneFence(platform, name="decode")
    release = eager_release(cell, fence)
    assert release.policy is WarReadDonePolicy.POST_REPLAY and release.bucket is None
    fence.before_replay(release)
    fence.after_replay(release)
    shutdown(platform, fence)
    assert impl.log[-1] == ("synchronize",) and fence.take() is None


def test_the_guide_captures_inside_the_warm_up_and_capture_orderings():
    """docs/integrating.md's Step 3 warms up, captures and ends serving through the helpers
    (tests/docs/test_code_blocks.py runs every block of the guide, in order, on sim)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "integrating.md").read_text()
    code = "".join(re.findall(r"```python\n(.*?)```", text, re.S))
    for call in ("with capturing(p):", "with warm_up(p):", "shutdown(p, fence)"):
        assert call in code, call


@pytest.mark.parametrize("bucket", ["x", None, -1, 0, 2.0, True])
def test_begin_refuses_what_is_not_a_batch_size_in_one_line(bucket):
    """Issue 26 finding 9: 0.3.0 raised raw errors for 'x' / None and accepted -1."""
    from warpolicy.testing import sim_platform

    platform = sim_platform()
    fence = ReadDoneFence(platform, name="decode")
    capture = ReadDoneCapture(platform, cell_policy(fixed_policy("in_graph"), "decode"), fence)
    with pytest.raises(InputError, match="a bucket is a batch size, a positive int"):
        capture.begin(bucket)
    assert capture.begin(torch.tensor(2)).bucket == 2
