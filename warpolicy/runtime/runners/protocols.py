"""What an engine supplies to a runner (`ModelAdapter`, optionally `CanaryAdapter`), and what a
runner is to the scheduler and the audit (`Runner`, optionally `CanaryHost`): named protocols
mypy checks. `GraphRunner` (decode, prefill, verify, draft extend) and `SpecStep` both satisfy
`Runner` and `CanaryHost`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.batch import BucketBatch
from warpolicy.runtime.canary import Canary, CanarySpec
from warpolicy.runtime.fence import ReadDoneSource
from warpolicy.runtime.observers import Observers
from warpolicy.runtime.platforms import EventHandle, GraphHandle, Platform
from warpolicy.runtime.release import BucketRelease, ReadDone


class ModelAdapter(Protocol):
    """What an engine supplies to a runner. Any object with these members.

    A *bucket* is an int: the batch size (decode), the token count (prefill) or
    ``batch_size * draft_tokens`` (verify). The runner also calls ``prepare_bucket`` with an
    exact, uncaptured size before running such a batch eagerly, so the adapter must accept
    any positive size there (it may allocate lazily and cache).

    Optional: ``batch_size(batch) -> int`` (the size in bucket units; default ``len(batch)``),
    see `SizedModelAdapter`.
    """

    @property
    def shared_buffers(self) -> Mapping[str, Any]:
        """Scheduler-shared state the forward reads, by name (the graph walk and the audit look
        for these); a plain attribute satisfies it."""
        ...

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        """The capture buckets for ``mode``; empty means always eager."""
        ...

    def prepare_bucket(self, bucket: int) -> None:
        """Allocate the bucket's static inputs/outputs (valid padding values: warm-up runs them)."""
        ...

    def host_prep(self, batch: Any, bucket: int) -> None:
        """Out of graph, on the forward stream: copy ``batch`` into the static inputs and pad."""
        ...

    def graph_prep(self, bucket: int) -> None:
        """In-graph metadata prep: the forward's reads of scheduler-shared buffers."""
        ...

    def forward(self, bucket: int) -> Any:
        """The model forward after the prep; returns the bucket's static output."""
        ...


@runtime_checkable
class SizedModelAdapter(ModelAdapter, Protocol):
    """A `ModelAdapter` that measures its own batches."""

    def batch_size(self, batch: Any) -> int:
        """The batch's size in bucket units."""
        ...


@runtime_checkable
class CanaryAdapter(Protocol):
    """Optional `ModelAdapter` capability: what the WAR canary needs to check a sampled step
    (`warpolicy.runtime.canary`). A model without it says so once (a warning when a runner is
    built with a canary) and its runners are never sampled.

    The runner calls ``canary_spec`` on a sampled step only, right after ``host_prep`` and
    before anything is published, on the forward stream (work it enqueues there, say computing
    the KV slots the step will write, precedes the step's release point).
    """

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> CanarySpec | None:
        """What to save, put back and compare for this step of ``bucket`` (the captured bucket,
        or the exact size of an eager step): a `CanarySpec` (defaults: the shared buffers as
        inputs, no extra state, the output compared bitwise), or None when this step cannot be
        checked (the canary skips it, saying so once per bucket)."""
        ...


@attrs.frozen
class CapturedBucket:
    """One captured graph and its release decision (`BucketRelease`), made at capture."""

    size: int
    graph: GraphHandle
    release: BucketRelease
    #: the event this graph's read-done node records, whatever the release decided (None: no
    #: node). Kept as long as the graph: a graph exec recording a destroyed event is undefined
    #: behaviour in CUDA (seen on the H200: a glibc mutex abort inside ``replay``).
    recorded: EventHandle | None = None
    #: what a step of this bucket does per batch (its cell reads per-batch facts: the release
    #: above is the earliest any batch can get, each batch publishes the same or later), or
    #: None: every step publishes ``release`` with no per-batch work
    batch: BucketBatch | None = attrs.field(default=None, repr=False)

    @property
    def event(self) -> EventHandle | None:
        """The read-done event this graph records and an ``in_graph`` step hands out (None:
        the bucket does not publish from inside its graph)."""
        return self.release.event

    @property
    def policy(self) -> WarReadDonePolicy:
        """What every step of this bucket publishes."""
        return self.release.policy

    @property
    def planted(self) -> bool:
        return self.release.planted


