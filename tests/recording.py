"""`RecModel`: a recording `ModelAdapter` the runner, overlap, NVTX and metrics tests share."""

from __future__ import annotations

import torch

from warpolicy.registry.vocabulary import ForwardMode


class RecModel:
    """A recording adapter: static input ``x`` per bucket, output ``x * 2 + table[0]``."""

    def __init__(self, buckets=(1, 2, 4, 8), events: list | None = None) -> None:
        self.buckets = tuple(buckets)
        self.events = events if events is not None else []
        self.table = torch.zeros(4)
        self.shared_buffers = {"table": self.table}
        self.x: dict[int, torch.Tensor] = {}
        self.out: dict[int, torch.Tensor] = {}
        self.prepared: list[int] = []

    def bucket_sizes(self, mode: ForwardMode):
        self.events.append(("bucket_sizes", mode))
        return self.buckets

    def prepare_bucket(self, bucket: int) -> None:
        self.prepared.append(bucket)
        self.x.setdefault(bucket, torch.zeros(bucket))
        self.out.setdefault(bucket, torch.zeros(bucket))

    def host_prep(self, batch, bucket: int) -> None:
        self.events.append(("host_prep", len(batch), bucket))
        x = self.x[bucket]
        x[: len(batch)] = torch.tensor(batch, dtype=x.dtype)
        x[len(batch) :] = -1.0  # padding

    def graph_prep(self, bucket: int) -> None:
        self.events.append(("graph_prep", bucket))
        self.seen = float(self.table[0])

    def forward(self, bucket: int):
        self.events.append(("forward", bucket))
        torch.mul(self.x[bucket], 2, out=self.out[bucket])
        self.out[bucket] += self.seen
        return self.out[bucket]
