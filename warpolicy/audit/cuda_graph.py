"""The static audit's CUDA side: list a captured ``cudaGraph_t``'s nodes and edges.

torch ``CUDAGraph(keep_graph=True)`` and ``raw_cuda_graph()`` give the ``cudaGraph_t``; the CUDA
driver bindings (``cuda.bindings``, optional) list its nodes and edges, read kernel arguments
(sizes from ``cuFuncGetParamInfo``), memcpy/memset ranges and the event-record node's event.
Kernel arguments are raw bytes: every 8-byte word of every argument is matched against the
shared buffers' address ranges (`warpolicy.audit.graph`). That sees pointers passed directly or
inside by-value structs (torch's ``TensorInfo``, ``Array<char*>``), but not pointers stored in
device memory, indices read from another buffer, host-side work after replay or other streams:
the dynamic race audit covers those (`report.STATIC_BLIND_SPOTS`).

torch and ``cuda.bindings`` are imported inside the functions that need them: the CPU tests
replace ``cuda.bindings.driver`` with a stand-in, and importing the audit needs neither.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Mapping, Optional, Sequence

import attrs

from warpolicy.audit.graph import (
    INERT_NODE_TYPES,
    BufferRange,
    GraphNode,
    buffers_hit,
    buffers_overlapping,
    short_kernel_name,
    words,
)

#: Upper bound on kernel parameters read per node (a malformed answer never loops forever).
MAX_PARAMS = 1024
#: Upper bound on the bytes read from one kernel parameter.
MAX_PARAM_BYTES = 32768


class graph_for:  # noqa: N801 - used like a function: ``with graph_for(...) as (raw, node)``
    """Context manager yielding ``(raw cudaGraph_t, planted event handle)`` for a bucket.

    Prefers the runner's own graph (what really replays) when the platform kept it
    (``keep_graph=True``); otherwise captures the same body once more (in-graph prep, an
    external event record, forward) into a kept, never-instantiated graph.
    """

    def __init__(self, runner: Any, bucket: int) -> None:
        self.runner = runner
        self.bucket = bucket
        self._own: Any = None  # (graph, event) of our own capture, kept alive while walked

    def __enter__(self) -> tuple[int, Optional[int]]:
        captured = getattr(self.runner, "captured", {}).get(self.bucket)
        raw = _raw_graph(getattr(captured, "graph", None))
        if raw:  # the bucket's own planted event when it keeps one, else the fence's
            event = getattr(captured, "event", None) or getattr(self.runner.fence, "event", None)
            return raw, _event_handle(event)
        self._own = _capture_body(self.runner.model, self.bucket)
        graph, event = self._own
        return int(graph.raw_cuda_graph()), int(event.cuda_event)

    def __exit__(self, *exc: Any) -> None:
        if self._own is not None:
            import torch

            self._own = None  # frees the never-instantiated graph and its memory pool
            torch.cuda.synchronize()


def _raw_graph(graph: Any) -> int:
    """The ``cudaGraph_t`` of a kept torch graph, or 0."""
    getter = getattr(graph, "raw_cuda_graph", None)
    if getter is None:
        return 0
    try:
        return int(getter())
    except Exception:  # noqa: BLE001 - not kept (keep_graph=False) or already freed
        return 0


def _event_handle(event: Any) -> Optional[int]:
    """The ``cudaEvent_t`` behind a torch event (possibly wrapped), or None."""
    for obj in (event, getattr(event, "event", None), getattr(event, "raw", None)):
        handle = getattr(obj, "cuda_event", None)
        if handle:
            return int(handle)
    return None


def _capture_body(model: Any, bucket: int) -> tuple[Any, Any]:
    """Capture prep -> external event record -> forward into a kept graph (not instantiated)."""
    import torch

    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError as exc:
        raise RuntimeError(
            f"torch {torch.__version__} lacks CUDAGraph(keep_graph=True) "
            f"(needs torch >= 2.8): {exc}"
        ) from None
    event = torch.cuda.Event(external=True)
    event.record()  # create it eagerly: a lazily created event has no handle to match
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        model.graph_prep(bucket)
        event.record()  # capture stream current: this becomes the event-record node
        model.forward(bucket)
    return graph, event


def walk_cuda_graph(
    raw: int, event_handle: Optional[int], ranges: Sequence[BufferRange]
) -> tuple[list[GraphNode], list[tuple[int, int]]]:
    """List a ``cudaGraph_t``'s nodes (with the shared buffers each touches) and edges.

    The planted node is the event-record node whose event is ``event_handle``; failing that,
    the graph's only event-record node (a graph with several is reported without one).
    """
    from cuda.bindings import driver

    graph = driver.CUgraph(raw)
    count = _ok(driver.cuGraphGetNodes(graph))[-1]
    handles = list(_ok(driver.cuGraphGetNodes(graph, count))[0])[:count]
    index = {int(h): i for i, h in enumerate(handles)}
    nodes = [_node(driver, i, h, ranges) for i, h in enumerate(handles)]
    nodes = _mark_planted(driver, nodes, handles, event_handle)
    try:
        edges = _edges(driver, graph, index)
    except Exception:  # noqa: BLE001 - e.g. a lossy query: ask each node instead
        edges = _edges_by_node(driver, handles, index)
    return nodes, edges


def _edges(driver: Any, graph: Any, index: Mapping[int, int]) -> list[tuple[int, int]]:
    count = _ok(driver.cuGraphGetEdges(graph))[-1]
    if not count:
        return []
    got = _ok(driver.cuGraphGetEdges(graph, count))
    return [
        (index[int(a)], index[int(b)])
        for a, b in zip(got[0], got[1])
        if int(a) in index and int(b) in index
    ]


def _edges_by_node(
    driver: Any, handles: Sequence[Any], index: Mapping[int, int]
) -> list[tuple[int, int]]:
    edges = []
    for i, handle in enumerate(handles):
        count = _ok(driver.cuGraphNodeGetDependencies(handle))[-1]
        if count:
            deps = _ok(driver.cuGraphNodeGetDependencies(handle, count))[0]
            edges += [(index[int(d)], i) for d in deps if int(d) in index]
    return edges


def _ok(result: Any) -> tuple:
    """Unpack a cuda-bindings ``(CUresult, *values)`` answer; raise on an error code."""
    from cuda.bindings import driver

    result = result if isinstance(result, tuple) else (result,)
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{getattr(err, 'name', err)}")
    return result[1:]


def _node(driver: Any, i: int, handle: Any, ranges: Sequence[BufferRange]) -> GraphNode:
    types = driver.CUgraphNodeType
    kind = _ok(driver.cuGraphNodeGetType(handle))[0]
    if kind == types.CU_GRAPH_NODE_TYPE_KERNEL:
        return _kernel_node(driver, i, handle, ranges)
    if kind == types.CU_GRAPH_NODE_TYPE_MEMCPY:
        spans = _memcpy_spans(_ok(driver.cuGraphMemcpyNodeGetParams(handle))[0])
        hit = sorted({b for s, e in spans for b in buffers_overlapping(s, e, ranges)})
        return GraphNode(i, "memcpy", "memcpy", buffers=tuple(hit))
    if kind == types.CU_GRAPH_NODE_TYPE_MEMSET:
        start, end = _memset_range(_ok(driver.cuGraphMemsetNodeGetParams(handle))[0])
        return GraphNode(i, "memset", "memset", buffers=buffers_overlapping(start, end, ranges))
    if kind == types.CU_GRAPH_NODE_TYPE_EVENT_RECORD:
        return GraphNode(i, "event_record", "event_record")
    name = getattr(kind, "name", str(kind))
    # a child graph, conditional body, host callback or memory op may touch shared state in
    # ways this walk does not follow: opaque, like a kernel whose arguments cannot be read
    return GraphNode(i, "other", name, readable=name in INERT_NODE_TYPES)


def _kernel_node(driver: Any, i: int, handle: Any, ranges: Sequence[BufferRange]) -> GraphNode:
    params = _ok(driver.cuGraphKernelNodeGetParams(handle))[0]
    symbol = _kernel_symbol(driver, params)
    name = short_kernel_name(_demangle(symbol)) if symbol else "?"
    try:
        blobs = _kernel_arguments(driver, params)
    except Exception:  # noqa: BLE001 - unreadable arguments: reported, not fatal
        return GraphNode(i, "kernel", name, symbol, readable=False)
    addresses = [w for blob in blobs for w in words(blob)]
    return GraphNode(i, "kernel", name, symbol, buffers_hit(addresses, ranges))


def _kernel_symbol(driver: Any, params: Any) -> str:
    """The kernel's (mangled) name from its CUfunction, or its CUkernel."""
    attempts = (
        (getattr(driver, "cuFuncGetName", None), params.func),
        (getattr(driver, "cuKernelGetName", None), getattr(params, "kern", None)),
    )
    for getter, handle in attempts:
        if getter is None or handle is None or not int(handle):
            continue
        try:
            name = _ok(getter(handle))[0]
        except Exception:  # noqa: BLE001
            continue
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    return ""


