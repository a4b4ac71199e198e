"""A decode whose scheduler reuses freed KV pages, for ``bench overlap --factory
warpolicy.bench.page_reuse:decode`` and ``audit --factory``.

Every step retires ``new_per_step`` requests and admits new ones in their request slots. Their
KV pages are freed through `warpolicy.runtime.lifetimes.DeferredFrees` with the read-done of the
step in flight (the last step that may read them), and the new requests get pages reclaimed
from earlier steps (``reclaim(before_step=...)``: events that have long fired, so no stall);
the scheduler writes the new requests' ``req_to_token`` rows (``metadata``) and their pages'
contents (``kv_pages``: what a KV transfer or cache load-back writes on a side stream), all on
its schedule stream. The forward's in-graph prep gathers the page table (``metadata`` reads
end there); every attention layer reads the pages (``kv_pages`` reads last the whole forward).

So the page writes need no barrier of their own: the deferred free orders them after the
reads of the step that freed the pages, and the metadata class's read-done releases the
scheduler at the end of the prep. A declaration that omits ``kv_pages`` hands the deferred free
the prep's read-done instead. In this schedule that races nothing (on an H100 the ``omit:kv_pages``
row corrupts no step): a group is reclaimed a step after its free, when even the prep's read-done
of the step that read it has long fired. The class's read-done is what a scheduler short of
pages relies on (it reclaims the newest group, ordered after that event), so the benchmark
shows the omitted row without judging it (`warpolicy.bench.overlap_classes.class_targets`).

What the deferred frees held is reported (`PageReuseDecode.lifetime_stats`): at most the
pages of the steps in flight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from warpolicy.audit.subject import AuditSubject
from warpolicy.bench.class_decode import OneBucketDecode, class_decode_subject, positive
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, ForwardMode, WarReadDonePolicy
from warpolicy.runtime.lifetimes import DeferredFrees, LifetimeStats
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.release import ReadDone

DECODE = ForwardMode.DECODE

#: What the shape's reads really are, per class.
DECLARED_CLASSES: Mapping[str, WarReadDonePolicy] = {
    "metadata": IN_GRAPH,
    "kv_pages": POST_REPLAY,
}

#: Pinned rows for the new requests' page tables: one per step, more than a run's steps (a
#: reused row first waits for everything).
STAGING_ROWS = 512

#: Which class each shared buffer belongs to.
BUFFER_CLASSES: Mapping[str, str] = {"req_to_token": "metadata", "kv": "kv_pages"}


@attrs.frozen
class PageReuseConfig:
    """Sizes of the page-reuse decode."""

    hidden: int = attrs.field(default=1024, validator=positive)
    ffn: int = attrs.field(default=4096, validator=positive)
    layers: int = attrs.field(default=8, validator=positive)
    batch: int = attrs.field(default=32, validator=positive)
    page: int = attrs.field(default=16, validator=positive)  # tokens per page
    pages_per_request: int = attrs.field(default=16, validator=positive)
    new_per_step: int = attrs.field(default=4, validator=positive)
    seed: int = 0

    @property
    def ctx(self) -> int:
        return self.page * self.pages_per_request

    @property
    def spare_pages(self) -> int:
        """Pages beyond the live requests': three steps of churn (two may be held)."""
        return 3 * self.new_per_step * self.pages_per_request

    @property
    def pages(self) -> int:
        return self.batch * self.pages_per_request + self.spare_pages


