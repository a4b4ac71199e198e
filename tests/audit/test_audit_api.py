"""`run_audit` arguments, factory strings and the `warpolicy audit` command's exit codes."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from warpolicy.audit import (
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    EXIT_UNSAFE,
    Verdict,
    parse_modes,
    parse_synthetic,
    resolve_factory,
    run_audit,
)
from warpolicy.audit.api import call_factory
from warpolicy.audit.synthetic import synthetic_names
from warpolicy.cli.main import main
from warpolicy.errors import CudaUnavailableError, InputError, UnknownNameError
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.testing import sim_platform

UNSAFE = Verdict.UNSAFE
DECODE = ForwardMode.DECODE


def test_run_audit_needs_exactly_one_source():
    with pytest.raises(InputError, match="exactly one"):
        run_audit()
    with pytest.raises(InputError, match="exactly one"):
        run_audit(factory="a:b", synthetic="in_graph")


@pytest.mark.parametrize("trials", [0, -1, 2.5, "x", True])
def test_run_audit_rejects_bad_trials(trials):
    with pytest.raises(InputError, match="--trials"):
        run_audit(synthetic="in_graph", trials=trials, platform=sim_platform())


def test_run_audit_rejects_negative_stall():
    with pytest.raises(InputError, match="--stall-us"):
        run_audit(synthetic="in_graph", stall_us=-1, platform=sim_platform())


def test_unknown_synthetic_name_suggests():
    with pytest.raises(UnknownNameError, match="did you mean 'in_graph'"):
        run_audit(synthetic="in_grap", platform=sim_platform())


def test_unknown_mode_raises():
    with pytest.raises(UnknownNameError):
        run_audit(synthetic="in_graph", modes="decod", platform=sim_platform())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_no_cuda_raises_cuda_unavailable():
    with pytest.raises(CudaUnavailableError, match="needs a CUDA device"):
        run_audit(synthetic="in_graph")


def test_usage_errors_come_before_the_device_check():
    with pytest.raises(UnknownNameError):
        run_audit(synthetic="nope", device="cuda")


def test_parse_modes():
    assert parse_modes(None) is None
    assert parse_modes("decode, prefill,decode") == [DECODE, ForwardMode.EXTEND]
    assert parse_modes(["verify"]) == [ForwardMode.TARGET_VERIFY]
    assert parse_modes(["decode,verify", ForwardMode.EXTEND]) == [
        DECODE,
        ForwardMode.TARGET_VERIFY,
        ForwardMode.EXTEND,
    ]
    with pytest.raises(InputError):
        parse_modes(" , ")


def test_parse_synthetic_all_and_lists():
    assert parse_synthetic("all") == synthetic_names()
    assert parse_synthetic("late_swa_read,in_graph,late_swa_read") == ["late_swa_read", "in_graph"]
    # backend names are matched ignoring case, everywhere
    assert parse_synthetic("Late_SWA_Read,IN_GRAPH") == ["late_swa_read", "in_graph"]
    assert parse_synthetic("ALL") == synthetic_names()


def test_modes_filter_limits_entries():
    report = run_audit(synthetic="in_graph", modes="verify", trials=1, platform=sim_platform())
    assert [e.mode for e in report.entries] == [ForwardMode.TARGET_VERIFY]


@pytest.mark.parametrize(
    "text, match",
    [
        ("nocolon", "expected MODULE:CALLABLE"),
        (":make", "expected MODULE:CALLABLE"),
        ("json:", "expected MODULE:CALLABLE"),
        ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
        ("json:no_such_attr", "has no attribute 'no_such_attr'"),
        ("json.decoder:__doc__", "is not callable"),
    ],
)
def test_resolve_factory_errors(text, match):
    with pytest.raises(InputError, match=match):
        resolve_factory(text)


def test_resolve_factory_dotted_attribute():
    assert resolve_factory("json:JSONDecoder.decode") is json.JSONDecoder.decode


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    """An importable module holding audit factories (removed from sys.modules afterwards)."""
    name = "warpolicy_audit_factory_for_tests"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent("""
        from warpolicy.audit.synthetic import make_synthetic

        def good(platform):
            return make_synthetic("late_swa_read", platform=platform)

        def several(platform):
            return [make_synthetic(n, platform=platform) for n in ("in_graph", "late_swa_read")]

        def wrong(platform):
            return 42

        def broken(platform):
            raise ValueError("cannot build")

        def crashes(platform):  # builds, but its forward raises in every mode
            subject = make_synthetic("in_graph", platform=platform)
            def boom(bucket):
                raise RuntimeError("forward exploded")
            subject.model.forward = boom
            return subject
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_factory_end_to_end(factory_module):
    report = run_audit(
        factory=f"{factory_module}:good", modes="decode", trials=2, platform=sim_platform()
    )
    assert [(e.backend, e.verdict) for e in report.entries] == [("late_swa_read", UNSAFE)]
    assert report.exit_code == EXIT_UNSAFE


def test_factory_returning_several_subjects(factory_module):
    report = run_audit(
        factory=f"{factory_module}:several", modes="decode", trials=1, platform=sim_platform()
    )
    assert [e.backend for e in report.entries] == ["in_graph", "late_swa_read"]


@pytest.mark.parametrize(
    "attr, match",
    [("wrong", "must return an AuditSubject"), ("broken", "failed: ValueError: cannot build")],
)
def test_bad_factories_are_input_errors(factory_module, attr, match):
    with pytest.raises(InputError, match=match):
        run_audit(factory=f"{factory_module}:{attr}", platform=sim_platform())


def test_call_factory_lets_warpolicy_errors_through():
    def raises(platform):
        raise UnknownNameError("backend", "x", ["y"])

    with pytest.raises(UnknownNameError):
        call_factory(raises, "m:raises", None)


# -- the command's exit codes -------------------------------------------------------------------


def _audit(capsys, *argv):
    code = main(["audit", "--device", "fake", "--format", "json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def test_cli_safe_run_exits_0(capsys):
    code, data = _audit(capsys, "--synthetic", "in_graph", "--trials", "2")
    assert code == EXIT_OK and data["summary"]["safe"] == 2


def test_cli_unsafe_run_exits_1(capsys):
    code, _ = _audit(capsys, "--synthetic", "late_kv_write", "--modes", "decode", "--trials", "2")
    assert code == EXIT_UNSAFE


def test_cli_inconclusive_fails_unless_allowed(capsys):
    # one trial replays one of the two captured buckets of each mode: nothing is proven
    code, data = _audit(capsys, "--synthetic", "in_graph", "--trials", "1")
    assert data["summary"]["inconclusive"] == 2 and code == EXIT_INCONCLUSIVE
    code, _ = _audit(capsys, "--synthetic", "in_graph", "--trials", "1", "--allow-inconclusive")
    assert code == EXIT_OK


def test_cli_factory_crashing_in_every_mode_never_exits_0(capsys, factory_module):
    for extra in ((), ("--allow-inconclusive",)):
        code, data = _audit(
            capsys, "--factory", f"{factory_module}:crashes", "--trials", "2", *extra
        )
        assert code == EXIT_INCONCLUSIVE, extra
        assert all(e["dynamic"]["failed"] for e in data["entries"]) and data["entries"]
