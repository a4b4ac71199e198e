"""Audit verdicts, exit codes and report formatting (`warpolicy.audit.report`)."""

from __future__ import annotations

import json

import pytest

from warpolicy.audit import (
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    EXIT_UNSAFE,
    AuditReport,
    Verdict,
    format_audit,
    run_audit,
)
from warpolicy.audit.dynamic import audit_mode, dynamic_verdict
from warpolicy.audit.report import (
    AuditEntry,
    DynamicResult,
    Mismatch,
    Offender,
    StaticResult,
    combine,
)
from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, ForwardMode
from warpolicy.testing import sim_platform

from audit_subjects import table_subject

SAFE, UNSAFE, INCONCLUSIVE = Verdict.SAFE, Verdict.UNSAFE, Verdict.INCONCLUSIVE
DECODE = ForwardMode.DECODE


class TestVerdicts:
    def test_unsafe_on_any_difference_even_with_notes(self):
        m = Mismatch(3, "out", (1,), 1.0, 2.0, 1)
        result = dynamic_verdict(10, 2, m, ["eager"])
        assert result.verdict is UNSAFE and result.first == m and result.corrupted == 2

    def test_inconclusive_with_notes_safe_without(self):
        assert dynamic_verdict(5, 0, None, ["why"]).verdict is INCONCLUSIVE
        assert dynamic_verdict(5, 0, None, ["why"]).reason == "why"
        assert dynamic_verdict(5, 0, None).verdict is SAFE
        assert dynamic_verdict(0, 0, None).verdict is INCONCLUSIVE  # nothing checked
        assert audit_mode(table_subject(), DECODE, trials=0).verdict is INCONCLUSIVE

    @pytest.mark.parametrize(
        "dyn, stat, want",
        [
            (SAFE, SAFE, SAFE),
            (SAFE, INCONCLUSIVE, SAFE),
            (SAFE, UNSAFE, UNSAFE),
            (UNSAFE, SAFE, UNSAFE),
            (INCONCLUSIVE, SAFE, INCONCLUSIVE),
            (INCONCLUSIVE, UNSAFE, UNSAFE),
            (INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE),
        ],
    )
    def test_combine(self, dyn, stat, want):
        assert combine(dyn, stat) is want


def _entry(dyn: Verdict, stat: Verdict = INCONCLUSIVE, failed: bool = False) -> AuditEntry:
    return AuditEntry(
        "b",
        DECODE,
        "none",
        IN_GRAPH,
        IN_GRAPH,
        DynamicResult(dyn, failed=failed),
        StaticResult(stat),
    )


class TestExitCode:
    """The audit cannot pass by default: only an all-SAFE run exits 0."""

    @pytest.mark.parametrize(
        "verdicts, code",
        [
            ([SAFE, SAFE], EXIT_OK),
            ([SAFE, UNSAFE], EXIT_UNSAFE),
            ([INCONCLUSIVE], EXIT_INCONCLUSIVE),
            ([SAFE, INCONCLUSIVE], EXIT_INCONCLUSIVE),
            ([INCONCLUSIVE, UNSAFE], EXIT_UNSAFE),
            ([], EXIT_INCONCLUSIVE),
        ],
    )
    def test_by_verdict(self, verdicts, code):
        assert AuditReport(tuple(_entry(v) for v in verdicts)).exit_code == code

    def test_codes_are_distinct_and_not_the_usage_error(self):
        assert len({EXIT_OK, EXIT_UNSAFE, EXIT_INCONCLUSIVE, 2}) == 4

    def test_allow_inconclusive(self):
        report = AuditReport((_entry(SAFE), _entry(INCONCLUSIVE)), allow_inconclusive=True)
        assert report.exit_code == EXIT_OK
        assert AuditReport((_entry(UNSAFE),), allow_inconclusive=True).exit_code == EXIT_UNSAFE

    def test_a_failed_audit_never_passes(self):
        failed = _entry(INCONCLUSIVE, failed=True)
        assert AuditReport((failed,), allow_inconclusive=True).exit_code == EXIT_INCONCLUSIVE
        assert AuditReport((_entry(SAFE), failed)).exit_code == EXIT_INCONCLUSIVE

    def test_nothing_audited_never_passes(self):
        assert AuditReport((), allow_inconclusive=True).exit_code == EXIT_INCONCLUSIVE


