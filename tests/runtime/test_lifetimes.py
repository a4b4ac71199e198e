"""Lifetimes: deferred frees and staging rings, judged by the simulated platform's
happens-before model (a reuse write must come after every read of the step that freed it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warpolicy.runtime.lifetimes import DeferredFrees, StagingRing
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing import ClassMarkModel, sim_impl, sim_platform


def setup(policy="post_replay", layers=2):
    platform = sim_platform()
    model = ClassMarkModel(platform, layers=layers)
    runner = DecodeRunner(model, fixed_policy(policy), platform)
    runner.capture()
    schedule = platform.new_stream()
    return platform, model, runner, schedule


def hb(first, second):
    return second.clock.get(first.stream, 0) >= first.tick


def step(platform, model, runner):
    model.marks.clear()
    runner.run([1.0])
    reads = [m for _name, m in model.marks]
    return reads, runner.fence.take()


def test_a_reclaimed_item_is_written_after_the_reads_of_the_step_that_freed_it():
    platform, model, runner, schedule = setup()
    impl = sim_impl(platform)
    frees = DeferredFrees(platform, forward_stream=platform.current_stream())
    reads, read_done = step(platform, model, runner)
    frees.free(["page7"], read_done)
    read_done.discard()
    assert frees.stats.held_items == 1
    with platform.stream(schedule):
        items = frees.reclaim(schedule)
        write = impl.mark("write:page7")
    assert items == ["page7"]
    assert all(hb(r, write) for r in reads)
    assert frees.stats.held_items == 0 and frees.stats.waits == 1


def test_without_the_deferred_free_the_write_races_the_reads():
    # positive control for the oracle: the same write without reclaim is not ordered
    platform, model, runner, schedule = setup()
    impl = sim_impl(platform)
    reads, read_done = step(platform, model, runner)
    read_done.discard()
    with platform.stream(schedule):
        write = impl.mark("write:page7")
    assert not all(hb(r, write) for r in reads)


def test_unknown_read_done_holds_until_a_coarse_point():
    platform, model, runner, schedule = setup(policy="none")
    frees = DeferredFrees(platform)
    _reads, read_done = step(platform, model, runner)
    assert read_done is None  # the step published nothing
    frees.free(["slot1"], read_done)
    assert frees.reclaim(schedule) == []
    assert frees.stats.unknown == 1 and frees.stats.held_items == 1
    platform.synchronize()
    assert frees.settle() == ["slot1"]


def test_a_failed_wait_falls_back_to_the_whole_forward_stream():
    platform, model, runner, schedule = setup()
    impl = sim_impl(platform)
    frees = DeferredFrees(platform, forward_stream=platform.current_stream())
    reads, read_done = step(platform, model, runner)
    frees.free([1], read_done)
    read_done.discard()
    impl.inject("wait_event")
    with pytest.warns(RuntimeWarning, match="wait_event"), platform.stream(schedule):
        items = frees.reclaim(schedule)
        write = impl.mark("write")
    impl.clear_faults()
    assert items == [1] and frees.stats.coarse == 1
    assert all(hb(r, write) for r in reads)


def test_both_waits_failing_keep_the_item_held():
    platform, model, runner, schedule = setup()
    impl = sim_impl(platform)
    frees = DeferredFrees(platform, forward_stream=platform.current_stream())
    _reads, read_done = step(platform, model, runner)
    frees.free([1], read_done)
    read_done.discard()
    impl.inject("wait_event")
    impl.inject("wait_stream")
    with pytest.warns(RuntimeWarning):
        assert frees.reclaim(schedule) == []
    impl.clear_faults()
    assert frees.stats.held_items == 1
    assert frees.reclaim(schedule) == [1]


def test_an_interrupt_during_reclaim_hands_nothing_out_unordered(monkeypatch):
    platform, model, runner, schedule = setup()
    frees = DeferredFrees(platform)  # no forward stream: no coarse fallback either
    for k in range(3):
        _reads, read_done = step(platform, model, runner)
        frees.free([k], read_done)
        read_done.discard()

    def interrupted(stream, event):
        raise KeyboardInterrupt

    monkeypatch.setattr(platform, "wait_event", interrupted)
    with pytest.raises(KeyboardInterrupt):
        frees.reclaim(schedule)
    monkeypatch.undo()
    assert frees.stats.held_items == 3  # every group kept
    assert sorted(frees.reclaim(schedule)) == [0, 1, 2]


def test_reclaim_before_step_keeps_the_newest_groups():
    platform, model, runner, schedule = setup()
    frees = DeferredFrees(platform)
    for k in range(1, 4):
        _reads, read_done = step(platform, model, runner)
        frees.free([k], read_done, step=k)
        read_done.discard()
    assert frees.reclaim(schedule, before_step=3) == [1, 2]
    assert frees.stats.held_steps == 1


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), min_size=1, max_size=12))
def test_held_stays_within_the_steps_freed_since_the_last_reclaim(plan):
    # property: with a reclaim every `gap + 1` steps, no more steps are held than were freed
    # since the last reclaim, and every item freed comes back exactly once
    platform, model, runner, schedule = setup()
    frees = DeferredFrees(platform)
    back, freed, since = [], [], 0
    for k, (publishes, gap) in enumerate(plan):
        _reads, read_done = step(platform, model, runner)
        frees.free([k], read_done if publishes else None)
        if read_done is not None:
            read_done.discard()
        freed.append(k)
        since += 1
        assert frees.stats.held_steps <= since + frees.stats.unknown
        if k % (gap + 1) == 0:
            back += frees.reclaim(schedule)
            since = 0
    platform.synchronize()
    back += frees.settle()
    assert sorted(back) == freed


def test_staging_ring_reuses_a_slot_only_after_its_step_is_done():
    ring = StagingRing(2)
    assert ring.acquire(1) == 0
    assert ring.acquire(2) == 1
    assert ring.acquire(3) is None  # both slots read by steps in flight: the caller waits
    assert ring.stats.held_steps == 2 and ring.stats.coarse == 1
    ring.completed(1)
    assert ring.acquire(3) == 0
    assert ring.stats.peak_items == 2


def test_staging_ring_needs_a_slot():
    with pytest.raises(ValueError):
        StagingRing(0)
