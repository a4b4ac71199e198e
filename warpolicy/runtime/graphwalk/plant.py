"""Runner-side entry points: derived placement and the marker self-check.

Derived placement (per captured bucket)::

    graph = torch.cuda.CUDAGraph(keep_graph=True)        # platform.new_graph(keep_graph=True)
    with torch.cuda.graph(graph, pool=pool):             # no marker recorded inside
        model.graph_prep(bucket); out = model.forward(bucket)
    result = derive_and_plant(graph, model.shared_buffers, event)   # event: recorded once eagerly
    graph.instantiate()                                  # before the first replay

Marker self-check (per captured in_graph bucket, before its first replay; the graph must be
kept, ``keep_graph=True``, instantiated or not)::

    check = check_marker(graph, model.shared_buffers, fence_event)
    if not check.ok: demote the bucket to post_replay; warn once with check.describe(bucket)

Both raise `PlacementError` (one line) on any failure; the caller then fails closed (the bucket
stays unplanted, or is demoted).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from warpolicy.runtime.graphwalk import cuda  # imports cuda-bindings only when a walk runs
from warpolicy.runtime.graphwalk.analysis import (
    DerivedPlan,
    Outcome,
    Reader,
    derive_plan,
    find_event_record,
    find_readers,
    late_readers,
)
from warpolicy.runtime.graphwalk.errors import GraphWalkError, PlacementError
from warpolicy.runtime.graphwalk.launch_sites import Sites
from warpolicy.runtime.graphwalk.model import BufferRange, Graph, TensorLike, buffer_ranges

SharedBuffers = Mapping[str, TensorLike] | Sequence[BufferRange]


@attrs.frozen
class DerivedPlant:
    """A read-done node added after the graph's last shared readers."""

    readers: tuple[Reader, ...]  # every reader found (opaque nodes included)
    frontier: tuple[Reader, ...]  # the readers the new node depends on
    nodes: int  # nodes in the graph before the new one
    walk_ms: float  # reading the graph through cuda-bindings
    analysis_ms: float  # finding readers and the frontier
    plant_ms: float  # adding the node
    weak_edges: int = 0  # programmatic edges not trusted for ordering
    node: Any = attrs.field(default=None, eq=False, repr=False)  # the new CUgraphNode
    #: nodes the new one was joined to by an edge (`joining_successors`); empty: a leaf
    successors: tuple[int, ...] = ()
    #: why joining failed (the node then stays a leaf: as safe, slower per replay)
    join_error: str = ""

    @property
    def total_ms(self) -> float:
        return self.walk_ms + self.analysis_ms + self.plant_ms

    def describe(self, sites: Sites | None = None) -> str:
        """One line naming the readers the node follows (``kernel (file.py:line) #12`` where
        ``sites``, the capture's launch sites, know the line)."""
        seen = [r for r in self.readers if not r.opaque]
        opaque = len(self.readers) - len(seen)
        after = ", ".join(f"{reader_label(r, sites)} #{r.index}" for r in self.frontier)
        text = (
            f"derived read-done node after {after} ({len(seen)} shared reader(s)"
            f"{f', {opaque} unseen node(s)' if opaque else ''} in {self.nodes} nodes; "
            f"{self.total_ms:.1f} ms)"
        )
        if self.join_error:
            text += f"; left a leaf of the graph ({self.join_error})"
        return text


@attrs.frozen
class SelfCheck:
    """The static check of a planted marker: shared readers its release does not cover."""

    marker: int  # index of the marker's event-record node
    late: tuple[Reader, ...]  # readers that are not ancestors of the marker
    readers: int  # readers in the whole graph (opaque nodes included)
    nodes: int
    walk_ms: float
    analysis_ms: float

    @property
    def ok(self) -> bool:
        return not self.late

    @property
    def total_ms(self) -> float:
        return self.walk_ms + self.analysis_ms

    def describe(self, bucket: object = None, sites: Sites | None = None) -> str:
        """One line naming each late kernel and its buffer (and the bucket, when given; and the
        Python line that launched it, ``kernel (file.py:line)``, where ``sites`` know it)."""
        where = f"bucket {bucket}: " if bucket is not None else ""
        if self.ok:
            return (
                f"{where}every shared reader precedes the read-done node ({self.readers} "
                f"reader(s), {self.nodes} nodes)"
            )
        late = "; ".join(
            f"{reader_label(r, sites)} (#{r.index}) reads {r.buffer_label}" for r in self.late
        )
        return f"{where}shared reader(s) after the read-done node: {late}"


