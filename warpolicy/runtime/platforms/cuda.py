"""The built-in CUDA platform, on ``torch.cuda``.

Claims device type ``cuda`` when ``torch.cuda.is_available()``. External events (an event
recorded during capture becomes a graph node) are detected from the signature of
``torch.cuda.Event`` (torch >= 2.8), not by catching ``TypeError``. A record with
``stream=None`` uses the *current* stream: during a capture that is the capture stream, which
is what makes torch emit the node.

The per-step operations (record, wait_event, wait_stream, is_capturing) are torch's own
functions bound once, so the fence pays no wrapper frame on top of the raw torch call. The
scheduler barrier's wait, ``event_wait`` (`warpolicy.runtime.platforms.base.EventFirstWait`),
is one driver call through cuda-bindings where it is installed
(`warpolicy.runtime.platforms.driver_wait`), else torch's ``torch.cuda.Event.wait`` (which
``torch.cuda.Stream.wait_event`` calls). Replay is
``operator.methodcaller("replay")`` (C-level: ``graph.replay()``), so a restored graph
(`warpolicy.runtime.graphwalk.restore.RestoredGraph`, which torch cannot hold) replays the same
way as a torch ``CUDAGraph``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import operator
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from warpolicy.runtime.graphwalk import (
    DerivedPlant,
    GraphWalkError,
    SelfCheck,
    check_marker,
    derive_and_plant,
)
from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.graphwalk.cuda import driver_module
from warpolicy.runtime.graphwalk.plant import SharedBuffers, is_instantiated
from warpolicy.runtime.graphwalk.restore import (
    Rebound,
    clone_restored,
    rebind_planted,
    save_planted,
)
from warpolicy.runtime.markers import hookimpl
from warpolicy.runtime.platforms.base import cuda_available, device_type
from warpolicy.runtime.platforms.driver_wait import driver_event_wait


def _torch() -> Any:
    import torch  # noqa: PLC0415 - deferred: importing warpolicy must not need torch

    return torch


@functools.cache
def external_events_in_signature() -> bool:
    """Whether this torch's ``torch.cuda.Event`` takes ``external=`` (torch >= 2.8)."""
    try:
        event_cls = _torch().cuda.Event
    except ImportError:
        return False
    for method in (event_cls.__new__, event_cls.__init__):
        try:
            if "external" in inspect.signature(method).parameters:
                return True
        except (TypeError, ValueError):  # a builtin without a signature
            continue
    return False


