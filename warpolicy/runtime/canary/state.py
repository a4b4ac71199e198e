"""What a sampled step's check saves and puts back: snapshots of device state, and the spec an
adapter gives for one step (`CanarySpec`).

A `Snapshot` is one piece of device state the step reads (or reads and writes). ``save()``
enqueues a copy of it on the current stream and returns the copy; ``load(saved)`` enqueues the
copy back. Two are built in:

* `Whole` (a tensor; a bare tensor in a spec means this): the whole tensor;
* `Rows`: the rows ``index`` of a tensor along ``dim`` (say the KV-pool slots one decode step
  writes), so a large pool costs only the rows the step touches. The index is copied when the
  `Rows` is made, so a later scheduler write to the tensor it came from cannot move it.

Anything with ``nbytes``, ``save`` and ``load`` is a snapshot too; the check compares what
``save`` returns when those are tensors (`warpolicy.runtime.canary.compare.flatten_outputs`),
and only restores the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from warpolicy.errors import InputError
from warpolicy.runtime.canary.compare import Tolerance


@runtime_checkable
class Snapshot(Protocol):
    """One piece of device state a sampled step's check saves and puts back."""

    @property
    def nbytes(self) -> int:
        """The bytes one saved copy holds (the canary's memory budget counts them)."""
        ...

    def save(self) -> Any:
        """A copy of the current contents, enqueued on the current stream."""
        ...

    def load(self, saved: Any) -> None:
        """Copy ``saved`` (from `save`) back into the state, enqueued on the current stream."""
        ...


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "copy_")


class Whole:
    """A whole tensor."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        if not _is_tensor(tensor):
            raise InputError(f"canary: Whole needs a tensor, not {type(tensor).__name__}")
        self.tensor = tensor

    @property
    def nbytes(self) -> int:
        return int(self.tensor.numel()) * int(self.tensor.element_size())

    def save(self) -> Any:
        return self.tensor.detach().clone()

    def load(self, saved: Any) -> None:
        self.tensor.copy_(saved)

    def __repr__(self) -> str:
        return f"Whole({self.tensor.dtype}{list(self.tensor.shape)})"


class Rows:
    """The rows ``index`` of ``tensor`` along ``dim`` (``index_select`` / ``index_copy_``).

    ``index`` is any 1-D integer tensor on the tensor's device; a copy is kept (as int64), taken
    on the current stream, so the rows are the ones named when the `Rows` was made.
    """

    __slots__ = ("dim", "index", "tensor")

    def __init__(self, tensor: Any, index: Any, dim: int = 0) -> None:
        if not _is_tensor(tensor) or not _is_tensor(index):
            raise InputError("canary: Rows needs a tensor and an index tensor")
        if index.dim() != 1 or index.is_floating_point() or index.is_complex():
            raise InputError(
                f"canary: Rows needs a 1-D integer index, not {index.dtype}{list(index.shape)}"
            )
        if not -tensor.dim() <= dim < tensor.dim():
            raise InputError(f"canary: Rows dim {dim} is out of range for {tensor.dim()} dims")
        import torch  # noqa: PLC0415 - deferred: the runtime imports without torch

        self.tensor = tensor
        self.dim = dim % tensor.dim()
        self.index = index.detach().to(torch.int64, copy=True)

    @property
    def nbytes(self) -> int:
        rows = int(self.tensor.shape[self.dim]) or 1
        per_row = int(self.tensor.numel()) // rows * int(self.tensor.element_size())
        return int(self.index.numel()) * per_row

    def save(self) -> Any:
        return self.tensor.index_select(self.dim, self.index)

    def load(self, saved: Any) -> None:
        self.tensor.index_copy_(self.dim, self.index, saved)

    def __repr__(self) -> str:
        return f"Rows({self.tensor.dtype}{list(self.tensor.shape)}, {self.index.numel()} along {self.dim})"


def as_snapshot(name: str, value: Any) -> Snapshot:
    """``value`` as a `Snapshot`: a tensor is `Whole`; a snapshot is itself; anything else is
    an `InputError` naming ``name``."""
    if isinstance(value, Snapshot):
        return value
    if _is_tensor(value):
        return Whole(value)
    raise InputError(
        f"canary: state {name!r} must be a tensor or a Snapshot (Whole, Rows, or an object "
        f"with nbytes, save and load), not {type(value).__name__}"
    )


@attrs.frozen
class CanarySpec:
    """What the canary needs to check one sampled step, from the model adapter
    (`warpolicy.runtime.runners.CanaryAdapter.canary_spec`).

    ``inputs``: state the step reads that someone else (the scheduler) may write before the
    check runs; saved before the step, put back for the replay, then the live contents restored.
    None means the model's ``shared_buffers``, whole. List a bucket's static inputs here too if
    the runner may run again before the check (a runner serving two phases of a step).

    ``state``: state the step reads *and writes* (KV pools, counters the graph bumps in place,
    the audit's ``extra_outputs``): saved before the step and put back for the replay, compared
    after it (what the overlapped step left against what the replay leaves), then the live
    contents restored. A step that changes state not listed here cannot be replayed faithfully:
    the replay would apply the change twice (the live contents are put back afterwards only for
    what is listed), and its comparison may differ (a false alarm, which fails closed).

    ``compare_output``: compare the step's returned output (default). ``tolerance``: None
    compares bitwise (a deterministic graph); a `Tolerance` for floating-point results that vary
    between runs.
    """

    inputs: Mapping[str, Any] | None = None
    state: Mapping[str, Any] = attrs.field(factory=dict)
    compare_output: bool = True
    tolerance: Tolerance | None = None


__all__ = ["CanarySpec", "Rows", "Snapshot", "Whole", "as_snapshot"]
