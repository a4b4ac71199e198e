"""The static graph audit: classification on hand-made graphs (`warpolicy.audit.graph`), the
CUDA walk against a stand-in for ``cuda.bindings.driver`` with real ctypes argument reading
(`warpolicy.audit.cuda_graph`), and the walk of every captured bucket
(`warpolicy.audit.static`)."""

from __future__ import annotations

import ctypes
import enum
import sys
import types

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.audit import Verdict
from warpolicy.audit.cuda_graph import walk_cuda_graph
from warpolicy.audit.graph import (
    BufferRange,
    GraphNode,
    analyze_graph,
    ancestors,
    buffer_ranges,
    buffers_hit,
    buffers_overlapping,
    short_kernel_name,
    tensor_range,
    words,
)
from warpolicy.audit.report import Offender, StaticResult
from warpolicy.audit.static import audit_static, audit_static_buckets, combine_buckets
from warpolicy.policy import IN_GRAPH, NONE, POST_REPLAY, PRE_REPLAY

SAFE, UNSAFE, INCONCLUSIVE = Verdict.SAFE, Verdict.UNSAFE, Verdict.INCONCLUSIVE
IN, PRE, POST = IN_GRAPH, PRE_REPLAY, POST_REPLAY

# ---------------------------------------------------------------------------------------------
# Static analysis on hand-made graphs
# ---------------------------------------------------------------------------------------------


def _chain(kinds_and_buffers, planted_at):
    """A linear graph (one capture stream): node i depends on node i - 1."""
    nodes = []
    for i, (kind, bufs) in enumerate(kinds_and_buffers):
        nodes.append(GraphNode(i, kind, f"k{i}", buffers=tuple(bufs), planted=(i == planted_at)))
    edges = [(i - 1, i) for i in range(1, len(nodes))]
    return nodes, edges


def test_in_graph_offenders_are_the_readers_after_the_plant():
    nodes, edges = _chain(
        [
            ("kernel", ["t"]),
            ("memcpy", ["t"]),
            ("event_record", []),
            ("kernel", []),
            ("kernel", ["m"]),
            ("memset", ["t"]),
        ],
        planted_at=2,
    )
    result = analyze_graph(nodes, edges, IN)
    assert result.verdict is UNSAFE
    assert [(o.node, o.kind, o.buffers) for o in result.offenders] == [
        (4, "kernel", ("m",)),
        (5, "memset", ("t",)),
    ]
    assert result.readers == 4 and result.nodes == 6


def test_pre_replay_every_reader_offends_post_replay_none():
    nodes, edges = _chain([("kernel", ["t"]), ("event_record", []), ("kernel", [])], 1)
    assert [o.node for o in analyze_graph(nodes, edges, PRE).offenders] == [0]
    assert analyze_graph(nodes, edges, POST).verdict is SAFE


def test_in_graph_clean_graph_is_safe():
    nodes, edges = _chain([("kernel", ["t"]), ("event_record", []), ("kernel", [])], 1)
    assert analyze_graph(nodes, edges, IN).verdict is SAFE


def test_branch_not_ordered_before_the_plant_offends():
    # 0 -> 1(plant); 0 -> 2 reads t on a parallel branch: not an ancestor of the plant
    nodes = [
        GraphNode(0, "kernel", "a"),
        GraphNode(1, "event_record", planted=True),
        GraphNode(2, "kernel", "side", buffers=("t",)),
    ]
    result = analyze_graph(nodes, [(0, 1), (0, 2)], IN)
    assert [o.name for o in result.offenders] == ["side"]


def test_missing_plant_unreadable_post_step_and_none_are_inconclusive():
    nodes, edges = _chain([("kernel", ["t"]), ("kernel", [])], planted_at=-1)
    assert "not in the graph" in analyze_graph(nodes, edges, IN).reason
    nodes, edges = _chain([("event_record", []), ("kernel", [])], 0)
    blind = [nodes[0], attrs.evolve(nodes[1], readable=False)]
    result = analyze_graph(blind, edges, IN)
    assert result.verdict is INCONCLUSIVE and result.unreadable == 1
    assert "could not read the arguments" in result.reason
    result = analyze_graph(nodes, edges, IN, post_step=True)
    assert result.verdict is INCONCLUSIVE and "eager work after replay" in result.reason
    assert analyze_graph(nodes, edges, NONE).verdict is INCONCLUSIVE


