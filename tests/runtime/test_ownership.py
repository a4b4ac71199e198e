"""One owner thread per runner, fence, overlap loop and speculative step (issue 17 class 7):
a call from any other thread raises `WrongThreadError` before it touches any state."""

from __future__ import annotations

import threading

import pytest

from warpolicy.errors import WarpolicyError
from warpolicy.runtime.ownership import ThreadOwner, WrongThreadError
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop, SpecStep
from warpolicy.testing import RecModel, sim_platform


def in_thread(fn):
    """Run ``fn`` in another thread; its exception (or None)."""
    box = []

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return box[0] if box else None


@pytest.fixture
def runner():
    runner = DecodeRunner(RecModel((1, 2)), fixed_policy("post_replay"), sim_platform())
    runner.capture()
    return runner


def test_the_error_is_a_warpolicy_error_naming_both_threads():
    owner = ThreadOwner("thing")
    owner.check()
    error = in_thread(owner.check)
    assert isinstance(error, WrongThreadError) and isinstance(error, WarpolicyError)
    assert "thing belongs to thread" in str(error) and "release_thread()" in str(error)


def test_a_second_thread_stepping_a_runner_is_refused_before_any_state_changes(runner):
    runner.run([1.0])
    step, fence_step = runner.last_step, runner.fence.step
    for call in (lambda: runner.run([1.0]), runner.capture, runner.fence.take):
        assert isinstance(in_thread(call), WrongThreadError)
    assert runner.last_step is step and runner.fence.step == fence_step


def test_the_runner_and_its_fence_share_one_owner(runner):
    """The runner's first user owns its fence too (the scheduler takes on the same thread)."""
    assert isinstance(in_thread(runner.fence.take), WrongThreadError)


def test_release_thread_hands_the_runner_over(runner):
    runner.run([1.0])
    runner.release_thread()
    assert in_thread(lambda: runner.run([1.0])) is None
    with pytest.raises(WrongThreadError):
        runner.run([1.0])  # the other thread owns it now


def test_only_the_owner_may_hand_over(runner):
    runner.run([1.0])
    assert isinstance(in_thread(runner.release_thread), WrongThreadError)


def test_the_first_user_owns_a_fresh_runner():
    runner = DecodeRunner(RecModel((1,)), fixed_policy("post_replay"), sim_platform())
    assert in_thread(runner.capture) is None  # built here, captured and owned there
    with pytest.raises(WrongThreadError):
        runner.run([1.0])


def test_a_second_thread_stepping_an_overlap_loop_is_refused(runner):
    loop = OverlapLoop(runner)
    loop.step([1.0], lambda: None)
    assert isinstance(in_thread(lambda: loop.step([1.0], lambda: None)), WrongThreadError)
    assert loop.steps == 1


def test_a_second_thread_stepping_a_speculative_step_is_refused():
    platform = sim_platform()
    phases = [
        DecodeRunner(RecModel((1,)), fixed_policy("in_graph"), platform, name="draft"),
        DecodeRunner(RecModel((1,)), fixed_policy("post_replay"), platform, name="verify"),
    ]
    step = SpecStep(phases)
    step.capture()
    step.run([1.0])
    assert isinstance(in_thread(lambda: step.run([1.0])), WrongThreadError)
    assert isinstance(in_thread(step.fence.take), WrongThreadError)
    step.release_thread()
    assert in_thread(lambda: step.run([1.0])) is None


def test_threads_racing_for_a_runner_never_both_step():
    """Many threads race for a fresh runner's first use: exactly one wins, the rest are
    refused, and every step the winner took is accounted for."""
    fresh = DecodeRunner(RecModel((1,)), fixed_policy("post_replay"), sim_platform())
    barrier = threading.Barrier(4)
    outcomes = []

    def contend():
        barrier.wait()
        try:
            for _ in range(20):
                fresh.run([1.0])
                fresh.fence.take().discard()  # the scheduler synchronized: no barrier
            outcomes.append("ran")
        except WrongThreadError:
            outcomes.append("refused")

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ran", "refused", "refused", "refused"]
    assert fresh.fence.step == 20 and fresh.last_step.step == 19
