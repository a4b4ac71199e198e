"""cuda-bindings adapter: read a raw ``cudaGraph_t`` into a `Graph`, add an event-record node.

Uses the driver API of cuda-bindings 13.x (``from cuda.bindings import driver``): every call
answers ``(CUresult, *values)``; `call` checks the code and turns a failure into a one-line
`CudaCallError` (a missing function or module into `BindingsMissingError`). cuda-bindings is
optional, so it is imported inside functions, only when a graph is really walked.

What a node touches:

* kernel: each argument's bytes (``kernelParams[i]`` points at argument ``i``; its size from
  ``cuFuncGetParamInfo`` / ``cuKernelGetParamInfo``), cut into aligned 8-byte words. Pointers
  passed directly or inside by-value structs are seen; pointers stored in device memory are not.
  A kernel whose argument sizes cannot be learned is marked unreadable (opaque), never read blind.
* memcpy / memset: the device byte ranges from their parameters (both sides of a copy count).

Edges: only plain full dependencies order nodes here. A programmatic (early-launch) edge does
not promise that the parent finished, so it is dropped from ``deps`` (more readers, never fewer,
look unordered) and counted in `RawGraph.weak_edges`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import struct
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import attrs

from warpolicy.runtime.graphwalk.errors import BindingsMissingError, CudaCallError
from warpolicy.runtime.graphwalk.model import Graph, Node, NodeKind

#: Upper bound on kernel parameters read per node (a malformed answer never loops forever).
MAX_PARAMS = 1024
#: Upper bound on the bytes read from one kernel parameter.
MAX_PARAM_BYTES = 32768

#: Driver node type names -> model kinds (anything else is UNKNOWN, hence opaque).
NODE_KINDS = {
    "CU_GRAPH_NODE_TYPE_KERNEL": NodeKind.KERNEL,
    "CU_GRAPH_NODE_TYPE_MEMCPY": NodeKind.MEMCPY,
    "CU_GRAPH_NODE_TYPE_MEMSET": NodeKind.MEMSET,
    "CU_GRAPH_NODE_TYPE_HOST": NodeKind.HOST,
    "CU_GRAPH_NODE_TYPE_GRAPH": NodeKind.CHILD_GRAPH,
    "CU_GRAPH_NODE_TYPE_EMPTY": NodeKind.EMPTY,
    "CU_GRAPH_NODE_TYPE_WAIT_EVENT": NodeKind.EVENT_WAIT,
    "CU_GRAPH_NODE_TYPE_EVENT_RECORD": NodeKind.EVENT_RECORD,
    "CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL": NodeKind.SEMAPHORE,
    "CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT": NodeKind.SEMAPHORE,
    "CU_GRAPH_NODE_TYPE_MEM_ALLOC": NodeKind.MEM_ALLOC,
    "CU_GRAPH_NODE_TYPE_MEM_FREE": NodeKind.MEM_FREE,
    "CU_GRAPH_NODE_TYPE_CONDITIONAL": NodeKind.CONDITIONAL,
    # CU_GRAPH_NODE_TYPE_BATCH_MEM_OP writes and waits on memory words: UNKNOWN (opaque)
}


def driver_module() -> ModuleType:
    """``cuda.bindings.driver``, imported here because cuda-bindings is optional."""
    try:
        from cuda.bindings import driver  # noqa: PLC0415 - cuda-bindings is optional
    except ImportError as exc:
        raise BindingsMissingError(
            f"cuda-bindings is not installed ({exc}); pip install 'cuda-bindings>=12.4'"
        ) from None
    return driver


def call(driver: ModuleType, name: str, *args: Any) -> tuple[Any, ...]:
    """Call ``driver.<name>(*args)``; return the values after the result code.

    Raises `BindingsMissingError` when the function does not exist and `CudaCallError` when
    the code is not ``CUDA_SUCCESS`` or the answer is not a ``(CUresult, ...)`` tuple.
    """
    fn = entry_point(driver, name)
    try:
        result = fn(*args)
    except (TypeError, ValueError, OverflowError) as exc:  # wrong argument types
        raise CudaCallError(name, type(exc).__name__, _one_line(str(exc))) from None
    return checked(driver, name, result)


def entry_point(driver: ModuleType, name: str) -> Callable[..., Any]:
    """``driver.<name>``; `BindingsMissingError` when this cuda-bindings lacks it."""
    fn = getattr(driver, name, None)
    if fn is None:
        raise BindingsMissingError(f"cuda-bindings lacks driver.{name} (needs 12.4 or newer)")
    return fn


def checked(driver: ModuleType, name: str, result: Any) -> tuple[Any, ...]:
    """The values after the result code of ``driver.<name>``'s answer ``result``; raises
    `CudaCallError` when the code is not ``CUDA_SUCCESS`` or the answer is not a tuple."""
    if not isinstance(result, tuple) or not result:
        raise CudaCallError(name, "unexpected answer", f"{type(result).__name__}, not a tuple")
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise CudaCallError(name, getattr(err, "name", str(err)), _error_string(driver, err))
    return result[1:]


def _error_string(driver: ModuleType, err: Any) -> str:
    try:
        code, text = driver.cuGetErrorString(err)
    except Exception:  # noqa: BLE001 - the description is a nicety
        return ""
    if code != driver.CUresult.CUDA_SUCCESS or not text:
        return ""
    return _one_line(text.decode(errors="replace") if isinstance(text, bytes) else str(text))


def _one_line(text: str) -> str:
    return " ".join(text.split())


@attrs.frozen(eq=False)
class RawGraph:
    """A walked ``cudaGraph_t``: the model plus the driver handles needed to change it."""

    graph: Graph
    cu_graph: Any  # driver.CUgraph
    handles: tuple[Any, ...]  # driver.CUgraphNode per model index
    weak_edges: int = 0  # programmatic edges left out of ``deps``


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def read_graph(raw: int) -> RawGraph:
    """Walk the ``cudaGraph_t`` whose integer handle is ``raw`` into a `RawGraph`."""
    if not raw:
        raise CudaCallError("raw_cuda_graph", "null graph", "keep_graph=True is needed")
    driver = driver_module()
    cu_graph = driver.CUgraph(int(raw))
    count = int(call(driver, "cuGraphGetNodes", cu_graph)[-1])
    handles: list[Any] = []
    if count:
        got = call(driver, "cuGraphGetNodes", cu_graph, count)
        handles = list(got[0])[:count]
        if len(handles) != count:
            raise CudaCallError(
                "cuGraphGetNodes", "short answer", f"{len(handles)} of {count} nodes"
            )
    index = {int(h): i for i, h in enumerate(handles)}
    deps, weak = _dependencies(driver, cu_graph, handles, index)
    reader = _NodeReader(driver)
    nodes = tuple(reader.node(i, h, deps[i]) for i, h in enumerate(handles))
    return RawGraph(Graph(nodes), cu_graph, tuple(handles), weak)


def _dependencies(
    driver: ModuleType, cu_graph: Any, handles: Sequence[Any], index: dict[int, int]
) -> tuple[list[tuple[int, ...]], int]:
    """Each node's full dependencies (indices) and the number of weak edges dropped.

    Asks for every edge at once; when that query fails (e.g. a lossy query refused by the
    driver), asks each node for its dependencies instead. If both fail, the walk fails.
    """
    if not handles:
        return [], 0
    try:
        edges = _edges_of_graph(driver, cu_graph)
    except CudaCallError:
        edges = _edges_by_node(driver, handles)
    deps: list[list[int]] = [[] for _ in handles]
    weak = 0
    for src, dst, data in edges:
        a, b = index.get(int(src)), index.get(int(dst))
        if a is None or b is None:
            raise CudaCallError("cuGraphGetEdges", "an edge names a node not in the graph")
        if _is_weak(data):
            weak += 1
            continue
        deps[b].append(a)
    return [tuple(sorted(set(d))) for d in deps], weak


def _edges_of_graph(driver: ModuleType, cu_graph: Any) -> list[tuple[Any, Any, Any]]:
    count = int(call(driver, "cuGraphGetEdges", cu_graph)[-1])
    if not count:
        return []
    got = call(driver, "cuGraphGetEdges", cu_graph, count)
    sources, targets = list(got[0])[:count], list(got[1])[:count]
    if len(sources) != count or len(targets) != count:
        raise CudaCallError("cuGraphGetEdges", "short answer", f"{len(sources)} of {count}")
    return list(zip(sources, targets, _edge_data(got, count)))


def _edges_by_node(driver: ModuleType, handles: Sequence[Any]) -> list[tuple[Any, Any, Any]]:
    edges = []
    for handle in handles:
        count = int(call(driver, "cuGraphNodeGetDependencies", handle)[-1])
        if count:
            got = call(driver, "cuGraphNodeGetDependencies", handle, count)
            parents = list(got[0])[:count]
            if len(parents) != count:
                raise CudaCallError(
                    "cuGraphNodeGetDependencies", "short answer", f"{len(parents)} of {count}"
                )
            edges += [(p, handle, d) for p, d in zip(parents, _edge_data(got, count, 1))]
    return edges


def _edge_data(got: tuple[Any, ...], count: int, at: int = 2) -> list[Any]:
    """The edge data list of a 13.x answer (``(..., edgeData, count)``), or Nones (12.x)."""
    data = got[at] if len(got) >= at + 2 else None
    out = list(data)[:count] if data is not None else []
    return out + [None] * (count - len(out))


def _is_weak(edge: Any) -> bool:
    """A programmatic edge or one leaving a non-default port: the parent may not be done."""
    if edge is None:
        return False
    kind = getattr(edge, "type", 0)
    port = getattr(edge, "from_port", 0)
    return (
        int(getattr(kind, "value", kind) or 0) != 0 or int(getattr(port, "value", port) or 0) != 0
    )


class _NodeReader:
    """Reads nodes of one graph; caches per-function facts (layers repeat the same kernels)."""

    def __init__(self, driver: ModuleType) -> None:
        self.driver = driver
        self.types = driver.CUgraphNodeType
        self._sizes: dict[tuple[str, int], tuple[int, ...] | None] = {}
        self._names: dict[int, tuple[str, str]] = {}

    def node(self, i: int, handle: Any, deps: tuple[int, ...]) -> Node:
        d = self.driver
        raw_kind = call(d, "cuGraphNodeGetType", handle)[0]
        kind = NODE_KINDS.get(getattr(raw_kind, "name", str(raw_kind)), NodeKind.UNKNOWN)
        if kind is NodeKind.KERNEL:
            return self._kernel(i, handle, deps)
        if kind is NodeKind.MEMCPY:
            params = call(d, "cuGraphMemcpyNodeGetParams", handle)[0]
            return Node(i, kind, deps=deps, spans=_memcpy_spans(params))
        if kind is NodeKind.MEMSET:
            params = call(d, "cuGraphMemsetNodeGetParams", handle)[0]
            return Node(i, kind, deps=deps, spans=(_memset_span(params),))
        if kind is NodeKind.EVENT_RECORD:
            event = call(d, "cuGraphEventRecordNodeGetEvent", handle)[0]
            return Node(i, kind, deps=deps, event=int(event))
        name = "" if kind is not NodeKind.UNKNOWN else getattr(raw_kind, "name", str(raw_kind))
        return Node(i, kind, name=name, deps=deps)

    def _kernel(self, i: int, handle: Any, deps: tuple[int, ...]) -> Node:
        params = call(self.driver, "cuGraphKernelNodeGetParams", handle)[0]
        name, symbol = self._name(params)
        try:
            blobs = self._arguments(params)
        except (CudaCallError, BindingsMissingError, ValueError):
            return Node(i, NodeKind.KERNEL, name, deps, readable=False, symbol=symbol)
        words = tuple(w for blob in blobs for w in words_of(blob))
        return Node(i, NodeKind.KERNEL, name, deps, words=words, symbol=symbol)

    def _function(self, params: Any) -> tuple[str, Any]:
        func = getattr(params, "func", None)
        if func is not None and int(func):
            return "func", func
        kern = getattr(params, "kern", None)
        if kern is not None and int(kern):
            return "kern", kern
        return "", None

    def _name(self, params: Any) -> tuple[str, str]:
        which, handle = self._function(params)
        if handle is None:
            return "?", ""
        key = int(handle)
        if key not in self._names:
            getter = "cuFuncGetName" if which == "func" else "cuKernelGetName"
            try:
                raw = call(self.driver, getter, handle)[0]
                symbol = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            except (CudaCallError, BindingsMissingError):
                symbol = ""
            full = demangle(symbol)
            self._names[key] = (short_kernel_name(full) if symbol else "?", full)
        return self._names[key]

    def _arguments(self, params: Any) -> list[bytes]:
        """Each argument's bytes. Raises when sizes are unknown: reading blind could fault."""
        base = int(getattr(params, "kernelParams", 0) or 0)
        if not base:
            extra = int(getattr(params, "extra", 0) or 0)
            return [_extra_buffer(extra)] if extra else []
        sizes = self._param_sizes(params)
        out = []
        pointer = ctypes.sizeof(ctypes.c_void_p)
        for k, size in enumerate(sizes):
            arg = ctypes.c_void_p.from_address(base + k * pointer).value
            if arg and size:
                out.append(ctypes.string_at(arg, min(size, MAX_PARAM_BYTES)))
        return out

    def _param_sizes(self, params: Any) -> tuple[int, ...]:
        which, handle = self._function(params)
        if handle is None:
            raise ValueError("kernel node without a function")
        key = (which, int(handle))
        if key not in self._sizes:
            self._sizes[key] = self._query_sizes(which, handle)
        sizes = self._sizes[key]
        if sizes is None:
            raise ValueError("parameter sizes unknown")
        return sizes

    def _query_sizes(self, which: str, handle: Any) -> tuple[int, ...] | None:
        d = self.driver
        getter = getattr(
            d, "cuFuncGetParamInfo" if which == "func" else "cuKernelGetParamInfo", None
        )
        if getter is None:
            return None
        sizes: list[int] = []
        for k in range(MAX_PARAMS):
            result = getter(handle, k)
            if not isinstance(result, tuple) or not result:
                return None
            if result[0] == d.CUresult.CUDA_ERROR_INVALID_VALUE:
                return tuple(sizes)  # past the last parameter
            if result[0] != d.CUresult.CUDA_SUCCESS or len(result) < 3:
                return None
            sizes.append(int(result[2]))
        return None  # more parameters than any kernel has: do not trust it


