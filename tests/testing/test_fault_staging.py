"""The fault matrix's staging scenario (`warpolicy.testing.faults.staging`): a real `Stager` in a
speculative step, its copies failed at every call in every raising mode, and not one early
release or stale read; the scenario really stages (verify's release) and really copies late
when staging failed."""

from __future__ import annotations

import warnings

from warpolicy.testing import faults
from warpolicy.testing.faults.harness import Harness
from warpolicy.testing.faults.injection import RAISING_MODES, Fault
from warpolicy.testing.faults.matrix import Case, cases, modes_for, run_case, run_cases
from warpolicy.testing.faults.staging import STAGED_READS, STAGING_TARGETS


def test_the_staging_copy_is_a_target_in_raising_modes_only():
    assert set(STAGING_TARGETS) <= set(faults.TARGETS)
    assert modes_for("stager_copy") == RAISING_MODES


def test_every_call_of_every_copy_fails_without_an_early_release():
    selected = list(cases(scenarios=["spec_stager"], targets=["stager_copy"], full=True))
    base = run_case(Case("spec_stager", "staged"))
    calls = dict(base.outcome.calls)["stager_copy"]
    assert calls >= 2 * len(STAGED_READS)  # every step staged both reads (or copied late)
    # every call's n-th failure in every raising mode, plus every call of each phase
    assert len([c for c in selected if c.fault.nth is not None]) == calls * len(RAISING_MODES)
    results = run_cases(selected)
    assert all(r.outcome.fired for r in results)
    bad = [r.case.describe() for r in results if r.early or r.outcome.stale_reads]
    assert bad == []


def test_a_failed_copy_makes_the_draft_extend_copy_late():
    """Staging fails at its first copy: the draft extend copies for itself (a read in its own
    host prep), so the step's reads outnumber a clean run's."""
    clean = run_case(Case("spec_stager", "staged"))
    failed = run_case(Case("spec_stager", "staged", Fault("stager_copy", "raise", nth=1)))
    assert failed.outcome.fired and not failed.early
    copies = dict(failed.outcome.calls)["stager_copy"]
    assert copies > dict(clean.outcome.calls)["stager_copy"]


def test_the_scenario_really_stages_and_the_liar_really_leaves_one_out():
    from warpolicy.testing.faults.scenarios import BUCKETS, DRAFT_TOKENS, STEPS, overlap
    from warpolicy.testing.faults.staging import spec_stager_scenario

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        honest = spec_stager_scenario(
            Harness(), "staged", overlap, BUCKETS, STEPS["tokens"], DRAFT_TOKENS
        )
        liar = spec_stager_scenario(
            Harness(), "lying", overlap, BUCKETS, STEPS["tokens"], DRAFT_TOKENS
        )
    assert honest.counts["staged"] > 0 and honest.names == STAGED_READS
    assert liar.counts["staged"] > 0 and len(liar.names) == len(STAGED_READS) - 1
