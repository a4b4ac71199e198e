"""The capture transaction and the one release decision per bucket (issue 17 item 1): any
exception, ``KeyboardInterrupt`` included, leaves the runner coarse with no old graph; the
ordering a failure would skip runs in ``finally``; every demotion reaches the observers; junk
inputs are one-line `InputError`s."""

from __future__ import annotations

import math
import warnings

import pytest

from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing import RecModel, sim_impl, sim_platform, sim_runtime

P = WarReadDonePolicy


def runner_on(platform, policy="in_graph", buckets=(1, 2), **kw):
    return DecodeRunner(RecModel(buckets), fixed_policy(policy), platform, **kw)


# -- BaseException anywhere in the transaction -------------------------------------------------------


@pytest.mark.parametrize("where", ["graph_prep", "forward"])
def test_a_keyboard_interrupt_in_the_warm_up_still_joins_and_synchronizes(where):
    """Class 3: the join and the synchronize run in ``finally`` for BaseException too."""
    platform = sim_platform()
    runner = runner_on(platform)
    impl = sim_impl(platform)
    reads = []
    original = getattr(runner.model, where)

    def interrupted(bucket):
        reads.append(impl.mark("warm-up read"))
        original(bucket)
        raise KeyboardInterrupt

    setattr(runner.model, where, interrupted)
    main = platform.current_stream()
    with pytest.raises(KeyboardInterrupt):
        runner.capture()
    with platform.stream(main):
        later = impl.mark("later work on the forward stream")
    assert impl.happens_before(reads[0], later)
    assert platform.log[-1] == ("synchronize",)
    assert runner.captured == {} and runner.coarse is not None


def test_a_keyboard_interrupt_in_the_join_makes_the_host_wait_and_leaves_the_runner_coarse():
    """Class 3: a KeyboardInterrupt in ``wait_stream`` during the join: the host synchronizes
    before it propagates, so the warm-up's shared reads are ordered anyway."""
    platform = sim_platform()
    runner = runner_on(platform)
    impl = sim_impl(platform)
    reads = []
    runner.model.graph_prep = lambda bucket: reads.append(impl.mark("warm-up read"))
    calls = []

    def join_interrupted(*args):
        calls.append(args)
        if len(calls) == 2:  # the first wait_stream orders the side stream; the second joins
            raise KeyboardInterrupt
        return type(impl).wait_stream(impl, *args)

    impl.wait_stream = join_interrupted
    platform.wait_stream = join_interrupted
    with pytest.raises(KeyboardInterrupt):
        runner.capture()
    schedule = platform.new_stream()
    with platform.stream(schedule):
        write = impl.mark("the scheduler's next write")
    assert all(impl.happens_before(r, write) for r in reads)  # the host waited for everything
    assert runner.captured == {} and runner.policy_for(None) == P.NONE


@pytest.mark.parametrize(
    "op", ["capture_callable", "new_graph", "graph_pool", "synchronize", "create_event"]
)
def test_a_keyboard_interrupt_in_a_capture_leaves_no_graph_and_the_runner_coarse(op):
    platform = sim_platform()
    runner = runner_on(platform)
    runner.capture()
    impl = sim_impl(platform)
    original = getattr(impl, op)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    setattr(impl, op, interrupted)
    if op in ("new_graph", "graph_pool", "create_event"):  # the facade calls the impl
        pass
    else:
        setattr(platform, op, interrupted)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(KeyboardInterrupt):
                runner.capture()
    finally:
        setattr(impl, op, original)
        if op not in ("new_graph", "graph_pool", "create_event"):
            setattr(platform, op, original)
    assert runner.captured == {} and runner.coarse is not None
    runner.run([1.0])
    assert runner.last_step.bucket is None and runner.last_step.policy == P.NONE
    assert runner.fence.take() is None


def test_a_keyboard_interrupt_in_the_policy_lookup_leaves_the_runner_coarse():
    asked = []

    def interrupted(mode, eager, planted):
        asked.append((eager, planted))
        raise KeyboardInterrupt

    runner = DecodeRunner(RecModel((1,)), interrupted, sim_platform())
    with pytest.raises(KeyboardInterrupt):
        runner.capture()
    assert runner.captured == {} and runner.coarse is not None


# -- every demotion reaches the observers (class 11) -----------------------------------------------------


class Demotions:
    def __init__(self):
        self.seen = []

    @hookimpl
    def warpolicy_on_demotion(self, runner, bucket, reason):
        self.seen.append((runner, bucket))