def _kernel_arguments(driver: Any, params: Any) -> list[bytes]:
    """Each argument's bytes: ``kernelParams[i]`` points at argument ``i`` (size from the
    driver's parameter info). Raises when the sizes are unknown: reading blind could fault."""
    base = int(params.kernelParams)
    if not base:
        if int(getattr(params, "extra", 0) or 0):
            return [_extra_buffer(int(params.extra))]
        return []
    sizes = _param_sizes(driver, params)
    out = []
    for i, size in enumerate(sizes):
        arg = ctypes.c_void_p.from_address(base + i * ctypes.sizeof(ctypes.c_void_p)).value
        if arg and size:
            out.append(ctypes.string_at(arg, min(size, MAX_PARAM_BYTES)))
    return out


def _param_sizes(driver: Any, params: Any) -> list[int]:
    func, kern = params.func, getattr(params, "kern", None)
    if func is not None and int(func):
        getter, handle = getattr(driver, "cuFuncGetParamInfo", None), func
    else:
        getter, handle = getattr(driver, "cuKernelGetParamInfo", None), kern
    if getter is None or handle is None:
        raise RuntimeError("cuda-bindings lacks cuFuncGetParamInfo (needs CUDA >= 12.4)")
    sizes = []
    for i in range(MAX_PARAMS):
        result = getter(handle, i)
        if result[0] == driver.CUresult.CUDA_ERROR_INVALID_VALUE:
            break  # past the last parameter
        _offset, size = _ok(result)
        sizes.append(int(size))
    return sizes


