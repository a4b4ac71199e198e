"""Which Python line launched each node of a captured graph.

A graph walk names a late reader by its kernel (``indexSelectLargeIndex``); an engineer needs the
line of *their* code that launched it. While a graph is captured, `LaunchRecorder` watches every
launch and notes, for the nodes the launch added to the graph, the innermost Python frame outside
torch and Triton (`LaunchSite`: ``sglang.py:63``):

* torch calls through a ``torch.overrides.TorchFunctionMode`` (every torch function and tensor
  method called from Python; a function-level hook, because torch's dispatch-level one,
  ``TorchDispatchMode``, lives in a private module);
* Triton kernels through Triton's launch enter / exit hooks (``triton.knobs.runtime``; a Triton
  launch inside a torch op keeps its own, innermost, site).

A launch's nodes are the graph's node count before and after it (`node_counter`: the capture
graph of the current stream, through cuda-bindings; node indices are the order
``cuGraphGetNodes`` lists, the order the walk uses). Launches the hooks do not see (a C++
extension called without the dispatcher, CUDA calls of another library) keep no site; the report
then names the kernel alone. torch >= 2.14 with a driver >= 13.1 records Python launch stacks per
graph node itself; on the lent GPU (torch 2.11, driver 580) these two hooks are what there is.

Cost: two driver calls and one frame walk per launch during capture only (``warpolicy bench
launch-sites`` prints the milliseconds per graph); nothing per replay.
Nothing here imports torch, Triton or cuda-bindings at module level.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import attrs

from warpolicy.runtime.graphwalk import cuda

#: Returns the node count of the graph being captured on the current stream, or None when no
#: capture is active (the recorder then records nothing).
NodeCounter = Callable[[], int | None]


@attrs.frozen
class LaunchSite:
    """The Python line that launched a graph node, and what it launched."""

    op: str  # the torch call (``index_select``, ``Tensor.copy_``) or the Triton kernel's name
    file: str
    line: int

    @property
    def where(self) -> str:
        """``file.py:line`` (the file's base name)."""
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_json(self) -> dict:
        return {"op": self.op, "file": self.file, "line": self.line}


#: node index -> its launch site, for one captured graph
Sites = Mapping[int, LaunchSite]


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(path) + os.sep if path else None


class LaunchRecorder:
    """A context manager that records `LaunchSite`s while a graph is captured (see the module
    docstring). ``count`` gives the capture graph's node count (`node_counter` on CUDA; tests
    pass their own). ``sites`` maps node index -> site, innermost launch first."""

    def __init__(self, count: NodeCounter) -> None:
        self.count = count
        self.sites: dict[int, LaunchSite] = {}
        self.launches = 0
        self.failures = 0  # sites lost to an exception in the hooks
        self._undo: list[Callable[[], None]] = []
        skipped = [_package_dir(n) for n in ("torch", "triton")]
        self._skip = tuple(p for p in skipped if p) + (__file__,)

    # -- what the hooks call ------------------------------------------------------------------

    def site(self, op: str, frame: FrameType | None) -> LaunchSite | None:
        """The innermost frame from ``frame`` outward that is not torch's, Triton's or ours."""
        while frame is not None:
            path = frame.f_code.co_filename
            if not path.startswith(self._skip) and not path.startswith("<"):
                return LaunchSite(op, path, frame.f_lineno)
            frame = frame.f_back
        return None

    def record(self, op: str, before: int | None, after: int | None, frame: Any) -> None:
        """Nodes ``[before, after)`` were added by a launch of ``op`` from ``frame``."""
        if before is None or after is None or after <= before:
            return
        self.launches += 1
        found = self.site(op, frame)
        if found is None:
            return
        for index in range(before, after):
            self.sites.setdefault(index, found)  # an inner launch (Triton in an op) came first

    def safely(self, op: str, before: int | None, frame: Any) -> None:
        """`record` with the count after the launch; a failure costs the site, never the
        capture (the hooks run inside the engine's capture)."""
        try:
            self.record(op, before, self.count(), frame)
        except Exception:  # noqa: BLE001 - a site is a nicety; the capture must go on
            self.failures += 1

    # -- installing the hooks -----------------------------------------------------------------

    def __enter__(self) -> LaunchRecorder:
        try:
            self._install_dispatch()
            self._install_triton()
        except BaseException:
            self._uninstall()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._uninstall()

    def _uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _install_dispatch(self) -> None:
        from torch.overrides import TorchFunctionMode  # noqa: PLC0415 - deferred: no torch import at module level

        recorder = self

        class _Sites(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                before = recorder.count()
                out = func(*args, **(kwargs or {}))
                recorder.safely(_op_name(func), before, sys._getframe(1))
                return out

        mode = _Sites()
        mode.__enter__()
        self._undo.append(lambda: mode.__exit__(None, None, None))

    def _install_triton(self) -> None:
        if "triton" not in sys.modules:  # nothing launched Triton yet: nothing to watch
            return
        try:
            from triton import knobs  # noqa: PLC0415 - deferred: Triton is optional
        except ImportError:  # an older Triton: its kernels keep no site
            return
        runtime = knobs.runtime
        pending: list[int | None] = []

        def enter(metadata: Any) -> None:
            pending.append(self.count())

        def leave(metadata: Any) -> None:
            before = pending.pop() if pending else None
            self.safely(_triton_name(metadata), before, sys._getframe(1))

        for attribute, hook in (("launch_enter_hook", enter), ("launch_exit_hook", leave)):
            chain = getattr(runtime, attribute, None)
            if chain is not None and hasattr(chain, "add") and hasattr(chain, "remove"):
                chain.add(hook)  # Triton >= 3.5: a hook chain
                self._undo.append(functools.partial(chain.remove, hook))
            else:
                setattr(runtime, attribute, hook)  # one hook: ours while capturing
                self._undo.append(functools.partial(setattr, runtime, attribute, chain))


def _op_name(func: Any) -> str:
    """``index_select`` for a torch function, ``Tensor.copy_`` for a tensor method."""
    name = str(getattr(func, "__name__", func))
    owner = str(getattr(func, "__qualname__", "")).rpartition(".")[0]
    return f"Tensor.{name}" if owner in ("Tensor", "TensorBase") else name


def _triton_name(metadata: Any) -> str:
    try:
        data = metadata.get() if hasattr(metadata, "get") else dict(metadata or {})
        return str(data.get("name", "triton kernel"))
    except Exception:  # noqa: BLE001 - the name is cosmetic
        return "triton kernel"


def node_counter() -> NodeCounter:
    """On CUDA: the node count of the graph the current stream captures (None when it does
    not, or when the driver cannot say: a recorder must never break a capture). Raises
    `BindingsMissingError` without cuda-bindings."""
    import torch  # noqa: PLC0415 - deferred: the graph walk imports without torch

    driver = cuda.driver_module()
    active = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
    # cuda-bindings 13 answers (status, id, graph, ...) from the plain name; 12.x needs _v2
    names = [n for n in _CAPTURE_INFO if hasattr(driver, n)]
    broken: list[str] = []

    def count() -> int | None:
        if broken or not names:
            return None
        try:
            stream = driver.CUstream(int(torch.cuda.current_stream().cuda_stream))
            info = cuda.call(driver, names[0], stream)
            if len(info) < 3:  # an old answer without the graph: try the next name once
                names.pop(0)
                return count()
            if info[0] != active:
                return None
            return int(cuda.call(driver, "cuGraphGetNodes", info[2])[-1])
        except Exception as exc:  # noqa: BLE001 - no sites, never a failed capture
            broken.append(f"{type(exc).__name__}: {exc}")
            return None

    return count


_CAPTURE_INFO = ("cuStreamGetCaptureInfo", "cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo_v2")


def recorder_for(platform_name: str) -> LaunchRecorder | None:
    """A recorder for the captures of a platform called ``platform_name``: on CUDA with
    cuda-bindings, else None (no node indices to map)."""
    if platform_name != "cuda":
        return None
    try:
        return LaunchRecorder(node_counter())
    except Exception:  # noqa: BLE001 - no bindings, no driver: no sites, the capture goes on
        return None


def run_recorded(recorder: LaunchRecorder | None, body: Callable[[], Any]) -> Any:
    """``body()`` with ``recorder``'s hooks installed (when given and they install; a failure
    to install costs the sites, never the capture)."""
    if recorder is None:
        return body()
    try:
        recorder.__enter__()
    except Exception:  # noqa: BLE001 - no hooks: no sites
        return body()
    try:
        return body()
    finally:
        recorder.__exit__(None, None, None)