def words_of(blob: bytes) -> tuple[int, ...]:
    """Every aligned little-endian 8-byte word of ``blob`` (one kernel argument's bytes)."""
    count = len(blob) // 8
    return struct.unpack_from(f"<{count}Q", blob) if count else ()


# The three keys of a cuLaunchKernel ``extra`` array.
_LAUNCH_PARAM_END, _LAUNCH_PARAM_BUFFER_POINTER, _LAUNCH_PARAM_BUFFER_SIZE = 0, 1, 2


def _extra_buffer(extra: int) -> bytes:
    """The packed argument buffer of a kernel launched with ``extra`` (bounded walk)."""
    pointer = ctypes.sizeof(ctypes.c_void_p)
    buffer = size = 0
    for k in range(0, 16, 2):
        key = ctypes.c_void_p.from_address(extra + k * pointer).value or 0
        value = ctypes.c_void_p.from_address(extra + (k + 1) * pointer).value or 0
        if key == _LAUNCH_PARAM_END:
            break
        if key == _LAUNCH_PARAM_BUFFER_POINTER:
            buffer = value
        elif key == _LAUNCH_PARAM_BUFFER_SIZE and value:
            size = ctypes.c_size_t.from_address(value).value
    if not buffer or not size:
        raise ValueError("kernel launched with an unreadable 'extra' argument buffer")
    return ctypes.string_at(buffer, min(size, MAX_PARAM_BYTES))


