"""Small factories for ``bench overlap --factory`` on the simulated platform (not a test module).

`writer`: a paged-table model whose ``make_batch`` is the scheduler: it rewrites the table rows
of the step's requests (half of them shared with the previous step) before returning the batch,
as a serving engine's scheduler does. `reader`: the same model, but ``make_batch`` writes
nothing shared. `two`: both subjects from one factory. Each works with ``audit --factory`` too.
"""

from __future__ import annotations

import torch

from warpolicy.audit import AuditSubject
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner

BUCKETS = (2, 4)
ROWS, WIDTH = 8, 4


class TableModel:
    """``graph_prep`` gathers the step's table rows (shared), ``forward`` sums them with a
    private weight and writes a KV slot per token (``kv``, an extra output)."""

    def __init__(self, writes: bool) -> None:
        self.writes = writes
        self.table = torch.arange(ROWS * WIDTH, dtype=torch.float32).view(ROWS, WIDTH)
        self.weight = torch.ones(WIDTH)
        self.kv = torch.zeros(64)
        self.shared_buffers = {"table": self.table}
        self.static: dict[int, dict[str, torch.Tensor]] = {}

    def bucket_sizes(self, mode):
        return BUCKETS if ForwardMode.parse(mode) is ForwardMode.DECODE else ()

    def batch_size(self, batch: torch.Tensor) -> int:
        return int(batch.shape[0])

    def prepare_bucket(self, bucket: int) -> None:
        self.static.setdefault(
            bucket,
            {
                "rows": torch.zeros(bucket, dtype=torch.long),
                "gathered": torch.zeros(bucket, WIDTH),
                "out": torch.zeros(bucket),
            },
        )

    def host_prep(self, batch: torch.Tensor, bucket: int) -> None:
        s = self.static[bucket]
        n = int(batch.shape[0])
        s["rows"][:n].copy_(batch)
        s["rows"][n:].zero_()

    def graph_prep(self, bucket: int) -> None:
        s = self.static[bucket]
        torch.index_select(self.table, 0, s["rows"], out=s["gathered"])

    def forward(self, bucket: int) -> torch.Tensor:
        s = self.static[bucket]
        torch.matmul(s["gathered"], self.weight, out=s["out"])
        self.kv.index_copy_(0, s["rows"], s["out"])
        return s["out"]

    def make_batch(self, mode, step: int) -> torch.Tensor:
        n = BUCKETS[step % len(BUCKETS)]
        rows = (torch.arange(n) + step * max(n // 2, 1)) % ROWS
        if self.writes:  # the scheduler's next-batch writes: fresh table rows
            self.table.index_copy_(0, rows, torch.full((n, WIDTH), float(step)) + rows[:, None])
        return rows


def _subject(name: str, writes: bool, platform) -> AuditSubject:
    model = TableModel(writes)
    return AuditSubject(
        name=name,
        model=model,
        runners={ForwardMode.DECODE: lambda m: DecodeRunner(m, fixed_policy("in_graph"), platform)},
        make_batch=model.make_batch,
        platform=platform,
        extra_outputs={"kv": model.kv},
    )


def writer(platform) -> AuditSubject:
    return _subject("writer", True, platform)


def reader(platform) -> AuditSubject:
    return _subject("reader", False, platform)


def two(platform) -> list[AuditSubject]:
    return [writer(platform), reader(platform)]


def broken(platform) -> AuditSubject:
    raise RuntimeError("the model did not load")
