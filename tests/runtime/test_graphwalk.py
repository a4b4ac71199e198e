"""Graph walk on CPU: hand-made graphs for the analysis, a fake cuda-bindings driver for the
adapter, and the runner entry points' failure paths (no GPU, no cuda-bindings needed)."""

from __future__ import annotations

import ctypes
import enum
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.runtime.graphwalk import cuda as gcuda
from warpolicy.runtime.graphwalk.analysis import (
    Outcome,
    ancestors,
    derive_plan,
    find_event_record,
    find_readers,
    joining_successors,
    late_readers,
    reader_frontier,
    topological_order,
)
from warpolicy.runtime.graphwalk.errors import (
    BindingsMissingError,
    CudaCallError,
    GraphWalkError,
    PlacementError,
)
from warpolicy.runtime.graphwalk.model import (
    BufferRange,
    Graph,
    Node,
    NodeKind,
    buffer_ranges,
    chain,
    tensor_range,
)
from warpolicy.runtime.graphwalk.plant import (
    check_marker,
    check_walked,
    derive_and_plant,
    event_handle,
    ranges_of,
)

TABLE = BufferRange("req_to_token", 0x1000, 0x2000)
MAP = BufferRange("swa_map", 0x8000, 0x8100)
RANGES = (TABLE, MAP)
EVENT = 0xE0E0


def kernel(i, deps=(), words=(), name=None):
    return Node(i, NodeKind.KERNEL, name or f"k{i}", deps=deps, words=words)


def plain(i, deps=()):
    return kernel(i, deps, words=(0x99, 0x10_0000))  # scalars and a private pointer


def marker(i, deps=()):
    return Node(i, NodeKind.EVENT_RECORD, deps=deps, event=EVENT)


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


class TestModel:
    def test_graph_rejects_bad_dependencies(self):
        with pytest.raises(ValueError, match="depends on 5"):
            Graph((kernel(0), kernel(1, deps=(5,))))
        with pytest.raises(ValueError, match="depends on 1"):
            Graph((kernel(0), kernel(1, deps=(1,))))
        with pytest.raises(ValueError, match="index 3"):
            Graph((kernel(3),))

    def test_buffer_range_validates(self):
        with pytest.raises(ValueError, match="before start"):
            BufferRange("x", 10, 5)
        with pytest.raises(ValueError):
            BufferRange("", 0, 5)

    def test_opaque_kinds(self):
        assert Node(0, "host").opaque and Node(0, "child_graph").opaque
        assert Node(0, "conditional").opaque and Node(0, "unknown").opaque
        assert Node(0, "kernel", readable=False).opaque
        assert not Node(0, "kernel").opaque and not Node(0, "event_record").opaque
        assert not Node(0, "memset").opaque and not Node(0, "event_wait").opaque

    def test_tensor_range_covers_strided_views(self):
        import torch

        t = torch.zeros(4, 6, dtype=torch.int32)
        r = tensor_range("t", t)
        assert r.end - r.start == 24 * 4
        col = t[:, 1]  # strided: from element 1 to element 19
        rc = tensor_range("c", col)
        assert rc.start == r.start + 4 and rc.end == r.start + 19 * 4 + 4
        assert buffer_ranges({"e": t[:0], "t": t}) == (r,)


# ---------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------