def _memcpy_spans(p: Any) -> tuple[tuple[int, int], ...]:
    """The device bytes a memcpy node reads (src) and writes (dst)."""
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
    return tuple(spans)


def _device_pointer(p: Any, side: str) -> int:
    try:
        kind = getattr(p, f"{side}MemoryType")
    except ValueError:  # unset memory type
        return 0
    if int(getattr(kind, "value", kind)) not in (2, 4):  # CU_MEMORYTYPE_DEVICE, _UNIFIED
        return 0
    return int(getattr(p, f"{side}Device"))


def _memset_span(p: Any) -> tuple[int, int]:
    start = int(p.dst)
    row = int(p.width) * int(p.elementSize)
    length = row + max(int(p.height) - 1, 0) * max(int(p.pitch), row)
    return start, start + max(length, 1)


# ---------------------------------------------------------------------------------------------
# Changing the graph
# ---------------------------------------------------------------------------------------------


def add_event_record_node(raw: RawGraph, deps: Sequence[int], event: int) -> Any:
    """Add a node recording ``event`` (a ``cudaEvent_t`` handle) after nodes ``deps``.

    The graph must not be instantiated yet: an executable graph keeps its old topology.
    """
    if not event:
        raise CudaCallError(
            "cuGraphAddEventRecordNode",
            "null event",
            "record the event once eagerly so it has a handle",
        )
    driver = driver_module()
    handles = [raw.handles[i] for i in sorted(set(deps))]
    return call(
        driver,
        "cuGraphAddEventRecordNode",
        raw.cu_graph,
        handles,
        len(handles),
        driver.CUevent(int(event)),
    )[0]


