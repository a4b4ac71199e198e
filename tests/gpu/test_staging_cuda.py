"""Staged speculative steps on a real GPU: the dynamic audit and the WAR canary judge the
staging copy (`warpolicy.runtime.runners.staging`).

The subject is `warpolicy.audit.synthetic_staged`: target verify (the default registry's
trtllm_mha + EAGLE: in_graph only after ``draft_extend_staged``) then the draft extend reading
draft-owned copies a `Stager` made during verify's per-batch action. The honest stager must be
SAFE with verify's in-graph event; the lying stager (it copies one table fewer, which the draft
extend then reads live after verify's release) must be caught in **every** audit trial, and by
the canary, which then turns staging off for the buckets it caught. Counts are printed for the
notes.

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_staging_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
from gpu_support import NEEDS_CUDA

pytestmark = [*NEEDS_CUDA]

from warpolicy.audit.dynamic import audit_mode  # noqa: E402
from warpolicy.audit.report import SAFE, UNSAFE  # noqa: E402
from warpolicy.audit.subject import make_stall, stalled_model  # noqa: E402
from warpolicy.audit.synthetic_staged import StagedEagle, staged_subject  # noqa: E402
from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode  # noqa: E402
from warpolicy.runtime.canary import Canary, CanaryConfig  # noqa: E402
from warpolicy.runtime.manager import new_plugin_manager, open_platform  # noqa: E402
from warpolicy.runtime.runners import OverlapLoop  # noqa: E402

DRAFT_EXTEND, VERIFY = ForwardMode.DRAFT_EXTEND, ForwardMode.TARGET_VERIFY
TRIALS = 20
STEPS = 24
VERSIONS = 4


@pytest.fixture(scope="module")
def platform():
    p = open_platform(new_plugin_manager(load_entry_points=False, environ={}), "cuda")
    if not p.external_events_supported():
        pytest.skip("this torch has no external events")
    return p


@pytest.mark.parametrize("lying", [False, True], ids=["honest", "lying_stager"])
def test_the_audit_judges_the_staging_copy(platform, lying):
    entry = audit_mode(staged_subject(platform, lying=lying), DRAFT_EXTEND, TRIALS)
    d = entry.dynamic
    print(
        f"\n[staging cuda] audit {entry.backend}: {entry.verdict.value} "
        f"(dynamic {d.verdict.value} {d.corrupted}/{d.trials}, static "
        f"{entry.static.summary()}, published "
        f"{entry.policy.label if entry.policy is not None else 'nothing'})"
    )
    assert entry.policy is IN_GRAPH  # the staged step really hands verify's in-graph event
    if lying:
        # nearly every trial: the race is timing (an H100 run missed 1 of 20; UNSAFE needs one)
        assert entry.verdict == UNSAFE and d.trials == TRIALS and d.corrupted >= TRIALS * 0.9
        # the walk of the draft extend's graph finds its live read of the table left out
        assert any(o.name.startswith("draft_extend: ") for o in entry.static.offenders)
    else:
        assert entry.verdict == SAFE and d.corrupted == 0 and d.trials == TRIALS


class HeadStall:
    """Holds the forward stream at each launch: the host enqueues the step and the scheduler's
    writes before the GPU starts the step (the writes then race anything after the release)."""

    def __init__(self, stall):
        self.stall = stall

    def mark(self, point, stream):
        if point == "launch":
            self.stall()


@pytest.mark.parametrize("lying", [False, True], ids=["honest", "lying_stager"])
def test_the_canary_catches_a_lying_stager_then_staging_is_off(platform, lying):
    eagle = StagedEagle(platform, lying=lying)
    live = eagle.live
    canary = Canary(platform, CanaryConfig(rate=1.0, seed=0))
    stall = make_stall(platform, 200.0)
    step = eagle.step(stalled_model(live, stall), canary=canary)
    step.capture()
    g = torch.Generator().manual_seed(5)
    swa = [
        torch.randint(0, live.cfg.swa_slots, live.full_to_swa.shape, generator=g).cuda()
        for _ in range(VERSIONS)
    ]
    tables = [torch.randperm(live.slots, generator=g).view_as(live.req_to_token).cuda()]
    tables += [tables[0].roll(k, 0) for k in range(1, VERSIONS)]

    def write(k: int) -> None:
        live.full_to_swa.copy_(swa[k % VERSIONS])
        live.req_to_token.copy_(tables[k % VERSIONS])

    write(0)
    platform.synchronize()
    loop = OverlapLoop(step, probe=HeadStall(make_stall(platform, 2000.0)))
    staged = 0
    for k in range(STEPS):
        loop.step(live.make_batch(VERIFY, k), lambda k=k: write(k + 1))
        staged += step.staged
    loop.drain()
    caught = [v for v in canary.violations if v.cell.scope.startswith("staging")]
    print(
        f"\n[staging cuda] canary {eagle.name}: {len(caught)} staging violation(s) "
        f"(buckets {sorted(v.cell.bucket for v in caught)}), staging off for "
        f"{sorted(eagle_stager(step).disabled)}, {staged}/{STEPS} steps staged, "
        f"{canary.stats['checked']} checks"
    )
    if lying:
        buckets = set(step.phases[0].runner.captured)
        assert {v.cell.bucket for v in caught} == buckets  # each bucket caught once
        assert set(eagle_stager(step).disabled) == buckets
        assert staged < STEPS  # after the catch, steps release at the draft extend
    else:
        assert not caught and staged == STEPS and not eagle_stager(step).disabled


def eagle_stager(step):
    return step.phases[1].runner.model.stager
