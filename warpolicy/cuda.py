"""The built-in CUDA platform plugin, on ``torch.cuda``.

Handles device type ``cuda`` when ``torch.cuda.is_available()``. External events (an event
recorded during capture becomes a graph node) are detected from the signature of
``torch.cuda.Event`` (torch >= 2.8), not by catching ``TypeError``. Records with
``stream=None`` use the *current* stream: during a capture that is the capture stream, which
is what makes torch emit the node (REFERENCE.md §3). Implementations are ``trylast`` so a
third-party plugin for ``cuda`` devices (e.g. a ROCm one) takes precedence.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

from warpolicy.hookspecs import hookimpl
from warpolicy.platform import device_type


def _torch() -> Any:
    import torch  # late: importing warpolicy must not need torch

    return torch


@functools.lru_cache(maxsize=None)
def cuda_available() -> bool:
    try:
        return bool(_torch().cuda.is_available())
    except ImportError:
        return False


@functools.lru_cache(maxsize=None)
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


def _handles(device: Any) -> bool:
    kind = getattr(device, "type", None)  # a torch.device: the common, cheap case
    if not isinstance(kind, str):
        kind = device_type(device)
    return kind == "cuda" and cuda_available()


def _index(device: Any) -> Any:
    """What torch.cuda calls accept: the torch.device, or None for the current device."""
    return device if getattr(device, "type", None) == "cuda" else None


# -- identity --------------------------------------------------------------------------------------

@hookimpl(trylast=True)
def warpolicy_platform_name(device: Any) -> Optional[str]:
    return "cuda" if _handles(device) else None


@hookimpl(trylast=True)
def warpolicy_external_events_supported(device: Any) -> Optional[bool]:
    return external_events_in_signature() if _handles(device) else None


# -- events ----------------------------------------------------------------------------------------

@hookimpl(trylast=True)
def warpolicy_create_event(device: Any, external: bool) -> Any:
    if not _handles(device):
        return None
    torch = _torch()
    if external:
        if not external_events_in_signature():
            raise RuntimeError(f"torch {torch.__version__} has no torch.cuda.Event(external=...)")
        return torch.cuda.Event(external=True)
    return torch.cuda.Event()


@hookimpl(trylast=True)
def warpolicy_record_event(device: Any, event: Any, stream: Any) -> Optional[bool]:
    if not _handles(device):
        return None
    if stream is None:
        event.record()  # the current stream: during capture, the capture stream (a node)
    else:
        event.record(stream)
    return True


@hookimpl(trylast=True)
def warpolicy_wait_event(device: Any, stream: Any, event: Any) -> Optional[bool]:
    if not _handles(device):
        return None
    stream.wait_event(event)
    return True


@hookimpl(trylast=True)
def warpolicy_wait_stream(device: Any, stream: Any, other: Any) -> Optional[bool]:
    if not _handles(device):
        return None
    stream.wait_stream(other)
    return True


# -- streams ---------------------------------------------------------------------------------------

@hookimpl(trylast=True)
def warpolicy_is_capturing(device: Any) -> Optional[bool]:
    if not _handles(device):
        return None
    return bool(_torch().cuda.is_current_stream_capturing())


@hookimpl(trylast=True)
def warpolicy_new_stream(device: Any) -> Any:
    return _torch().cuda.Stream(device=_index(device)) if _handles(device) else None


@hookimpl(trylast=True)
def warpolicy_current_stream(device: Any) -> Any:
    return _torch().cuda.current_stream(_index(device)) if _handles(device) else None


@hookimpl(trylast=True)
def warpolicy_use_stream(device: Any, stream: Any) -> Any:
    return _torch().cuda.stream(stream) if _handles(device) else None


# -- graphs ----------------------------------------------------------------------------------------

@hookimpl(trylast=True)
def warpolicy_new_graph(device: Any, keep_graph: bool) -> Any:
    if not _handles(device):
        return None
    torch = _torch()
    if keep_graph:
        return torch.cuda.CUDAGraph(keep_graph=True)
    return torch.cuda.CUDAGraph()


@hookimpl(trylast=True)
def warpolicy_graph_pool(device: Any) -> Any:
    return _torch().cuda.graph_pool_handle() if _handles(device) else None


@hookimpl(trylast=True)
def warpolicy_capture(device: Any, graph: Any, stream: Any, pool: Any) -> Any:
    if not _handles(device):
        return None
    return _torch().cuda.graph(graph, pool=pool, stream=stream)


@hookimpl(trylast=True)
def warpolicy_capture_callable(device: Any, graph: Any, fn: Callable[[], Any], stream: Any,
                               pool: Any) -> Optional[bool]:
    if not _handles(device):
        return None
    with _torch().cuda.graph(graph, pool=pool, stream=stream):
        fn()
    return True


@hookimpl(trylast=True)
def warpolicy_replay(device: Any, graph: Any) -> Optional[bool]:
    if not _handles(device):
        return None
    graph.replay()
    return True


@hookimpl(trylast=True)
def warpolicy_synchronize(device: Any) -> Optional[bool]:
    if not _handles(device):
        return None
    _torch().cuda.synchronize(_index(device))
    return True
