"""The CUDA side of a restore (`warpolicy.runtime.graphwalk.restore`) on a fake driver module.

The fake keeps several graphs (a clone is a deep copy), executables that remember the event
each record node fires, and every launch; the real calls' behaviour on driver 580 / CUDA 13 is
checked on the GPU by ``scripts/restore-probe``.
"""

from __future__ import annotations

import copy
import enum
import types

import pytest

from warpolicy.runtime.graphwalk import PlacementError
from warpolicy.runtime.graphwalk import cuda as gcuda
from warpolicy.runtime.graphwalk.restore import (
    RestoredGraph,
    clone_restored,
    rebind_planted,
    save_planted,
)


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1


class CUgraphNodeType(enum.IntEnum):
    CU_GRAPH_NODE_TYPE_KERNEL = 0
    CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7


class Handle(int):
    pass


KERNEL, RECORD = (
    CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL,
    CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD,
)
OK = CUresult.CUDA_SUCCESS


class Driver(types.SimpleNamespace):
    """Graphs by handle: {"nodes": [dict(type, func | event)], "edges": [(a, b)]}."""

    CUresult = CUresult
    CUgraphNodeType = CUgraphNodeType

    def __init__(self) -> None:
        super().__init__()
        self.graphs: dict[int, dict] = {}
        self.execs: dict[int, list] = {}  # exec -> per node, the event it records
        self.launches: list[tuple[int, int]] = []
        self.destroyed: list[tuple[str, int]] = []
        self.fail: set[str] = set()
        self._next = 1

    def new(self, nodes, edges) -> int:
        handle = 0x1000 * self._next
        self._next += 1
        self.graphs[handle] = {"nodes": nodes, "edges": edges}
        return handle

    # handles
    CUgraph = CUevent = CUgraphExec = CUstream = staticmethod(Handle)

    def cuGetErrorString(self, err):
        return OK, b"invalid value"

    def _graph_of(self, node):
        return int(node) & ~0xFFF, int(node) & 0xFFF

    def cuGraphGetNodes(self, graph, count=0):
        nodes = self.graphs[int(graph)]["nodes"]
        if not count:
            return OK, [], len(nodes)
        return OK, [Handle(int(graph) + i) for i in range(count)], count

    def cuGraphGetEdges(self, graph, count=0):
        edges = self.graphs[int(graph)]["edges"]
        if not count:
            return OK, [], [], [], len(edges)
        g = int(graph)
        return (
            OK,
            [Handle(g + a) for a, _ in edges],
            [Handle(g + b) for _, b in edges],
            [None] * len(edges),
            len(edges),
        )

    def _node(self, node):
        graph, index = self._graph_of(node)
        return self.graphs[graph]["nodes"][index]

    def cuGraphNodeGetType(self, node):
        return OK, self._node(node)["type"]

    def cuGraphKernelNodeGetParams(self, node):
        params = types.SimpleNamespace(
            func=Handle(self._node(node)["func"]), kern=Handle(0), kernelParams=0, extra=0
        )
        return OK, params

    def cuFuncGetName(self, func):
        return OK, f"kernel_{int(func)}".encode()

    def cuFuncGetParamInfo(self, func, k):
        return CUresult.CUDA_ERROR_INVALID_VALUE, 0, 0

    def cuGraphEventRecordNodeGetEvent(self, node):
        return OK, Handle(self._node(node)["event"])

    # restoring
    def cuGraphClone(self, graph):
        if "clone" in self.fail:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        return OK, Handle(self.new(*copy.deepcopy(list(self.graphs[int(graph)].values()))))

    def cuGraphEventRecordNodeSetEvent(self, node, event):
        self._node(node)["event"] = int(event)
        return (OK,)

    def cuEventCreate(self, flags):
        self._next += 1
        return OK, Handle(0xE000 + self._next)

    def cuGraphInstantiate(self, graph, flags):
        exec_ = 0x900000 + int(graph)
        self.execs[exec_] = [n.get("event") for n in self.graphs[int(graph)]["nodes"]]
        return OK, Handle(exec_)

    def cuGraphExecEventRecordNodeSetEvent(self, exec_, node, event):
        graph, index = self._graph_of(node)
        if int(exec_) != 0x900000 + graph:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        self.execs[int(exec_)][index] = int(event)
        return (OK,)

    def cuGraphLaunch(self, exec_, stream):
        self.launches.append((int(exec_), int(stream)))
        return (OK,)

    def cuGraphExecDestroy(self, exec_):
        self.destroyed.append(("exec", int(exec_)))
        return (OK,)

    def cuGraphDestroy(self, graph):
        self.destroyed.append(("graph", int(graph)))
        return (OK,)


