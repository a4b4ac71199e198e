"""GPU: the audit catches every unsafe synthetic variant in every run (the late KV write
through the KV pool it names as an extra output), passes every safe one over 50 trials with no
false alarm, and the static audit names the late kernel in every captured bucket where it can
see it (docs/ARCHITECTURE.md, "Audit")."""

from __future__ import annotations

import pytest
from gpu_support import NEEDS_BINDINGS, NEEDS_CUDA

from warpolicy.audit import EXIT_OK, EXIT_UNSAFE, Verdict, format_audit, run_audit
from warpolicy.audit.synthetic import synthetic_backend, synthetic_names

pytestmark = [*NEEDS_CUDA]

TRIALS = 50
RUNS = 2  # "in every run": the whole audit is repeated


@pytest.mark.parametrize("name", synthetic_names())
def test_dynamic_verdict_every_run(name):
    expected = synthetic_backend(name).expected
    for run in range(RUNS):
        report = run_audit(synthetic=name, trials=TRIALS, device="cuda")
        print(format_audit(report))
        assert report.entries
        for entry in report.entries:
            where = f"run {run}, {name} {entry.mode.label}: {entry.dynamic}"
            assert entry.policy is entry.declared, where
            assert entry.dynamic.verdict is expected, where
            if expected is Verdict.SAFE:
                assert entry.dynamic.trials == TRIALS and entry.dynamic.corrupted == 0, where
            else:
                assert entry.dynamic.first is not None, where
        assert report.exit_code == (EXIT_UNSAFE if expected is Verdict.UNSAFE else EXIT_OK)


def backend_buckets(name, mode):
    from warpolicy.audit.synthetic_model import SyntheticConfig

    return SyntheticConfig().buckets[mode]


@NEEDS_BINDINGS
@pytest.mark.parametrize("name", synthetic_names())
def test_static_audit_names_the_late_kernel(name):
    backend = synthetic_backend(name)
    report = run_audit(synthetic=name, trials=1, device="cuda")
    for entry in report.entries:
        static = entry.static
        where = f"{name} {entry.mode.label}: {static}"
        assert "unavailable" not in static.reason, where
        assert static.nodes > 0, where
        assert static.buckets == tuple(sorted(backend_buckets(name, entry.mode))), where
        if backend.static_visible:
            assert static.verdict is Verdict.UNSAFE, where
            assert any(backend.offender_hint in o.name.lower() for o in static.offenders), where
            assert all(o.buffers for o in static.offenders), where
            # every captured bucket has the late reader, and the walk sees it in each
            assert {o.bucket for o in static.offenders} == set(static.buckets), where
        elif backend.layout.reread_after_replay:
            # the reread is eager work after replay: invisible to a graph walk, and it says so
            assert static.verdict is Verdict.INCONCLUSIVE, where
            assert "eager work after replay" in static.reason, where
        else:
            assert not static.offenders, where
            # SAFE, unless some library kernel after the release hides its parameter layout
            assert static.verdict is Verdict.SAFE or (
                static.verdict is Verdict.INCONCLUSIVE
                and "could not read the arguments" in static.reason
            ), where


@NEEDS_BINDINGS
def test_static_audit_sees_the_in_graph_prep_readers():
    """Not vacuous: in the safe in-graph backend the walk does find the prep's readers (they
    are ancestors of the planted node, so none offends)."""
    report = run_audit(synthetic="in_graph", modes="decode", trials=1, device="cuda")
    static = report.entries[0].static
    print(static)
    assert not static.offenders and static.readers >= 2


def test_all_synthetic_in_one_report():
    report = run_audit(synthetic="all", trials=TRIALS, device="cuda")
    print(format_audit(report))
    for entry in report.entries:
        assert entry.verdict is synthetic_backend(entry.backend).expected, entry
    assert report.exit_code == 1
