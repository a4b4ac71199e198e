"""The engine-facing API on a real GPU: an engine that captures its own graphs.

No warpolicy runner: the test captures its own graph (a spin, a metadata prep gathering rows of
a shared table, a chain of in-place kernels, optionally a late read of a shared mapping), then
``BucketCapture.finish`` checks the marker or plants the derived node, and a write-after-read
trial replays it through the fence while the scheduler, after the `SchedulerBarrier`,
overwrites both shared buffers. Graphs: a torch ``CUDAGraph(keep_graph=True)``, the raw
``cudaGraph_t`` of one (`RawGraph`, instantiated by torch after the plant), and a graph the
test captures, instantiates and launches through cuda-bindings alone. Each test prints one
``[engine api cuda] ...`` line.

Run on the GPU box:
``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_owned_capture_cuda.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from gpu_support import NEEDS_BINDINGS, NEEDS_CUDA

pytestmark = [*NEEDS_CUDA, NEEDS_BINDINGS]

from warpolicy.registry.engine import PolicyEngine  # noqa: E402
from warpolicy.registry.vocabulary import WarReadDonePolicy as P  # noqa: E402
from warpolicy.runtime.manager import open_runtime  # noqa: E402
from warpolicy.runtime.owned_capture import (  # noqa: E402
    BucketCapture,
    BucketOutcome,
    RawGraph,
    ReadDoneCapture,
    ReadDoneFence,
    SchedulerBarrier,
    cell_policy,
    resolve_cell,
)
from warpolicy.runtime.policy import fixed_policy  # noqa: E402

SPIN_US = 200.0
ROWS, WIDTH, TABLE_ROWS = 256, 1024, 4096
CHAIN = 64  # in-place kernels after the prep (the "layers")
LATE_AFTER = 32  # the late mapping read comes after this many of them
TRIALS = 30


def spin_cycles() -> int:
    cycles = 100_000
    torch.cuda._sleep(cycles)
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return max(int(cycles * SPIN_US / max(start.elapsed_time(end) * 1000.0, 1.0)), 1000)


class Forward:
    """The engine's forward: static buffers only, so the body allocates nothing (it can be
    captured by torch or by a raw stream capture alike)."""

    def __init__(self, late: bool) -> None:
        dev = torch.device("cuda")
        gen = torch.Generator(device=dev).manual_seed(0)
        self.late = late
        self.table = torch.randn(TABLE_ROWS, WIDTH, device=dev, generator=gen)  # req_to_token
        self.mapping = torch.randn(ROWS, device=dev, generator=gen)  # swa_map
        self.index = torch.randperm(TABLE_ROWS, device=dev, generator=gen)[:ROWS].contiguous()
        self.positions = torch.arange(ROWS, device=dev)
        self.h = torch.empty(ROWS, WIDTH, device=dev)
        self.late_rows = torch.empty(ROWS, device=dev)
        self.saved = (self.table.clone(), self.mapping.clone())
        self.cycles = spin_cycles()

    @property
    def shared(self) -> dict[str, Any]:
        return {"req_to_token": self.table, "swa_map": self.mapping}

    def body(self, mark: Callable[[], Any] | None = None) -> None:
        torch.cuda._sleep(self.cycles)
        torch.index_select(self.table, 0, self.index, out=self.h)  # the prep: shared read
        if mark is not None:
            mark()
        for k in range(CHAIN):
            self.h.mul_(1.0001)
            if self.late and k + 1 == LATE_AFTER:  # a late shared read
                torch.index_select(self.mapping, 0, self.positions, out=self.late_rows)
                self.h.add_(self.late_rows.unsqueeze(1))
            else:
                self.h.add_(0.5)

    def restore(self) -> None:
        self.table.copy_(self.saved[0])
        self.mapping.copy_(self.saved[1])

    def poison(self) -> None:
        self.mapping.fill_(999.0)
        self.table.fill_(7.0)


def new_capture(placement: str, *, self_check: str = "warn", policy: P = P.IN_GRAPH):
    rt = open_runtime("cuda")
    cell = cell_policy(fixed_policy(policy), "decode", placement=placement)
    fence = ReadDoneFence(rt.platform, name=f"engine-{placement}", observers=rt.observers)
    capture = ReadDoneCapture(rt.platform, cell, fence, self_check=self_check)
    return rt, fence, capture


def torch_capture(fwd: Forward, bucket: BucketCapture) -> Any:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fwd.body()  # warm-up, eager
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        fwd.body(bucket.mark)  # mark() is a no-op under derived placement
    return graph


def war_trial(
    fwd: Forward,
    fence: ReadDoneFence,
    release: Any,
    launch: Callable[[Any], None],
    *,
    barrier: bool = True,
) -> tuple[int, float]:
    """``TRIALS`` steps: publish through the fence around ``launch(stream)``; the scheduler
    takes, waits through the barrier (or not: the unsafe control) and poisons both buffers.
    Returns (corrupted steps, median release in us after launch)."""
    forward, schedule = torch.cuda.Stream(), torch.cuda.Stream()
    platform = fence.platform
    wall = SchedulerBarrier(platform)
    fwd.restore()
    torch.cuda.synchronize()
    launch(forward)
    torch.cuda.synchronize()
    reference = fwd.h.clone()
    corrupted, releases = 0, []
    for _ in range(TRIALS):
        start, released = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        with torch.cuda.stream(forward):
            start.record()
            fence.before_replay(release)
            launch(forward)
            fence.after_replay(release)
        read_done = fence.take()
        if barrier:
            wall.apply(schedule, forward, read_done)
        elif read_done is not None:
            read_done.discard()
        with torch.cuda.stream(schedule):
            released.record()
            fwd.poison()
        torch.cuda.synchronize()
        releases.append(start.elapsed_time(released) * 1000.0)
        corrupted += not torch.equal(fwd.h, reference)
        fwd.restore()
        torch.cuda.synchronize()
    releases.sort()
    return corrupted, releases[len(releases) // 2]


def finish(bucket: BucketCapture, graph: Any, fwd: Forward, **kw: Any) -> BucketOutcome:
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        return bucket.finish(graph, fwd.shared, **kw)


# -- torch CUDAGraph ---------------------------------------------------------------------------


def test_torch_graph_marker_checked_publishes_in_graph_and_never_corrupts():
    fwd = Forward(late=False)
    _, fence, capture = new_capture("marker")
    bucket = capture.begin(ROWS)
    graph = torch_capture(fwd, bucket)
    outcome = finish(bucket, graph, fwd)
    corrupted, release = war_trial(fwd, fence, outcome.release, lambda s: graph.replay())
    print(
        f"[engine api cuda] torch graph, marker after the prep: {outcome.policy.label} "
        f"(self-check {outcome.report.walk_ms:.1f} ms, ok={outcome.report.ok}); "
        f"{corrupted}/{TRIALS} corrupted, released {release:.0f} us after launch"
    )
    assert outcome.policy is P.IN_GRAPH and outcome.report.ok and outcome.report.walked
    assert corrupted == 0


def test_torch_graph_marker_before_a_late_read_is_demoted_and_its_control_corrupts():
    fwd = Forward(late=True)
    _, fence, capture = new_capture("marker")
    bucket = capture.begin(ROWS)
    graph = torch_capture(fwd, bucket)
    outcome = finish(bucket, graph, fwd)
    corrupted, release = war_trial(fwd, fence, outcome.release, lambda s: graph.replay())
    # positive control: the same graph with the self-check off publishes the early marker
    fwd2 = Forward(late=True)
    _, fence2, unchecked = new_capture("marker", self_check="off")
    bucket2 = unchecked.begin(ROWS)
    graph2 = torch_capture(fwd2, bucket2)
    early = finish(bucket2, graph2, fwd2)
    bad, bad_release = war_trial(fwd2, fence2, early.release, lambda s: graph2.replay())
    print(
        f"[engine api cuda] torch graph, marker before a late read: demoted to "
        f"{outcome.policy.label} ({outcome.report.detail}); {corrupted}/{TRIALS} corrupted "
        f"({release:.0f} us); control (self-check off, {early.policy.label}): "
        f"{bad}/{TRIALS} corrupted ({bad_release:.0f} us)"
    )
    assert outcome.policy is P.POST_REPLAY and "reads swa_map" in outcome.report.detail
    assert corrupted == 0
    assert early.policy is P.IN_GRAPH and bad > 0


def test_torch_graph_derived_after_the_late_read_never_corrupts():
    fwd = Forward(late=True)
    _, fence, capture = new_capture("derived")
    bucket = capture.begin(ROWS)
    graph = torch_capture(fwd, bucket)
    outcome = finish(bucket, graph, fwd)
    corrupted, release = war_trial(fwd, fence, outcome.release, lambda s: graph.replay())
    print(
        f"[engine api cuda] torch graph, derived: {outcome.policy.label}, "
        f"{outcome.report.detail}; {corrupted}/{TRIALS} corrupted, released {release:.0f} us "
        "after launch"
    )
    assert outcome.policy is P.IN_GRAPH and outcome.event is bucket.event
    assert corrupted == 0


def test_the_registry_cell_for_triton_decode_on_cuda():
    rt = open_runtime("cuda")
    cell = resolve_cell(PolicyEngine.load(), "triton", "decode", "none", platform=rt.platform)
    print(
        f"[engine api cuda] resolve_cell(triton, decode, none) on cuda: planted "
        f"{cell.policies.planted.label}, unplanted {cell.policies.unplanted.label}, placement "
        f"{cell.placement.value}"
    )
    assert cell.policies.planted is P.IN_GRAPH and cell.policies.unplanted is P.POST_REPLAY


# -- a raw cudaGraph_t -------------------------------------------------------------------------


def test_raw_handle_of_a_torch_graph_derived_then_torch_instantiates():
    fwd = Forward(late=True)
    _, fence, capture = new_capture("derived")
    bucket = capture.begin(ROWS)
    graph = torch_capture(fwd, bucket)
    outcome = finish(bucket, RawGraph(graph.raw_cuda_graph()), fwd)  # not instantiated here
    graph.instantiate()  # the engine's job, after the plant
    corrupted, release = war_trial(fwd, fence, outcome.release, lambda s: graph.replay())
    print(
        f"[engine api cuda] raw cudaGraph_t of a torch graph, derived: {outcome.policy.label}; "
        f"{corrupted}/{TRIALS} corrupted, released {release:.0f} us after launch"
    )
    assert outcome.policy is P.IN_GRAPH and corrupted == 0


def _check(result: tuple) -> Any:
    """cuda-bindings' runtime API answers (cudaError_t, *values)."""
    from cuda.bindings import runtime as cudart

    err, *values = result
    assert err == cudart.cudaError_t.cudaSuccess, f"CUDA runtime call failed: {err}"
    return values[0] if len(values) == 1 else tuple(values)