def test_every_demotion_reaches_the_observers_and_the_counters_the_warning_once():
    rt = sim_runtime()
    demotions = Demotions()
    rt.pm.register(demotions)
    runner = DecodeRunner(
        RecModel((1, 2)),
        fixed_policy("in_graph"),
        rt.platform,
        observers=rt.observers,
        keep_graphs=True,  # kept graphs are instantiated at capture
    )
    sim_impl(rt.platform).inject("instantiate")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            runner.capture()
    assert sorted(demotions.seen) == [("decode", 1)] * 3 + [("decode", 2)] * 3
    assert runner.reporter.counts["demotion:1"] == 3 and runner.reporter.counts["demotion:2"] == 3
    assert len([w for w in caught if "instantiating the graph failed" in str(w.message)]) == 2


# -- the decision record ----------------------------------------------------------------------------------


def test_each_bucket_has_one_immutable_release_the_step_path_reads():
    import attrs

    runner = runner_on(sim_platform(), buckets=(1, 2, 4))
    runner.capture()
    releases = {b: cb.release for b, cb in runner.captured.items()}
    for bucket, release in releases.items():
        assert release.bucket == bucket and release.source == "decode"
        assert release.policy is P.IN_GRAPH and release.event is not None
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            release.policy = P.NONE
    assert len({id(r.event) for r in releases.values()}) == 3  # an event per bucket
    runner.capture()  # a re-capture decides afresh: new events
    assert not {id(cb.event) for cb in runner.captured.values()} & {
        id(r.event) for r in releases.values()
    }


# -- junk inputs are one line (class 13) --------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["x", math.inf, math.nan, None, 2.5, 0, -4, True])
def test_junk_bucket_sizes_are_one_input_error(bad):
    model = RecModel((1, 2))
    model.buckets = (1, bad)
    with pytest.raises(InputError, match="bucket sizes must be positive") as info:
        DecodeRunner(model, fixed_policy("in_graph"), sim_platform())
    assert "\n" not in str(info.value)


def test_a_bucket_list_that_is_not_a_sequence_is_one_input_error():
    model = RecModel((1,))
    model.buckets = 7
    with pytest.raises(InputError, match="must be a sequence"):
        DecodeRunner(model, fixed_policy("in_graph"), sim_platform())


@pytest.mark.parametrize("bad", ["bogus", "", 3, None.__class__])
def test_a_bogus_placement_is_one_input_error(bad):
    with pytest.raises(InputError, match="placement must be one of marker, derived"):
        DecodeRunner(RecModel((1,)), fixed_policy("in_graph"), sim_platform(), placement=bad)


def test_a_placement_name_or_member_is_accepted():
    for given in ("derived", Placement.DERIVED):
        runner = DecodeRunner(
            RecModel((1,)), fixed_policy("in_graph"), sim_platform(), placement=given
        )
        assert runner.placement is Placement.DERIVED


@pytest.mark.parametrize("size", [10**7, 1, "4", 3.0])
def test_an_unbounded_or_junk_ring_size_is_refused_at_construction(size):
    with pytest.raises(InputError, match="ring_size must be an integer from 2 to 1024"):
        DecodeRunner(RecModel((1,)), fixed_policy("in_graph"), sim_platform(), ring_size=size)


def test_a_runner_needs_a_platform():
    with pytest.raises(InputError, match="needs a Platform"):
        DecodeRunner(RecModel((1,)), fixed_policy("in_graph"), None)


def test_the_mode_is_parsed():
    runner = DecodeRunner(RecModel((1,)), fixed_policy("in_graph"), sim_platform(), mode="extend")
    assert runner.mode is ForwardMode.EXTEND


@pytest.mark.parametrize("facts", [(True, -1), (False, 1), (0, True), (None, False), ("yes", True)])
def test_a_compiled_policy_refuses_facts_that_are_not_booleans(facts):
    """Class 13: ``lookup(mode, True, -1)`` indexed the table and answered in_graph."""
    from warpolicy.registry.engine import PolicyEngine

    compiled = PolicyEngine.load(environ={}).compile("fa3")
    with pytest.raises(InputError, match="must be booleans"):
        compiled.lookup(ForwardMode.DECODE, *facts)
    with pytest.raises(InputError, match="must be booleans"):
        compiled.per_step(*facts)
    assert compiled.lookup(ForwardMode.DECODE, False, True) is P.IN_GRAPH
