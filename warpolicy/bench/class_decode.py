"""What the one-bucket decodes that declare per buffer class share (`warpolicy.bench.hybrid`,
`warpolicy.bench.page_reuse`): the `ModelAdapter` parts of a decode whose one bucket is the
batch, and the `AuditSubject` whose runner decides the declaration per class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
import torch

from warpolicy.audit.subject import AuditSubject
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.release import class_policy_fns
from warpolicy.runtime.runners import DecodeRunner

DECODE = ForwardMode.DECODE


def positive(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    """attrs validator: a size of at least one."""
    if value < 1:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


class BatchSized(Protocol):
    """A decode's sizes: its one bucket is the batch."""

    @property
    def batch(self) -> int: ...


class OneBucketDecode:
    """The `ModelAdapter` parts a one-bucket decode shares: its bucket is ``cfg.batch``, the
    host prep stages the batch's request ids into the bucket's static ``req`` (padded with
    request 0), and its buffer classes are the subclass's `BUFFER_CLASSES`."""

    BUFFER_CLASSES: Mapping[str, str]
    cfg: BatchSized
    _buckets: dict[int, dict[str, torch.Tensor]]

    @property
    def buffer_classes(self) -> Mapping[str, str]:
        """Which class each shared buffer belongs to (the class self-check walks by it)."""
        return self.BUFFER_CLASSES

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return (self.cfg.batch,) if mode is DECODE else ()

    def batch_size(self, batch: torch.Tensor) -> int:
        return int(batch.shape[0])

    def host_prep(self, batch: torch.Tensor, bucket: int) -> None:
        static = self._buckets[bucket]["req"]
        n = int(batch.shape[0])
        static[:n].copy_(batch, non_blocking=True)
        if n < bucket:
            static[n:].fill_(0)


def class_decode_subject(
    platform: Platform,
    model: Any,
    classes: Mapping[str, WarReadDonePolicy],
    buffer_classes: Mapping[str, str],
    *,
    name: str,
    self_check: str = "warn",
) -> AuditSubject:
    """The `AuditSubject` of ``model`` (a one-bucket decode that writes per class), its runner
    deciding ``classes`` per class (the cell: the latest class) with the marker self-check
    ``self_check``."""
    classes = dict(classes)
    cell, per_class = class_policy_fns(classes)

    def runner(m: Any) -> DecodeRunner:
        return DecodeRunner(
            m,
            cell,
            platform,
            f"{name}:decode",
            keep_graphs=True,
            class_policies=per_class,
            self_check=self_check,
        )

    return AuditSubject(
        name=name,
        model=model,
        runners={DECODE: runner},
        make_batch=model.make_batch,
        platform=platform,
        declared={DECODE: max(classes.values())},
        spec="none",
        extra_outputs=model.extra_outputs,
        declared_classes={DECODE: classes},
        buffer_classes=buffer_classes,
    )


__all__ = ["BatchSized", "OneBucketDecode", "class_decode_subject", "positive"]
