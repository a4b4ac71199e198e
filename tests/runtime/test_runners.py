"""Graph runners on the simulated platform: capture/replay sequencing, buckets, padding, eager
fallback and per-mode policy resolution."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner, PrefillRunner, VerifyRunner, sound
from warpolicy.testing import RecModel, sim_impl, sim_platform, sim_runtime

P = WarReadDonePolicy


def merged(platform, model: RecModel) -> list:
    """One ordered list of model calls and platform calls."""
    sim_impl(platform).listeners.append(model.events.append)
    return model.events


def calls_after(events: list, start: int) -> list:
    return [
        e
        for e in events[start:]
        if e[0] in ("host_prep", "record", "replay", "graph_prep", "forward")
    ]


@pytest.fixture
def platform():
    return sim_platform()


def make(platform, policy="in_graph", buckets=(1, 2, 4, 8), cls=DecodeRunner, **kw):
    model = RecModel(buckets)
    events = merged(platform, model)
    runner = cls(model, fixed_policy(policy) if isinstance(policy, str) else policy, platform, **kw)
    return runner, model, events


# -- buckets --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size, bucket", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, None)])
def test_bucket_selection_picks_smallest_that_fits(platform, size, bucket):
    runner, _, _ = make(platform)
    runner.capture()
    assert runner.bucket_for(size) == bucket


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers(1, 64), max_size=6), st.integers(1, 80))
def test_bucket_for_is_smallest_fitting_bucket(buckets, size):
    runner, _, _ = make(sim_platform(), buckets=sorted(buckets))
    runner.capture()
    fitting = [b for b in buckets if b >= size]
    assert runner.bucket_for(size) == (min(fitting) if fitting else None)


def test_bad_buckets_are_input_errors(platform):
    with pytest.raises(InputError):
        make(platform, buckets=(0, 4))


def test_before_capture_every_step_is_eager(platform):
    runner, model, _ = make(platform)
    runner.run([1.0])
    assert runner.last_step.bucket is None
    assert sim_impl(platform).log.of("replay") == []


def test_empty_batch_is_an_input_error(platform):
    runner, _, _ = make(platform)
    runner.capture()
    with pytest.raises(InputError):
        runner.run([])


# -- capture ----------------------------------------------------------------------------------------


def test_capture_warms_up_then_plants_after_graph_prep_in_every_bucket(platform):
    runner, model, events = make(platform, buckets=(2, 4))
    runner.capture()
    kinds = [e[0] for e in events]
    # warm-up: one eager prep + forward per bucket before any capture
    first_capture = kinds.index("capture_begin")
    assert [e for e in events[:first_capture] if e[0] in ("graph_prep", "forward")] == [
        ("graph_prep", 2),
        ("forward", 2),
        ("graph_prep", 4),
        ("forward", 4),
    ]
    # each bucket gets a fresh external event, seeded with one eager record before its capture
    ext = [e for e in events if e[0] == "create_event" and e[2]]
    assert len(ext) == 2
    for (_, ev_id, _), bucket in zip(ext, (4, 2)):
        begin = next(
            i
            for i, e in enumerate(events)
            if e[0] == "capture_begin" and events[i + 1] == ("graph_prep", bucket)
        )
        assert ("record", ev_id, 0, False) in events[:begin]
        # inside the capture: graph_prep, plant (record during capture), forward
        body = events[begin + 1 : begin + 4]
        assert body[0] == ("graph_prep", bucket)
        assert body[1][0] == "record" and body[1][1] == ev_id and body[1][3] is True
        assert body[2] == ("forward", bucket)
        assert runner.captured[bucket].event.id == ev_id
    assert all(cb.planted for cb in runner.captured.values())
    assert sorted(runner.captured) == [2, 4]


def test_capture_keeps_raw_graphs_when_asked(platform):
    runner, _, _ = make(platform, keep_graphs=True)
    runner.capture()
    assert all(cb.graph.keep_graph for cb in runner.captured.values())


# -- replay sequencing per policy -------------------------------------------------------------------


def test_pre_replay_records_after_host_prep_before_replay(platform):
    runner, _, events = make(platform, "pre_replay")
    runner.capture()
    start = len(events)
    runner.run([1.0, 2.0, 3.0])
    seq = calls_after(events, start)
    assert seq[0] == ("host_prep", 3, 4)
    assert seq[1][0] == "record" and seq[1][3] is False
    assert seq[2][0] == "replay"
    read_done = runner.fence.take()
    assert read_done.policy == P.PRE_REPLAY and read_done.event.id == seq[1][1]


def test_in_graph_hands_out_the_planted_event_and_records_nothing_fresh(platform):
    runner, _, events = make(platform, "in_graph")
    runner.capture()
    start = len(events)
    runner.run([1.0])
    seq = calls_after(events, start)
    assert [e[0] for e in seq] == ["host_prep", "replay", "graph_prep", "record", "forward"]
    assert seq[3][3] == "in_graph"  # the planted node fires inside the replay
    read_done = runner.fence.take()
    assert read_done.policy == P.IN_GRAPH and read_done.event is runner.fence.event


def test_post_replay_records_after_the_replay(platform):
    runner, _, events = make(platform, "post_replay")
    runner.capture()
    start = len(events)
    runner.run([1.0])
    seq = calls_after(events, start)
    assert [e[0] for e in seq][-1] == "record" and seq[-1][3] is False
    assert runner.fence.take().policy == P.POST_REPLAY


def test_none_publishes_nothing(platform):
    runner, _, events = make(platform, "none")
    runner.capture()
    start = len(events)
    runner.run([1.0])
    assert [e for e in calls_after(events, start) if e[0] == "record"] == [
        e for e in calls_after(events, start) if e[0] == "record" and e[3] == "in_graph"
    ]
    assert runner.fence.take() is None


def test_take_is_consume_once(platform):
    runner, _, _ = make(platform, "post_replay")
    runner.capture()
    runner.run([1.0])
    assert runner.fence.take() is not None
    assert runner.fence.take() is None


# -- padding and outputs ----------------------------------------------------------------------------


def test_batch_is_padded_to_its_bucket_and_output_is_the_buckets(platform):
    runner, model, _ = make(platform)
    runner.capture()
    model.table[0] = 10.0  # the replayed body reads the shared table in graph_prep
    out = runner.run([1.0, 2.0, 3.0])
    assert runner.last_step.bucket == 4 and runner.last_step.size == 3
    assert out.tolist() == [12.0, 14.0, 16.0, 8.0]  # padding row: -1 * 2 + 10


# -- eager fallback ---------------------------------------------------------------------------------


def test_eager_fallback_when_no_bucket_fits(platform):
    runner, model, events = make(platform, "in_graph")
    runner.capture()
    replays = len(sim_impl(platform).log.of("replay"))
    start = len(events)
    out = runner.run([1.0] * 9)
    assert len(sim_impl(platform).log.of("replay")) == replays  # no graph
    assert runner.last_step.bucket is None and model.prepared.count(9) == 1
    seq = calls_after(events, start)
    assert [e[0] for e in seq] == ["host_prep", "graph_prep", "forward", "record"]
    assert out.tolist() == [2.0] * 9
    runner.run([1.0] * 9)
    assert model.prepared.count(9) == 1  # eager buffers prepared once per size


def test_eager_in_graph_is_demoted_to_post_replay(platform):
    runner, _, _ = make(platform, "in_graph")
    runner.capture()
    assert runner.policy_for(None) == P.POST_REPLAY
    runner.run([1.0] * 9)
    assert runner.fence.take().policy == P.POST_REPLAY


def test_sound_demotion_never_goes_earlier():
    for policy in P:
        for eager in (False, True):
            for planted in (False, True):
                assert sound(policy, eager, planted) >= policy
    assert sound(P.IN_GRAPH, False, False) == P.POST_REPLAY
    assert sound(P.IN_GRAPH, True, True) == P.POST_REPLAY
    assert sound(P.PRE_REPLAY, True, False) == P.PRE_REPLAY


def test_unplanted_buckets_demote_in_graph():
    platform = sim_platform(external_events=False)
    runner, _, _ = make(platform, "in_graph")
    runner.capture()
    assert not any(cb.planted for cb in runner.captured.values())
    assert {cb.policy for cb in runner.captured.values()} == {P.POST_REPLAY}
    runner.run([1.0])
    assert runner.fence.take().policy == P.POST_REPLAY


# -- policy resolution ------------------------------------------------------------------------------


class RecordingPolicy:
    """A CompiledPolicy-like object: records every lookup."""

    def __init__(self, answer=P.IN_GRAPH) -> None:
        self.calls: list[tuple] = []
        self.answer = answer

    def lookup(self, mode, eager=False, planted=True):
        self.calls.append((mode, eager, planted))
        return self.answer


ONCE = [(False, True), (False, False), (True, False)]  # graph planted, graph unplanted, eager


@pytest.mark.parametrize(
    "cls, mode, kw",
    [
        (DecodeRunner, ForwardMode.DECODE, {}),
        (PrefillRunner, ForwardMode.EXTEND, {}),
        (VerifyRunner, ForwardMode.TARGET_VERIFY, {"draft_tokens": 1}),
    ],
)
def test_the_policy_is_asked_once_per_fact_set_and_never_again(platform, cls, mode, kw):
    policy = RecordingPolicy()
    runner, model, _ = make(platform, policy, cls=cls, **kw)
    assert ("bucket_sizes", mode) in model.events
    runner.capture()
    assert policy.calls == [(mode, *facts) for facts in ONCE]
    for _ in range(5):
        runner.run([1.0, 2.0])
    runner.run([1.0] * 9)
    runner.run([1.0] * 9)
    runner.capture()  # a re-capture decides from the same answers
    assert policy.calls == [(mode, *facts) for facts in ONCE]


class FailsOnce(RecordingPolicy):
    """Raises on its first lookup, then answers in_graph: a second ask would read in_graph."""

    def lookup(self, mode, eager=False, planted=True):
        super().lookup(mode, eager, planted)
        if len(self.calls) == 1:
            raise RuntimeError("transient")
        return self.answer


def test_a_lookup_that_fails_once_is_coarse_and_never_asked_again(platform):
    policy = FailsOnce()
    runner, _, _ = make(platform, policy, buckets=(1, 2))
    with pytest.warns(RuntimeWarning, match="policy lookup failed"):
        runner.capture()
    assert {cb.policy for cb in runner.captured.values()} == {P.NONE}
    assert runner.policy_for(None) == P.NONE and len(policy.calls) == 1
    runner.run([1.0])
    assert runner.fence.take() is None and runner.last_step.policy == P.NONE


def test_mode_can_be_overridden(platform):
    policy = RecordingPolicy()
    runner, _, _ = make(platform, policy, mode="draft_extend")
    runner.capture()
    assert runner.mode == ForwardMode.DRAFT_EXTEND
    assert {c[0] for c in policy.calls} == {ForwardMode.DRAFT_EXTEND}


def test_failing_policy_lookup_is_coarse_with_one_warning(platform):
    def broken(mode, eager, planted):
        raise RuntimeError("boom")

    runner, _, _ = make(platform, broken)
    with pytest.warns(RuntimeWarning, match="policy lookup failed") as record:
        runner.capture()
    assert len(record) == 1
    assert {cb.policy for cb in runner.captured.values()} == {P.NONE}


def test_non_callable_policy_is_an_input_error(platform):
    with pytest.raises(InputError):
        make(platform, 42)


def test_publish_failure_fails_closed(platform, monkeypatch):
    runner, _, _ = make(platform, "post_replay")
    runner.capture()

    def boom(*a: Any, **k: Any) -> None:
        raise RuntimeError("fence broke")

    monkeypatch.setattr(runner.fence, "after_replay", boom)
    with pytest.warns(RuntimeWarning, match="publishing the read-done event failed"):
        runner.run([1.0])
    assert runner.fence.take() is None


def test_failed_before_replay_is_not_followed_by_a_publish(platform, monkeypatch):
    runner, _, _ = make(platform, "pre_replay")
    runner.capture()
    seen = []
    monkeypatch.setattr(runner.fence, "before_replay", lambda *a, **k: 1 / 0)
    monkeypatch.setattr(runner.fence, "after_replay", lambda *a, **k: seen.append(a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner.run([1.0])
    assert seen == []
    assert runner.fence.take() is None and runner.last_step.policy == P.NONE


# -- verify runner ----------------------------------------------------------------------------------


def test_verify_buckets_must_be_multiples_of_draft_tokens(platform):
    with pytest.raises(InputError, match="multiples"):
        make(platform, cls=VerifyRunner, buckets=(2, 3), draft_tokens=2)
    with pytest.raises(InputError):
        make(platform, cls=VerifyRunner, draft_tokens=0)


def test_verify_runner_buckets_by_batch_times_draft(platform):
    runner, _, _ = make(platform, cls=VerifyRunner, buckets=(3, 6, 12), draft_tokens=3)
    runner.capture()
    assert runner.batch_buckets == (1, 2, 4)
    runner.run([1.0] * 6)
    assert runner.last_step.bucket == 6
    with pytest.raises(InputError, match="multiple"):
        runner.run([1.0] * 4)


def test_verify_publishes_only_what_the_policy_says_for_the_spec(platform):
    def spec_policy(mode, eager, planted):  # an EAGLE-like spec: verify publishes nothing
        return P.NONE if mode == ForwardMode.TARGET_VERIFY else P.IN_GRAPH

    runner, _, _ = make(platform, spec_policy, cls=VerifyRunner, draft_tokens=1)
    runner.capture()
    runner.run([1.0, 2.0])
    assert runner.fence.take() is None


# -- prefill runner ---------------------------------------------------------------------------------


def test_eager_prefill_snapshot_point_is_right_after_host_prep(platform):
    runner, _, events = make(platform, "pre_replay", cls=PrefillRunner, buckets=(16,))
    runner.capture()
    start = len(events)
    runner.run([1.0] * 20)
    seq = calls_after(events, start)
    assert [e[0] for e in seq] == ["host_prep", "record", "graph_prep", "forward"]
    assert runner.fence.take().policy == P.PRE_REPLAY


def test_engine_compiled_policy_is_accepted(platform):
    engine_mod = pytest.importorskip("warpolicy.registry.engine")
    compiled = engine_mod.CompiledPolicy("x", "none", {ForwardMode.DECODE: (P.POST_REPLAY,) * 4})
    runner, _, _ = make(platform, compiled)
    runner.capture()
    assert runner.policy_for(1) == P.POST_REPLAY
    prefill, _, _ = make(platform, compiled, cls=PrefillRunner)
    prefill.capture()
    assert prefill.policy_for(1) == P.NONE  # mode not in the table: NONE


def test_observers_see_each_resolved_decision_with_its_reasons():
    from warpolicy.registry.engine import PolicyEngine
    from warpolicy.runtime.hookspecs import hookimpl

    seen = []

    class Observer:
        @hookimpl
        def warpolicy_on_decision(self, decision, where):
            seen.append((where, decision))

    rt = sim_runtime()
    rt.pm.register(Observer())
    compiled = PolicyEngine.load(plugins=False, environ={}).compile("fa3")
    runner, _, _ = make(rt.platform, compiled, buckets=(1, 2), observers=rt.observers)
    runner.capture()  # each bucket's decision and the eager one
    runner.policy_for(None)
    assert [w for w, _ in seen] == ["runner:decode"] * 3
    policies = sorted(d.policy.label for _, d in seen)
    assert policies == ["in_graph", "in_graph", "post_replay"]
    eager = next(d for _, d in seen if d.context.eager)
    assert eager.reasons[0].id == "declared" and eager.reasons[-1].id == "sound-demotion"


def test_last_step_says_nothing_was_published_after_a_publish_failure(platform, monkeypatch):
    runner, _, _ = make(platform, "post_replay")
    runner.capture()
    monkeypatch.setattr(runner.fence, "after_replay", lambda *a, **k: 1 / 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner.run([1.0])
    assert runner.last_step.policy == P.NONE and runner.fence.take() is None


def test_eager_step_never_claims_a_planted_node(platform, monkeypatch):
    runner, _, _ = make(platform, "in_graph")
    runner.capture()
    seen = []
    real_after = runner.fence.after_replay
    monkeypatch.setattr(
        runner.fence,
        "after_replay",
        lambda rel, **k: (seen.append((rel.policy, rel.event)), real_after(rel, **k)),
    )
    runner.run([1.0] * 9)  # no bucket fits
    runner.run([1.0])
    assert seen == [(P.POST_REPLAY, None), (P.IN_GRAPH, runner.captured[1].event)]
    events = [cb.event for cb in runner.captured.values()]
    assert len({id(e) for e in events}) == len(events)  # a fresh event per bucket


# -- publishes tied to their bucket's graph, failures during capture --------------------------------


def test_each_bucket_keeps_the_event_its_own_graph_records(platform):
    runner, _, _ = make(platform, "in_graph", buckets=(2, 4))
    impl = sim_impl(platform)
    captured = []  # the second bucket captured (2, smallest last) fails to plant
    impl.inject("record", "raise", when=lambda: impl.capturing and len(captured) == 1)
    impl.listeners.append(lambda e: e[0] == "capture_end" and captured.append(e))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.capture()
    impl.clear_faults()
    assert any("plant failed" in str(w.message) for w in caught)
    assert any("bucket 2 publishes nothing" in str(w.message) for w in caught)
    assert runner.captured[4].event is not None and runner.captured[2].event is None
    assert runner.captured[4].policy == P.IN_GRAPH and runner.captured[2].policy == P.NONE
    runner.run([1.0, 2.0, 3.0])
    assert runner.fence.take().event is runner.captured[4].event
    runner.run([1.0])  # bucket 2 doubted its node: coarse, never bucket 4's event
    assert runner.fence.take() is None and runner.last_step.policy == P.NONE


def test_a_failed_recapture_leaves_no_graph_and_the_runner_coarse(platform):
    runner, _, _ = make(platform, "in_graph", buckets=(2, 4))
    runner.capture()
    old = {b: cb.graph for b, cb in runner.captured.items()}
    impl = sim_impl(platform)
    captures = []
    impl.listeners.append(lambda e: e[0] == "capture_end" and captures.append(e))
    impl.inject("capture_callable", "raise", when=lambda: len(captures) == 1)  # the second fails
    with pytest.raises(Exception, match="injected"):
        runner.capture()
    impl.clear_faults()
    assert runner.captured == {} and runner.coarse is not None
    assert runner.bucket_for(3) is None and runner.bucket_for(1) is None
    for batch in ([1.0, 2.0, 3.0], [1.0]):  # no old graph, no old event: eager and coarse
        runner.run(batch)
        assert runner.last_step.bucket is None and runner.last_step.policy == P.NONE
        assert runner.fence.take() is None
    assert all(g.replays == 0 for g in old.values())
    runner.capture()  # a capture that succeeds ends it
    assert runner.coarse is None and runner.policy_for(2) == P.IN_GRAPH


def test_a_failed_plant_in_a_replayed_step_publishes_nothing(platform):
    runner, _, _ = make(platform, "in_graph", buckets=(2,))
    runner.capture()
    impl = sim_impl(platform)
    impl.inject("record", "raise", when=lambda: impl.replaying)
    with pytest.warns(RuntimeWarning, match="plant failed"):
        runner.run([1.0])
    assert runner.last_step.policy == P.NONE
    assert runner.fence.take() is None


def test_a_failed_warm_up_still_joins_the_side_stream(platform):
    runner, model, _ = make(platform, buckets=(2,))
    impl = sim_impl(platform)
    main = platform.current_stream()
    reads = []
    model.graph_prep = lambda bucket: (reads.append(impl.mark("warm-up read")), 1 / 0)
    with pytest.raises(ZeroDivisionError):
        runner.capture()
    with platform.stream(main):
        later = impl.mark("later work on the forward stream")
    assert impl.happens_before(reads[0], later)


def test_a_failed_join_makes_the_host_wait(platform):
    runner, model, _ = make(platform, buckets=(2,))
    impl = sim_impl(platform)
    model.graph_prep = lambda bucket: 1 / 0
    calls = []
    impl.inject("wait_stream", "raise", when=lambda: bool(calls.append(1)) or len(calls) > 1)
    with pytest.raises(Exception, match="injected"):  # the join's failure, after the host waited
        runner.capture()
    assert len(calls) == 2 and platform.log[-1] == ("synchronize",)