def decode(event: int = 0xE1):
    """prep (kernel 1) -> marker -> gemm (kernel 2) -> gemm."""
    nodes = [
        {"type": KERNEL, "func": 1},
        {"type": RECORD, "event": event},
        {"type": KERNEL, "func": 2},
        {"type": KERNEL, "func": 2},
    ]
    return nodes, [(0, 1), (1, 2), (2, 3)]


class TorchGraph:
    def __init__(self, raw: int) -> None:
        self.raw = raw

    def raw_cuda_graph(self) -> int:
        return self.raw


class Event:
    def __init__(self, handle: int) -> None:
        self.cuda_event = handle


@pytest.fixture
def driver(monkeypatch):
    d = Driver()
    monkeypatch.setattr(gcuda, "driver_module", lambda: d)
    return d


def test_clone_with_private_events_then_rebind_before_and_after_instantiation(driver):
    original = TorchGraph(driver.new(*decode()))
    saved = save_planted(original, {"read_done": Event(0xE1)})
    restored = clone_restored(original, lambda: 0x5, private_events=True)
    clone = driver.graphs[restored.raw_cuda_graph()]
    assert restored.source is original
    assert clone["nodes"][1]["event"] not in (0xE1, None)  # a private event, as after a load

    first = rebind_planted(restored, saved, {"read_done": Event(0xF1)})
    assert [(f.label, f.index) for f in first.found] == [("read_done", 1)]
    assert not first.executable and clone["nodes"][1]["event"] == 0xF1

    restored.replay()  # instantiates at the first replay, as torch does
    exec_ = restored.raw_cuda_graph_exec()
    assert driver.launches == [(exec_, 0x5)] and driver.execs[exec_][1] == 0xF1

    second = rebind_planted(restored, saved, {"read_done": Event(0xF2)})
    assert second.executable and second.rebind_us >= 0
    assert driver.execs[exec_][1] == 0xF2 and clone["nodes"][1]["event"] == 0xF2
    assert driver.graphs[original.raw]["nodes"][1]["event"] == 0xE1  # the original untouched
    assert "executable" in second.describe()


def test_a_moved_node_is_a_placement_error_and_nothing_is_rebound(driver):
    original = TorchGraph(driver.new(*decode()))
    saved = save_planted(original, {"read_done": Event(0xE1)})
    restored = clone_restored(original, lambda: 0)
    clone = driver.graphs[restored.raw_cuda_graph()]
    clone["edges"] = [(1, 0), (0, 2), (2, 3)]  # the record node now before the prep
    with pytest.raises(PlacementError, match="not the saved one|moved or vanished"):
        rebind_planted(restored, saved, {"read_done": Event(0xF1)})
    assert clone["nodes"][1]["event"] == 0xE1


def test_events_must_be_given_and_have_handles(driver):
    original = TorchGraph(driver.new(*decode()))
    saved = save_planted(original, {"read_done": Event(0xE1)})
    with pytest.raises(PlacementError, match="no new event given"):
        rebind_planted(original, saved, {})
    with pytest.raises(PlacementError, match="no CUDA handle yet"):
        rebind_planted(original, saved, {"read_done": Event(0)})
    with pytest.raises(PlacementError, match="no CUDA handle"):
        save_planted(original, {"read_done": Event(0)})


def test_driver_failures_are_one_line_placement_errors(driver):
    original = TorchGraph(driver.new(*decode()))
    driver.fail.add("clone")
    with pytest.raises(PlacementError) as info:
        clone_restored(original, lambda: 0)
    assert "cuGraphClone failed: CUDA_ERROR_INVALID_VALUE" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_restored_graph_destroys_what_it_owns(driver):
    original = TorchGraph(driver.new(*decode()))
    restored = clone_restored(original, lambda: 0)
    raw = restored.raw_cuda_graph()
    restored.instantiate()
    exec_ = restored.raw_cuda_graph_exec()
    del restored
    assert ("exec", exec_) in driver.destroyed and ("graph", raw) in driver.destroyed


def test_a_restored_graph_refuses_a_null_handle():
    with pytest.raises(PlacementError):
        RestoredGraph(0, lambda: 0)
