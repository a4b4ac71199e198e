"""Derived placement and the marker self-check inside the runners, on a real GPU.

For every synthetic backend that declares in_graph: the default self-check (``"warn"``) must
demote each bucket of the unsafe marker shapes at capture and never demote the safe one; derived
placement must plant every bucket of the shapes whose late reads are in the graph. Figures
print as ``[runner cuda] ...`` lines (``scripts/gpu-check`` collects them).

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_runner_placement_cuda.py``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from gpu_support import NEEDS_BINDINGS, NEEDS_CUDA

pytestmark = [*NEEDS_CUDA, NEEDS_BINDINGS]

from warpolicy.audit.synthetic import make_synthetic  # noqa: E402
from warpolicy.registry.vocabulary import WarReadDonePolicy as P  # noqa: E402
from warpolicy.runtime.manager import open_runtime  # noqa: E402
from warpolicy.runtime.policy import fixed_policy  # noqa: E402
from warpolicy.runtime.runners import DecodeRunner  # noqa: E402

UNSAFE_MARKER = [
    "late_swa_read",
    "late_kv_write",
    "plant_before_prep",
    "composite_late_child",
    "first_layer_rebuild",
]


def capture(name: str, placement: str):
    platform = open_runtime("cuda").platform
    subject = make_synthetic(name, platform=platform)
    runner = DecodeRunner(
        subject.model,
        fixed_policy("in_graph"),
        platform,
        f"{name}:decode",
        placement=placement,
        self_check="warn",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.capture()
    return runner, [str(w.message) for w in caught]


def _costs(runner) -> str:
    return ", ".join(
        f"bucket {b}: {r.walk_ms:.2f} ms" for b, r in sorted(runner.capture_report.items())
    )


@pytest.mark.parametrize("name", UNSAFE_MARKER)
def test_self_check_demotes_every_unsafe_marker_bucket(name):
    runner, messages = capture(name, "marker")
    policies = {b: cb.policy for b, cb in runner.captured.items()}
    print(
        f"[runner cuda] self-check {name}: {policies and sorted(policies.items())}; "
        f"{_costs(runner)}; {messages[0] if messages else 'no warning'}"
    )
    assert set(policies.values()) == {P.POST_REPLAY}
    assert all(not r.ok and r.walked for r in runner.capture_report.values())
    for bucket in runner.captured:
        assert any(f"bucket {bucket}:" in m and "demoted to post_replay" in m for m in messages)


def test_self_check_passes_the_safe_marker():
    runner, messages = capture("in_graph", "marker")
    print(f"[runner cuda] self-check in_graph: {_costs(runner)}; warnings {messages}")
    assert messages == []
    assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}
    assert all(r.ok for r in runner.capture_report.values())


@pytest.mark.parametrize("name", ["in_graph"] + UNSAFE_MARKER)
def test_derived_placement_plants_every_bucket(name):
    runner, messages = capture(name, "derived")
    print(
        f"[runner cuda] derived {name}: {_costs(runner)}; "
        f"{next(iter(runner.capture_report.values())).detail}"
    )
    assert messages == []
    assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}
    events = [cb.event for cb in runner.captured.values()]
    assert all(e is not None for e in events) and len({id(e) for e in events}) == len(events)
    batch = runner.model.make_batch(runner.mode, 0)
    runner.run(batch)
    taken = runner.fence.take()
    assert taken is not None and taken.policy == P.IN_GRAPH
    torch.cuda.synchronize()
