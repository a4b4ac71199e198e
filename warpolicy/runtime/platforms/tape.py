"""The simulated platform's record of a context-manager capture: the torch work the body did,
replayed at every launch into the tensors the capture produced.

``with platform.capture(graph): body`` cannot re-run its body later (a ``with`` block runs
once), so without a record a simulated replay would do nothing, and a test comparing overlapped
steps with sequential ones would pass without testing anything. A `Tape` watches the body
through torch's public `TorchFunctionMode` and keeps each call with the tensors it produced;
a replay calls each again on the same (now current) inputs and copies every result into the
tensor the capture returned, as a CUDA graph replays into the memory it captured. Records of
the graph's planted events keep their place between the calls.

Reading a tensor's value on the host during the capture (``.item()``, ``bool(t)``, ...) is
refused, as CUDA refuses it in a capture: the value would be baked into the graph.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

#: Tensor methods that read a value on the host: a capture cannot contain them.
HOST_READS = frozenset(
    {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__complex__"}
)


class Tape:
    """What one context-manager capture did, in order: torch calls and planted records."""

    def __init__(self) -> None:
        #: ``("call", func, args, kwargs, result)`` or ``("record", event)``
        self.entries: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.entries)

    def planted(self, event: Any) -> None:
        self.entries.append(("record", event))

    @contextlib.contextmanager
    def recording(self) -> Iterator[Tape]:
        """Watch the body; without torch imported the body can do no torch work."""
        if "torch" not in sys.modules:
            yield self
            return
        with _watcher(self):
            yield self

    def replay(self, fire: Callable[[Any], None]) -> None:
        """Run every call again, results into the captured tensors; ``fire`` each planted
        record at its place."""
        for entry in self.entries:
            if entry[0] == "record":
                fire(entry[1])
                continue
            _, func, args, kwargs, result = entry
            _copy_into(result, func(*args, **kwargs))


def _watcher(tape: Tape) -> Any:
    import torch  # noqa: PLC0415 - deferred: the simulated platform runs without torch
    from torch.overrides import TorchFunctionMode  # noqa: PLC0415 - deferred, as above

    class _Watch(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: dict | None = None
        ) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name in HOST_READS:
                raise RuntimeError(
                    f"sim platform: Tensor.{name}() reads a value on the host during a graph "
                    "capture (CUDA refuses it too: the value would be baked into the graph)"
                )
            result = func(*args, **kwargs)
            # calls that return a tensor, or nothing (in-place setters), are work to replay;
            # metadata getters (shape, dtype, device) are not
            if result is None or _has_tensor(result, torch.Tensor):
                tape.entries.append(("call", func, args, kwargs, result))
            return result

    return _Watch()


def _has_tensor(value: Any, tensor_type: type) -> bool:
    if isinstance(value, tensor_type):
        return True
    if isinstance(value, (tuple, list)):
        return any(_has_tensor(v, tensor_type) for v in value)
    return False


def _copy_into(captured: Any, fresh: Any) -> None:
    if captured is None or captured is fresh:
        return
    if isinstance(captured, (tuple, list)) and isinstance(fresh, (tuple, list)):
        for old, new in zip(captured, fresh):
            _copy_into(old, new)
        return
    copy = getattr(captured, "copy_", None)
    if copy is None or not hasattr(fresh, "data_ptr"):
        return
    if (
        captured.data_ptr() == fresh.data_ptr()
        and captured.shape == fresh.shape
        and captured.stride() == fresh.stride()
    ):
        return  # the same memory (a view, an in-place result): already current
    copy(fresh)


__all__ = ["HOST_READS", "Tape"]
