"""The zoo run (`warpolicy.audit.zoo.run`, ``warpolicy audit --zoo``) on the simulated platform:
every verdict pinned (each buggy variant UNSAFE in the dynamic audit and caught by the canary,
each fixed one SAFE and clean), and positive controls that make the zoo fail: a "fixed"
variant that still releases early is a false alarm's twin (exit 1), a "buggy" variant that
declares late enough escapes (exit 1)."""

from __future__ import annotations

import json

import attrs
import pytest

from warpolicy.audit import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_UNSAFE, Verdict
from warpolicy.audit.zoo import (
    FIXTURES,
    ZooReport,
    format_zoo,
    parse_fixtures,
    run_variant,
    run_zoo,
    zoo_fixture,
)
from warpolicy.audit.zoo.fixture import Declares
from warpolicy.cli.main import main
from warpolicy.errors import UnknownNameError
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, PRE_REPLAY
from warpolicy.runtime.runners.widen import RaceWidener
from warpolicy.testing import sim_platform

OFF = RaceWidener()


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
def test_the_buggy_variant_is_unsafe_and_caught_by_the_canary(fixture):
    row = run_variant(fixture, True, sim_platform(), 2, OFF)
    assert row.entry.dynamic.verdict is Verdict.UNSAFE, row.entry.dynamic.reason
    assert row.entry.dynamic.corrupted == 2
    assert row.canary is not None and row.canary.detected, row.canary
    assert row.detected_by == ("dynamic", "canary")  # no graph walk on the simulated platform
    assert row.as_expected


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
def test_the_fixed_variant_is_safe_and_clean(fixture):
    row = run_variant(fixture, False, sim_platform(), 2, OFF)
    assert row.entry.dynamic.verdict is Verdict.SAFE, row.entry.dynamic.reason
    assert row.canary is not None and row.canary.caught == 0
    assert row.canary.checked == row.canary.steps  # every step compared, none demoted
    assert row.detected_by == () and row.as_expected


def test_the_whole_zoo_exits_0_with_8_of_8_detected():
    report = run_zoo(sim_platform(), device="sim")
    assert report.exit_code == EXIT_OK
    assert report.summary().startswith("buggy detected 8/8, fixed flagged 0/8")
    assert report.trials == 2  # the simulated default


def _variant_of(name, **changes):
    return attrs.evolve(zoo_fixture(name), **changes)


def test_positive_control_a_fixed_variant_that_releases_early_fails_the_zoo():
    early = _variant_of(
        "req_pool_reuse",
        declares=Declares(zoo_fixture("req_pool_reuse").mode, IN_GRAPH, PRE_REPLAY),
    )
    report = run_zoo(sim_platform(), [early])
    fixed = report.rows[1]
    assert fixed.detected_by and not fixed.as_expected
    assert report.exit_code == EXIT_UNSAFE
    assert "NO" in format_zoo(report)


def test_positive_control_a_buggy_variant_declared_late_enough_escapes():
    late = _variant_of(
        "recurrent_state_replay",
        declares=Declares(zoo_fixture("recurrent_state_replay").mode, POST_REPLAY, POST_REPLAY),
    )
    report = run_zoo(sim_platform(), [late])
    assert report.rows[0].detected_by == () and not report.rows[0].as_expected
    assert report.exit_code == EXIT_UNSAFE


def test_no_variant_is_inconclusive():
    assert ZooReport(()).exit_code == EXIT_INCONCLUSIVE


def test_parse_fixtures():
    assert parse_fixtures(None) == list(FIXTURES) == parse_fixtures("all")
    assert [
        f.name for f in parse_fixtures("wrapper_one_child, req_pool_reuse,wrapper_one_child")
    ] == [
        "wrapper_one_child",
        "req_pool_reuse",
    ]
    with pytest.raises(UnknownNameError):
        parse_fixtures("req_pool_reuse,nope")