@attrs.frozen
class StepInfo:
    """What a runner did for one step (``bucket`` None = eager; ``policy`` = what was really
    published, ``NONE`` when nothing was; ``facts``: the per-batch facts the step reported, None
    for a cell that reads none; ``decided``: what the runner decided for this step (its
    bucket's release, or the later per-batch one), None when not recorded)."""

    step: int
    size: int
    bucket: int | None
    policy: WarReadDonePolicy
    facts: Mapping[str, object] | None = None
    decided: WarReadDonePolicy | None = None


class Mailbox(ReadDoneSource, Protocol):
    """Where the scheduler takes a step's read-done from (a fence, or a speculative step's):
    ``take()`` (`ReadDoneSource`) and the latest external event."""

    @property
    def event(self) -> EventHandle | None:
        """The latest external read-done event (the static audit's fallback for a bucket)."""
        ...


@runtime_checkable
class ClassedModel(Protocol):
    """Optional `ModelAdapter` capability: which buffer class each shared buffer belongs to
    (one not listed: ``metadata``); the class self-check walks only a class's own buffers."""

    @property
    def buffer_classes(self) -> Mapping[str, str]: ...


def class_buffers(model: Any, buffer_class: str) -> Mapping[str, Any]:
    """The shared buffers of ``buffer_class`` (a model that does not say: every one)."""
    shared = dict(model.shared_buffers)
    if not isinstance(model, ClassedModel):
        return shared
    classes = model.buffer_classes
    return {n: t for n, t in shared.items() if classes.get(n, "metadata") == buffer_class}


@runtime_checkable
class ClassMailbox(Protocol):
    """A mailbox that also hands out one read-done per buffer class (`ReadDoneFence`)."""

    def take_class(self, buffer_class: str) -> ReadDone | None:
        """This step's read-done of ``buffer_class`` once, then None (None: coarse)."""
        ...


@runtime_checkable
class CanaryHost(Protocol):
    """A runner that can carry the WAR canary (`GraphRunner`, `SpecStep`): the overlap loop
    runs its check after the scheduler's writes, and measures release leads with its canary."""

    @property
    def canary(self) -> Canary | None:
        """The process's canary this runner samples with (None: none)."""
        ...

    def check_canary(self) -> None:
        """Check the pending sampled step, if any: call it after the scheduler's writes for the
        next step, with their stream current (`warpolicy.runtime.canary.CanarySession.check`)."""
        ...


class Runner(Protocol):
    """A runner as the overlap loop, the audit and an engine's scheduler use it."""

    @property
    def name(self) -> str: ...

    @property
    def mode(self) -> ForwardMode: ...

    @property
    def platform(self) -> Platform: ...

    @property
    def model(self) -> ModelAdapter: ...

    @property
    def fence(self) -> Mailbox: ...

    @property
    def observers(self) -> Observers: ...

    @property
    def captured(self) -> Mapping[int, CapturedBucket]: ...

    @property
    def is_captured(self) -> bool: ...

    @property
    def last_step(self) -> StepInfo | None: ...

    def capture(self) -> None:
        """Capture every bucket (a transaction)."""
        ...

    def run(self, batch: Any) -> Any:
        """Launch one step on the current (forward) stream and publish its read-done."""
        ...

    def policy_for(self, bucket: int | None = None) -> WarReadDonePolicy:
        """What a step of ``bucket`` (None: eager) publishes."""
        ...


__all__ = [
    "CanaryAdapter",
    "CanaryHost",
    "CapturedBucket",
    "Mailbox",
    "ModelAdapter",
    "Runner",
    "SizedModelAdapter",
    "StepInfo",
]
