"""Target-verify runner: one graph per ``batch_size x draft_tokens``.

It publishes only where the engine's policy says so for the speculative algorithm: the
policy comes from ``engine.compile(backend, spec=...)``, which is ``NONE`` for target verify
unless the algorithm declares ``target_verify_read_done`` (the DFlash family). For EAGLE-like
algorithms the last shared read is the draft extend, so the scheduler must read the draft
runner's fence, not this one's.
"""

from __future__ import annotations

import operator
from typing import Any

from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.policy import RunnerPolicy
from warpolicy.runtime.runners.base import GraphRunner
from warpolicy.runtime.runners.protocols import ModelAdapter


class VerifyRunner(GraphRunner):
    """Buckets are token counts ``bs * draft_tokens`` (``model.bucket_sizes(TARGET_VERIFY)``);
    each must be a multiple of ``draft_tokens``, and so must every batch."""

    mode = ForwardMode.TARGET_VERIFY

    def __init__(
        self,
        model: ModelAdapter,
        policy: RunnerPolicy,
        platform: Platform,
        name: str | None = None,
        *,
        draft_tokens: int,
        **kwargs: Any,
    ) -> None:
        try:
            tokens = operator.index(draft_tokens)
        except TypeError:
            tokens = 0
        if tokens <= 0:
            raise InputError(
                f"verify runner: draft_tokens must be a positive integer, got {draft_tokens!r}"
            )
        self.draft_tokens = tokens
        super().__init__(model, policy, platform, name, **kwargs)
        odd = [b for b in self.buckets if b % self.draft_tokens]
        if odd:
            raise InputError(
                f"verify runner: buckets {odd} are not multiples of "
                f"draft_tokens={self.draft_tokens}"
            )

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """The captured batch sizes (bucket // draft_tokens)."""
        return tuple(b // self.draft_tokens for b in self.buckets)

    def size_of(self, batch: Any) -> int:
        size = super().size_of(batch)
        if size % self.draft_tokens:
            raise InputError(
                f"verify runner: batch of {size} tokens is not a multiple of "
                f"draft_tokens={self.draft_tokens}"
            )
        return size
