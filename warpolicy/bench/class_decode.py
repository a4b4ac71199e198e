"""What the one-bucket decodes that declare per buffer class share (`warpolicy.bench.hybrid`,
`warpolicy.bench.page_reuse`): the `ModelAdapter` parts of a decode whose one bucket is the
batch, the attention and feed-forward layers they both run, and the `AuditSubject` whose
runner decides the declaration per class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs
import torch

from warpolicy.audit.subject import AuditSubject
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.canary import CanarySpec
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.release import class_policy_fns
from warpolicy.runtime.runners import DecodeRunner

DECODE = ForwardMode.DECODE


def positive(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    """attrs validator: a size of at least one."""
    if value < 1:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


class DecodeSizes(Protocol):
    """A decode's sizes: its one bucket is the batch; each request attends over ``ctx`` KV
    rows of ``hidden`` values."""

    @property
    def batch(self) -> int: ...

    @property
    def ctx(self) -> int: ...

    @property
    def hidden(self) -> int: ...


class OneBucketDecode:
    """The `ModelAdapter` parts a one-bucket decode shares: its bucket is ``cfg.batch``, the
    host prep stages the batch's request ids into the bucket's static ``req`` (padded with
    request 0), its buffer classes are the subclass's `BUFFER_CLASSES`, every shared buffer is
    a canary input, and its layers (`attend`, `feed_forward`) use the subclass's weights."""

    BUFFER_CLASSES: Mapping[str, str]
    cfg: DecodeSizes
    _buckets: dict[int, dict[str, torch.Tensor]]
    # the weights the subclass builds: KV rows, and per layer the mix and feed-forward weights
    kv: torch.Tensor
    w_mix: list[torch.Tensor]
    w_up: list[torch.Tensor]
    w_down: list[torch.Tensor]

    @property
    def shared_buffers(self) -> Mapping[str, torch.Tensor]:
        raise NotImplementedError

    def attend(
        self,
        layer: int,
        x: torch.Tensor,
        locs: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Layer ``layer``'s attention of ``x`` (one row per request) over the KV rows at
        ``locs`` (``ctx`` per request, flat), mixed back into ``x``; ``mask`` (per request and
        position) hides the positions past a request's length."""
        k = self.kv.index_select(0, locs).view(x.shape[0], self.cfg.ctx, -1)
        scores = torch.bmm(k, x.unsqueeze(-1)).squeeze(-1) * (1.0 / math.sqrt(self.cfg.hidden))
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)
        p = torch.softmax(scores, dim=-1)
        a = torch.bmm(p.unsqueeze(1), k).squeeze(1)
        return x + torch.tanh(a @ self.w_mix[layer])

    def feed_forward(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s feed-forward, added to ``x`` (scaled down: many layers stay
        bounded)."""
        return x + torch.relu(x @ self.w_up[layer]) @ self.w_down[layer] * 0.1

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> CanarySpec:
        """Every shared buffer as the step's inputs (saved before it, put back for the replay,
        the live contents restored after); only the output is compared (state the step and
        the scheduler both write would read as a difference after a sound release)."""
        return CanarySpec(inputs=self.shared_buffers)

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


__all__ = ["DecodeSizes", "OneBucketDecode", "class_decode_subject", "positive"]