def test_unreadable_before_the_plant_does_not_matter():
    nodes, edges = _chain([("kernel", []), ("event_record", []), ("kernel", [])], 1)
    nodes[0] = attrs.evolve(nodes[0], readable=False)
    assert analyze_graph(nodes, edges, IN).verdict is SAFE


def test_ancestors_diamond():
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    assert ancestors(3, edges) == {0, 1, 2}
    assert ancestors(0, edges) == set()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["kernel", "memcpy", "memset", "other"]), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    st.integers(min_value=0, max_value=12),
)
def test_later_release_never_has_more_offenders(spec, plant):
    """On a chain, in_graph offenders are exactly the readers after the plant, and a later
    release point never offends more: pre_replay >= in_graph >= post_replay."""
    plant = min(plant, len(spec))
    items = [(k, ["t"] if r else []) for k, r in spec]
    items.insert(plant, ("event_record", []))
    nodes, edges = _chain(items, plant)
    offend = {
        p: {o.node for o in analyze_graph(nodes, edges, p).offenders} for p in (PRE, IN, POST)
    }
    readers_after = {n.index for n in nodes if n.index > plant and n.buffers and n.kind != "other"}
    assert offend[IN] == readers_after
    assert offend[PRE] >= offend[IN] >= offend[POST] == set()


# ---------------------------------------------------------------------------------------------
# Address matching and names
# ---------------------------------------------------------------------------------------------


def test_words_little_endian_aligned():
    blob = (0x1122334455667788).to_bytes(8, "little") + (5).to_bytes(8, "little") + b"\x01\x02"
    assert words(blob) == [0x1122334455667788, 5]


def test_buffers_hit_and_overlap():
    ranges = (BufferRange("a", 100, 200), BufferRange("b", 200, 260))
    assert buffers_hit([99, 150, 260], ranges) == ("a",)
    assert buffers_hit([199, 200], ranges) == ("a", "b")
    assert buffers_overlapping(190, 210, ranges) == ("a", "b")
    assert buffers_overlapping(260, 300, ranges) == ()


def test_tensor_range_contiguous_and_strided():
    t = torch.zeros(4, 6, dtype=torch.long)
    r = tensor_range("t", t)
    assert (r.start, r.end - r.start) == (t.data_ptr(), 4 * 6 * 8)
    col = t[:, 2]  # strided view: from element 2 to element 3*6+2
    rc = tensor_range("c", col)
    assert rc.start == t.data_ptr() + 2 * 8 and rc.end == t.data_ptr() + (3 * 6 + 2 + 1) * 8


@pytest.mark.parametrize(
    "symbol, short",
    [
        (
            "void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long, unsigned int, "
            "2, 2, -2>(at::cuda::detail::TensorInfo<float, unsigned int>, long)",
            "indexSelectSmallIndex",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>, "
            "std::array<char*, 1ul> >(int, at::native::FillFunctor<long>, std::array<char*, 1ul>)",
            "vectorized_elementwise_kernel",
        ),
        ("_ZN2at6native21indexSelectLargeIndexIflLi2EEEvv", "indexSelectLargeIndex"),
        ("my_triton_kernel", "my_triton_kernel"),
        ("", "?"),
    ],
)
def test_short_kernel_name(symbol, short):
    assert short_kernel_name(symbol) == short


# ---------------------------------------------------------------------------------------------
# The CUDA walk, against a stand-in for cuda.bindings.driver (real ctypes argument reading)
# ---------------------------------------------------------------------------------------------


