"""Positive controls for the audit's poisons (issue 19 item 5), on the simulated platform.

Each control is a late page-table rebuild reduced to one of the two readers 0.2's ``x + 1``
missed on the H200 (`warpolicy.conformance.controls`): under the old poison the dynamic audit
must miss it (SAFE, 0 trials differ), under the default poison set it must catch it in every
trial; without the late rebuild both poisons must find it SAFE (no false alarm).
"""

from __future__ import annotations

import pytest

from warpolicy.audit import run_audit
from warpolicy.audit.dynamic import audit_mode
from warpolicy.audit.poison import plus_one
from warpolicy.audit.report import Verdict
from warpolicy.conformance.controls import KINDS, control_subject
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.testing import sim_platform

DECODE = ForwardMode.DECODE
TRIALS = 6
OLD = {"req_to_token": plus_one, "seq_lens": plus_one}


def audit(kind: str, *, late: bool = True, old: bool = False):
    subject = control_subject(kind, sim_platform(), late=late, poison=OLD if old else None)
    return audit_mode(subject, DECODE, trials=TRIALS)


@pytest.mark.parametrize("kind", KINDS)
class TestPositiveControls:
    def test_the_old_poison_misses_the_late_rebuild(self, kind):
        entry = audit(kind, old=True)
        assert entry.verdict is Verdict.SAFE, entry.dynamic  # the miss seen on the H200
        assert entry.dynamic.corrupted == 0 and entry.dynamic.caught == (("plus_one", 0),)

    def test_the_poison_set_catches_it_in_every_trial(self, kind):
        entry = audit(kind)
        assert entry.verdict is Verdict.UNSAFE
        assert entry.dynamic.corrupted == entry.dynamic.trials == TRIALS
        caught = dict(entry.dynamic.caught)
        assert caught["half_turn"] == TRIALS  # the rotation alone survives division and 0
        assert entry.dynamic.first is not None and entry.dynamic.first.poison == "half_turn"

    @pytest.mark.parametrize("old", [False, True])
    def test_no_false_alarm_without_the_late_rebuild(self, kind, old):
        entry = audit(kind, late=False, old=old)
        assert entry.verdict is Verdict.SAFE, entry.dynamic


def test_what_each_control_isolates():
    lone = control_subject("lone_length", sim_platform())
    aligned = control_subject("page_aligned", sim_platform())
    assert set(lone.model.shared_buffers) == {"req_to_token", "seq_lens"}
    assert lone.model.bucket_sizes(DECODE) == (1,)  # one-request batches only
    assert set(aligned.model.shared_buffers) == {"req_to_token"}  # lengths are private there
    table = aligned.model.req_to_token
    assert int(table.max()) % 64 == 63  # the largest slot ends a page: x + 1 never wraps a start


def test_the_factories_through_run_audit():
    report = run_audit(
        factory="warpolicy.conformance.controls:controls", trials=2, platform=sim_platform()
    )
    assert [(e.backend, e.verdict) for e in report.entries] == [
        ("control:lone_length", Verdict.UNSAFE),
        ("control:page_aligned", Verdict.UNSAFE),
    ]
    safe = run_audit(
        factory="warpolicy.conformance.controls:safe_controls", trials=2, platform=sim_platform()
    )
    assert {e.verdict for e in safe.entries} == {Verdict.SAFE} and safe.exit_code == 0