def add_dependencies(raw: RawGraph, node: Any, successors: Sequence[int]) -> None:
    """Add edges from the new ``node`` to nodes ``successors`` of the walked graph."""
    driver = driver_module()
    targets = [raw.handles[i] for i in sorted(set(successors))]
    sources = [node] * len(targets)
    try:  # cuda-bindings 13: (graph, from, to, edgeData, count); None: plain edges
        call(driver, "cuGraphAddDependencies", raw.cu_graph, sources, targets, None, len(targets))
    except CudaCallError as exc:
        if exc.code != "TypeError":
            raise
        # cuda-bindings 12: (graph, from, to, count)
        call(driver, "cuGraphAddDependencies", raw.cu_graph, sources, targets, len(targets))


def node_count(raw: int) -> int:
    """How many nodes the ``cudaGraph_t`` ``raw`` has now."""
    driver = driver_module()
    return int(call(driver, "cuGraphGetNodes", driver.CUgraph(int(raw)))[-1])


# ---------------------------------------------------------------------------------------------
# Kernel names
# ---------------------------------------------------------------------------------------------

_ANON = "(anonymous namespace)"


def short_kernel_name(symbol: str) -> str:
    """``void at::native::(anonymous namespace)::indexSelectSmallIndex<float, ...>(...)`` ->
    ``indexSelectSmallIndex``; mangled names keep their longest identifier-looking part."""
    text = symbol.strip()
    if not text:
        return "?"
    if text.startswith("_Z"):
        parts = _mangled_identifiers(text)
        return max(parts, key=len) if parts else text
    text = text.replace(_ANON, "anon")
    if text.startswith("void "):
        text = text[len("void ") :]
    cut = min((k for k in (text.find("<"), text.find("(")) if k >= 0), default=len(text))
    return text[:cut].split("::")[-1] or symbol