class _Result(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_SUPPORTED = 801


class _NodeType(enum.IntEnum):
    CU_GRAPH_NODE_TYPE_KERNEL = 0
    CU_GRAPH_NODE_TYPE_MEMCPY = 1
    CU_GRAPH_NODE_TYPE_MEMSET = 2
    CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7
    CU_GRAPH_NODE_TYPE_EMPTY = 5
    CU_GRAPH_NODE_TYPE_GRAPH = 4


class StandInDriver(types.ModuleType):
    """Answers like cuda-bindings: ``(CUresult, *values)`` tuples, count-then-fill lists."""

    CUresult = _Result
    CUgraphNodeType = _NodeType

    def __init__(self, nodes, edges, kernels, events):
        super().__init__("cuda.bindings.driver")
        self.nodes = nodes  # handle -> (type, params)
        self.edge_list = edges
        self.kernels = kernels  # func handle -> (mangled name, [param sizes] or None)
        self.events = events  # node handle -> event handle

    @staticmethod
    def CUgraph(raw):
        return raw

    def cuGraphGetNodes(self, graph, count=0):
        handles = list(self.nodes)
        return _Result.CUDA_SUCCESS, handles[:count] if count else [], len(handles)

    def cuGraphGetEdges(self, graph, count=0):
        src = [a for a, _ in self.edge_list][:count] if count else []
        dst = [b for _, b in self.edge_list][:count] if count else []
        return _Result.CUDA_SUCCESS, src, dst, None, len(self.edge_list)

    def cuGraphNodeGetType(self, node):
        return _Result.CUDA_SUCCESS, self.nodes[node][0]

    def cuGraphKernelNodeGetParams(self, node):
        return _Result.CUDA_SUCCESS, self.nodes[node][1]

    def cuGraphMemcpyNodeGetParams(self, node):
        return _Result.CUDA_SUCCESS, self.nodes[node][1]

    def cuGraphMemsetNodeGetParams(self, node):
        return _Result.CUDA_SUCCESS, self.nodes[node][1]

    def cuGraphEventRecordNodeGetEvent(self, node):
        return _Result.CUDA_SUCCESS, self.events[node]

    def cuFuncGetName(self, func):
        return _Result.CUDA_SUCCESS, self.kernels[func][0].encode()

    def cuFuncGetParamInfo(self, func, index):
        sizes = self.kernels[func][1]
        if sizes is None:
            return _Result.CUDA_ERROR_NOT_SUPPORTED, 0, 0
        if index >= len(sizes):
            return _Result.CUDA_ERROR_INVALID_VALUE, 0, 0
        return _Result.CUDA_SUCCESS, 8 * index, sizes[index]


def _kernel(func, *args):
    """Kernel node params whose kernelParams point at real host buffers (kept alive)."""
    buffers = [ctypes.create_string_buffer(bytes(a), len(a)) for a in args]
    array = (ctypes.c_void_p * max(1, len(buffers)))(*[ctypes.addressof(b) for b in buffers])
    params = types.SimpleNamespace(
        func=func, kern=None, kernelParams=ctypes.addressof(array), extra=0, _keep=(buffers, array)
    )
    return params


def _u64(*values):
    return b"".join(int(v).to_bytes(8, "little") for v in values)


@pytest.fixture
def stand_in(monkeypatch):
    """Install a stand-in driver and a graph: prep -> plant -> late readers (see below)."""
    table = torch.arange(16, dtype=torch.long)  # shared "table"
    other = torch.zeros(8, dtype=torch.long)  # shared "other"
    private = torch.zeros(8)
    t0, o0, p0 = table.data_ptr(), other.data_ptr(), private.data_ptr()
    kernels = {
        11: ("_ZN2at6native21indexSelectSmallIndexEv", [8, 4]),
        12: ("_ZN3foo11late_gatherEv", [24, 4]),
        13: ("_ZN3foo7privateEv", [8]),
        14: ("_ZN3foo6opaqueEv", None),
    }
    nodes = {
        101: (_NodeType.CU_GRAPH_NODE_TYPE_KERNEL, _kernel(11, _u64(t0), b"\0" * 4)),
        102: (_NodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD, None),
        # a struct by value whose second word points inside "table"
        103: (_NodeType.CU_GRAPH_NODE_TYPE_KERNEL, _kernel(12, _u64(7, t0 + 40, 3), b"\0" * 4)),
        104: (
            _NodeType.CU_GRAPH_NODE_TYPE_MEMSET,
            types.SimpleNamespace(dst=o0 + 8, pitch=0, elementSize=1, width=8, height=1),
        ),
        105: (
            _NodeType.CU_GRAPH_NODE_TYPE_MEMCPY,
            types.SimpleNamespace(
                srcMemoryType=2,
                srcDevice=p0,
                srcXInBytes=0,
                srcPitch=0,
                srcHeight=0,
                dstMemoryType=2,
                dstDevice=p0 + 16,
                dstXInBytes=0,
                dstPitch=0,
                dstHeight=0,
                WidthInBytes=8,
                Height=1,
                Depth=1,
            ),
        ),
        106: (_NodeType.CU_GRAPH_NODE_TYPE_KERNEL, _kernel(13, _u64(p0))),
        107: (_NodeType.CU_GRAPH_NODE_TYPE_KERNEL, _kernel(14, _u64(t0))),
    }
    handles = list(nodes)
    edges = list(zip(handles, handles[1:]))
    driver = StandInDriver(nodes, edges, kernels, {102: 777})
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    return {"table": table, "other": other}, driver


class _KeptGraph:
    def raw_cuda_graph(self):
        return 4242


def _cuda_runner(event_handle=777):
    return types.SimpleNamespace(
        platform=types.SimpleNamespace(name="cuda"),
        captured={4: types.SimpleNamespace(graph=_KeptGraph())},
        fence=types.SimpleNamespace(event=types.SimpleNamespace(cuda_event=event_handle)),
    )


def test_walk_reads_arguments_ranges_names_and_the_planted_node(stand_in):
    shared, _ = stand_in

    nodes, edges = walk_cuda_graph(4242, 777, buffer_ranges(shared))
    assert [n.kind for n in nodes] == [
        "kernel",
        "event_record",
        "kernel",
        "memset",
        "memcpy",
        "kernel",
        "kernel",
    ]
    assert [n.buffers for n in nodes] == [("table",), (), ("table",), ("other",), (), (), ()]
    assert nodes[0].name == "indexSelectSmallIndex" and nodes[2].name == "late_gather"
    assert [n.planted for n in nodes] == [False, True] + [False] * 5
    assert nodes[6].readable is False  # no parameter info: not read blind
    assert edges == [(i, i + 1) for i in range(6)]


def test_audit_static_end_to_end_on_the_stand_in(stand_in):
    shared, _ = stand_in
    result = audit_static(_cuda_runner(), 4, shared, IN)
    assert result.verdict is UNSAFE
    assert [(o.name, o.buffers) for o in result.offenders] == [
        ("late_gather", ("table",)),
        ("memset", ("other",)),
    ]
    assert result.unreadable == 1 and result.readers == 3 and result.nodes == 7
    pre = audit_static(_cuda_runner(), 4, shared, PRE)
    assert [o.name for o in pre.offenders][0] == "indexSelectSmallIndex"
    post = audit_static(_cuda_runner(), 4, shared, POST)
    assert post.verdict is SAFE


def test_audit_static_unknown_event_handle_falls_back_to_the_only_record(stand_in):
    shared, _ = stand_in
    assert audit_static(_cuda_runner(event_handle=1), 4, shared, IN).verdict is UNSAFE


def test_audit_static_driver_error_is_inconclusive(stand_in):
    shared, driver = stand_in
    driver.cuGraphGetNodes = lambda graph, count=0: (_Result.CUDA_ERROR_INVALID_VALUE, [], 0)
    result = audit_static(_cuda_runner(), 4, shared, IN)
    assert result.verdict is INCONCLUSIVE
    assert result.reason == "static audit unavailable: RuntimeError: CUDA_ERROR_INVALID_VALUE"


def test_audit_static_without_bindings_says_how_to_get_them(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails
    result = audit_static(_cuda_runner(), 4, {}, IN)
    assert result.verdict is INCONCLUSIVE
    assert "cuda-bindings is not installed" in result.reason


def test_opaque_nodes_after_the_release_are_inconclusive_not_safe():
    """A child graph (or conditional, host node, ...) may read shared state the walk does not
    follow: after the release point it blocks SAFE; before it, it does not matter."""
    nodes, edges = _chain([("kernel", ["t"]), ("event_record", []), ("other", [])], 1)
    nodes[2] = attrs.evolve(nodes[2], name="CU_GRAPH_NODE_TYPE_GRAPH", readable=False)
    result = analyze_graph(nodes, edges, IN)
    assert result.verdict is INCONCLUSIVE and "CU_GRAPH_NODE_TYPE_GRAPH" in result.reason
    assert analyze_graph(nodes, edges, POST).verdict is SAFE


def test_walk_marks_child_graph_nodes_opaque_and_empty_nodes_inert(stand_in):
    shared, driver = stand_in

    driver.nodes[108] = (_NodeType.CU_GRAPH_NODE_TYPE_EMPTY, None)
    driver.nodes[109] = (_NodeType.CU_GRAPH_NODE_TYPE_GRAPH, None)
    driver.edge_list += [(107, 108), (108, 109)]
    nodes, _ = walk_cuda_graph(4242, 777, buffer_ranges(shared))
    assert [(n.kind, n.readable) for n in nodes[7:]] == [("other", True), ("other", False)]


def test_audit_static_never_raises():
    class Broken:
        @property
        def platform(self):
            raise RuntimeError("no platform")

    result = audit_static(Broken(), 4, {}, IN)
    assert result.verdict is INCONCLUSIVE and "no platform" in result.reason


# ---------------------------------------------------------------------------------------------
# Every captured bucket
# ---------------------------------------------------------------------------------------------


class TestEveryBucket:
    def test_walks_each_bucket_with_the_policy_it_publishes(self, stand_in):
        shared, _ = stand_in
        runner = _cuda_runner()
        runner.captured = {
            2: types.SimpleNamespace(graph=_KeptGraph(), policy=NONE),
            4: types.SimpleNamespace(graph=_KeptGraph(), policy=IN),
        }
        result = audit_static_buckets(runner, shared)
        assert result.verdict is UNSAFE and result.buckets == (2, 4)
        assert {o.bucket for o in result.offenders} == {4}
        assert "bucket 4 node 2" in result.offenders[0].describe()

    def test_a_late_reader_in_any_bucket_is_unsafe(self):
        late = Offender(3, "kernel", "late", ("t",))
        result = combine_buckets(
            {2: StaticResult(SAFE, nodes=5), 8: StaticResult(UNSAFE, (late,), nodes=7)}
        )
        assert result.verdict is UNSAFE and result.nodes == 12
        assert [o.bucket for o in result.offenders] == [8]

    def test_inconclusive_buckets_are_named(self):
        result = combine_buckets(
            {2: StaticResult(SAFE), 4: StaticResult(INCONCLUSIVE, reason="opaque")}
        )
        assert result.verdict is INCONCLUSIVE and result.reason == "bucket(s) 4: opaque"
        same = combine_buckets(
            {2: StaticResult(INCONCLUSIVE, reason="x"), 4: StaticResult(INCONCLUSIVE, reason="x")}
        )
        assert same.reason == "x"
        assert combine_buckets({2: StaticResult(SAFE), 4: StaticResult(SAFE)}).verdict is SAFE

    def test_no_captured_graph_is_unavailable(self):
        runner = types.SimpleNamespace(captured={}, platform=types.SimpleNamespace(name="cuda"))
        result = audit_static_buckets(runner, {})
        assert result.verdict is INCONCLUSIVE and "captured no graph" in result.reason