class TestReaders:
    def test_pointer_at_the_edges_of_a_buffer(self):
        first, last, past, before = TABLE.start, TABLE.end - 1, TABLE.end, TABLE.start - 1
        g = Graph(
            (
                kernel(0, words=(first,)),
                kernel(1, deps=(0,), words=(last,)),
                kernel(2, deps=(1,), words=(past,)),
                kernel(3, deps=(2,), words=(before,)),
            )
        )
        assert [r.index for r in find_readers(g, RANGES)] == [0, 1]

    def test_memset_and_memcpy_spans(self):
        g = Graph(
            (
                Node(0, "memset", spans=((TABLE.end, TABLE.end + 64),)),  # just after
                Node(1, "memset", deps=(0,), spans=((0x0F00, TABLE.start),)),  # just before
                Node(2, "memset", deps=(1,), spans=((0x0F00, TABLE.start + 1),)),
                Node(3, "memcpy", deps=(2,), spans=((0x50, 0x60), (MAP.end - 1, MAP.end))),
            )
        )
        readers = find_readers(g, RANGES)
        assert [(r.index, r.buffers) for r in readers] == [
            (2, ("req_to_token",)),
            (3, ("swa_map",)),
        ]

    def test_overlapping_buffers_both_named(self):
        whole = BufferRange("kv_pool", 0x1000, 0x3000)
        view = BufferRange("kv_view", 0x1800, 0x2000)
        g = Graph((kernel(0, words=(0x1900,)), kernel(1, deps=(0,), words=(0x1200,))))
        readers = find_readers(g, (whole, view))
        assert readers[0].buffers == ("kv_pool", "kv_view")
        assert readers[1].buffers == ("kv_pool",)

    def test_opaque_nodes_count_inert_nodes_do_not(self):
        g = chain(
            [
                "kernel",
                "host",
                "child_graph",
                "conditional",
                "unknown",
                "event_record",
                "empty",
                "event_wait",
                "mem_alloc",
                "mem_free",
                "semaphore",
            ]
        )
        readers = find_readers(g, RANGES)
        assert [r.index for r in readers] == [1, 2, 3, 4]
        assert all(r.opaque and not r.buffers for r in readers)
        assert "unseen" in readers[0].describe()

    def test_no_shared_buffers_no_readers(self):
        g = Graph((kernel(0, words=(TABLE.start,)),))
        assert find_readers(g, ()) == ()


# ---------------------------------------------------------------------------------------------
# Ordering and derived placement
# ---------------------------------------------------------------------------------------------


def diamond(reader_at):
    """0 -> {1, 2} -> 3; nodes in ``reader_at`` read the table."""

    def node(i, deps):
        return kernel(i, deps, words=(TABLE.start,)) if i in reader_at else plain(i, deps)

    return Graph((node(0, ()), node(1, (0,)), node(2, (0,)), node(3, (1, 2))))


class TestDerived:
    def test_chain_prep_reader(self):
        g = Graph((plain(0), kernel(1, (0,), (TABLE.start + 8,)), plain(2, (1,)), plain(3, (2,))))
        plan = derive_plan(g, RANGES)
        assert plan.outcome is Outcome.PLANNED and plan.frontier == (1,)
        assert [r.name for r in plan.seen] == ["k1"]

    def test_late_reader_moves_the_node(self):
        g = Graph(
            (
                kernel(0, (), (TABLE.start,)),
                plain(1, (0,)),
                plain(2, (1,)),
                kernel(3, (2,), (MAP.start,)),
                plain(4, (3,)),
            )
        )
        plan = derive_plan(g, RANGES)
        assert plan.frontier == (3,)  # 0 is an ancestor of 3
        assert {r.index for r in plan.readers} == {0, 3}

    def test_diamond_two_branches(self):
        assert derive_plan(diamond({1, 2}), RANGES).frontier == (1, 2)
        assert derive_plan(diamond({1, 3}), RANGES).frontier == (3,)
        assert derive_plan(diamond({0}), RANGES).frontier == (0,)

    def test_parallel_readers_all_depended_on(self):
        g = Graph(
            (
                plain(0),
                kernel(1, (0,), (TABLE.start,)),
                kernel(2, (0,), (MAP.start,)),
                kernel(3, (0,), (TABLE.start,)),
                plain(4, (1,)),
            )
        )
        assert derive_plan(g, RANGES).frontier == (1, 2, 3)

    def test_opaque_node_after_the_reader_moves_the_node(self):
        g = Graph((kernel(0, (), (TABLE.start,)), Node(1, "host", deps=(0,)), plain(2, (1,))))
        plan = derive_plan(g, RANGES)
        assert plan.frontier == (1,)

    def test_no_readers_is_its_own_outcome(self):
        g = chain(["kernel", "kernel", "event_record"])
        assert derive_plan(g, RANGES).outcome is Outcome.NO_READERS
        only_opaque = chain(["kernel", "host"])
        plan = derive_plan(only_opaque, RANGES)
        assert plan.outcome is Outcome.NO_READERS and plan.frontier == ()

    def test_ancestors_and_topology(self):
        g = diamond(set())
        assert ancestors(g, 3) == {0, 1, 2} and ancestors(g, 0) == frozenset()
        order = topological_order(g)
        assert order.index(0) < order.index(1) < order.index(3)

    def test_cycle_is_an_error(self):
        # the model cannot see a cycle cheaply; the ordering does
        g = Graph((kernel(0, (2,)), kernel(1, (0,)), kernel(2, (1,))))
        with pytest.raises(ValueError, match="cycle"):
            topological_order(g)


