"""Zoo fixtures from peer engines: a host-visible input ring reused without a wait (vLLM) and a
pinned staging buffer reused while its copy is pending (TensorRT-LLM).

Both tables are host-visible (`ZooModel.host`: pinned host memory on CUDA, read by a copy the
graph captured), so the scheduler writes them from the host once its barrier cleared, as these
engines do. The mechanisms are rebuilt from the public reports, not from their code.
"""

from __future__ import annotations

from typing import Any

import torch

from warpolicy.audit.zoo.model import BUCKETS, Static, ZooModel
from warpolicy.registry.vocabulary import ForwardMode


class EncoderRingNoWait(ZooModel):
    """vLLM #53057 (fixed by #53176): the model runner keeps its inputs in
    ``max_concurrent_batches`` host-visible slots; a slot is rewritten only after the output
    copy of the step that read it, one step of margin. Encoder-only steps copy no output, so
    nothing waited, and the scheduler rewrote the slot the encoder was still reading.

    The step is an extend (the encoder's whole-prompt pass). Its graph copies the token ids out
    of the host ring (``input_ring``) first thing and embeds them. Buggy: the encoder step
    publishes before its replay (``extend: pre_replay``: no wait for the ring). Fixed: its
    read-done is the marker after that copy (``extend: in_graph``)."""

    modes = (ForwardMode.EXTEND,)
    vocab = 64

    def __init__(self, device: Any, buggy: bool) -> None:
        super().__init__(device, buggy)
        self.input_ring = self.host("input_ring", torch.zeros(max(BUCKETS), dtype=torch.long))
        self.embedding = torch.randn(self.vocab, self.hidden, generator=self.generator).to(
            self.device
        )

    def scheduled(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        ids = torch.randint(0, self.vocab, (self.input_ring.numel(),), generator=generator)
        self.input_ring.copy_(ids)  # the scheduler fills the slot from the host

    def prep(self, s: Static) -> None:
        s.aux.copy_(self.input_ring[: s.n], non_blocking=True)  # host ring -> device, in graph
        super().prep(s)

    def layer(self, s: Static, index: int, h: torch.Tensor) -> torch.Tensor:
        return h + self.embedding.index_select(0, s.aux) if index == 0 else h


class PinnedStagingReuse(ZooModel):
    """TensorRT-LLM #15546: block offsets are staged in a pinned host buffer and copied to the
    device asynchronously; planning the next batch rewrote the staging buffer while that copy
    was still pending.

    ``block_offsets_host`` (pinned) holds each slot's block offset; the attention of the last
    layer gathers KV rows at the offsets of the step's slots from a device copy of it. Buggy:
    the host-to-device copy is enqueued in the forward, after the read-done marker (the
    metadata copy issued lazily by the attention layer). Fixed: the copy is part of the
    in-graph metadata prep, before the marker."""

    def __init__(self, device: Any, buggy: bool) -> None:
        super().__init__(device, buggy)
        offsets = torch.randperm(self.slots, generator=self.generator)
        self.block_offsets_host = self.host("block_offsets_host", offsets)
        self.block_offsets = torch.zeros(self.slots, dtype=torch.long, device=self.device)

    def stage(self) -> None:
        self.block_offsets.copy_(self.block_offsets_host, non_blocking=True)

    def prep(self, s: Static) -> None:
        super().prep(s)
        if not self.buggy:
            self.stage()

    def layer(self, s: Static, index: int, h: torch.Tensor) -> torch.Tensor:
        if index != self.layers - 1:
            return h
        if self.buggy:
            self.stage()  # the staging buffer read after the release
        return h + self.k_full.index_select(0, self.block_offsets.index_select(0, s.loc))
