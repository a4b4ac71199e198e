"""The static graph audit: verdicts on hand-made `warpolicy.runtime.graphwalk` graphs
(`warpolicy.audit.graph`), the graph walk it reads through (`warpolicy.runtime.graphwalk.cuda`) against a
stand-in for ``cuda.bindings.driver`` with real ctypes argument reading, and the walk of every
captured bucket (`warpolicy.audit.static`)."""

from __future__ import annotations

import ctypes
import enum
import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.audit import Verdict
from warpolicy.audit.graph import analyze_graph, planted_node
from warpolicy.audit.report import Offender, StaticResult
from warpolicy.audit.static import audit_static, audit_static_buckets, combine_buckets
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, PRE_REPLAY
from warpolicy.runtime.graphwalk.analysis import buffers_touched
from warpolicy.runtime.graphwalk.cuda import read_graph, short_kernel_name, words_of
from warpolicy.runtime.graphwalk.model import (
    BufferRange,
    Graph,
    Node,
    NodeKind,
    buffer_ranges,
    tensor_range,
)
from warpolicy.runtime.graphwalk.plant import check_walked

SAFE, UNSAFE, INCONCLUSIVE = Verdict.SAFE, Verdict.UNSAFE, Verdict.INCONCLUSIVE
IN, PRE, POST = IN_GRAPH, PRE_REPLAY, POST_REPLAY

# ---------------------------------------------------------------------------------------------
# Verdicts on hand-made graphs
# ---------------------------------------------------------------------------------------------

EVENT = 777  # the planted read-done event
RANGES = (BufferRange("t", 0x10000, 0x10100), BufferRange("m", 0x20000, 0x20100))
ADDRESS = {"t": 0x10008, "m": 0x20010}  # an address inside each shared buffer
KINDS = {
    "kernel": NodeKind.KERNEL,
    "memcpy": NodeKind.MEMCPY,
    "memset": NodeKind.MEMSET,
    "event_record": NodeKind.EVENT_RECORD,
    "other": NodeKind.HOST,  # opaque: the walk cannot see what it touches
}


def _node(i, kind, bufs=(), deps=(), *, planted=False, **kw):
    """A model node touching ``bufs``: argument words for a kernel, byte spans for a copy."""
    kind = KINDS[kind]
    addresses = [ADDRESS[b] for b in bufs]
    if kind is NodeKind.KERNEL:
        return Node(i, kind, kw.pop("name", f"k{i}"), deps, words=addresses, **kw)
    if kind in (NodeKind.MEMCPY, NodeKind.MEMSET):
        return Node(i, kind, deps=deps, spans=[(a, a + 8) for a in addresses], **kw)
    return Node(i, kind, deps=deps, event=EVENT if planted else None, **kw)


def _chain(kinds_and_buffers, planted_at):
    """A linear graph (one capture stream): node i depends on node i - 1."""
    return Graph(
        _node(i, kind, bufs, (i - 1,) if i else (), planted=(i == planted_at))
        for i, (kind, bufs) in enumerate(kinds_and_buffers)
    )


def _analyze(graph, policy, **kw):
    return analyze_graph(graph, RANGES, policy, event=EVENT, **kw)