@st.composite
def dags(draw):
    n = draw(st.integers(1, 25))
    nodes = []
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        nodes.append(plain(i, tuple(sorted(deps))))
    readers = draw(st.sets(st.integers(0, n - 1), min_size=1))
    return Graph(tuple(nodes)), readers


@settings(max_examples=200, deadline=None)
@given(dags())
def test_frontier_covers_every_reader_and_is_minimal(case):
    graph, readers = case
    frontier = reader_frontier(graph, readers)
    assert set(frontier) <= readers
    covered = set(frontier).union(*(ancestors(graph, f) for f in frontier))
    assert readers <= covered  # a node after the frontier is after every reader
    for a in frontier:  # minimal: no frontier reader is an ancestor of another reader
        assert not any(a in ancestors(graph, r) for r in readers if r != a)


@settings(max_examples=200, deadline=None)
@given(dags())
def test_joining_successors_order_nothing_new_and_keep_the_graph_acyclic(case):
    graph, readers = case
    frontier = reader_frontier(graph, readers)
    successors = joining_successors(graph, frontier)
    # oracle: brute-force descendants through ancestors(), not the function's own walk
    common = {c for c in range(len(graph.nodes)) if all(f in ancestors(graph, c) for f in frontier)}
    first = {c for c in common if not any(d in common for d in graph.nodes[c].deps)}
    assert set(successors) == first
    # the new node after the frontier, joined to the successors: still a DAG, and every
    # successor already had the whole frontier among its ancestors (no new ordering)
    new = len(graph.nodes)
    joined = [
        plain(n.index, tuple(sorted(set(n.deps) | ({new} if n.index in first else set()))))
        for n in graph.nodes
    ]
    topological_order(Graph((*joined, plain(new, tuple(frontier)))))
    for c in successors:
        assert set(frontier) <= ancestors(graph, c)


def test_joining_successors_of_hand_made_graphs():
    assert joining_successors(chain(["kernel"] * 4), (1,)) == (2,)
    assert joining_successors(chain(["kernel"] * 4), (3,)) == ()  # a sink: nothing after it
    assert joining_successors(diamond(set()), (1, 2)) == (3,)
    assert joining_successors(diamond(set()), (0,)) == (1, 2)
    assert joining_successors(diamond(set()), ()) == ()


# ---------------------------------------------------------------------------------------------
# Self-check
# ---------------------------------------------------------------------------------------------


class TestSelfCheck:
    def graph(self, marker_after):
        """prep reader #0 -> work #1 -> late map reader #2 -> work #3, marker after a node."""
        nodes = [
            kernel(0, (), (TABLE.start,), "gather"),
            plain(1, (0,)),
            kernel(2, (1,), (MAP.start + 4,), "swa_index"),
            plain(3, (2,)),
        ]
        nodes.append(marker(4, (marker_after,)))
        return Graph(tuple(nodes))

    def test_marker_after_prep_misses_the_late_reader(self):
        check = check_walked(self.graph(0), RANGES, EVENT)
        assert not check.ok and [r.name for r in check.late] == ["swa_index"]
        line = check.describe(bucket=8)
        assert "bucket 8" in line and "swa_index" in line and "swa_map" in line
        assert "\n" not in line

    def test_marker_after_the_last_reader_is_safe(self):
        check = check_walked(self.graph(2), RANGES, EVENT)
        assert check.ok and check.readers == 2 and check.marker == 4
        assert late_readers(self.graph(3), RANGES, 4) == ()

    def test_unseen_node_after_the_marker_fails(self):
        g = Graph((kernel(0, (), (TABLE.start,)), marker(1, (0,)), Node(2, "host", deps=(1,))))
        check = check_walked(g, RANGES, EVENT)
        assert [r.index for r in check.late] == [2] and check.late[0].opaque

    def test_marker_not_found_or_ambiguous(self):
        g = Graph((kernel(0, (), (TABLE.start,)), marker(1, (0,))))
        with pytest.raises(PlacementError, match="not in the 2-node graph"):
            check_walked(g, RANGES, EVENT + 1)
        twice = Graph((kernel(0, (), (TABLE.start,)), marker(1, (0,)), marker(2, (0,))))
        with pytest.raises(PlacementError, match="recorded by 2 nodes"):
            find_event_record(twice, EVENT)
        assert find_event_record(g, EVENT) == 1