def _report() -> AuditReport:
    bad = AuditEntry(
        "late",
        DECODE,
        "none",
        IN_GRAPH,
        IN_GRAPH,
        DynamicResult(UNSAFE, 50, 50, Mismatch(0, "out", (2, 1), 0.5, 0.75, 12)),
        StaticResult(
            UNSAFE,
            (Offender(7, "kernel", "indexSelectSmallIndex", ("full_to_swa",), bucket=8),),
            nodes=20,
            readers=3,
        ),
    )
    good = AuditEntry(
        "safe",
        DECODE,
        "none",
        IN_GRAPH,
        IN_GRAPH,
        DynamicResult(SAFE, 50),
        StaticResult(SAFE, nodes=20, readers=2),
    )
    vague = AuditEntry(
        "coarse",
        ForwardMode.EXTEND,
        "none",
        None,
        NONE,
        DynamicResult(INCONCLUSIVE, reason="policy none: nothing to audit"),
        StaticResult(INCONCLUSIVE, reason="policy none"),
    )
    return AuditReport((good, bad, vague), device="cuda (NVIDIA H200)", trials=50, stall_us=200)


class TestFormat:
    def test_text_table_and_details(self):
        lines = format_audit(_report(), "text").splitlines()
        assert lines[0].startswith("warpolicy audit on cuda (NVIDIA H200): 50 trials")
        assert lines[1].split() == [
            "backend",
            "mode",
            "spec",
            "declared",
            "published",
            "dynamic",
            "static",
            "verdict",
        ]
        row = next(line for line in lines if line.startswith("late "))
        assert "unsafe 50/50" in row and "unsafe: indexSelectSmallIndex" in row
        assert row.split()[-1] == "UNSAFE"
        assert "  dynamic: trial 0: out[2, 1] = 0.75, expected 0.5 (12 elements differ)" in lines
        assert any(
            "indexSelectSmallIndex (bucket 8 node 7, kernel) touches full_to_swa" in line
            for line in lines
        )
        assert "1 safe, 1 unsafe, 1 inconclusive" in lines
        assert lines[-1].startswith("note: the static audit")

    def test_failed_entries_are_counted(self):
        report = AuditReport((_entry(INCONCLUSIVE, failed=True), _entry(SAFE)))
        assert "0 safe, 0 unsafe, 2 inconclusive (1 failed)" not in format_audit(report)
        assert "1 safe, 0 unsafe, 1 inconclusive (1 failed)" in format_audit(report)

    def test_json_round_trips(self):
        data = json.loads(format_audit(_report(), "json"))
        assert data["schema_version"] == 1
        assert data["exit_code"] == EXIT_UNSAFE and data["allow_inconclusive"] is False
        assert data["summary"] == {"safe": 1, "unsafe": 1, "inconclusive": 1}
        late = data["entries"][1]
        assert late["verdict"] == "unsafe" and late["dynamic"]["first"]["index"] == [2, 1]
        assert late["static"]["offenders"][0]["name"] == "indexSelectSmallIndex"
        assert late["static"]["offenders"][0]["bucket"] == 8
        assert data["entries"][2]["declared"] is None
        assert data["entries"][2]["published"] == "none"

    def test_rejects_unknown_format(self):
        with pytest.raises(InputError, match="unknown audit format"):
            format_audit(_report(), "yaml")

    def test_common_static_reason_printed_once(self):
        report = run_audit(synthetic="in_graph", trials=2, platform=sim_platform())
        assert format_audit(report).count("static audit unavailable") == 1
