"""Small audit subjects shared by the audit tests (not a test module).

`TableModel`: the in-graph prep gathers ``table[rows]`` (the shared buffer); the forward doubles
what the prep gathered. `table_subject` wraps it for the simulated platform; its post step can
reread the live table from some trial on (a reader after every release point).
"""

from __future__ import annotations

import attrs
import torch

from warpolicy.audit import AuditSubject
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, WarReadDonePolicy
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing import sim_platform

BUCKETS = (2, 4)


@attrs.frozen
class TrialBatch:
    trial: int
    rows: torch.Tensor  # indices into the shared table


def trial_rows(trial: int) -> torch.Tensor:
    """Even trials fill bucket 2, odd trials bucket 4: two trials replay every bucket."""
    n = BUCKETS[trial % 2]
    return torch.tensor([(trial + 3 * i) % 10 for i in range(n)])


class TableModel:
    """Prep gathers ``table[rows]`` in-graph; the forward returns twice that."""

    def __init__(self, fail: bool = False) -> None:
        self.table = torch.arange(10, 20, dtype=torch.long)
        self.shared_buffers = {"table": self.table}
        self.static: dict[int, dict] = {}
        self.fail = fail

    def bucket_sizes(self, mode):
        return BUCKETS

    def batch_size(self, batch: TrialBatch) -> int:
        return int(batch.rows.numel())

    def prepare_bucket(self, bucket: int) -> None:
        self.static.setdefault(
            bucket,
            {
                "rows": torch.zeros(bucket, dtype=torch.long),
                "snap": torch.zeros(bucket, dtype=torch.long),
                "out": torch.zeros(bucket),
            },
        )

    def host_prep(self, batch: TrialBatch, bucket: int) -> None:
        s = self.static[bucket]
        n = batch.rows.numel()
        s["rows"][:n].copy_(batch.rows)
        s["rows"][n:].zero_()

    def graph_prep(self, bucket: int) -> None:
        s = self.static[bucket]
        torch.index_select(self.table, 0, s["rows"], out=s["snap"])

    def forward(self, bucket: int) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("boom in forward")
        s = self.static[bucket]
        s["out"].copy_(s["snap"].float() * 2)
        return s["out"]


class KVModel(TableModel):
    """Also writes a KV pool: at the slots its prep gathered, or (``late``) at slots it rereads
    from the live table after the release. The returned output never shows where it wrote."""

    def __init__(self, late: bool) -> None:
        super().__init__()
        self.late = late
        self.kv = torch.zeros(32)

    def forward(self, bucket: int) -> torch.Tensor:
        out = super().forward(bucket)
        s = self.static[bucket]
        slots = self.table.index_select(0, s["rows"]) if self.late else s["snap"]
        self.kv.index_fill_(0, slots, 1.0)
        return out


class CountingModel(TableModel):
    """Its forward reads, then bumps, a shared step counter (state the forward writes)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = torch.zeros(1)
        self.shared_buffers = {"table": self.table, "count": self.count}

    def forward(self, bucket: int) -> torch.Tensor:
        out = super().forward(bucket)
        out.add_(self.count)
        self.count.add_(1)
        return out


def fixed(policy: WarReadDonePolicy):
    return lambda mode, eager, planted: policy


def table_subject(
    policy: WarReadDonePolicy = IN_GRAPH,
    *,
    late_from: int | None = None,
    declared: WarReadDonePolicy | None = None,
    fail: bool = False,
    platform=None,
    model=None,
    runner_cls=DecodeRunner,
    **extra,
) -> AuditSubject:
    platform = platform or sim_platform()
    model = model or TableModel(fail=fail)

    def make_batch(mode, trial):
        return TrialBatch(trial, trial_rows(trial))

    def post_step(mode, batch, out):
        if late_from is not None and batch.trial >= late_from:
            return out + model.table[: out.shape[0]].float()  # reads the live table
        return out.clone()

    return AuditSubject(
        name="table",
        model=model,
        platform=platform,
        make_batch=make_batch,
        runners={"decode": lambda m: runner_cls(m, fixed(policy), platform)},
        declared={"decode": declared if declared is not None else policy},
        post_step=post_step,
        **extra,
    )


class RenamedPlatform(Platform):
    """The simulated platform under another name: to the audit, a real (non-simulated)
    platform, so its GPU code path runs on CPU tensors in program order."""

    def __init__(self, inner: Platform, name: str) -> None:
        impl = inner.impl
        impl.name = name  # the simulated implementation, renamed (``inner`` is used up)
        super().__init__(impl)


class DroppingRunner(DecodeRunner):
    """Publishes on odd runs only: every second step leaves the scheduler nothing to wait on
    (it falls back to the coarse barrier), so a poisoned step never races."""

    runs = 0

    def run(self, batch):
        out = super().run(batch)
        self.runs += 1
        if self.runs % 2 == 0:
            self.fence.take()  # the scheduler's take comes back empty
        return out


__all__ = [
    "BUCKETS",
    "CountingModel",
    "DroppingRunner",
    "KVModel",
    "POST_REPLAY",
    "RenamedPlatform",
    "TableModel",
    "TrialBatch",
    "fixed",
    "table_subject",
    "trial_rows",
]
