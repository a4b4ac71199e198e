"""The audit's synthetic shapes under the WAR canary on the simulated platform (the CPU twin of
tests/gpu/test_canary_cuda.py): with the marker placement and the self-check off, every unsafe
shape's seeded race is caught at the step it fires (judged against an independent eager,
sequential reference), the cell then runs coarse with nothing corrupted; the safe shapes raise
no alarm. The race is seeded by `canary_support.SimRace` (writes land at the release point)."""

from __future__ import annotations

import pytest
from canary_support import SAFE_SHAPES, UNSAFE_SHAPES, ShapeTrial, reference_run

from warpolicy.registry.vocabulary import NONE
from warpolicy.testing import sim_platform

STEPS = 5
BATCH = 4


@pytest.mark.parametrize("name", UNSAFE_SHAPES)
def test_every_unsafe_shape_is_caught_where_its_race_fires_then_runs_coarse(name):
    platform = sim_platform()
    reference, slots = reference_run(name, platform, STEPS, BATCH)
    trial = ShapeTrial(name, platform, slots, BATCH, sim_race=True)
    fired, after = trial.judge(reference, exact=True)
    assert fired, f"{name}: the seeded race never changed a step (the shape reads nothing late?)"
    assert trial.flagged == [fired[0]], (fired, trial.flagged)
    assert after == [], f"{name}: corrupted after the demotion at steps {after}"
    assert trial.policy_after is NONE


@pytest.mark.parametrize("name", SAFE_SHAPES)
def test_safe_shapes_raise_no_alarm_under_the_same_race(name):
    platform = sim_platform()
    reference, slots = reference_run(name, platform, STEPS, BATCH)
    trial = ShapeTrial(name, platform, slots, BATCH, sim_race=True)
    fired, _ = trial.judge(reference, exact=True)
    assert fired == [] and trial.flagged == []
    assert trial.canary.stats["checked"] == STEPS


def test_the_kv_rows_a_step_writes_are_enough_state_to_catch_a_late_kv_write():
    platform = sim_platform()
    reference, slots = reference_run("late_kv_write", platform, STEPS, BATCH)
    trial = ShapeTrial("late_kv_write", platform, slots, BATCH, sim_race=True, canary_state="rows")
    fired, after = trial.judge(reference, exact=True)
    assert fired and trial.flagged == [fired[0]] and after == []
