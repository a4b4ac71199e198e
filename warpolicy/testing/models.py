"""`RecModel`: a recording `ModelAdapter` for testing runners, loops, observers and backends."""

from __future__ import annotations

from typing import Any, Optional, Sequence

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

    def __init__(
        self, buckets: Sequence[int] = (1, 2, 4, 8), events: Optional[list] = None
    ) -> None:
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


__all__ = ["RecModel"]
