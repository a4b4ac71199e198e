"""Positive controls for the audit's poisons: the two late readers 0.2's ``x + 1`` missed.

On the H200 a late page-table rebuild on SGLang's kernels passed the dynamic audit 0/30: the
poison ``(x + 1) mod (max + 1)`` maps the only length of a one-request batch to 0 (the rebuild
then rewrites nothing and the table keeps the values the in-graph prep wrote), and leaves
``x // page_size`` unchanged on every page-aligned request-to-token entry (the rebuild writes
the same pages). Each control here is that rebuild, reduced to one of the two misses, in plain
torch (no wheel, no triton), so it runs on the simulated platform and on CUDA alike:

* ``lone_length``: one-request batches; the scheduler writes ``seq_lens`` (shared) and the
  request-to-token table (shared); the in-graph prep snapshots the length and gathers the
  request's token slots into ``kv_indices`` (page size 1, the shape of SGLang's
  ``create_flashinfer_kv_indices_triton``); after the marker a late rebuild rewrites the live
  prefix ``kv_indices[:seq_lens]`` from the *live* tables. ``x + 1`` gives the lone length 0.
* ``page_aligned``: batches of 1-4 requests, lengths private (copied before replay), the table
  shared; the prep builds ``page_table[i, p] = req_to_token[row_i, p * 64] // 64`` (the shape
  of ``build_trtllm_mha_page_table``), and after the marker a late rebuild does it again from
  the live table. Every entry read is a page start, so ``x + 1`` changes no page.

The forward then sums a value per token slot over each request's tokens (through the rebuilt
table), so a rebuild that read poison changes the output. ``late=False`` is the same model
without the late rebuild: the audit must find it SAFE (no false alarm). `control_subject`
builds the `AuditSubject`; `controls` / `safe_controls` are ``--factory`` callables::

    warpolicy audit --factory warpolicy.conformance.controls:controls --device fake
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from warpolicy.audit.poison import PoisonSpec
from warpolicy.audit.subject import AuditSubject
from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode, WarReadDonePolicy
from warpolicy.runtime.runners import DecodeRunner

DECODE = ForwardMode.DECODE
#: The two controls.
KINDS = ("lone_length", "page_aligned")


@attrs.frozen
class ControlConfig:
    """Sizes of one control (small: the audit runs many trials)."""

    kind: str
    page_size: int  # 1: token slots (kv indices); 64: pages
    buckets: tuple[int, ...]
    share_lengths: bool  # seq_lens written by the scheduler (shared) or copied before replay
    requests: int = 4
    context: int = 256  # tokens per request row (whole pages)
    seed: int = 0

    @property
    def columns(self) -> int:
        return self.context // self.page_size


CONFIGS: Mapping[str, ControlConfig] = {
    "lone_length": ControlConfig("lone_length", 1, (1,), share_lengths=True),
    "page_aligned": ControlConfig("page_aligned", 64, (2, 4), share_lengths=False),
}


@attrs.frozen(eq=False)
class ControlBatch:
    rows: torch.Tensor  # request rows of req_to_token, int64 [n]
    lengths: torch.Tensor  # seq_lens, int64 [n]


class _Bucket:
    def __init__(self, bs: int, cfg: ControlConfig, device: torch.device) -> None:
        self.rows = torch.zeros(bs, dtype=torch.int64, device=device)
        self.lengths = torch.ones(bs, dtype=torch.int64, device=device)  # private copy
        self.cache_seqlens = torch.ones(bs, dtype=torch.int64, device=device)  # prep's snapshot
        self.table = torch.zeros(bs, cfg.columns, dtype=torch.int64, device=device)
        self.out = torch.zeros(bs, device=device)


class PageTableControl:
    """The `ModelAdapter` of one control (see the module doc)."""

    def __init__(self, cfg: ControlConfig, device: Any = "cpu", *, late: bool = True) -> None:
        self.cfg = cfg
        self.late = late
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(cfg.seed)
        page = 64  # the pool is paged whatever the control's table granularity
        per_row = cfg.context // page
        pool_pages = 1 + cfg.requests * per_row + 2  # page 0 is the padding sink
        pages = torch.randperm(pool_pages - 1, generator=g)[: cfg.requests * per_row] + 1
        rows = (pages.view(cfg.requests, per_row, 1) * page + torch.arange(page)).view(
            cfg.requests, cfg.context
        )
        table = torch.zeros(cfg.requests + 1, cfg.context, dtype=torch.int64)
        table[1:] = rows  # whole pages: the largest slot ends a page, so it is never read
        self.req_to_token = table.to(self.device)
        self.seq_lens = torch.ones(max(cfg.buckets), dtype=torch.int64, device=self.device)
        self.values = torch.randn(pool_pages * page, generator=g).to(self.device)
        self.weights = (1.0 / torch.arange(1, cfg.context + 1, dtype=torch.float32)).to(self.device)
        self.shared_buffers: dict[str, torch.Tensor] = {"req_to_token": self.req_to_token}
        if cfg.share_lengths:
            self.shared_buffers["seq_lens"] = self.seq_lens
        self.static: dict[int, _Bucket] = {}

    # -- ModelAdapter ------------------------------------------------------------------------

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return self.cfg.buckets if ForwardMode.parse(mode) == DECODE else ()

    def batch_size(self, batch: ControlBatch) -> int:
        return int(batch.rows.numel())

    def prepare_bucket(self, bucket: int) -> None:
        if bucket not in self.static:
            self.static[bucket] = _Bucket(bucket, self.cfg, self.device)

    def host_prep(self, batch: ControlBatch, bucket: int) -> None:
        s = self.static[bucket]
        n = self.batch_size(batch)
        s.rows[:n].copy_(batch.rows)
        s.rows[n:].zero_()  # padding: row 0, length 1
        if not self.cfg.share_lengths:
            s.lengths[:n].copy_(batch.lengths)
            s.lengths[n:].fill_(1)

    def graph_prep(self, bucket: int) -> None:
        s = self.static[bucket]
        s.cache_seqlens.copy_(self._lengths(bucket))
        self._rebuild(s, s.cache_seqlens)

    def forward(self, bucket: int) -> torch.Tensor:
        s = self.static[bucket]
        if self.late:  # the late rebuild: the live tables, after the marker
            self._rebuild(s, self._lengths(bucket))
        cfg = self.cfg
        pos = torch.arange(cfg.context, device=self.device)
        slots = s.table[:, pos // cfg.page_size] * cfg.page_size + pos % cfg.page_size
        live = pos[None, :] < s.cache_seqlens[:, None]
        contrib = self.values[slots.clamp(0, self.values.numel() - 1)] * self.weights
        s.out.copy_(torch.where(live, contrib, torch.zeros_like(contrib)).sum(dim=1))
        return s.out

    # -- the shared reads --------------------------------------------------------------------

    def _lengths(self, bucket: int) -> torch.Tensor:
        if self.cfg.share_lengths:
            return self.seq_lens[:bucket]
        return self.static[bucket].lengths

    def _rebuild(self, s: _Bucket, lengths: torch.Tensor) -> None:
        """``table[i, c] = req_to_token[row_i, c * P] // P`` for the live columns only (those
        past ``cdiv(length, P)`` keep their values, as SGLang's kernels do)."""
        cfg = self.cfg
        cols = torch.arange(cfg.columns, device=self.device)
        entries = self.req_to_token.index_select(0, s.rows)[:, cols * cfg.page_size]
        live = cols[None, :] < (lengths[:, None] + cfg.page_size - 1) // cfg.page_size
        s.table.copy_(torch.where(live, entries // cfg.page_size, s.table))

    # -- batches -----------------------------------------------------------------------------

    def make_batch(self, mode: ForwardMode, trial: int) -> ControlBatch:
        """Trial ``t`` fits bucket ``t mod len(buckets)`` (and no smaller one); the scheduler's
        write of the shared lengths happens here."""
        cfg = self.cfg
        g = torch.Generator().manual_seed(zlib.crc32(f"{cfg.kind}:{trial}".encode()))
        k = trial % len(cfg.buckets)
        low = cfg.buckets[k - 1] if k else 0
        n = int(torch.randint(low + 1, cfg.buckets[k] + 1, (1,), generator=g))
        rows = torch.randperm(cfg.requests, generator=g)[:n] + 1
        lengths = torch.randint(2, cfg.context + 1, (n,), generator=g)
        batch = ControlBatch(rows.to(self.device), lengths.to(self.device))
        if cfg.share_lengths:
            self.seq_lens.fill_(1)
            self.seq_lens[:n].copy_(batch.lengths)
        return batch


def control_subject(
    kind: str,
    platform: Any,
    *,
    late: bool = True,
    poison: Mapping[str, PoisonSpec] | None = None,
) -> AuditSubject:
    """The `AuditSubject` of control ``kind`` (``lone_length`` or ``page_aligned``), declared
    ``in_graph``; ``poison`` overrides the audit's default poisons (e.g. 0.2's ``plus_one``)."""
    if kind not in CONFIGS:
        raise ValueError(f"unknown control {kind!r}; known: {', '.join(KINDS)}")
    device = torch.device(platform.device) if platform.name == "cuda" else torch.device("cpu")
    model = PageTableControl(CONFIGS[kind], device, late=late)

    def policy(mode: ForwardMode, eager: bool, planted: bool) -> WarReadDonePolicy:
        return IN_GRAPH  # the runner demotes an unplanted or eager step itself

    def runner(m: Any) -> DecodeRunner:
        # the audit judges the declaration: no self-check demotes it behind the audit's back
        return DecodeRunner(
            m, policy, platform, f"control:{kind}", keep_graphs=True, self_check="off"
        )

    return AuditSubject(
        name=f"control:{kind}" + ("" if late else ":safe"),
        model=model,
        runners={DECODE: runner},
        make_batch=model.make_batch,
        platform=platform,
        declared={DECODE: IN_GRAPH},
        poison=dict(poison or {}),
    )


def controls(platform: Any) -> list[AuditSubject]:
    """``--factory`` callable: both controls with their late rebuild (each must be UNSAFE)."""
    return [control_subject(kind, platform) for kind in KINDS]


def safe_controls(platform: Any) -> list[AuditSubject]:
    """``--factory`` callable: both controls without the late rebuild (each must be SAFE)."""
    return [control_subject(kind, platform, late=False) for kind in KINDS]


__all__ = [
    "CONFIGS",
    "KINDS",
    "ControlBatch",
    "ControlConfig",
    "PageTableControl",
    "control_subject",
    "controls",
    "safe_controls",
]