@pytest.mark.parametrize("placement", ["derived", "engine marker"])
def test_a_graph_captured_and_launched_through_cuda_bindings_alone(placement):
    """The engine holds only a ``cudaGraph_t``: stream capture, instantiation and launch are
    cuda-bindings calls; warpolicy sees the handle (`RawGraph`)."""
    from cuda.bindings import runtime as cudart

    fwd = Forward(late=placement == "derived")
    _, fence, capture = new_capture("derived" if placement == "derived" else "marker")
    bucket = capture.begin(ROWS)
    own = None
    if placement == "engine marker":
        own = torch.cuda.Event(external=True)
        own.record()  # created and seeded eagerly
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fwd.body()  # warm-up, eager, on the capture stream
    torch.cuda.synchronize()
    handle = cudart.cudaStream_t(stream.cuda_stream)
    mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    with torch.cuda.stream(stream):
        _check(cudart.cudaStreamBeginCapture(handle, mode))
        try:
            fwd.body(own.record if own is not None else None)
        finally:
            raw = _check(cudart.cudaStreamEndCapture(handle))
    outcome = finish(bucket, RawGraph(raw), fwd, marker=own)
    graph_exec = _check(cudart.cudaGraphInstantiate(raw, 0))

    def launch(s: Any) -> None:
        _check(cudart.cudaGraphLaunch(graph_exec, cudart.cudaStream_t(s.cuda_stream)))

    try:
        corrupted, release = war_trial(fwd, fence, outcome.release, launch)
    finally:
        torch.cuda.synchronize()
        _check(cudart.cudaGraphExecDestroy(graph_exec))
        _check(cudart.cudaGraphDestroy(raw))
    print(
        f"[engine api cuda] cuda-bindings graph, {placement}: {outcome.policy.label} "
        f"({outcome.report.detail}); {corrupted}/{TRIALS} corrupted, released {release:.0f} us "
        "after launch"
    )
    assert outcome.policy is P.IN_GRAPH and corrupted == 0
    if own is not None:
        assert outcome.event is own and outcome.report.ok
