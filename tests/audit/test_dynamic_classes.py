"""The audit per buffer class on the simulated platform: each class's buffers poisoned the
moment that class's read-done releases (`audit_classes`), next to the whole step's entry."""

from __future__ import annotations

from warpolicy.audit.api import run_audit
from warpolicy.audit.report import SAFE, UNSAFE
from warpolicy.bench import hybrid
from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode
from warpolicy.testing import sim_platform

DECODE = ForwardMode.DECODE


def verdicts(report):
    return {e.backend: e.verdict for e in report.entries}


def test_declared_as_read_every_class_and_the_step_are_safe():
    report = run_audit(factory="warpolicy.bench.hybrid:decode", device="sim", trials=3)
    assert verdicts(report) == {
        "hybrid-decode": SAFE,
        "hybrid-decode:metadata": SAFE,
        "hybrid-decode:recurrent_state": SAFE,
    }


def test_a_declaration_omitting_the_recurrent_class_is_unsafe_every_trial():
    report = run_audit(
        factory="warpolicy.bench.hybrid:decode_omits_recurrent", device="sim", trials=3
    )
    entry = next(e for e in report.entries if e.backend == "hybrid-decode-omits")
    assert entry.verdict == UNSAFE
    assert entry.dynamic.corrupted == 3


def test_a_class_declared_too_early_is_unsafe_on_its_own_entry():
    # positive control: recurrent state declared in_graph (it is read to the end)
    subject = hybrid.subject(
        sim_platform(), declared={"metadata": IN_GRAPH, "recurrent_state": IN_GRAPH}
    )
    from warpolicy.audit.dynamic import audit_classes

    entries = {e.backend: e.verdict for e in audit_classes(subject, DECODE, 3)}
    assert entries["hybrid-decode:recurrent_state"] == UNSAFE
    assert entries["hybrid-decode:metadata"] == SAFE
