"""The WAR canary under the fault matrix's oracle: its own saves, restores, replay and put-back
are logged reads and writes, ordered like the scheduler's (the ``canary`` scenario of
`warpolicy.testing.faults`, run in full by tests/testing), and a canary that skipped its full
barrier would be caught (a positive control)."""

from __future__ import annotations

import pytest

from warpolicy.runtime.canary import CanarySession
from warpolicy.runtime.canary.compare import first_difference, flatten_outputs
from warpolicy.testing import faults
from warpolicy.testing.faults.harness import Harness


def test_the_canary_scenario_logs_the_canarys_own_reads_and_writes():
    harness = Harness()
    entries: list[tuple] = []
    harness.impl.log.listeners.append(entries.append)
    with harness.recording():
        faults.SCENARIOS["canary"].run(harness, "in_graph")
    labels = [e[-1] for e in entries if e[0] in ("read", "write")]
    assert any(label.startswith("canary.save.") for label in labels)
    assert any(label.startswith("canary.load.") for label in labels)
    outcome = harness.outcome()
    assert outcome.early_writes == 0 and outcome.stale_reads == 0 and not outcome.errors
    assert dict(outcome.calls)["canary_spec"] > 0


def _unordered_compare(self: CanarySession, sample):
    """A broken check: no full barrier, and on a fresh stream nothing waits for."""
    p = self.canary.platform
    with p.stream(p.new_stream()):
        live_in = [s.save() for _, s in sample.inputs]
        for (_, s), saved in zip(sample.inputs, sample.pre_inputs):
            s.load(saved)
        output = sample.rerun()
        reference = flatten_outputs(output) if sample.spec.compare_output else []
        difference = first_difference(reference, sample.observed, sample.spec.tolerance)
        for (_, s), saved in zip(sample.inputs, live_in):
            s.load(saved)
    return difference


@pytest.mark.parametrize("variant", ["pre_replay", "in_graph"])
def test_a_canary_without_its_full_barrier_is_caught_by_the_oracle(monkeypatch, variant):
    intact = faults.run_case(faults.Case("canary", variant))
    assert not intact.early and not intact.outcome.stale_reads
    monkeypatch.setattr(CanarySession, "_compare", _unordered_compare)
    broken = faults.run_case(faults.Case("canary", variant))
    assert broken.early or broken.outcome.stale_reads, broken.outcome