# ---------------------------------------------------------------------------------------------
# The cuda-bindings adapter, driven by a fake driver module
# ---------------------------------------------------------------------------------------------


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_INVALID_HANDLE = 400


class CUgraphNodeType(enum.IntEnum):
    CU_GRAPH_NODE_TYPE_KERNEL = 0
    CU_GRAPH_NODE_TYPE_MEMCPY = 1
    CU_GRAPH_NODE_TYPE_MEMSET = 2
    CU_GRAPH_NODE_TYPE_HOST = 3
    CU_GRAPH_NODE_TYPE_GRAPH = 4
    CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7
    CU_GRAPH_NODE_TYPE_BATCH_MEM_OP = 12


class Handle(int):
    """Stands in for CUgraph / CUgraphNode / CUfunction / CUevent (they convert to int)."""


class Edge:
    def __init__(self, kind=0, port=0):
        self.type = kind
        self.from_port = port


class FakeDriver(types.SimpleNamespace):
    """The slice of ``cuda.bindings.driver`` the adapter calls, over a described graph."""

    CUresult = CUresult
    CUgraphNodeType = CUgraphNodeType

    def __init__(self, nodes, edges, weak=()):
        super().__init__()
        self.nodes = nodes  # list of dicts: type, plus params
        self.edges = edges
        self.weak = set(weak)
        self.added = []
        self.drop_added = False  # simulate a driver that accepts the node but loses it
        self.joined = []  # edges added from a new node
        self._keep = []

    # handle constructors
    def CUgraph(self, raw):
        return Handle(raw)

    def CUevent(self, raw):
        return Handle(raw)

    def cuGetErrorString(self, err):
        return CUresult.CUDA_SUCCESS, b"invalid argument"

    def cuGraphGetNodes(self, graph, count=0):
        if not count:
            return CUresult.CUDA_SUCCESS, [], len(self.nodes)
        return CUresult.CUDA_SUCCESS, [Handle(100 + i) for i in range(count)], count

    def cuGraphGetEdges(self, graph, count=0):
        if not count:
            return CUresult.CUDA_SUCCESS, [], [], [], len(self.edges)
        data = [Edge(1) if k in self.weak else Edge() for k in range(len(self.edges))]
        return (
            CUresult.CUDA_SUCCESS,
            [Handle(100 + a) for a, _ in self.edges],
            [Handle(100 + b) for _, b in self.edges],
            data,
            len(self.edges),
        )

    def _node(self, handle):
        return self.nodes[int(handle) - 100]

    def cuGraphNodeGetType(self, handle):
        return CUresult.CUDA_SUCCESS, self._node(handle)["type"]

    def cuGraphKernelNodeGetParams(self, handle):
        node = self._node(handle)
        args = [ctypes.create_string_buffer(bytes(a), len(a)) for a in node["args"]]
        array = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
        self._keep += [args, array]
        params = types.SimpleNamespace(
            func=Handle(node["func"]), kern=Handle(0), kernelParams=ctypes.addressof(array), extra=0
        )
        return CUresult.CUDA_SUCCESS, params

    def cuFuncGetName(self, func):
        return CUresult.CUDA_SUCCESS, b"_ZN2at6native21indexSelectSmallIndexEv"

    def cuFuncGetParamInfo(self, func, k):
        node = next(n for n in self.nodes if n.get("func") == int(func))
        if node.get("no_info"):
            return (CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if k >= len(node["args"]):
            return CUresult.CUDA_ERROR_INVALID_VALUE, 0, 0
        return CUresult.CUDA_SUCCESS, 8 * k, len(node["args"][k])

    def cuGraphMemsetNodeGetParams(self, handle):
        dst, width = self._node(handle)["span"]
        return CUresult.CUDA_SUCCESS, types.SimpleNamespace(
            dst=dst, width=width, elementSize=1, height=1, pitch=0
        )

    def cuGraphEventRecordNodeGetEvent(self, handle):
        return CUresult.CUDA_SUCCESS, Handle(self._node(handle)["event"])

    def cuGraphAddEventRecordNode(self, graph, deps, count, event):
        if count != len(deps) or not all(isinstance(d, Handle) for d in deps):
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        self.added.append(([int(d) - 100 for d in deps], int(event)))
        if not self.drop_added:
            self.nodes.append(
                {"type": CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD, "event": int(event)}
            )
            self.edges += [(int(d) - 100, len(self.nodes) - 1) for d in deps]
        return CUresult.CUDA_SUCCESS, Handle(100 + len(self.nodes) - 1)

    def cuGraphAddDependencies(self, graph, sources, targets, data, count):
        if count != len(sources) or len(sources) != len(targets) or data is not None:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        self.joined += [(int(a) - 100, int(b) - 100) for a, b in zip(sources, targets)]
        self.edges += self.joined[-count:]
        return (CUresult.CUDA_SUCCESS,)


def arg(value, size=8):
    return value.to_bytes(size, "little")


def fake_forward(marker_after=None):
    """prep gathers the table (#0), layer (#1), late map read (#2, by-value struct), layer (#3),
    a host node (#4) that only a weak edge orders after #3, optionally a marker."""
    struct_arg = arg(4) + arg(MAP.start + 16) + arg(7)  # pointer inside a by-value struct
    nodes = [
        {
            "type": CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL,
            "func": 11,
            "args": [arg(TABLE.start), arg(3, 4)],
        },
        {"type": CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL, "func": 12, "args": [arg(0x77)]},
        {"type": CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL, "func": 13, "args": [struct_arg]},
        {"type": CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET, "span": (0x9000, 64)},
    ]
    edges = [(0, 1), (1, 2), (2, 3)]
    if marker_after is not None:
        nodes.append({"type": CUgraphNodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD, "event": EVENT})
        edges.append((marker_after, len(nodes) - 1))
    return nodes, edges


@pytest.fixture
def fake_driver(monkeypatch):
    def install(nodes, edges, weak=()):
        driver = FakeDriver(nodes, edges, weak)
        monkeypatch.setattr(gcuda, "driver_module", lambda: driver)
        return driver

    return install


class FakeTorchGraph:
    def __init__(self, raw=0xABC, instantiated=False):
        self.raw, self.instantiated = raw, instantiated

    def raw_cuda_graph(self):
        return self.raw

    def raw_cuda_graph_exec(self):
        if not self.instantiated:
            raise RuntimeError(
                "You cannot access the raw cudaGraphExec_t instance until "
                "instantiate() has been called"
            )
        return 0xEEE


class FakeEvent:
    def __init__(self, handle=EVENT):
        self.cuda_event = handle


class TestCudaAdapter:
    def test_reads_kinds_words_spans_and_names(self, fake_driver):
        fake_driver(*fake_forward(marker_after=0))
        walked = gcuda.read_graph(0xABC)
        g = walked.graph
        assert [n.kind for n in g.nodes] == [NodeKind.KERNEL] * 3 + [
            NodeKind.MEMSET,
            NodeKind.EVENT_RECORD,
        ]
        assert g.nodes[0].name == "indexSelectSmallIndex"
        assert TABLE.start in g.nodes[0].words and MAP.start + 16 in g.nodes[2].words
        assert g.nodes[3].spans == ((0x9000, 0x9040),) and g.nodes[4].event == EVENT
        assert g.nodes[2].deps == (1,) and g.nodes[4].deps == (0,)
        assert [r.index for r in find_readers(g, RANGES)] == [0, 2]

    def test_weak_edges_do_not_order(self, fake_driver):
        nodes, edges = fake_forward()
        nodes.append(
            {"type": CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL, "func": 15, "args": [arg(0)]}
        )
        edges.append((2, 4))
        fake_driver(nodes, edges, weak={3})
        walked = gcuda.read_graph(0xABC)
        assert walked.weak_edges == 1 and walked.graph.nodes[4].deps == ()

    def test_unreadable_kernel_is_opaque(self, fake_driver):
        nodes, edges = fake_forward()
        nodes[1]["no_info"] = True
        fake_driver(nodes, edges)
        node = gcuda.read_graph(0xABC).graph.nodes[1]
        assert not node.readable and node.opaque

    def test_unknown_node_type_is_opaque(self, fake_driver):
        nodes, edges = fake_forward()
        nodes[3] = {"type": CUgraphNodeType.CU_GRAPH_NODE_TYPE_BATCH_MEM_OP}
        fake_driver(nodes, edges)
        node = gcuda.read_graph(0xABC).graph.nodes[3]
        assert node.kind is NodeKind.UNKNOWN and node.name == "CU_GRAPH_NODE_TYPE_BATCH_MEM_OP"

    def test_call_checks_every_answer(self):
        driver = FakeDriver([], [])
        driver.cuBad = lambda: (CUresult.CUDA_ERROR_INVALID_VALUE,)
        driver.cuOdd = lambda: None
        with pytest.raises(
            CudaCallError,
            match=r"^cuBad failed: CUDA_ERROR_INVALID_VALUE "
            r"\(invalid argument\)$",
        ):
            gcuda.call(driver, "cuBad")
        with pytest.raises(CudaCallError, match="cuOdd failed: unexpected answer"):
            gcuda.call(driver, "cuOdd")
        with pytest.raises(BindingsMissingError, match="lacks driver.cuNothing"):
            gcuda.call(driver, "cuNothing")
        assert gcuda.call(driver, "cuGraphGetNodes", Handle(1)) == ([], 0)

    def test_short_kernel_names(self):
        assert (
            gcuda.short_kernel_name(
                "void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long>(int)"
            )
            == "indexSelectSmallIndex"
        )
        assert (
            gcuda.short_kernel_name("_ZN2at6native18elementwise_kernelEv") == "elementwise_kernel"
        )
        assert gcuda.short_kernel_name("") == "?"
        assert gcuda.words_of(arg(5) + arg(6) + b"\x01\x02") == (5, 6)


class TestPlant:
    def test_derived_plants_after_the_late_reader(self, fake_driver):
        driver = fake_driver(*fake_forward())
        result = derive_and_plant(FakeTorchGraph(), RANGES, FakeEvent())
        assert driver.added == [([2], EVENT)]  # #0 is an ancestor of #2
        assert [r.index for r in result.frontier] == [2] and result.nodes == 4
        assert driver.joined == [(4, 3)] and result.successors == (3,)  # not a leaf
        assert len(result.readers) == 2 and result.total_ms >= 0
        assert "#2" in result.describe()

    def test_no_readers_is_a_placement_error(self, fake_driver):
        driver = fake_driver(*fake_forward())
        with pytest.raises(PlacementError, match="no node of the 4-node graph") as info:
            derive_and_plant(
                FakeTorchGraph(), (BufferRange("elsewhere", 0x50_0000, 0x50_1000),), FakeEvent()
            )
        assert info.value.no_readers and driver.added == []

    def test_refusals_are_one_line(self, fake_driver):
        driver = fake_driver(*fake_forward(marker_after=0))
        cases = [
            (FakeTorchGraph(), FakeEvent(), "already records the read-done event"),
            (FakeTorchGraph(instantiated=True), FakeEvent(), "already instantiated"),
            (FakeTorchGraph(), FakeEvent(0), "no CUDA handle"),
            (FakeTorchGraph(raw=0), FakeEvent(), "raw graph is null"),
            (object(), FakeEvent(), "no raw_cuda_graph"),
        ]
        for graph, event, message in cases:
            with pytest.raises(PlacementError, match=message) as info:
                derive_and_plant(graph, RANGES, event)
            assert "\n" not in str(info.value)
        with pytest.raises(PlacementError, match="no non-empty shared buffers"):
            derive_and_plant(FakeTorchGraph(), {}, FakeEvent())
        assert driver.added == []

    def test_plant_is_verified(self, fake_driver):
        driver = fake_driver(*fake_forward())
        driver.drop_added = True
        with pytest.raises(PlacementError, match="4 nodes after adding one to 4"):
            derive_and_plant(FakeTorchGraph(), RANGES, FakeEvent())

    def test_planted_node_passes_the_self_check(self, fake_driver):
        fake_driver(*fake_forward())
        derive_and_plant(FakeTorchGraph(), RANGES, FakeEvent())
        check = check_marker(FakeTorchGraph(), RANGES, FakeEvent())
        assert check.ok and check.marker == 4 and check.readers == 2

    def test_a_join_that_fails_leaves_a_planted_leaf(self, fake_driver):
        driver = fake_driver(*fake_forward())
        driver.cuGraphAddDependencies = lambda *a: (CUresult.CUDA_ERROR_INVALID_VALUE,)
        result = derive_and_plant(FakeTorchGraph(), RANGES, FakeEvent())
        assert driver.added == [([2], EVENT)] and result.successors == ()
        assert "left a leaf of the graph (cuGraphAddDependencies failed" in result.describe()
        assert check_marker(FakeTorchGraph(), RANGES, FakeEvent()).ok

    def test_join_with_the_12x_signature(self, fake_driver):
        driver = fake_driver(*fake_forward())
        calls = []

        def old(graph, sources, targets, count):  # cuda-bindings 12: no edge data
            calls.append(count)
            return (CUresult.CUDA_SUCCESS,)

        driver.cuGraphAddDependencies = old
        assert derive_and_plant(FakeTorchGraph(), RANGES, FakeEvent()).successors == (3,)
        assert calls == [1]

    def test_api_error_becomes_placement_error(self, fake_driver):
        driver = fake_driver(*fake_forward())
        driver.cuGraphAddEventRecordNode = lambda *a: (CUresult.CUDA_ERROR_INVALID_VALUE, None)
        with pytest.raises(
            PlacementError, match="cuGraphAddEventRecordNode failed: CUDA_ERROR_INVALID_VALUE"
        ):
            derive_and_plant(FakeTorchGraph(), RANGES, FakeEvent())

    def test_check_marker_names_the_late_reader(self, fake_driver):
        fake_driver(*fake_forward(marker_after=0))
        check = check_marker(FakeTorchGraph(instantiated=True), RANGES, FakeEvent())
        assert [r.index for r in check.late] == [2] and check.late[0].buffers == ("swa_map",)
        fake_driver(*fake_forward(marker_after=2))
        assert check_marker(FakeTorchGraph(), RANGES, FakeEvent()).ok

    def test_check_marker_without_the_marker_fails(self, fake_driver):
        fake_driver(*fake_forward())
        with pytest.raises(PlacementError, match="marker's event-record node is not in"):
            check_marker(FakeTorchGraph(), RANGES, FakeEvent())

    def test_without_cuda_bindings(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "cuda", None)
        monkeypatch.setitem(sys.modules, "cuda.bindings", None)
        with pytest.raises(PlacementError, match="cuda-bindings is not installed"):
            derive_and_plant(FakeTorchGraph(), RANGES, FakeEvent())
        with pytest.raises(PlacementError, match="cuda-bindings is not installed"):
            check_marker(FakeTorchGraph(), RANGES, FakeEvent())

    def test_errors_are_warpolicy_errors(self):
        assert issubclass(PlacementError, GraphWalkError)
        from warpolicy.errors import WarpolicyError

        assert issubclass(GraphWalkError, WarpolicyError)

    def test_helpers(self):
        assert event_handle(FakeEvent(7)) == 7 and event_handle(object()) == 0
        assert event_handle(types.SimpleNamespace(event=FakeEvent(9))) == 9
        assert ranges_of(RANGES) == RANGES


class TestBench:
    def test_forward_graph_shape(self):
        from warpolicy.bench import graphwalk as bench

        graph = bench.forward_graph(1000)
        assert len(graph) == 1000
        plan = derive_plan(graph, bench.RANGES)
        assert [graph.nodes[i].name for i in plan.frontier] == ["swa_index"]
        check = check_walked(graph, bench.RANGES, bench.EVENT)
        assert [r.name for r in check.late] == ["swa_index"]

    def test_main_prints_figures(self, capsys):
        from warpolicy.bench import graphwalk as bench

        assert bench.main(["--nodes", "60", "--repeat", "1"]) == 0
        out = capsys.readouterr().out
        assert "60-node graph" in out and "budget" in out and "naive" in out
        assert bench.main(["--nodes", "2"]) == 2


def test_edges_fall_back_to_per_node_dependencies(fake_driver):
    nodes, edges = fake_forward(marker_after=0)
    driver = fake_driver(nodes, edges)
    driver.cuGraphGetEdges = lambda *a: (CUresult.CUDA_ERROR_INVALID_VALUE,)

    def deps_of(handle, count=0):
        parents = [Handle(100 + a) for a, b in edges if b == int(handle) - 100]
        if not count:
            return CUresult.CUDA_SUCCESS, [], [], len(parents)
        return CUresult.CUDA_SUCCESS, parents, [Edge() for _ in parents], len(parents)

    driver.cuGraphNodeGetDependencies = deps_of
    graph = gcuda.read_graph(0xABC).graph
    assert [n.deps for n in graph.nodes] == [(), (0,), (1,), (2,), (0,)]
    driver.cuGraphNodeGetDependencies = lambda *a: (CUresult.CUDA_ERROR_INVALID_VALUE,)
    with pytest.raises(CudaCallError, match="cuGraphNodeGetDependencies failed"):
        gcuda.read_graph(0xABC)
