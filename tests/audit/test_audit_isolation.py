"""Per-subject fault isolation (`warpolicy.audit.isolation`): a subject that kills its process,
or leaves the device unusable, fails alone; every other subject keeps its own verdict.

On CUDA the fault is a device-side assert that poisons the whole context; on the simulated
platform the child's death is an ``os._exit`` and the lost context a ``synchronize`` that
raises, which is what `device_healthy` probes."""

from __future__ import annotations

import sys
import textwrap

import pytest

pytest.importorskip("torch")  # the benchmarks/subjects run torch models (the no-torch nox sessions)

from warpolicy.audit import EXIT_INCONCLUSIVE, Verdict, run_audit
from warpolicy.audit.isolation import device_healthy
from warpolicy.testing import sim_platform

FACTORIES = """
import os

import attrs

from warpolicy.audit.synthetic import make_synthetic


def _exits(platform):
    subject = make_synthetic("plant_before_prep", platform=platform)

    def exit_now(bucket):
        os._exit(9)  # what a device-side assert's abort looks like from outside

    subject.model.forward = exit_now
    return subject


def _loses_device(platform):
    subject = make_synthetic("plant_before_prep", platform=platform)
    make_batch = subject.make_batch

    def make_batch_then_lose(mode, trial):
        def lost():
            raise RuntimeError("CUDA error: device-side assert triggered")

        platform.synchronize = lost  # every later device call of this process fails
        return make_batch(mode, trial)

    return attrs.evolve(subject, make_batch=make_batch_then_lose)


def crash_in_the_middle(platform):
    return [
        make_synthetic("in_graph", platform=platform),
        _exits(platform),
        make_synthetic("late_swa_read", platform=platform),
    ]


def lost_device_in_the_middle(platform):
    return [
        make_synthetic("in_graph", platform=platform),
        _loses_device(platform),
        make_synthetic("late_swa_read", platform=platform),
    ]
"""


@pytest.fixture
def factories(tmp_path, monkeypatch):
    name = "isolation_factories"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _verdicts(report):
    return [(e.backend, e.verdict, e.dynamic.failed) for e in report.entries]


def test_a_subject_that_kills_its_process_fails_alone(factories):
    report = run_audit(
        factory=f"{factories}:crash_in_the_middle",
        modes="decode",
        trials=2,
        device="sim",
        isolate=True,
    )
    assert _verdicts(report) == [
        ("in_graph", Verdict.SAFE, False),
        ("plant_before_prep", Verdict.INCONCLUSIVE, True),
        ("late_swa_read", Verdict.UNSAFE, False),
    ]
    reason = report.entries[1].dynamic.reason
    assert "'plant_before_prep'" in reason and "status 9" in reason


def test_a_subject_that_leaves_the_device_unusable_fails_alone(factories):
    report = run_audit(
        factory=f"{factories}:lost_device_in_the_middle",
        modes="decode",
        trials=2,
        device="sim",
        isolate=True,
    )
    # the third subject ran in a fresh process: its verdict is its own, not the lost device's
    assert _verdicts(report) == [
        ("in_graph", Verdict.SAFE, False),
        ("plant_before_prep", Verdict.INCONCLUSIVE, True),
        ("late_swa_read", Verdict.UNSAFE, False),
    ]
    assert "device-side assert" in report.entries[1].dynamic.reason


def test_without_isolation_a_lost_device_takes_the_later_subjects_down(factories):
    # the positive control: in one process the later subject meets the lost device too
    report = run_audit(
        factory=f"{factories}:lost_device_in_the_middle",
        modes="decode",
        trials=2,
        device="sim",
        isolate=False,
    )
    assert report.entries[2].verdict is not Verdict.UNSAFE
    assert report.exit_code == EXIT_INCONCLUSIVE


def test_device_healthy_names_what_failed():
    platform = sim_platform()
    assert device_healthy(platform) is None

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    platform.synchronize = broken
    assert device_healthy(platform) == (
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    )


def test_the_cli_isolates_on_request(capsys):
    from warpolicy.cli.main import main

    code = main(
        ["audit", "--synthetic", "in_graph", "--device", "sim", "--modes", "decode"]
        + ["--trials", "2", "--isolation", "process"]
    )
    assert code == 0, capsys.readouterr().out
    assert "in_graph" in capsys.readouterr().out