def reader_label(reader: Reader, sites: Sites | None) -> str:
    """``kernel (file.py:line)`` when ``sites`` know the node's launch site, else ``kernel``."""
    site = sites.get(reader.index) if sites else None
    return f"{reader.name} ({site.where})" if site is not None else reader.name


def ranges_of(shared_buffers: SharedBuffers) -> tuple[BufferRange, ...]:
    """Buffer ranges from tensors by name, or the ranges themselves."""
    if isinstance(shared_buffers, Mapping):
        return buffer_ranges(shared_buffers)
    return tuple(shared_buffers)


def event_handle(event: Any) -> int:
    """The ``cudaEvent_t`` behind a torch event (or an object wrapping one in ``.event`` /
    ``.raw``); 0 when it has none yet (a torch event is created at its first record)."""
    for obj in (event, getattr(event, "event", None), getattr(event, "raw", None)):
        handle = getattr(obj, "cuda_event", None)
        if handle:
            return int(handle)
    if isinstance(event, int):
        return event
    return 0


def _graph_handle(value: Any) -> int:
    """A ``cudaGraph_t`` as an int: an int, or a handle object with ``__int__`` (cuda-bindings'
    ``cudaGraph_t`` / ``CUgraph``)."""
    if isinstance(value, bool):
        raise TypeError(f"not a cudaGraph_t: {value!r}")
    try:
        handle = int(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"not a cudaGraph_t: {type(value).__name__} (give an int or a cuda-bindings handle)"
        ) from None
    if handle <= 0:
        raise ValueError(f"not a cudaGraph_t: {handle} (null or negative)")
    return handle


@attrs.frozen
class RawGraph:
    """A raw ``cudaGraph_t`` an engine holds, for derived placement and the marker self-check
    in place of a torch ``CUDAGraph``: an int, or a cuda-bindings ``cudaGraph_t`` / ``CUgraph``
    (``RawGraph(torch_graph.raw_cuda_graph())`` for a torch graph captured with
    ``keep_graph=True``). warpolicy never instantiates it: the engine does, after planting."""

    handle: int = attrs.field(converter=_graph_handle)

    def raw_cuda_graph(self) -> int:
        """The handle (the same call torch's ``CUDAGraph`` answers)."""
        return self.handle


def raw_graph_of(graph: Any) -> int:
    """The ``cudaGraph_t`` of a torch graph captured with ``keep_graph=True``."""
    getter = getattr(graph, "raw_cuda_graph", None)
    if getter is None:
        raise PlacementError(f"{type(graph).__name__} has no raw_cuda_graph() (needs torch >= 2.8)")
    try:
        raw = int(getter())
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError; any failure is one line
        raise PlacementError(
            f"the raw graph is not available ({_first_line(exc)}); capture "
            f"with torch.cuda.CUDAGraph(keep_graph=True)"
        ) from None
    if not raw:
        raise PlacementError("the raw graph is null; capture with CUDAGraph(keep_graph=True)")
    return raw


def is_instantiated(graph: Any) -> bool:
    """Whether torch already built the executable graph (planting then changes nothing)."""
    getter = getattr(graph, "raw_cuda_graph_exec", None)
    if getter is None:
        return False
    try:
        return bool(int(getter()))
    except Exception:  # noqa: BLE001 - torch refuses before instantiate(): not instantiated
        return False


