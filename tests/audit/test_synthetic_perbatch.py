"""The per-batch synthetic prefill (`warpolicy.audit.synthetic_perbatch*`) on the simulated
platform: the CPU twin of tests/gpu/test_perbatch_cuda.py. The audit (program-order race
simulation) finds the snapshot-then-declare prefill SAFE across batches on both sides of the
threshold when the action copies, UNSAFE when the action reports True without copying, and the
big bucket coarse when the action fails; captured outputs equal the eager ones."""

from __future__ import annotations

import pytest
import torch

from warpolicy.audit import Verdict, audit_mode
from warpolicy.audit.synthetic_perbatch import (
    SNAPSHOT_ACTION,
    THRESHOLD,
    SnapshotAction,
    perbatch_policy,
)
from warpolicy.audit.synthetic_perbatch_model import PERBATCH_BUCKETS, make_perbatch
from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.testing import sim_platform

EXTEND = ForwardMode.EXTEND
P = WarReadDonePolicy
TRIALS = 6  # two rounds of the three buckets


def test_the_declaration_needs_the_snapshot_above_the_threshold_only():
    rule = perbatch_policy().rule(EXTEND)
    assert rule is not None and rule.actions == (SNAPSHOT_ACTION,)
    assert rule({"num_qo_tokens": THRESHOLD}) is P.PRE_REPLAY
    assert rule({"num_qo_tokens": THRESHOLD + 1}) is P.NONE
    assert rule({"num_qo_tokens": THRESHOLD + 1, SNAPSHOT_ACTION: True}) is P.PRE_REPLAY
    assert rule({}) is P.NONE
    assert [b <= THRESHOLD for b in PERBATCH_BUCKETS] == [True, True, False]  # both sides


def test_an_unknown_action_kind_is_refused():
    with pytest.raises(InputError, match="action kind"):
        SnapshotAction(object(), "sometimes")


def test_the_honest_snapshot_is_safe_across_the_threshold():
    subject = make_perbatch(sim_platform(), action="honest")
    entry = audit_mode(subject, EXTEND, trials=TRIALS, static=False)
    dyn = entry.dynamic
    assert dyn.verdict is Verdict.SAFE, dyn.reason
    assert dyn.trials == TRIALS and dyn.corrupted == 0
    plugin = subject.model.plugin
    # asked for the big bucket only: once per step of each of its trials (reference + rounds)
    assert plugin.performed == plugin.answered > 0


def test_a_snapshot_that_reports_true_without_copying_is_unsafe():
    subject = make_perbatch(sim_platform(), action="lying")
    entry = audit_mode(subject, EXTEND, trials=TRIALS, static=False)
    assert entry.dynamic.verdict is Verdict.UNSAFE, entry.dynamic.reason
    assert entry.dynamic.first is not None
    assert subject.model.plugin.performed == 0


def run_each_bucket(subject, captured=True):
    runner = subject.runners[EXTEND](subject.model)
    if captured:
        runner.capture()
    published, outputs = [], []
    for trial in range(len(PERBATCH_BUCKETS)):
        batch = subject.make_batch(EXTEND, trial)
        out = runner.run(batch)
        taken = runner.fence.take()
        subject.platform.synchronize()
        if taken is not None:
            taken.discard()
        published.append((runner.last_step.bucket, None if taken is None else taken.policy))
        outputs.append(out[: batch.shape[0]].clone())
    return published, outputs


def test_a_failed_snapshot_makes_the_big_bucket_coarse():
    subject = make_perbatch(sim_platform(), action="failing")
    published, _ = run_each_bucket(subject)
    assert published == [(32, P.PRE_REPLAY), (64, P.PRE_REPLAY), (128, None)]
    assert subject.model.plugin.answered == 1 and subject.model.plugin.performed == 0


@pytest.mark.parametrize("action", ["honest", "failing"])
def test_captured_outputs_equal_the_eager_ones(action):
    captured = make_perbatch(sim_platform(), action=action)
    eager = make_perbatch(sim_platform(), action=action)
    published, got = run_each_bucket(captured)
    eager_published, want = run_each_bucket(eager, captured=False)
    assert [b for b, _ in published] == list(PERBATCH_BUCKETS)
    assert [b for b, _ in eager_published] == [None] * len(PERBATCH_BUCKETS)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
