"""CUDA side of restoring a graph: save where its planted nodes sit, find them again, rebind them.

Three entry points the CUDA platform calls (the simulated platform models the same on its own
graphs)::

    saved = save_planted(graph, {"read_done": fence_event})   # after capture (kept graph)
    ...                                                        # persist `saved.to_json()`
    restored = clone_restored(graph, current_stream)           # or the engine's restored graph
    rebound = rebind_planted(restored, saved, {"read_done": new_fence_event})

`rebind_planted` walks the restored graph, finds every planted node by its anchor
(`warpolicy.runtime.graphwalk.anchor`), re-points each node of the graph at its new event
(``cuGraphEventRecordNodeSetEvent``: what the self-check walks and what a later instantiation
uses) and, when the graph is already instantiated, each node of the executable too
(``cuGraphExecEventRecordNodeSetEvent``: future launches record the new event, no
re-instantiation; `Rebound.rebind_us` is what that cost). Everything raises `PlacementError`
(one line) on any failure: the caller makes the bucket publish nothing.

`RestoredGraph` is a graph the CUDA platform holds without torch: a ``cudaGraph_t`` (a clone)
and its executable, replayed with ``cuGraphLaunch`` on the current stream; it answers
``raw_cuda_graph()`` / ``raw_cuda_graph_exec()`` / ``instantiate()`` / ``replay()`` as torch's
``CUDAGraph`` does, and keeps the graph it was cloned from alive (its kernels use that graph's
memory pool). Nothing here imports torch: the stream handle comes from the caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from warpolicy.runtime.graphwalk import cuda
from warpolicy.runtime.graphwalk.anchor import Found, SavedAnchors, find_anchored, save_anchors
from warpolicy.runtime.graphwalk.errors import GraphWalkError, PlacementError
from warpolicy.runtime.graphwalk.model import NodeKind
from warpolicy.runtime.graphwalk.plant import event_handle, is_instantiated, raw_graph_of


@attrs.frozen
class Rebound:
    """What `rebind_planted` did: the nodes found, and what walking, finding and re-pointing
    cost (``rebind_us``: every planted node of one executable, or of the graph before it is
    instantiated)."""

    found: tuple[Found, ...]
    nodes: int
    walk_ms: float
    #: finding the nodes and preparing the driver calls' arguments
    find_ms: float
    #: the driver calls re-pointing every found node of the executable (what its launches
    #: record), or of the graph when it is not instantiated yet
    rebind_us: float
    #: whether an instantiated executable was re-pointed (else only the graph, before
    #: instantiation)
    executable: bool
    #: with an executable, re-pointing the graph's own nodes too (what the self-check walks and
    #: a later instantiation copies), timed apart
    graph_us: float = 0.0

    def describe(self) -> str:
        where = "executable" if self.executable else "graph (before instantiation)"
        labels = ", ".join(f"{f.label} #{f.index}" for f in self.found)
        graph = f", its graph's node {self.graph_us:.1f} us" if self.executable else ""
        return (
            f"rebound {labels} in the {self.nodes}-node restored {where} "
            f"(walk {self.walk_ms:.1f} ms, find {self.find_ms:.2f} ms, rebind "
            f"{self.rebind_us:.1f} us{graph})"
        )


def _handles(events: Mapping[str, Any], saved: SavedAnchors) -> dict[str, int]:
    handles = {}
    for label in saved.labels:
        if label not in events:
            raise PlacementError(f"no new event given for planted node {label!r}")
        handle = event_handle(events[label])
        if not handle:
            raise PlacementError(
                f"the new event of planted node {label!r} has no CUDA handle yet; record it "
                f"once eagerly before rebinding"
            )
        handles[label] = handle
    return handles


def save_planted(graph: Any, planted: Mapping[str, Any]) -> SavedAnchors:
    """The anchors of ``graph``'s planted nodes (``planted``: label -> the event its node
    records now), to persist beside the graph."""
    try:
        handles = {}
        for label, event in planted.items():
            handle = event_handle(event)
            if not handle:
                raise PlacementError(f"planted node {label!r}: its event has no CUDA handle")
            handles[label] = handle
        return save_anchors(cuda.read_graph(raw_graph_of(graph)).graph, handles)
    except PlacementError:
        raise
    except GraphWalkError as exc:
        raise PlacementError(f"saving the planted nodes failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - fail closed: nothing saved, a restore is coarse
        raise PlacementError(
            f"saving the planted nodes failed: {type(exc).__name__}: {_first_line(exc)}"
        ) from None


def rebind_planted(graph: Any, saved: SavedAnchors, events: Mapping[str, Any]) -> Rebound:
    """Find every planted node of ``saved`` in the restored ``graph`` and re-point it at
    ``events[label]`` (see the module docstring). Raises `PlacementError` on any doubt."""
    try:
        return _rebind(graph, saved, events)
    except PlacementError:
        raise
    except GraphWalkError as exc:
        raise PlacementError(f"rebinding failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - fail closed: the bucket publishes nothing
        raise PlacementError(
            f"rebinding failed: {type(exc).__name__}: {_first_line(exc)}"
        ) from None


def _rebind(graph: Any, saved: SavedAnchors, events: Mapping[str, Any]) -> Rebound:
    handles = _handles(events, saved)
    raw = raw_graph_of(graph)
    t0 = time.perf_counter()
    walked = cuda.read_graph(raw)
    t1 = time.perf_counter()
    found = find_anchored(walked.graph, saved)
    executable = is_instantiated(graph)
    repointer = cuda.EventRepointer(int(graph.raw_cuda_graph_exec()) if executable else 0)
    pairs = [repointer.prepare(walked.handles[f.index], handles[f.label]) for f in found]
    t2 = time.perf_counter()
    repointer.repoint_executable(pairs)  # what launches record: the executable's own cost
    t3 = time.perf_counter()
    repointer.repoint_graph(pairs)
    t4 = time.perf_counter()
    us = ((t3 - t2) * 1e6, (t4 - t3) * 1e6)
    return Rebound(
        found,
        len(walked.graph),
        (t1 - t0) * 1e3,
        (t2 - t1) * 1e3,
        us[0] if executable else us[1],
        executable,
        us[1] if executable else 0.0,
    )


class RestoredGraph:
    """A restored ``cudaGraph_t`` and its executable, replayed like torch's ``CUDAGraph``.

    ``handle``: the graph (owned: destroyed with this object); ``current_stream``: the handle of
    the stream a replay launches on; ``source``: what must outlive the graph (the graph it was
    cloned from, whose memory pool its kernels use).
    """

    _launch: Callable[[int], None]  # set by `instantiate`

    def __init__(self, handle: int, current_stream: Callable[[], int], source: Any = None):
        if int(handle) <= 0:
            raise PlacementError("a restored graph needs a cudaGraph_t")
        self._handle = int(handle)
        self._exec = 0
        self._current_stream = current_stream
        self.source = source

    def raw_cuda_graph(self) -> int:
        return self._handle

    def raw_cuda_graph_exec(self) -> int:
        if not self._exec:
            raise RuntimeError("the restored graph is not instantiated yet")
        return self._exec

    def instantiate(self) -> None:
        if not self._exec:
            self._exec = cuda.instantiate_graph(self._handle)
            self._launch = cuda.launcher(self._exec)

    def replay(self) -> None:
        """Launch the executable on the current stream (instantiated at the first replay, as
        torch does); the per-step path: one driver call, its result checked."""
        if not self._exec:
            self.instantiate()
        self._launch(self._current_stream())

    def __del__(self) -> None:
        cuda.destroy_graph(getattr(self, "_handle", 0), getattr(self, "_exec", 0))

    def __repr__(self) -> str:
        return f"RestoredGraph({self._handle:#x}, instantiated={bool(self._exec)})"


def clone_restored(
    graph: Any, current_stream: Callable[[], int], *, private_events: bool = False
) -> RestoredGraph:
    """A `RestoredGraph` cloned from the kept ``graph`` (``cuGraphClone``), not instantiated.

    ``private_events=True`` re-points every event-record node of the clone at a fresh event
    nobody knows: what a persistence library's restore does (SGLang with Foundry), and the
    state `rebind_planted` repairs. Raises `PlacementError` on any failure.
    """
    try:
        raw = raw_graph_of(graph)
        restored = RestoredGraph(cuda.clone_graph(raw), current_stream, source=graph)
        if private_events:
            walked = cuda.read_graph(restored.raw_cuda_graph())
            for node in walked.graph.nodes:
                if node.kind is NodeKind.EVENT_RECORD:
                    cuda.set_record_event(walked.handles[node.index], cuda.create_private_event())
        return restored
    except PlacementError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line; the caller fails closed
        raise PlacementError(
            f"cloning the graph failed: {type(exc).__name__}: {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = [
    "Rebound",
    "RestoredGraph",
    "clone_restored",
    "rebind_planted",
    "save_planted",
]