def _mangled_identifiers(text: str) -> list[str]:
    """The length-prefixed identifiers of an Itanium-mangled name (``6native`` -> native)."""
    parts = []
    for match in re.finditer(r"(\d+)", text):
        n = int(match.group(1))
        ident = text[match.end() : match.end() + n]
        if n and len(ident) == n and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ident):
            parts.append(ident)
    return parts


_cxa_demangle: Any = None


def demangle(symbol: str) -> str:
    """Demangle a C++ symbol with libstdc++'s ``__cxa_demangle``; the input on any failure."""
    global _cxa_demangle
    if not symbol.startswith("_Z"):
        return symbol
    try:
        if _cxa_demangle is None:
            lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
            fn = lib.__cxa_demangle
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


# ---------------------------------------------------------------------------------------------
# Restoring: clone, re-point event-record nodes, instantiate, launch
# ---------------------------------------------------------------------------------------------


def clone_graph(raw: int) -> int:
    """``cuGraphClone`` of the ``cudaGraph_t`` ``raw``: a new graph with the same nodes and
    edges (and node parameters: its event-record nodes record the same events)."""
    driver = driver_module()
    return int(call(driver, "cuGraphClone", driver.CUgraph(int(raw)))[0])


def set_record_event(node: Any, event: int) -> None:
    """Re-point the event-record ``node`` of a graph (not of an executable) at ``event``."""
    driver = driver_module()
    call(driver, "cuGraphEventRecordNodeSetEvent", node, driver.CUevent(int(event)))


