"""The fault-injection matrix (CPU, simulated platform): every platform operation and observer
hook, in every phase, under every policy, raising / returning None / acting then raising, never
releases the scheduler early nor lets a forward read before the scheduler's writes; and the
checker itself catches the 0.1 failure modes (positive controls)."""

from __future__ import annotations

import functools

import pytest

from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY
from warpolicy.runtime import hookspecs
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.runners.overlap import OverlapLoop
from warpolicy.testing import faults
from warpolicy.testing.sim import OPERATIONS

ALL_CASES = list(faults.cases())
TARGETS = sorted({c.target for c in ALL_CASES})


@functools.cache
def results_for(target):
    return faults.run_fault_matrix([c for c in ALL_CASES if c.target == target]).results


def test_the_matrix_covers_every_operation_hook_phase_policy_and_mode():
    targets = {c.target for c in ALL_CASES}
    assert targets == set(OPERATIONS) | set(hookspecs.OBSERVER_HOOKS)
    assert {c.phase for c in ALL_CASES} == set(faults.PHASES)
    assert {c.policy for c in ALL_CASES} == set(faults.POLICIES)
    assert {c.mode for c in ALL_CASES} == {"raise", "none", "act_then_raise"}
    assert len(ALL_CASES) == len(set(ALL_CASES))


@pytest.mark.parametrize("target", TARGETS)
def test_no_fault_releases_early_or_reads_stale_and_every_fired_fault_surfaces(target):
    results = results_for(target)
    bad = [r for r in results if r.early_releases or r.stale_reads]
    assert bad == []
    silent = [r.case for r in results if r.fired and not (r.errors or r.warnings)]
    assert silent == []


def test_the_per_step_operations_and_observers_are_really_exercised():
    fired = {
        r.case.target
        for target in TARGETS
        for r in results_for(target)
        if r.fired and r.case.policy in (IN_GRAPH, POST_REPLAY)
    }
    assert {
        "record",
        "wait_event",
        "wait_stream",
        "replay",
        "is_capturing",
        "current_stream",
        "use_stream",
        "capture_callable",
        "warpolicy_on_publish",
        "warpolicy_on_barrier",
        "warpolicy_on_decision",
    } <= fired


def test_the_table_lists_every_target_and_a_total():
    table = faults.format_fault_matrix(faults.run_fault_matrix(ALL_CASES[:3]))
    lines = table.splitlines()
    assert lines[0].split() == [
        "target",
        "cases",
        "fired",
        "early_releases",
        "stale_reads",
        "surfaced",
        "silent",
    ]
    assert lines[-1].split()[:2] == ["total", "3"]


# -- positive controls: the checker catches what 0.1 got wrong ------------------------------------


def test_control_a_barrier_that_does_not_wait_is_caught(monkeypatch):
    monkeypatch.setattr(SchedulerBarrier, "apply", lambda self, *a: "event")
    result = faults.run_case(faults.Case("record", "take", IN_GRAPH, "raise"))  # a no-op fault
    assert result.early_releases > 0


def test_control_an_in_graph_publish_after_a_failed_replay_plant_is_caught(monkeypatch):
    def plant_01(self, event=None):
        # 0.1: a failed plant inside a replay is swallowed, in_graph still published
        event = event if event is not None else self._event
        try:
            if self.platform.is_capturing():
                self._record(event)
        except Exception:
            return None
        return event

    case = faults.Case("record", "replay", IN_GRAPH, "raise")
    assert faults.run_case(case).early_releases == 0
    monkeypatch.setattr(ReadDoneFence, "plant", plant_01)
    assert faults.run_case(case).early_releases > 0


def test_control_waiting_on_an_older_write_event_after_a_failed_record_is_caught(monkeypatch):
    def record_writes_01(self):  # 0.1: a failed record is not followed by a whole-stream wait
        try:
            slot = self._ring.record(self.schedule_stream)
        except Exception:
            return
        self._pending = slot

    case = faults.Case("record", "write", POST_REPLAY, "raise")
    assert faults.run_case(case).stale_reads == 0
    monkeypatch.setattr(OverlapLoop, "_record_writes", record_writes_01)
    assert faults.run_case(case).stale_reads > 0