# The three keys of a cuLaunchKernel ``extra`` array.
_LAUNCH_PARAM_END, _LAUNCH_PARAM_BUFFER_POINTER, _LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2


def _extra_buffer(extra: int) -> bytes:
    """The packed argument buffer of a kernel launched with ``extra`` (bounded walk)."""
    ptr_size = ctypes.sizeof(ctypes.c_void_p)
    buffer = size = 0
    for i in range(0, 16, 2):
        key = ctypes.c_void_p.from_address(extra + i * ptr_size).value or 0
        value = ctypes.c_void_p.from_address(extra + (i + 1) * ptr_size).value or 0
        if key == _LAUNCH_PARAM_END:
            break
        if key == _LAUNCH_PARAM_BUFFER_POINTER:
            buffer = value
        elif key == _LAUNCH_PARAM_BUFFER_SIZE and value:
            size = ctypes.c_size_t.from_address(value).value
    if not buffer or not size:
        raise RuntimeError("kernel launched with an unreadable 'extra' argument buffer")
    return ctypes.string_at(buffer, min(size, MAX_PARAM_BYTES))


def _memcpy_spans(p: Any) -> list[tuple[int, int]]:
    """The device bytes a memcpy node reads (src) and writes (dst). Both count: a write into
    shared state after the release races with the scheduler's writes too."""
    spans = []
    for side in ("src", "dst"):
        device = _device_pointer(p, side)
        if device:
            pitch = int(getattr(p, f"{side}Pitch") or 0)
            height = int(getattr(p, f"{side}Height") or 0)
            start = device + int(getattr(p, f"{side}XInBytes") or 0)
            length = (
                int(p.WidthInBytes)
                + max(int(p.Height) - 1, 0) * pitch
                + max(int(p.Depth) - 1, 0) * pitch * height
            )
            spans.append((start, start + max(length, 1)))
    return spans


def _device_pointer(p: Any, side: str) -> int:
    try:
        kind = getattr(p, f"{side}MemoryType")
    except ValueError:  # unset memory type
        return 0
    if int(kind) not in (2, 4):  # CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_UNIFIED
        return 0
    return int(getattr(p, f"{side}Device"))


def _memset_range(p: Any) -> tuple[int, int]:
    start = int(p.dst)
    row = int(p.width) * int(p.elementSize)
    length = row + max(int(p.height) - 1, 0) * max(int(p.pitch), row)
    return start, start + max(length, 1)


def _mark_planted(
    driver: Any, nodes: list[GraphNode], handles: Sequence[Any], event_handle: Optional[int]
) -> list[GraphNode]:
    records = [n.index for n in nodes if n.kind == "event_record"]
    chosen: Optional[int] = None
    if event_handle is not None:
        for i in records:
            event = _ok(driver.cuGraphEventRecordNodeGetEvent(handles[i]))[0]
            if int(event) == int(event_handle):
                chosen = i
                break
    if chosen is None and len(records) == 1:  # unknown handle: the only record is the plant
        chosen = records[0]
    if chosen is None:
        return nodes
    return [attrs.evolve(n, planted=True) if n.index == chosen else n for n in nodes]


_cxa_demangle: Any = None


def _demangle(symbol: str) -> str:
    """Demangle a C++ symbol with libstdc++'s ``__cxa_demangle``; the input on any failure."""
    global _cxa_demangle
    if not symbol.startswith("_Z"):
        return symbol
    try:
        if _cxa_demangle is None:
            lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            fn = getattr(lib, "__cxa_demangle")
            fn.restype = ctypes.c_void_p
            fn.argtypes = [
                ctypes.c_char_p,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_int),
            ]
            _cxa_demangle = fn
        status = ctypes.c_int(0)
        ptr = _cxa_demangle(symbol.encode(), None, None, ctypes.byref(status))
        if status.value != 0 or not ptr:
            return symbol
        text = ctypes.string_at(ptr).decode(errors="replace")
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))
        return text
    except Exception:  # noqa: BLE001 - a mangled name is still a name
        return symbol
