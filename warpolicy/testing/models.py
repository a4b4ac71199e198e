"""`RecModel`: a recording `ModelAdapter` for testing runners, loops, observers and backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from warpolicy.registry.vocabulary import ForwardMode


def _torch() -> Any:
    import torch  # noqa: PLC0415 - deferred: warpolicy.testing imports without torch

    return torch


class RecModel:
    """A recording adapter on CPU tensors: static input ``x`` per bucket, output
    ``x * 2 + table[0]`` (``table`` is the shared buffer the in-graph prep reads).

    ``events`` records every call (``("bucket_sizes", mode)``, ``("host_prep", len, bucket)``,
    ``("graph_prep", bucket)``, ``("forward", bucket)``); pass a list to merge it with the
    simulated platform's call log (``sim_impl(platform).listeners.append(events.append)``).
    """

    def __init__(self, buckets: Sequence[int] = (1, 2, 4, 8), events: list | None = None) -> None:
        torch = _torch()
        self.buckets = tuple(buckets)
        self.events: list = events if events is not None else []
        self.table = torch.zeros(4)
        self.shared_buffers = {"table": self.table}
        self.x: dict[int, Any] = {}
        self.out: dict[int, Any] = {}
        self.prepared: list[int] = []
        self.seen = 0.0

    def bucket_sizes(self, mode: ForwardMode) -> tuple[int, ...]:
        self.events.append(("bucket_sizes", mode))
        return self.buckets

    def prepare_bucket(self, bucket: int) -> None:
        torch = _torch()
        self.prepared.append(bucket)
        self.x.setdefault(bucket, torch.zeros(bucket))
        self.out.setdefault(bucket, torch.zeros(bucket))

    def host_prep(self, batch: Sequence[float], bucket: int) -> None:
        torch = _torch()
        self.events.append(("host_prep", len(batch), bucket))
        x = self.x[bucket]
        x[: len(batch)] = torch.tensor(batch, dtype=x.dtype)
        x[len(batch) :] = -1.0  # padding

    def graph_prep(self, bucket: int) -> None:
        self.events.append(("graph_prep", bucket))
        self.seen = float(self.table[0])

    def forward(self, bucket: int) -> Any:
        torch = _torch()
        self.events.append(("forward", bucket))
        torch.mul(self.x[bucket], 2, out=self.out[bucket])
        self.out[bucket] += self.seen
        return self.out[bucket]


class ClassMarkModel:
    """A `ModelAdapter` of a hybrid forward on the simulated platform that stamps its reads of
    each buffer class (`SimPlatform.mark`): the in-graph prep reads ``metadata``, every layer
    reads ``recurrent_state`` until the last. ``marks`` keeps ``(label, Mark)`` of executed
    steps only (replays), so a test can ask the platform's happens-before model whether a
    scheduler write of a class (marked on the schedule stream) came after every read of it.
    """

    def __init__(self, platform: Any, layers: int = 3, buckets: Sequence[int] = (2,)) -> None:
        self.platform = platform
        self.impl = platform.impl
        self.layers = layers
        self.buckets = tuple(buckets)
        self.shared_buffers: dict[str, Any] = {}
        self.marks: list[tuple[str, Any]] = []

    def bucket_sizes(self, mode: ForwardMode) -> tuple[int, ...]:
        return self.buckets

    def prepare_bucket(self, bucket: int) -> None:
        return None

    def host_prep(self, batch: Any, bucket: int) -> None:
        return None

    def _mark(self, label: str) -> None:
        mark = self.impl.mark(label)
        if mark.executed:
            self.marks.append((label, mark))

    def graph_prep(self, bucket: int) -> None:
        self._mark("read:metadata")

    def forward(self, bucket: int) -> Any:
        for _ in range(self.layers):
            self._mark("read:recurrent_state")
        return bucket

    def reads(self, label: str) -> list[Any]:
        """The executed marks of ``read:CLASS``."""
        return [m for name, m in self.marks if name == label]


__all__ = ["ClassMarkModel", "RecModel"]
