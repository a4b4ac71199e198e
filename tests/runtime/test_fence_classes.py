"""One read-done per buffer class: the fence publishes one per class, the barrier takes the
class the scheduler is about to write (`ReadDoneFence.take_class`, `OverlapLoop`'s
``class_writes``), judged by the simulated platform's happens-before model (not by the fence)."""

from __future__ import annotations

import pytest

from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, PRE_REPLAY, ForwardMode
from warpolicy.runtime.fence import ReadDoneFence
from warpolicy.runtime.release import (
    BucketFacts,
    BucketRelease,
    class_policy_fns,
    decide_classes,
    resolve_policies,
    with_classes,
)
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop
from warpolicy.testing import ClassMarkModel, sim_impl, sim_platform

HYBRID = {"metadata": IN_GRAPH, "recurrent_state": POST_REPLAY}
DECODE = ForwardMode.DECODE


@pytest.fixture
def platform():
    return sim_platform()


def hybrid_runner(platform, classes=HYBRID, per_class=True, layers=3):
    model = ClassMarkModel(platform, layers=layers)
    cell, per = class_policy_fns(classes)
    runner = DecodeRunner(model, cell, platform, class_policies=per if per_class else None)
    runner.capture()
    return model, runner


def run_steps(platform, runner, model, steps=3, per_class=True):
    """Steps with the scheduler's writes of each class marked on the schedule stream; returns
    per step the marks of (reads of the step, writes after it)."""
    impl = sim_impl(platform)
    loop = OverlapLoop(runner)
    out = []
    for _ in range(steps):
        model.marks.clear()
        writes = {}

        def writer(name, writes=writes):
            return lambda: writes.__setitem__(name, impl.mark(f"write:{name}"))

        if per_class:
            loop.step([1.0, 2.0], class_writes=[(c, writer(c)) for c in HYBRID])
        else:

            def write_all():
                for c in HYBRID:
                    writer(c)()

            loop.step([1.0, 2.0], write_all)
        out.append((list(model.marks), dict(writes), loop))
    return out


def ordered_after_reads(marks, write, cls):
    return all(sim_impl_hb(m, write) for name, m in marks if name == f"read:{cls}")


def sim_impl_hb(first, second):
    return second.clock.get(first.stream, 0) >= first.tick


def test_each_class_write_waits_for_its_own_reads_only(platform):
    model, runner = hybrid_runner(platform)
    for marks, writes, loop in run_steps(platform, runner, model):
        assert ordered_after_reads(marks, writes["metadata"], "metadata")
        assert ordered_after_reads(marks, writes["recurrent_state"], "recurrent_state")
        # the metadata writes were released before the recurrent reads ended: the gain
        last_recurrent = [m for n, m in marks if n == "read:recurrent_state"][-1]
        assert not sim_impl_hb(last_recurrent, writes["metadata"])
        assert loop.last_class_barriers == (("metadata", "event"), ("recurrent_state", "event"))


def test_take_keeps_its_meaning_the_latest_class(platform):
    model, runner = hybrid_runner(platform)
    release = runner.release_of(runner.buckets[0])
    assert release.policy is POST_REPLAY
    assert release.classes["metadata"].policy is IN_GRAPH
    runner.run([1.0])
    latest = runner.fence.take()
    assert latest is not None and latest.policy is POST_REPLAY
    recurrent = runner.fence.take_class("recurrent_state")
    assert recurrent is latest  # the latest class shares the step's event
    metadata = runner.fence.take_class("metadata")
    assert metadata is not None and metadata.policy is IN_GRAPH
    assert metadata.event is not latest.event
    for rd in (latest, metadata):
        rd.discard()


def test_take_class_is_consume_once_and_unknown_class_is_coarse(platform):
    model, runner = hybrid_runner(platform)
    runner.run([1.0])
    assert runner.fence.take_class("kv_pages") is None  # not published: the coarse barrier
    first = runner.fence.take_class("metadata")
    assert first is not None
    assert runner.fence.take_class("metadata") is None
    first.discard()
    runner.run([1.0])  # a new step: the last step's classes are gone
    runner.fence.take_class("metadata").discard()
    assert runner.fence.take_class("metadata") is None


def test_omitting_the_recurrent_class_releases_its_writes_early(platform):
    # positive control: one event from a declaration without recurrent_state (in_graph) lets
    # the scheduler's recurrent writes race the forward's recurrent reads
    model, runner = hybrid_runner(platform, {"metadata": IN_GRAPH}, per_class=False)
    races = 0
    for marks, writes, _loop in run_steps(platform, runner, model, per_class=False):
        races += not ordered_after_reads(marks, writes["recurrent_state"], "recurrent_state")
    assert races == 3


def test_single_event_of_the_latest_class_is_sound_but_releases_nothing_early(platform):
    model, runner = hybrid_runner(platform, per_class=False)
    for marks, writes, _loop in run_steps(platform, runner, model, per_class=False):
        last_recurrent = [m for n, m in marks if n == "read:recurrent_state"][-1]
        assert sim_impl_hb(last_recurrent, writes["metadata"])  # held to the forward's end


def test_pre_replay_class_is_recorded_before_the_replay(platform):
    classes = {"host_staging": PRE_REPLAY, "recurrent_state": POST_REPLAY}
    model, runner = hybrid_runner(platform, classes)
    log = sim_impl(platform).log
    start = len(log)
    runner.run([1.0])
    staging = runner.fence.take_class("host_staging")
    assert staging is not None and staging.policy is PRE_REPLAY
    kinds = [e for e in log[start:] if e[0] in ("record", "replay")]
    first_record = next(i for i, e in enumerate(kinds) if e[0] == "record")
    assert first_record < [e[0] for e in kinds].index("replay")
    assert kinds[first_record][1] == staging.event.id
    staging.discard()
    runner.fence.take().discard()


def test_a_failed_step_publishes_no_class(platform):
    model, runner = hybrid_runner(platform)
    impl = sim_impl(platform)
    impl.inject("record")  # every record of the step fails (the planted one too)
    with pytest.warns(RuntimeWarning, match="failed"):
        runner.run([1.0])
    impl.clear_faults()
    assert runner.fence.take() is None
    assert runner.fence.take_class("recurrent_state") is None


def test_decide_classes_shares_one_release_per_policy_and_never_later_than_the_bucket():
    classes = {"metadata": IN_GRAPH, "kv_pages": IN_GRAPH, "recurrent_state": POST_REPLAY}
    _cell, per = class_policy_fns(classes)
    policies = {c: resolve_policies(fn, DECODE) for c, fn in per.items()}
    event = object()
    decided = decide_classes(policies, BucketFacts(4, event=event), "decode")
    assert decided["metadata"] is decided["kv_pages"]
    bucket = BucketRelease("decode", 4, POST_REPLAY)
    release = with_classes(bucket, decided)
    assert [e.policy for e in release.early] == [IN_GRAPH]
    # a class decided later than the bucket makes every class coarse, never earlier
    late = with_classes(BucketRelease("decode", 4, IN_GRAPH, event), decided)
    assert late.policy is NONE and {r.policy for r in late.classes.values()} == {NONE}
    # doubt: every class coarse
    doubted = decide_classes(policies, BucketFacts(4, doubt="x"), "decode")
    assert {r.policy for r in doubted.values()} == {NONE}


def test_fence_without_classes_is_unchanged(platform):
    fence = ReadDoneFence(platform)
    release = BucketRelease("decode", None, POST_REPLAY)
    fence.before_replay(release)
    fence.after_replay(release)
    assert fence.take_class("metadata") is None
    assert fence.take() is not None
