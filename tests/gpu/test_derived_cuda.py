"""Derived placement and the marker self-check on a real GPU.

Runs ``scripts/derived-demo``'s experiment (derived 0 corrupted, marker after the prep caught
by the trial and by the self-check, coarse 0, safe marker passes the self-check), the refusals
on real torch graphs, and times the whole self-check and derived plant (walk included) on a
captured graph of about 1,000 nodes. Figures print as ``[derived cuda] ...`` lines.

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_derived_cuda.py``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import pathlib

import pytest
import torch
from gpu_support import NEEDS_BINDINGS, NEEDS_CUDA

pytestmark = [*NEEDS_CUDA, NEEDS_BINDINGS]

from warpolicy.runtime.graphwalk import PlacementError, check_marker, derive_and_plant  # noqa: E402

DEMO = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "derived-demo"
TARGET_NODES = 1000


def load_demo():
    loader = importlib.machinery.SourceFileLoader("derived_demo", str(DEMO))
    spec = importlib.util.spec_from_loader("derived_demo", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_demo_expectations_hold():
    demo_mod = load_demo()
    assert demo_mod.preflight() is None
    demo = demo_mod.Demo(replays=30, layers=24, late_after=3)
    demo.section("warm-up", demo.warm_up)
    demo.section("derived placement", demo.derived)
    demo.section("marker after the prep (and coarse)", demo.marker)
    demo.section("safe marker (after the late read)", demo.safe_marker)
    demo.summary()
    for name, (corrupted, release_us) in demo.results.items():
        print(
            f"[derived cuda] demo {name}: {corrupted}/30 corrupted, released "
            f"{release_us:.1f} us after launch"
        )
    assert not demo.failures, demo.failures
    assert set(demo.results) == {"derived", "marker", "coarse"}


class LongGraph:
    """prep gathers a shared table, then about 1,000 small kernels; optionally a marker."""

    def __init__(self, marker: bool) -> None:
        dev = torch.device("cuda")
        self.table = torch.randn(4096, 64, device=dev)
        self.index = torch.arange(0, 4096, 16, device=dev)
        self.shared = {"req_to_token": self.table}
        self.event = torch.cuda.Event(external=marker)
        self.event.record()
        self._body(None)  # eager warm-up
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(self.graph):
            self._body(self.event if marker else None)

    def _body(self, marker) -> None:
        h = self.table.index_select(0, self.index)
        if marker is not None:
            marker.record()
        for _ in range((TARGET_NODES - 2) // 2):
            h.mul_(1.0001)
            h.add_(0.5)
        self.out = h


def test_self_check_cost_on_a_1000_node_graph():
    g = LongGraph(marker=True)
    check = check_marker(g.graph, g.shared, g.event)
    again = check_marker(g.graph, g.shared, g.event)  # second walk: warm caches and driver
    print(
        f"[derived cuda] self-check of a {check.nodes}-node graph: first {check.total_ms:.1f} ms "
        f"(walk {check.walk_ms:.1f}, analysis {check.analysis_ms:.1f}); again "
        f"{again.total_ms:.1f} ms; target < 50 ms"
    )
    assert check.nodes >= TARGET_NODES - 10
    assert check.ok and check.readers >= 1
    g.graph.instantiate()
    g.graph.replay()
    torch.cuda.synchronize()


def test_derived_cost_on_a_1000_node_graph():
    g = LongGraph(marker=False)
    plant = derive_and_plant(g.graph, g.shared, g.event)
    print(
        f"[derived cuda] derived plant on a {plant.nodes}-node graph: {plant.total_ms:.1f} ms "
        f"(walk {plant.walk_ms:.1f}, analysis {plant.analysis_ms:.1f}, plant "
        f"{plant.plant_ms:.2f}); {plant.describe()}"
    )
    assert [r.name for r in plant.frontier] and all(not r.opaque for r in plant.frontier)
    g.graph.instantiate()
    g.graph.replay()
    torch.cuda.synchronize()
    # the added node is in the graph, and the self-check sees every reader before it
    check = check_marker(g.graph, g.shared, g.event)
    assert check.ok and check.nodes == plant.nodes + 1


def test_refusals_on_real_graphs():
    g = LongGraph(marker=False)
    fresh = torch.cuda.Event()  # never recorded: no handle yet
    with pytest.raises(PlacementError, match="no CUDA handle"):
        derive_and_plant(g.graph, g.shared, fresh)
    elsewhere = {"unrelated": torch.zeros(1024, device="cuda")}
    with pytest.raises(PlacementError, match="no node of the") as info:
        derive_and_plant(g.graph, elsewhere, g.event)
    assert info.value.no_readers
    g.graph.instantiate()
    with pytest.raises(PlacementError, match="already instantiated"):
        derive_and_plant(g.graph, g.shared, g.event)
    plain = torch.cuda.CUDAGraph()  # keep_graph=False: no raw graph after capture
    with torch.cuda.graph(plain):
        g._body(None)
    with pytest.raises(PlacementError, match="raw graph"):
        derive_and_plant(plain, g.shared, g.event)
