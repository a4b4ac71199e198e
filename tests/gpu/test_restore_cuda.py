"""Restored graphs on a real GPU: save, clone with fresh private events, restore, WAR trials.

The engine captures the forward of ``test_owned_capture_cuda`` (a spin, a prep gathering a
shared table, in-place kernels, a late read of a shared mapping), saves where the read-done
node sits, clones the graph with private events at its event-record nodes (what a persistence
library's load leaves), instantiates the clone and restores it through the engine API; the
scheduler then poisons both shared buffers after the barrier. Expected: the restored bucket
publishes ``in_graph`` and never corrupts; the clone *not* restored, published with the old
release, corrupts (the control); a clone whose node moved publishes nothing. Each test prints one
``[restore cuda] ...`` line.

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_restore_cuda.py``.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from gpu_support import NEEDS_BINDINGS, NEEDS_CUDA

pytestmark = [*NEEDS_CUDA, NEEDS_BINDINGS]

# the engine API's GPU test module (pytest puts tests/gpu on the path; mypy does not see it)
from test_owned_capture_cuda import (  # type: ignore[import-not-found]  # noqa: E402
    ROWS,
    TRIALS,
    Forward,
    finish,
    new_capture,
    torch_capture,
    war_trial,
)

from warpolicy.bench.restored import move_planted_node  # noqa: E402
from warpolicy.registry.vocabulary import WarReadDonePolicy as P  # noqa: E402
from warpolicy.runtime.owned_capture import ReadDoneCapture  # noqa: E402


def restore(rt: Any, fence: Any, capture: ReadDoneCapture, graph: Any, fwd: Forward, **kw: Any):
    clone = rt.platform.clone_graph(graph, private_events=True)
    if kw.pop("moved", False):
        move_planted_node(rt.platform, clone)
    rt.platform.instantiate(clone)  # handed back instantiated, as after a load
    again = ReadDoneCapture(rt.platform, capture.cell, fence)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        outcome = again.restore(ROWS, clone, kw["saved"], fwd.shared)
    return clone, outcome


@pytest.mark.parametrize("placement", ["marker", "derived"])
def test_a_restored_clone_publishes_in_graph_and_never_corrupts(placement):
    fwd = Forward(late=placement == "derived")
    rt, fence, capture = new_capture(placement)
    bucket = capture.begin(ROWS)
    graph = torch_capture(fwd, bucket)
    captured = finish(bucket, graph, fwd)
    saved = capture.save(graph, captured)
    clone, outcome = restore(rt, fence, capture, graph, fwd, saved=saved)
    corrupted, release = war_trial(fwd, fence, outcome.release, lambda s: clone.replay())
    # the control: the clone published with the capture-time release (its node records a
    # private event the scheduler never sees)
    stale, stale_release = war_trial(fwd, fence, captured.release, lambda s: clone.replay())
    print(
        f"[restore cuda] {placement}: restored {outcome.policy.label}, rebind "
        f"{outcome.report.rebind_us:.1f} us per executable; {corrupted}/{TRIALS} corrupted "
        f"({release:.0f} us after launch); control (old release on the clone): "
        f"{stale}/{TRIALS} corrupted ({stale_release:.0f} us)"
    )
    assert captured.policy is P.IN_GRAPH and outcome.policy is P.IN_GRAPH
    assert outcome.report.restored and outcome.report.rebind_us is not None
    assert corrupted == 0
    assert stale > 0


def test_a_clone_whose_node_moved_publishes_nothing():
    fwd = Forward(late=False)
    rt, fence, capture = new_capture("marker")
    bucket = capture.begin(ROWS)
    graph = torch_capture(fwd, bucket)
    captured = finish(bucket, graph, fwd)
    saved = capture.save(graph, captured)
    clone, outcome = restore(rt, fence, capture, graph, fwd, saved=saved, moved=True)
    corrupted, release = war_trial(fwd, fence, outcome.release, lambda s: clone.replay())
    print(
        f"[restore cuda] moved: {outcome.policy.label} ({outcome.report.detail}); "
        f"{corrupted}/{TRIALS} corrupted ({release:.0f} us, coarse)"
    )
    assert outcome.policy is P.NONE and corrupted == 0
