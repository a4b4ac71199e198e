"""The staged speculative step's audit subjects (`warpolicy.audit.synthetic_staged`) on the
simulated platform: the honest stager SAFE, the stager that copies one table fewer UNSAFE in
every trial, and the staged step really handing verify's event (not a coarse pass)."""

from __future__ import annotations

import pytest

from warpolicy.audit.dynamic import audit_mode
from warpolicy.audit.report import SAFE, UNSAFE
from warpolicy.audit.synthetic_staged import LYING_SKIPS, staged, staged_subject
from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode
from warpolicy.testing import sim_platform

DRAFT_EXTEND = ForwardMode.DRAFT_EXTEND
TRIALS = 12


@pytest.fixture
def platform():
    return sim_platform()


def test_the_honest_stager_is_safe_and_publishes_verifys_event(platform):
    entry = audit_mode(staged_subject(platform), DRAFT_EXTEND, TRIALS, static=False)
    assert entry.dynamic.verdict == SAFE and entry.dynamic.corrupted == 0
    assert entry.policy is IN_GRAPH and entry.dynamic.trials == TRIALS


def test_the_lying_stager_is_unsafe_in_every_trial(platform):
    entry = audit_mode(staged_subject(platform, lying=True), DRAFT_EXTEND, TRIALS, static=False)
    assert entry.dynamic.verdict == UNSAFE
    assert entry.dynamic.corrupted == entry.dynamic.trials == TRIALS


def test_the_lying_stager_reads_the_skipped_table_live(platform):
    subject = staged_subject(platform, lying=True)
    step = subject.runners[DRAFT_EXTEND](subject.model)
    consumer = step.phases[1].runner.model
    assert set(consumer.shared_buffers) == {LYING_SKIPS}
    assert LYING_SKIPS not in consumer.stager.names
    assert LYING_SKIPS not in consumer.stager.sources


def test_the_factory_lists_both(platform):
    assert [s.name for s in staged(platform)] == ["eagle_staged", "eagle_staged+lying_stager"]
