"""The static audit's CUDA side: which ``cudaGraph_t`` to walk for a captured bucket.

Reading the graph is `warpolicy.runtime.graphwalk.cuda.read_graph` (the walk derived placement and the
marker self-check use); this module only finds the graph and its planted event: the runner's
own kept graph (``keep_graph=True``) when there is one, else a fresh capture of the same body
into a kept, never-instantiated graph. torch is imported inside the functions that need it.
"""

from __future__ import annotations

from typing import Any

from warpolicy.runtime.graphwalk.errors import PlacementError
from warpolicy.runtime.graphwalk.plant import event_handle, raw_graph_of
from warpolicy.runtime.runners.protocols import Runner


class graph_for:  # noqa: N801 - used like a function: ``with graph_for(...) as (raw, event)``
    """Context manager yielding ``(raw cudaGraph_t, planted event handle or None)``.

    Prefers the runner's own graph (what really replays) when the platform kept it
    (``keep_graph=True``); otherwise captures the same body once more (in-graph prep, an
    external event record, forward) into a kept, never-instantiated graph.
    """

    def __init__(self, runner: Runner, bucket: int) -> None:
        self.runner = runner
        self.bucket = bucket
        self._own: Any = None  # (graph, event) of our own capture, kept alive while walked

    def __enter__(self) -> tuple[int, int | None]:
        captured = getattr(self.runner, "captured", {}).get(self.bucket)
        raw = _raw_graph(getattr(captured, "graph", None))
        if raw:  # the event the bucket's own graph records (each bucket has its own), else
            # the one its release hands out, else the fence's
            event = (
                getattr(captured, "recorded", None)
                or getattr(captured, "event", None)
                or getattr(self.runner.fence, "event", None)
            )
            return raw, event_handle(event) or None
        self._own = _capture_body(self.runner.model, self.bucket)
        graph, event = self._own
        return int(graph.raw_cuda_graph()), int(event.cuda_event)

    def __exit__(self, *exc: Any) -> None:
        if self._own is not None:
            import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

            self._own = None  # frees the never-instantiated graph and its memory pool
            torch.cuda.synchronize()


def _raw_graph(graph: Any) -> int:
    """The ``cudaGraph_t`` of a kept torch graph, or 0 (not kept, freed, or no graph)."""
    try:
        return raw_graph_of(graph)
    except PlacementError:
        return 0


def _capture_body(model: Any, bucket: int) -> tuple[Any, Any]:
    """Capture prep -> external event record -> forward into a kept graph (not instantiated)."""
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

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
