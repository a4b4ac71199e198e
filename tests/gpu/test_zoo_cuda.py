"""GPU: the zoo of field bug shapes with the race widener on and off, and a real device-side
assert isolated to its subject.

* widener on (``ZOO_WIDEN_US``, default 200 us): every buggy variant detected (dynamic, static
  or canary), every fixed one SAFE with no alarm, each variant within 30 s, batches <= 8;
* widener off: the same table, printed (which races needed the widener); still no false alarm;
* isolation: three subjects, the middle one's forward indexes out of bounds in a CUDA kernel
  (a device-side assert loses the process's context): it alone fails, the others keep their
  verdicts.

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_zoo_cuda.py``;
each test prints its table.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from gpu_support import NEEDS_CUDA

pytestmark = [*NEEDS_CUDA]

from warpolicy.audit import Verdict, run_audit  # noqa: E402
from warpolicy.audit.api import describe_device, platform_for  # noqa: E402
from warpolicy.audit.zoo import format_zoo, run_zoo  # noqa: E402
from warpolicy.audit.zoo.model import BUCKETS  # noqa: E402
from warpolicy.runtime.runners.widen import RaceWidener  # noqa: E402

WIDEN_US = float(os.environ.get("ZOO_WIDEN_US", "200"))
TRIALS = int(os.environ.get("ZOO_TRIALS", "10"))


@pytest.fixture(scope="module")
def platform():
    return platform_for("cuda")


def test_widened_zoo_detects_every_buggy_variant_and_passes_every_fixed_one(platform):
    assert max(BUCKETS) <= 8
    report = run_zoo(
        platform,
        trials=TRIALS,
        widener=RaceWidener.resolve(WIDEN_US),
        device=describe_device(platform),
    )
    print("\n[zoo cuda widened]\n" + format_zoo(report))
    for row in report.rows:
        where = f"{row.fixture.name}:{row.variant}: {row.entry.dynamic.reason}"
        assert row.as_expected, where
        assert row.seconds < 30.0, where
    assert report.summary().startswith("buggy detected 8/8, fixed flagged 0/8")
    named = [o for r in report.rows for o in r.entry.static.offenders]
    print("[zoo cuda readers]", *sorted({o.label for o in named}), sep="\n  ")
    assert named and all(o.site.count(".py:") == 1 for o in named), named


def test_unwidened_zoo_table_and_no_false_alarm(platform):
    report = run_zoo(
        platform, trials=TRIALS, widener=RaceWidener.resolve(0), device=describe_device(platform)
    )
    print("\n[zoo cuda unwidened]\n" + format_zoo(report))
    assert not [r for r in report.rows if not r.buggy and r.detected_by]


FACTORIES = """
import attrs
import torch

from warpolicy.audit.synthetic import make_synthetic


def _out_of_bounds(platform):
    subject = make_synthetic("plant_before_prep", platform=platform)
    model = subject.model
    forward = model.forward

    def oob(bucket):
        bad = torch.full((bucket,), 10**7, dtype=torch.long, device=model.device)
        model.k_full.index_select(0, bad)  # a device-side assert
        return forward(bucket)

    model.forward = oob
    return subject


def oob_in_the_middle(platform):
    return [
        make_synthetic("in_graph", platform=platform),
        _out_of_bounds(platform),
        make_synthetic("late_swa_read", platform=platform),
    ]
"""


def test_a_device_side_assert_fails_only_its_subject(tmp_path, monkeypatch):
    (tmp_path / "zoo_gpu_factories.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        report = run_audit(
            factory="zoo_gpu_factories:oob_in_the_middle",
            modes="decode",
            trials=10,
            device="cuda",
            isolate=True,
        )
    finally:
        sys.modules.pop("zoo_gpu_factories", None)
    got = [(e.backend, e.verdict, e.dynamic.failed, e.dynamic.reason[:160]) for e in report.entries]
    print("\n[zoo cuda isolation]\n" + "\n".join(map(str, got)))
    assert [g[:3] for g in got] == [
        ("in_graph", Verdict.SAFE, False),
        ("plant_before_prep", Verdict.INCONCLUSIVE, True),
        ("late_swa_read", Verdict.UNSAFE, False),
    ]


def test_runner_self_check_and_derived_plant_name_readers_by_file_and_line(platform):
    import warnings

    from warpolicy.audit.zoo.fixture import make_subject, zoo_fixture
    from warpolicy.runtime.runners import DecodeRunner

    lines = {}
    for placement, check in (("marker", "warn"), ("derived", "off")):
        built = make_subject(zoo_fixture("swa_mapping_recovery"), True, platform)
        runner = DecodeRunner(
            built.model, built.policy, platform, f"zoo-{placement}",
            keep_graphs=True, placement=placement, self_check=check,
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the self-check's demotion warning
            runner.capture()
        lines[placement] = [r.detail for r in runner.capture_report.values()]
    print("\n[zoo cuda runner]", *[f"{k}: {d}" for k, v in lines.items() for d in v], sep="\n  ")
    assert all("sglang.py:" in d for d in lines["marker"]), lines
    assert all("sglang.py:" in d for d in lines["derived"]), lines