class PageReuseDecode(OneBucketDecode):
    """The page-reuse decode as a `ModelAdapter` (one bucket: ``batch``) whose scheduler
    writes per class (`warpolicy.bench.overlap_classes.ClassScheduled`)."""

    BUFFER_CLASSES = BUFFER_CLASSES
    cfg: PageReuseConfig

    def __init__(self, cfg: PageReuseConfig, device: Any, platform: Platform) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.platform = platform
        gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
        scale = 1.0 / math.sqrt(cfg.hidden)

        def weight(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(self.device)

        h, b = cfg.hidden, cfg.batch
        self.embed = weight(b, h) * math.sqrt(h)
        self.w_mix = [weight(h, h) for _ in range(cfg.layers)]
        self.w_up = [weight(h, cfg.ffn) for _ in range(cfg.layers)]
        self.w_down = [weight(cfg.ffn, h) * math.sqrt(h / cfg.ffn) for _ in range(cfg.layers)]
        self.kv = torch.randn(cfg.pages * cfg.page, h, generator=gen).to(self.device)
        self.req_to_token = torch.zeros(b, cfg.ctx, dtype=torch.int64, device=self.device)
        self._initial_pages = [
            list(range(r * cfg.pages_per_request, (r + 1) * cfg.pages_per_request))
            for r in range(b)
        ]
        self.req_to_token.copy_(self._slots(self._initial_pages))
        self._buckets: dict[int, dict[str, torch.Tensor]] = {}
        self._values: dict[int, torch.Tensor] = {}
        # the new requests' page tables, written by the host into pinned rows (one per step of
        # a run, never reused within it) and copied to the device on the schedule stream
        self._staging = torch.zeros(STAGING_ROWS, cfg.new_per_step, cfg.ctx, dtype=torch.int64)
        if self.device.type == "cuda":
            self._staging = self._staging.pin_memory()
        self.frees: DeferredFrees[int] = DeferredFrees(platform, "kv page frees")
        self._reset_pages()

    # -- pages ----------------------------------------------------------------------------------

    def _slots(self, pages: Sequence[Sequence[int]]) -> torch.Tensor:
        page = self.cfg.page
        rows = [[p * page + t for p in row for t in range(page)] for row in pages]
        return torch.tensor(rows, dtype=torch.int64)

    def _reset_pages(self) -> None:
        """A run's start (step 0, the device idle): the pages as the model was built."""
        cfg = self.cfg
        self.row_pages = [list(p) for p in self._initial_pages]
        self.free_pages = list(range(cfg.batch * cfg.pages_per_request, cfg.pages))
        self.frees.settle()

    def _allocate(self, count: int, step: int, stream: Any) -> list[int]:
        """``count`` pages for step ``step``: every group freed before this step is reclaimed
        (ordered on ``stream`` after events that have fired: the step before's reads ended
        before the step in flight began), so at most the groups of the steps in flight stay
        held; short of pages, every group whose event is known, and last the coarse point (a
        host synchronize)."""
        self.free_pages += self.frees.reclaim(stream, before_step=step)  # every step: bounded
        if len(self.free_pages) < count:
            self.free_pages += self.frees.reclaim(stream)
        if len(self.free_pages) < count:
            self.platform.synchronize()
            self.free_pages += self.frees.settle()
        pages, self.free_pages = self.free_pages[:count], self.free_pages[count:]
        return pages

    def lifetime_stats(self) -> Mapping[str, LifetimeStats]:
        """What the deferred frees held (now and at most) and did."""
        return {"kv pages": self.frees.stats}

    # -- ModelAdapter ---------------------------------------------------------------------------

    @property
    def shared_buffers(self) -> Mapping[str, torch.Tensor]:
        return {"req_to_token": self.req_to_token, "kv": self.kv}

    @property
    def extra_outputs(self) -> Mapping[str, torch.Tensor]:
        return {}

    def prepare_bucket(self, bucket: int) -> None:
        if bucket in self._buckets:
            return
        cfg, dev = self.cfg, self.device
        self._buckets[bucket] = {
            "req": torch.zeros(bucket, dtype=torch.int64, device=dev),
            "locs": torch.zeros(bucket, cfg.ctx, dtype=torch.int64, device=dev),
            "out": torch.zeros(bucket, cfg.hidden, device=dev),
        }

    def graph_prep(self, bucket: int) -> None:
        """The in-graph metadata prep: the page table gathered once."""
        s = self._buckets[bucket]
        s["locs"].copy_(self.req_to_token.index_select(0, s["req"]))

    def forward(self, bucket: int) -> torch.Tensor:
        s = self._buckets[bucket]
        x = self.embed.index_select(0, s["req"] % self.cfg.batch)
        locs = s["locs"].reshape(-1)
        for layer in range(self.cfg.layers):  # every layer reads the pages
            x = self.feed_forward(layer, self.attend(layer, x, locs))
        s["out"].copy_(x)
        return s["out"]

    # -- the scheduler --------------------------------------------------------------------------

    def write_classes(self) -> tuple[str, ...]:
        """One class of writes: the page contents go with the page table, ordered by the
        deferred frees (never after a barrier of their own)."""
        return ("metadata",)

    def batch_of(self, step: int) -> torch.Tensor:
        return torch.arange(self.cfg.batch, device=self.device)

    def write_class(
        self,
        buffer_class: str,
        step: int,
        read_done: ReadDone | None = None,
        *,
        ordered: bool = False,
    ) -> None:
        """Step ``step``'s writes on the current stream. ``read_done``: the read-done of the
        step in flight (None: unknown, so its pages are held until a coarse point, unless
        ``ordered``: the sequential path, writes on the readers' own stream)."""
        if buffer_class != "metadata":
            raise ValueError(f"the page-reuse decode writes no {buffer_class!r} on its own")
        if step == 0:
            self._reset_pages()
            return
        cfg = self.cfg
        rows = [(step * cfg.new_per_step + i) % cfg.batch for i in range(cfg.new_per_step)]
        freed = [p for r in rows for p in self.row_pages[r]]
        self.frees.free(freed, read_done, step=step, ordered=ordered)
        stream = self.platform.current_stream()
        pages = self._allocate(len(freed), step, stream)
        for i, r in enumerate(rows):
            self.row_pages[r] = pages[i * cfg.pages_per_request : (i + 1) * cfg.pages_per_request]
        if step % STAGING_ROWS == 0:  # a row is reused: wait until its copy is done
            self.platform.synchronize()
        staged = self._staging[step % STAGING_ROWS]
        staged.copy_(self._slots([self.row_pages[r] for r in rows]))
        slots = staged.to(self.device, non_blocking=True)
        first = step * cfg.new_per_step
        rows_t = (torch.arange(cfg.new_per_step, device=self.device) + first) % cfg.batch
        self.req_to_token.index_copy_(0, rows_t, slots)
        self.kv.index_copy_(0, slots.reshape(-1), self._new_values(step))

    def _new_values(self, step: int) -> torch.Tensor:
        values = self._values.get(step)
        if values is None:
            cfg = self.cfg
            gen = torch.Generator(device="cpu").manual_seed(cfg.seed * 7919 + step)
            shape = (cfg.new_per_step * cfg.ctx, cfg.hidden)
            values = self._values[step] = torch.randn(*shape, generator=gen).to(self.device)
        return values

    def make_batch(self, mode: ForwardMode, step: int) -> torch.Tensor:
        """Step ``step``'s writes (the sequential path: on the readers' stream) and its batch."""
        self.write_class("metadata", step, ordered=True)
        return self.batch_of(step)


def subject(
    platform: Platform,
    config: PageReuseConfig | None = None,
    *,
    declared: Mapping[str, WarReadDonePolicy] | None = None,
    name: str = "page-reuse",
) -> AuditSubject:
    """The `AuditSubject` of the page-reuse decode, its runner deciding ``declared`` per
    class (default `DECLARED_CLASSES`)."""
    cfg = config or PageReuseConfig()
    on_cuda = platform.name == "cuda"
    if not on_cuda and cfg == PageReuseConfig():
        cfg = PageReuseConfig(
            hidden=32, ffn=64, layers=2, batch=4, page=2, pages_per_request=2, new_per_step=2
        )
    model = PageReuseDecode(cfg, platform.device if on_cuda else "cpu", platform)
    return class_decode_subject(
        platform,
        model,
        declared if declared is not None else DECLARED_CLASSES,
        BUFFER_CLASSES,
        name=name,
    )


def decode(platform: Platform) -> AuditSubject:
    """Page reuse through deferred frees, declared as it reads."""
    return subject(platform)


__all__ = [
    "BUFFER_CLASSES",
    "DECLARED_CLASSES",
    "PageReuseConfig",
    "PageReuseDecode",
    "decode",
    "subject",
]
