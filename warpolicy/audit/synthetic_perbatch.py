"""The per-batch synthetic prefill: its declaration and its snapshot action (no torch here).

A snapshot-then-declare backend, declared like DeepSeek-V4's sparse prefill in the default
registry: ``perbatch_prefill`` ends its prefill's shared reads before the replay (``extend:
pre_replay``) for a batch of at most ``threshold`` query tokens, and above it only when the
batch's per-batch snapshot action ``synthetic_snapshot`` succeeded::

    reads_end: {extend: pre_replay}
    gates: [{when: {mode: extend, facts: {num_qo_tokens: {gt: N}, synthetic_snapshot: false}},
             at_least: none}]

The model (`warpolicy.audit.synthetic_perbatch_model`) and its audit subject build on this;
`SnapshotAction` is the ``warpolicy_batch_action`` implementation that performs (``honest``),
fakes (``lying``: reports True without copying, the UNSAFE mutant) or refuses (``failing``:
returns False) the snapshot. The fault matrix and the CPU tests use the same declaration
(`warpolicy.testing.perbatch`).
"""

from __future__ import annotations

from typing import Protocol

from warpolicy.errors import InputError
from warpolicy.registry.compiled import CompiledPolicy
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader.fragments import Fragment
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.markers import hookimpl

#: The backend the fragment declares.
PERBATCH_BACKEND = "perbatch_prefill"
#: Its per-batch snapshot action (a ``type: action`` fact).
SNAPSHOT_ACTION = "synthetic_snapshot"
#: Default threshold: above it a prefill reads shared state in its forward unless snapshotted.
THRESHOLD = 64
#: What `SnapshotAction` does: perform the snapshot, report True without it, or refuse.
ACTION_KINDS = ("honest", "lying", "failing")


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
    return Fragment("synthetic:perbatch", perbatch_yaml(threshold))


def perbatch_engine(threshold: int = THRESHOLD) -> PolicyEngine:
    """The default registry plus the fragment (empty environment)."""
    return PolicyEngine.load(fragments=[perbatch_fragment(threshold)], environ={})


def perbatch_policy(
    threshold: int = THRESHOLD, *, platform: str = "cuda", external_events: bool = True
) -> CompiledPolicy:
    """``perbatch_prefill`` compiled with prefill read-done on (strict: a broken registry
    raises)."""
    return perbatch_engine(threshold).compile(
        PERBATCH_BACKEND,
        "none",
        {"prefill_read_done": True},
        platform=platform,
        external_events=external_events,
        strict=True,
    )


class Snapshotter(Protocol):
    """A model whose per-batch snapshot an action builds."""

    def snapshot(self, bucket: int) -> None:
        """Copy this batch's shared reads for ``bucket`` before the release (forward stream)."""
        ...


class SnapshotAction:
    """``warpolicy_batch_action`` for `SNAPSHOT_ACTION` on ``model`` (``kind``: see
    `ACTION_KINDS`); ``performed`` / ``answered`` count the snapshots built and the answers."""

    def __init__(self, model: Snapshotter, kind: str = "honest") -> None:
        if kind not in ACTION_KINDS:
            raise InputError(f"action kind must be one of {', '.join(ACTION_KINDS)}, not {kind!r}")
        self.model = model
        self.kind = kind
        self.performed = 0
        self.answered = 0

    @hookimpl
    def warpolicy_batch_action(
        self, action: str, mode: ForwardMode, bucket: int | None
    ) -> bool | None:
        if action != SNAPSHOT_ACTION or mode is not ForwardMode.EXTEND or bucket is None:
            return None  # not ours (an eager batch has no static buffers to snapshot into)
        self.answered += 1
        if self.kind == "failing":
            return False
        if self.kind == "honest":
            self.model.snapshot(bucket)
            self.performed += 1
        return True  # the lying kind: True without copying


__all__ = [
    "ACTION_KINDS",
    "PERBATCH_BACKEND",
    "SNAPSHOT_ACTION",
    "THRESHOLD",
    "SnapshotAction",
    "Snapshotter",
    "perbatch_engine",
    "perbatch_fragment",
    "perbatch_policy",
    "perbatch_yaml",
]