class CudaPlatform:
    """`PlatformImpl` for one CUDA device (``torch.device("cuda")`` = the current device)."""

    name = "cuda"

    # torch's own functions, bound in __init__ (see the module docstring)
    record: Callable[..., None]
    wait_event: Callable[[Any, Any], None]
    event_wait: Callable[[Any, Any], None]
    wait_stream: Callable[[Any, Any], None]
    replay: Callable[[Any], None]
    is_capturing: Callable[[], bool]

    def __init__(self, device: str = "cuda", *, driver_wait: bool = True) -> None:
        """``driver_wait=False``: the barrier waits through torch even with cuda-bindings."""
        torch = _torch()
        self.device = torch.device(device)
        self._index = self.device if self.device.index is not None else None
        self.external_events_supported = external_events_in_signature()
        self.record = torch.cuda.Event.record  # (event, stream=None): None = current stream
        self.wait_event = torch.cuda.Stream.wait_event  # (stream, event): calls the next one
        # (event, stream): EventFirstWait; the driver's call where cuda-bindings has it
        torch_wait = torch.cuda.Event.wait
        driver = driver_event_wait(torch_wait) if driver_wait else None
        self.event_wait = torch_wait if driver is None else driver
        self.wait_stream = torch.cuda.Stream.wait_stream  # (stream, other)
        # (graph): ``graph.replay()``, one C-level attribute call: a torch CUDAGraph, or a
        # restored graph (`warpolicy.runtime.graphwalk.restore.RestoredGraph`) torch cannot hold
        self.replay = operator.methodcaller("replay")
        self.is_capturing = torch.cuda.is_current_stream_capturing
        self._torch = torch

    def __repr__(self) -> str:
        return f"CudaPlatform(device={self.device!r})"

    def create_event(self, external: bool) -> Any:
        torch = self._torch
        if external:
            if not self.external_events_supported:
                raise RuntimeError(
                    f"torch {torch.__version__} has no torch.cuda.Event(external=...)"
                )
            return torch.cuda.Event(external=True)
        return torch.cuda.Event()

    def new_stream(self) -> Any:
        return self._torch.cuda.Stream(device=self._index)

    def current_stream(self) -> Any:
        return self._torch.cuda.current_stream(self._index)

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        return self._torch.cuda.stream(stream)

    def new_graph(self, keep_graph: bool) -> Any:
        if keep_graph:
            return self._torch.cuda.CUDAGraph(keep_graph=True)
        return self._torch.cuda.CUDAGraph()

    def graph_pool(self) -> Any:
        return self._torch.cuda.graph_pool_handle()

    @contextlib.contextmanager
    def capture(self, graph: Any, stream: Any | None, pool: Any | None) -> Iterator[Any]:
        with _no_collection(), self._torch.cuda.graph(graph, pool=pool, stream=stream) as got:
            yield got

    def capture_callable(
        self, graph: Any, fn: Callable[[], Any], stream: Any | None, pool: Any | None
    ) -> None:
        with _no_collection(), self._torch.cuda.graph(graph, pool=pool, stream=stream):
            fn()

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self._index)

    # -- graph walk (derived placement, marker self-check) --------------------------------------

    def graph_walk_unavailable(self) -> str | None:
        """None when kept graphs can be walked here (cuda-bindings and keep_graph), else why."""
        if not hasattr(self._torch.cuda.CUDAGraph, "raw_cuda_graph"):
            return f"torch {self._torch.__version__} lacks CUDAGraph.raw_cuda_graph (needs >= 2.8)"
        try:
            driver_module()
        except GraphWalkError as exc:
            return str(exc)
        return None

    def plant_derived(self, graph: Any, shared_buffers: SharedBuffers, event: Any) -> DerivedPlant:
        return derive_and_plant(graph, shared_buffers, event)

    def check_marker(self, graph: Any, shared_buffers: SharedBuffers, event: Any) -> SelfCheck:
        return check_marker(graph, shared_buffers, event)

    def instantiate(self, graph: Any) -> None:
        """Build the executable graph of a kept graph (once; torch would otherwise do it at the
        first replay, after a derived node could still be added)."""
        if not is_instantiated(graph):
            graph.instantiate()

    # -- restoring (clone, find the planted nodes again, rebind) ---------------------------------

    def save_planted(self, graph: Any, planted: Mapping[str, Any]) -> SavedAnchors:
        return save_planted(graph, planted)

    def rebind_planted(self, graph: Any, saved: SavedAnchors, events: Mapping[str, Any]) -> Rebound:
        return rebind_planted(graph, saved, events)

    def clone_graph(self, graph: Any, private_events: bool) -> Any:
        torch = self._torch
        index = self._index

        def current_stream() -> int:
            return int(torch.cuda.current_stream(index).cuda_stream)

        return clone_restored(graph, current_stream, private_events=private_events)


@hookimpl
def warpolicy_platform(device: str) -> CudaPlatform | None:
    """Claim ``cuda`` devices when torch sees CUDA."""
    if device_type(device) != "cuda" or not cuda_available():
        return None
    return CudaPlatform(device)


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """Python's garbage collector off while a graph is captured (torch collects on entry).

    A collection during capture can destroy an old graph, whose private memory pool is then
    freed (``cudaFree``), and that call invalidates the capture in progress: on the H200 a
    test building a fresh model and graphs per trial failed one capture in about 70 that way.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