def test_in_graph_offenders_are_the_readers_after_the_plant():
    graph = _chain(
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
    result = _analyze(graph, IN)
    assert result.verdict is UNSAFE
    assert [(o.node, o.kind, o.name, o.buffers) for o in result.offenders] == [
        (4, "kernel", "k4", ("m",)),
        (5, "memset", "memset", ("t",)),
    ]
    assert result.readers == 4 and result.nodes == 6
    assert result.offenders[0].describe() == "k4 (node 4, kernel) touches m"


def test_pre_replay_every_reader_offends_post_replay_none():
    graph = _chain([("kernel", ["t"]), ("event_record", []), ("kernel", [])], 1)
    assert [o.node for o in _analyze(graph, PRE).offenders] == [0]
    assert _analyze(graph, POST).verdict is SAFE


def test_in_graph_clean_graph_is_safe():
    graph = _chain([("kernel", ["t"]), ("event_record", []), ("kernel", [])], 1)
    assert _analyze(graph, IN).verdict is SAFE


def test_branch_not_ordered_before_the_plant_offends():
    # 0 -> 1(plant); 0 -> 2 reads t on a parallel branch: not an ancestor of the plant
    graph = Graph(
        [
            _node(0, "kernel", name="a"),
            _node(1, "event_record", deps=(0,), planted=True),
            _node(2, "kernel", ["t"], deps=(0,), name="side"),
        ]
    )
    result = _analyze(graph, IN)
    assert [o.name for o in result.offenders] == ["side"]


def test_diamond_readers_before_the_plant_are_covered():
    # 0 -> {1 reads t, 2 reads m} -> 3 (plant) -> 4: both branches are ancestors of the plant
    def graph(late_reader):
        return Graph(
            [
                _node(0, "kernel"),
                _node(1, "kernel", ["t"], deps=(0,)),
                _node(2, "memcpy", ["m"], deps=(0,)),
                _node(3, "event_record", deps=(1, 2), planted=True),
                _node(4, "kernel", ["t"] if late_reader else [], deps=(3,)),
            ]
        )

    assert _analyze(graph(False), IN).verdict is SAFE
    assert _analyze(graph(False), IN).readers == 2
    assert [o.node for o in _analyze(graph(True), IN).offenders] == [4]


def test_missing_plant_unreadable_post_step_and_none_are_inconclusive():
    graph = _chain([("kernel", ["t"]), ("kernel", [])], planted_at=-1)
    assert "not in the graph" in _analyze(graph, IN).reason
    blind = Graph(
        [_node(0, "event_record", planted=True), _node(1, "kernel", deps=(0,), readable=False)]
    )
    result = _analyze(blind, IN)
    assert result.verdict is INCONCLUSIVE and result.unreadable == 1
    assert result.reason == (
        "could not read the arguments of 1 node(s) after the release point (k1)"
    )
    graph = _chain([("event_record", []), ("kernel", [])], 0)
    result = _analyze(graph, IN, post_step=True)
    assert result.verdict is INCONCLUSIVE and "eager work after replay" in result.reason
    assert _analyze(graph, NONE).verdict is INCONCLUSIVE


def test_unreadable_before_the_plant_does_not_matter():
    graph = Graph(
        [
            _node(0, "kernel", readable=False),
            _node(1, "event_record", deps=(0,), planted=True),
            _node(2, "kernel", deps=(1,)),
        ]
    )
    assert _analyze(graph, IN).verdict is SAFE


def test_the_planted_node_is_the_event_or_else_the_only_record():
    graph = _chain([("kernel", ["t"]), ("event_record", []), ("kernel", ["t"])], planted_at=-1)
    assert planted_node(graph, EVENT) == 1  # no node records EVENT: the only record
    assert [o.node for o in _analyze(graph, IN).offenders] == [2]
    two = _chain([("event_record", []), ("kernel", ["t"]), ("event_record", [])], planted_at=2)
    assert planted_node(two, EVENT) == 2
    assert planted_node(two, None) is None  # several records, none known: no release point
    assert "not in the graph" in analyze_graph(two, RANGES, IN).reason


def test_an_event_recorded_twice_is_inconclusive():
    graph = Graph(
        [
            _node(0, "event_record", planted=True),
            _node(1, "kernel", ["t"], deps=(0,)),
            _node(2, "event_record", deps=(1,), planted=True),
        ]
    )
    result = _analyze(graph, IN)
    assert result.verdict is INCONCLUSIVE and "ambiguous" in result.reason
    assert result.readers == 1


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
    items = [(k, ["t"] if r and k != "other" else []) for k, r in spec]
    items.insert(plant, ("event_record", []))
    graph = _chain(items, plant)
    offend = {p: {o.node for o in _analyze(graph, p).offenders} for p in (PRE, IN, POST)}
    readers_after = {i for i, (k, b) in enumerate(items) if i > plant and b}
    assert offend[IN] == readers_after
    assert offend[PRE] >= offend[IN] >= offend[POST] == set()
    opaque_after = any(k == "other" for k, _ in items[plant + 1 :])
    if not readers_after:  # no offender: an opaque node after the plant still blocks SAFE
        assert (_analyze(graph, IN).verdict is SAFE) is not opaque_after


def test_opaque_nodes_after_the_release_are_inconclusive_not_safe():
    """A child graph (or conditional, host node, ...) may read shared state the walk does not
    follow: after the release point it blocks SAFE; before it, it does not matter."""
    graph = Graph(
        [
            _node(0, "kernel", ["t"]),
            _node(1, "event_record", deps=(0,), planted=True),
            Node(2, NodeKind.CHILD_GRAPH, deps=(1,)),
        ]
    )
    result = _analyze(graph, IN)
    assert result.verdict is INCONCLUSIVE and result.reason == (
        "could not read the arguments of 1 node(s) after the release point "
        "(CU_GRAPH_NODE_TYPE_GRAPH)"
    )
    assert _analyze(graph, POST).verdict is SAFE


# ---------------------------------------------------------------------------------------------
# Address matching and names (the graph walk's, as the audit uses them)
# ---------------------------------------------------------------------------------------------


def test_words_little_endian_aligned():
    blob = (0x1122334455667788).to_bytes(8, "little") + (5).to_bytes(8, "little") + b"\x01\x02"
    assert list(words_of(blob)) == [0x1122334455667788, 5]


def test_buffers_hit_and_overlap():
    ranges = (BufferRange("a", 100, 200), BufferRange("b", 200, 260))

    def kernel(*words):
        return buffers_touched(Node(0, NodeKind.KERNEL, words=words), ranges)

    def memset(start, end):
        return buffers_touched(Node(0, NodeKind.MEMSET, spans=[(start, end)]), ranges)

    assert kernel(99, 150, 260) == ("a",)
    assert kernel(199, 200) == ("a", "b")
    assert memset(190, 210) == ("a", "b")
    assert memset(260, 300) == ()


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
    ranges = buffer_ranges(shared)
    graph = read_graph(4242).graph
    assert [n.kind.value for n in graph.nodes] == [
        "kernel",
        "event_record",
        "kernel",
        "memset",
        "memcpy",
        "kernel",
        "kernel",
    ]
    assert [buffers_touched(n, ranges) for n in graph.nodes] == [
        ("table",),
        (),
        ("table",),
        ("other",),
        (),
        (),
        (),
    ]
    assert graph.nodes[0].name == "indexSelectSmallIndex" and graph.nodes[2].name == "late_gather"
    assert planted_node(graph, 777) == 1 and graph.nodes[1].event == 777
    assert graph.nodes[6].readable is False and graph.nodes[6].opaque  # no parameter info
    assert [n.deps for n in graph.nodes] == [()] + [(i,) for i in range(6)]


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
    assert result.reason == (
        "static audit unavailable: CudaCallError: cuGraphGetNodes failed: CUDA_ERROR_INVALID_VALUE"
    )


def test_audit_static_without_bindings_says_how_to_get_them(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails
    result = audit_static(_cuda_runner(), 4, {}, IN)
    assert result.verdict is INCONCLUSIVE
    assert "cuda-bindings is not installed" in result.reason


def test_audit_static_agrees_with_the_marker_self_check(stand_in):
    """The audit reads and orders the graph exactly as the runner's marker self-check does:
    its offenders plus its unreadable nodes are the self-check's late readers."""
    shared, _ = stand_in
    result = audit_static(_cuda_runner(), 4, shared, IN)
    check = check_walked(read_graph(4242).graph, buffer_ranges(shared), 777)
    assert {o.node for o in result.offenders} == {r.index for r in check.late if not r.opaque}
    assert result.unreadable == sum(r.opaque for r in check.late) == 1


def test_audit_static_names_a_late_opaque_node(stand_in):
    shared, driver = stand_in
    driver.nodes[103] = (_NodeType.CU_GRAPH_NODE_TYPE_EMPTY, None)  # no late readers left...
    driver.nodes[104] = (_NodeType.CU_GRAPH_NODE_TYPE_EMPTY, None)
    result = audit_static(_cuda_runner(), 4, shared, IN)  # ...but the opaque kernel 107
    assert result.verdict is INCONCLUSIVE and result.reason == (
        "could not read the arguments of 1 node(s) after the release point (opaque)"
    )


def test_walk_marks_child_graph_nodes_opaque_and_empty_nodes_inert(stand_in):
    shared, driver = stand_in

    driver.nodes[108] = (_NodeType.CU_GRAPH_NODE_TYPE_EMPTY, None)
    driver.nodes[109] = (_NodeType.CU_GRAPH_NODE_TYPE_GRAPH, None)
    driver.edge_list += [(107, 108), (108, 109)]
    nodes = read_graph(4242).graph.nodes
    assert [(n.kind, n.opaque) for n in nodes[7:]] == [
        (NodeKind.EMPTY, False),
        (NodeKind.CHILD_GRAPH, True),
    ]
    result = audit_static(_cuda_runner(), 4, shared, POST)
    assert result.verdict is SAFE and result.nodes == 9


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


# -- staged speculative steps: the release's walk and the staged consumer's --------------------


def test_a_staged_consumers_reader_is_an_offender_named_by_its_phase():
    from warpolicy.audit.report import INCONCLUSIVE, SAFE, UNSAFE, Offender, StaticResult
    from warpolicy.audit.static import combine_parts

    clean = StaticResult(SAFE, nodes=3, buckets=(8,))
    late = StaticResult(UNSAFE, (Offender(2, "kernel", "gather", ("full_to_swa",)),), nodes=4)
    blind = StaticResult(INCONCLUSIVE, reason="no walk")
    merged = combine_parts(clean, late, "draft_extend")
    assert merged.verdict is UNSAFE and merged.nodes == 7 and merged.buckets == (8,)
    assert [o.name for o in merged.offenders] == ["draft_extend: gather"]
    unclear = combine_parts(clean, blind, "draft_extend")
    assert unclear.verdict is INCONCLUSIVE and unclear.reason == "draft_extend: no walk"
    assert combine_parts(clean, clean, "draft_extend").verdict is SAFE
    assert combine_parts(late, clean, "draft_extend").verdict is UNSAFE


def test_a_staged_step_walks_verify_and_the_consumer():
    from warpolicy.audit.dynamic import audit_mode
    from warpolicy.audit.synthetic_staged import staged_subject
    from warpolicy.registry.vocabulary import ForwardMode
    from warpolicy.testing import sim_platform

    entry = audit_mode(staged_subject(sim_platform()), ForwardMode.DRAFT_EXTEND, 2)
    # the simulated platform has no graphs to walk: both parts say so, the consumer's named
    assert "draft_extend: " in entry.static.reason