class EventRepointer:
    """Re-points event-record nodes of one graph, and of its executable ``exec_`` (0: not
    instantiated), at new events. The driver entry points and the executable's handle are
    resolved once, and `prepare` wraps each (node, event) pair beforehand, so the ``repoint_*``
    calls are the driver calls alone."""

    def __init__(self, exec_: int = 0) -> None:
        driver = self._driver = driver_module()
        self._graph_set = entry_point(driver, "cuGraphEventRecordNodeSetEvent")
        self._exec_set = entry_point(driver, "cuGraphExecEventRecordNodeSetEvent")
        self._exec = driver.CUgraphExec(int(exec_)) if exec_ else None
        self._event = driver.CUevent

    def prepare(self, node: Any, event: int) -> tuple[Any, Any]:
        """The arguments of re-pointing ``node`` (a graph node handle) at ``event``."""
        return node, self._event(int(event))

    def repoint_executable(self, pairs: Sequence[tuple[Any, Any]]) -> None:
        """Each prepared (node, event) in the executable: future launches record the new event
        (no re-instantiation). Nothing without an executable."""
        if self._exec is None:
            return
        driver = self._driver
        for node, event in pairs:
            result = self._exec_set(self._exec, node, event)
            checked(driver, "cuGraphExecEventRecordNodeSetEvent", result)

    def repoint_graph(self, pairs: Sequence[tuple[Any, Any]]) -> None:
        """Each prepared (node, event) in the graph: what a self-check walks and a later
        instantiation copies (left stale, a re-instantiated executable would record the old
        event again)."""
        driver = self._driver
        for node, event in pairs:
            checked(driver, "cuGraphEventRecordNodeSetEvent", self._graph_set(node, event))


def create_private_event() -> int:
    """A fresh event no caller knows (what a persistence library's restore records into)."""
    driver = driver_module()
    return int(call(driver, "cuEventCreate", 0)[0])


def instantiate_graph(raw: int) -> int:
    """``cuGraphInstantiate`` of the ``cudaGraph_t`` ``raw``: the executable's handle."""
    driver = driver_module()
    return int(call(driver, "cuGraphInstantiate", driver.CUgraph(int(raw)), 0)[0])


def launch_graph(exec_: int, stream: int) -> None:
    """``cuGraphLaunch`` of the executable ``exec_`` on the stream whose handle is ``stream``."""
    driver = driver_module()
    call(driver, "cuGraphLaunch", driver.CUgraphExec(int(exec_)), driver.CUstream(int(stream)))


def launcher(exec_: int) -> Callable[[int], None]:
    """``launch(stream)``: `launch_graph` of ``exec_`` with the driver objects made once (the
    per-step replay of a restored graph)."""
    driver = driver_module()
    launch = driver.cuGraphLaunch
    handle = driver.CUgraphExec(int(exec_))
    stream_of = driver.CUstream
    success = driver.CUresult.CUDA_SUCCESS

    def run(stream: int) -> None:
        result = launch(handle, stream_of(int(stream)))
        if result[0] != success:
            raise CudaCallError("cuGraphLaunch", getattr(result[0], "name", str(result[0])))

    return run


def destroy_graph(raw: int, exec_: int = 0) -> None:
    """Destroy an executable (when given) and its graph; errors are ignored (teardown)."""
    try:
        driver = driver_module()
        if exec_:
            driver.cuGraphExecDestroy(driver.CUgraphExec(int(exec_)))
        if raw:
            driver.cuGraphDestroy(driver.CUgraph(int(raw)))
    except Exception:  # noqa: BLE001 - teardown at interpreter exit may find no driver
        pass