def derive_and_plant(graph: Any, shared_buffers: SharedBuffers, event: Any) -> DerivedPlant:
    """Walk ``graph`` (kept, not instantiated), add a node recording ``event`` after exactly the
    shared readers, and return what was done. Instantiate the graph afterwards.

    Raises `PlacementError` on any failure, and (with ``no_readers=True``) when no node is seen
    touching a shared buffer.
    """
    try:
        return _derive_and_plant(graph, ranges_of(shared_buffers), event)
    except PlacementError:
        raise
    except GraphWalkError as exc:
        raise PlacementError(f"derived placement failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - fail closed: the bucket stays unplanted
        raise PlacementError(
            f"derived placement failed: {type(exc).__name__}: {_first_line(exc)}"
        ) from None


def _derive_and_plant(graph: Any, ranges: Sequence[BufferRange], event: Any) -> DerivedPlant:
    if not ranges:
        raise PlacementError("no non-empty shared buffers to look for")
    raw = raw_graph_of(graph)
    if is_instantiated(graph):
        raise PlacementError(
            "the graph is already instantiated (replayed?); plant before "
            "instantiate() and the first replay"
        )
    handle = event_handle(event)
    if not handle:
        raise PlacementError(
            "the read-done event has no CUDA handle yet; record it once eagerly before planting"
        )
    t0 = time.perf_counter()
    walked = cuda.read_graph(raw)
    t1 = time.perf_counter()
    if find_event_record(walked.graph, handle) is not None:
        raise PlacementError(
            "the graph already records the read-done event (a marker was "
            "planted); derived placement captures without one"
        )
    try:
        plan = derive_plan(walked.graph, ranges)
    except ValueError as exc:
        raise PlacementError(f"cannot order the graph: {exc}") from None
    t2 = time.perf_counter()
    if plan.outcome is Outcome.NO_READERS:
        raise PlacementError(_no_readers(plan, ranges), no_readers=True)
    node = cuda.add_event_record_node(walked, plan.frontier, handle)
    after = cuda.node_count(raw)
    if after != plan.nodes + 1:  # the driver accepted the call but the graph did not change
        raise PlacementError(f"the graph has {after} nodes after adding one to {plan.nodes}")
    joined, join_error = _join(walked, node, plan.successors)
    t3 = time.perf_counter()
    by_index = {r.index: r for r in plan.readers}
    return DerivedPlant(
        plan.readers,
        tuple(by_index[i] for i in plan.frontier),
        plan.nodes,
        _ms(t1 - t0),
        _ms(t2 - t1),
        _ms(t3 - t2),
        walked.weak_edges,
        node,
        joined,
        join_error,
    )


def _join(
    walked: cuda.RawGraph, node: Any, successors: tuple[int, ...]
) -> tuple[tuple[int, ...], str]:
    """Join the new node to ``successors`` (edges that order nothing new, for replay speed);
    the joined nodes, or none and why."""
    if not successors:
        return (), ""
    try:
        cuda.add_dependencies(walked, node, successors)
    except GraphWalkError as exc:  # the node is planted: a leaf is as safe, only slower
        return (), str(exc)
    return successors, ""


def _no_readers(plan: DerivedPlan, ranges: Sequence[BufferRange]) -> str:
    names = ", ".join(r.name for r in ranges)
    return (
        f"no node of the {plan.nodes}-node graph was seen touching a shared buffer "
        f"({names}); its reads are hidden from the walk (pointers in device memory?), so "
        f"no release point can be derived"
    )


def check_marker(graph: Any, shared_buffers: SharedBuffers, marker_event: Any) -> SelfCheck:
    """Find the node recording ``marker_event`` in the kept ``graph`` and list every shared
    reader that is not its ancestor. Raises `PlacementError` when it cannot (the caller then
    treats the bucket as failing the check)."""
    try:
        return _check_marker(graph, ranges_of(shared_buffers), marker_event)
    except PlacementError:
        raise
    except GraphWalkError as exc:
        raise PlacementError(f"self-check failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - fail closed: the caller demotes the bucket
        raise PlacementError(
            f"self-check failed: {type(exc).__name__}: {_first_line(exc)}"
        ) from None


def _check_marker(graph: Any, ranges: Sequence[BufferRange], marker_event: Any) -> SelfCheck:
    raw = raw_graph_of(graph)
    handle = event_handle(marker_event)
    if not handle:
        raise PlacementError("the marker event has no CUDA handle; nothing to look for")
    t0 = time.perf_counter()
    walked = cuda.read_graph(raw)
    t1 = time.perf_counter()
    return check_walked(walked.graph, ranges, handle, walk_ms=_ms(t1 - t0))


def check_walked(
    walked: Graph, ranges: Sequence[BufferRange], handle: int, *, walk_ms: float = 0.0
) -> SelfCheck:
    """The self-check on an already-read `Graph` (also what the CPU tests drive)."""
    t1 = time.perf_counter()
    marker = find_event_record(walked, handle)
    if marker is None:
        raise PlacementError(
            f"the marker's event-record node is not in the "
            f"{len(walked)}-node graph (was it planted in this capture?)"
        )
    readers = find_readers(walked, ranges)
    late = late_readers(walked, ranges, marker, readers=readers)
    t2 = time.perf_counter()
    return SelfCheck(marker, late, len(readers), len(walked), walk_ms, _ms(t2 - t1))


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
