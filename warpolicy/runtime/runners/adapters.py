"""Model adapters built on other model adapters: how a batch is measured, and a view that hands
every `ModelAdapter` member to the model it wraps (the audit's stalled model, the benchmarks'
prep-only and canary models change one or two members of it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.runners.protocols import ClassedModel, ModelAdapter, SizedModelAdapter


def batch_measure(model: ModelAdapter) -> Callable[[Any], int]:
    """How ``model`` measures a batch in bucket units: its ``batch_size`` (`SizedModelAdapter`),
    else ``len``. Resolve it once, where the model is taken."""
    if isinstance(model, SizedModelAdapter):
        return model.batch_size
    return len


class ModelView:
    """A `SizedModelAdapter` handing every member to ``model``; subclasses override what they
    change. Every member is defined on the class, so protocol checks see them (Python 3.12's
    ``isinstance`` ignores ``__getattr__``); a `ClassedModel`'s ``buffer_classes`` is kept as an
    instance attribute, which those checks see too."""

    def __init__(self, model: ModelAdapter) -> None:
        self.model = model
        self._measure = batch_measure(model)
        if isinstance(model, ClassedModel):  # an instance attribute: protocol checks see it
            # (without it a view would make the class self-check walk every shared buffer)
            self.buffer_classes = model.buffer_classes

    @property
    def shared_buffers(self) -> Mapping[str, Any]:
        return self.model.shared_buffers

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return self.model.bucket_sizes(mode)

    def batch_size(self, batch: Any) -> int:
        return int(self._measure(batch))

    def prepare_bucket(self, bucket: int) -> None:
        self.model.prepare_bucket(bucket)

    def host_prep(self, batch: Any, bucket: int) -> None:
        self.model.host_prep(batch, bucket)

    def graph_prep(self, bucket: int) -> None:
        self.model.graph_prep(bucket)

    def forward(self, bucket: int) -> Any:
        return self.model.forward(bucket)
