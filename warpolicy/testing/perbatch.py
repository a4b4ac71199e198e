"""Per-batch test support: a registry with a snapshot-then-declare prefill, an action plugin.

The registry fragment (`perbatch_fragment`) declares, like DeepSeek-V4's sparse prefill in the
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

from typing import Callable, Optional

from warpolicy.registry.compiled import CompiledPolicy
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader.fragments import Fragment
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.markers import hookimpl

#: The backend the fragment declares.
PERBATCH_BACKEND = "perbatch_prefill"
#: Its per-batch snapshot action (a ``type: action`` fact).
SNAPSHOT_ACTION = "synthetic_snapshot"
#: Default threshold: above it, a prefill reads shared state in its forward unless snapshotted.
THRESHOLD = 64


def perbatch_yaml(threshold: int = THRESHOLD) -> str:
    """The registry fragment (YAML text) for ``threshold`` query tokens."""
    return f"""\
version: 1
facts:
  {SNAPSHOT_ACTION}:
    type: action
    doc: "The synthetic prefill built its snapshot of the shared reads before replay."
backends:
  {PERBATCH_BACKEND}:
    inherits: base
    reads_end:
      extend: pre_replay
    gates:
      - id: perbatch-prefill-needs-snapshot
        when: {{mode: extend, facts: {{num_qo_tokens: {{gt: {threshold}}}, {SNAPSHOT_ACTION}: false}}}}
        at_least: none
        because: Above {threshold} tokens the prefill reads shared state unless snapshotted.
    doc: "Synthetic snapshot-then-declare prefill (tests)."
"""


def perbatch_fragment(threshold: int = THRESHOLD) -> Fragment:
    return Fragment("test:perbatch", perbatch_yaml(threshold))


def perbatch_engine(threshold: int = THRESHOLD) -> PolicyEngine:
    """The default registry plus the fragment (empty environment)."""
    return PolicyEngine.load(fragments=[perbatch_fragment(threshold)], environ={})


def perbatch_policy(threshold: int = THRESHOLD) -> CompiledPolicy:
    """``perbatch_prefill`` compiled with prefill read-done on (strict: a broken registry
    raises)."""
    engine = perbatch_engine(threshold)
    return engine.compile(PERBATCH_BACKEND, "none", {"prefill_read_done": True}, strict=True)


#: ``answer(action, runner, mode, bucket, batch) -> result`` (or raises)
Answer = Callable[[str, str, ForwardMode, Optional[int], object], object]


class ActionPlugin:
    """A ``warpolicy_batch_action`` implementation answering through ``answer``; ``calls``
    records every call's ``(action, runner, mode, bucket)``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, ForwardMode, Optional[int]]] = []

    @hookimpl
    def warpolicy_batch_action(
        self, action: str, runner: str, mode: ForwardMode, bucket: Optional[int], batch: object
    ) -> object:
        self.calls.append((action, runner, mode, bucket))
        return self.answer(action, runner, mode, bucket, batch)


def always(result: object) -> Answer:
    """An answer that returns ``result`` (or raises it, when it is an exception)."""

    def answer(
        action: str, runner: str, mode: ForwardMode, bucket: Optional[int], batch: object
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
