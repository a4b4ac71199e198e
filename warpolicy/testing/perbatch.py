"""Per-batch test support: a registry with a snapshot-then-declare prefill, an action plugin.

The registry fragment (`perbatch_fragment`, from `warpolicy.audit.synthetic_perbatch`, where the
GPU proof's synthetic prefill is declared) declares, like DeepSeek-V4's sparse prefill in the
default registry, a backend ``perbatch_prefill`` whose prefill (``extend``) ends its shared
reads before the replay (``pre_replay``) only when the batch has at most ``threshold`` query
tokens, or when its per-batch snapshot action ``synthetic_snapshot`` succeeded::

    reads_end: {extend: pre_replay}
    gates: [{when: {mode: extend, facts: {num_qo_tokens: {gt: N}, synthetic_snapshot: false}},
             at_least: none}]

`ActionPlugin` implements ``warpolicy_batch_action`` by calling a function the test gives,
counting calls. The CPU tests (``tests/runtime/test_per_batch.py``), the fault matrix's
per-batch scenario and the GPU proof (``tests/gpu/test_perbatch_cuda.py``) share them.
"""

from __future__ import annotations

from collections.abc import Callable

from warpolicy.audit.synthetic_perbatch import (
    PERBATCH_BACKEND,
    SNAPSHOT_ACTION,
    THRESHOLD,
    perbatch_engine,
    perbatch_fragment,
    perbatch_policy,
    perbatch_yaml,
)
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.markers import hookimpl

#: ``answer(action, runner, mode, bucket, batch) -> result`` (or raises)
Answer = Callable[[str, str, ForwardMode, int | None, object], object]


class ActionPlugin:
    """A ``warpolicy_batch_action`` implementation answering through ``answer``; ``calls``
    records every call's ``(action, runner, mode, bucket)``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, ForwardMode, int | None]] = []

    @hookimpl
    def warpolicy_batch_action(
        self, action: str, runner: str, mode: ForwardMode, bucket: int | None, batch: object
    ) -> object:
        self.calls.append((action, runner, mode, bucket))
        return self.answer(action, runner, mode, bucket, batch)


def always(result: object) -> Answer:
    """An answer that returns ``result`` (or raises it, when it is an exception)."""

    def answer(
        action: str, runner: str, mode: ForwardMode, bucket: int | None, batch: object
    ) -> object:
        if isinstance(result, BaseException):
            raise result
        return result

    return answer


__all__ = [
    "PERBATCH_BACKEND",
    "SNAPSHOT_ACTION",
    "THRESHOLD",
    "ActionPlugin",
    "Answer",
    "always",
    "perbatch_engine",
    "perbatch_fragment",
    "perbatch_policy",
    "perbatch_yaml",
]