class TestCommand:
    def test_text_table(self, capsys):
        code = main(["audit", "--zoo", "req_pool_reuse,live_mapping_reread", "--device", "sim"])
        out = capsys.readouterr().out
        assert code == EXIT_OK, out
        header = out.splitlines()[1].split()
        assert header[:3] == ["fixture", "report", "variant"] and "detected" in header
        assert "SGLang #18803" in out and "dynamic, canary" in out
        assert out.rstrip().endswith("buggy detected 2/2, fixed flagged 0/2 (widener off)")

    def test_json(self, capsys):
        code = main(["audit", "--zoo", "wrapper_one_child", "--device", "sim", "--format", "json"])
        doc = json.loads(capsys.readouterr().out)
        assert code == EXIT_OK == doc["exit_code"]
        assert [(r["variant"], r["detected_by"]) for r in doc["rows"]] == [
            ("buggy", ["dynamic", "canary"]),
            ("fixed", []),
        ]
        assert doc["rows"][0]["report"].startswith("REFERENCE 1f")

    def test_unknown_fixture_is_one_line_exit_2(self, capsys):
        assert main(["audit", "--zoo", "nope", "--device", "sim"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "unknown zoo fixture 'nope'" in err[0]

    def test_a_bad_widener_value_is_one_line_exit_2(self, capsys):
        assert main(["audit", "--zoo", "--device", "sim", "--widen-race-us", "-5"]) == 2
        assert "widen_race_us" in capsys.readouterr().err


def _poison_03(kind):
    """0.3.0's integer poisons: ``lo = min(0, min x)`` over the sentinels too (the bug)."""
    import torch

    def poison(t):
        lo, hi = min(0, int(t.min())), int(t.max())
        if kind == "low":
            return torch.where(t != lo + 1, lo + 1, hi)
        return torch.where(t != hi, hi, lo)  # high: the entries at hi become -1

    poison.__name__ = kind
    return poison


def test_regression_the_sentinel_mapping_is_unsafe_where_the_03_poisons_crashed_the_audit():
    # issue 30 item 5: SGLang 0.5.23's SWA mapping ends in -1; 0.3.0's low/high wrote -1 into
    # live entries, so the late reader indexed out of bounds and the audit ended INCONCLUSIVE
    from warpolicy.audit.dynamic import audit_mode
    from warpolicy.audit.zoo import make_subject

    fixture = zoo_fixture("swa_mapping_recovery")

    def subject():
        built = make_subject(fixture, True, sim_platform())
        mapping = built.model.full_to_swa
        mapping[:-1] = 47  # every live token's SWA slot is the mapping's largest value...
        mapping[0] = 0  # ...but one, and the last entry stays the -1 sentinel
        return built.subject

    entry = audit_mode(subject(), fixture.mode, 2, 0.0)
    assert entry.verdict is Verdict.UNSAFE and not entry.dynamic.failed

    then = attrs.evolve(subject(), poison={"full_to_swa": _poison_03("high")})
    old = audit_mode(then, fixture.mode, 2, 0.0)
    assert old.dynamic.failed and "index" in old.dynamic.reason.lower()
    assert old.verdict is Verdict.INCONCLUSIVE


def test_plain_warpolicy_audit_finds_every_buggy_variant_through_the_factory():
    from warpolicy.audit import run_audit

    report = run_audit(
        factory="warpolicy.audit.zoo:zoo_subjects", trials=2, platform=sim_platform()
    )
    verdicts = {e.backend: e.verdict for e in report.entries}
    assert len(verdicts) == 2 * len(FIXTURES)
    assert all(
        v is (Verdict.UNSAFE if n.endswith(":buggy") else Verdict.SAFE) for n, v in verdicts.items()
    )
    assert report.exit_code == EXIT_UNSAFE


EXITING_MODEL = """
import os

from warpolicy.audit.zoo.sglang import RequestPoolReuse


class ExitsWhenBuggy(RequestPoolReuse):
    def forward(self, bucket):
        if self.buggy:
            os._exit(9)  # what losing the device looks like from outside
        return super().forward(bucket)
"""


def test_isolated_zoo_a_lost_variant_fails_alone(tmp_path, monkeypatch):
    import sys

    (tmp_path / "zoo_exiting.py").write_text(EXITING_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import importlib

        model = importlib.import_module("zoo_exiting").ExitsWhenBuggy
        exiting = attrs.evolve(zoo_fixture("req_pool_reuse"), name="exits", model=model)
        report = run_zoo(sim_platform(), [exiting, zoo_fixture("wrapper_one_child")], isolate=True)
    finally:
        sys.modules.pop("zoo_exiting", None)
    rows = [(r.fixture.name, r.variant, r.failed, r.detected_by) for r in report.rows]
    assert rows == [
        ("exits", "buggy", True, ()),
        ("exits", "fixed", False, ()),
        ("wrapper_one_child", "buggy", False, ("dynamic", "canary")),
        ("wrapper_one_child", "fixed", False, ()),
    ]
    assert "status 9" in report.rows[0].entry.dynamic.reason
    assert report.exit_code == EXIT_INCONCLUSIVE
