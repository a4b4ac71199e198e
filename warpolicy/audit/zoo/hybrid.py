"""Zoo fixtures of composite models: a hybrid model reading recurrent state during the replay, and
a wrapper backend that declares only one of the children it runs.

Both are modelled with today's single-event semantics: one read-done per step, a declaration
that misses a reader releases early. (Per-class read ends would declare the recurrent state as
its own class; the bug shape, an early release past a reader the declaration did not name, is
the same.)
"""

from __future__ import annotations

from typing import Any

import torch

from warpolicy.audit.zoo.model import BUCKETS, Static, ZooModel


class RecurrentStateReplay(ZooModel):
    """Hybrid linear-attention models (Mamba / GDN layers beside full attention) keep reading
    recurrent state during the replay: each linear layer reads its request's state slot
    through ``state_indices`` (scheduler-written: slots of finished requests are handed to new
    ones and their state reset). An RL fork disabled overlap for it (miles #1726); vLLM saw an
    async state race (#51599) and corrupted hybrid + MTP outputs (#53912, 12 of 5000).

    Buggy: the backend declares ``decode: in_graph``, where the full-attention metadata prep
    ends; every linear layer after the marker reads ``state_indices`` and ``ssm_state`` (the
    scheduler resets slots meanwhile). Fixed: the declaration covers the recurrent reader,
    ``decode: post_replay`` (the layers' reads end with the graph)."""

    def __init__(self, device: Any, buggy: bool) -> None:
        super().__init__(device, buggy)
        g = self.generator
        self.state_slots = 2 * self.reqs
        self.state_indices = self.share(
            "state_indices", torch.zeros(max(BUCKETS), dtype=torch.long, device=self.device)
        )
        self.ssm_state = self.share(
            "ssm_state", torch.randn(self.state_slots, self.hidden, generator=g).to(self.device)
        )

    def scheduled(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        slots = torch.randperm(self.state_slots, generator=generator)[: self.state_indices.numel()]
        self.state_indices.copy_(slots.to(self.device))

    def layer(self, s: Static, index: int, h: torch.Tensor) -> torch.Tensor:
        state = self.ssm_state.index_select(0, self.state_indices[: s.n])  # every linear layer
        return torch.tanh(h + state)


class WrapperOneChild(ZooModel):
    """A fork's wrapper backend runs N children but declares only the primary child's read end
    (REFERENCE 1f). Here the primary (full attention) child ends its shared reads in the
    in-graph prep; the second child, a sparse indexer, gathers ``req_to_token`` rows again in
    its forward to pick the KV rows its layer attends to, and declares ``post_replay``.

    The model is the same in both variants; the registry is the bug. Buggy: the wrapper
    declares ``decode: in_graph`` itself (the primary's read end). Fixed: the wrapper is a
    composite, ``latest_of: [primary, indexer]``, so the engine takes the latest child:
    ``post_replay``."""

    def layer(self, s: Static, index: int, h: torch.Tensor) -> torch.Tensor:
        if index != 1:
            return h
        slots = self.req_to_token.view(-1).index_select(0, s.flat)  # the indexer's own read
        return h + self.k_full.index_select(0, slots)
