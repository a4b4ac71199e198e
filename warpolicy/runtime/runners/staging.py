"""Staging: a later phase's shared reads copied early, so an earlier phase's read-done ends the step.

In an EAGLE-family step the draft extend runs after target verify and reads scheduler-shared
state (request rows, sequence lengths, cache locations, the KV plan), so the scheduler waits for
the draft extend (`SpecStep`'s last reader). A `Stager` moves those reads earlier: during target
verify's per-batch action ``draft_extend_staged`` (after verify's host prep, before anything of
verify is published, with the forward stream current) it enqueues a copy of each of them into a
buffer the scheduler never writes. The draft extend's graph reads only those copies, so verify's
read-done event (in-graph, right after verify's metadata prep) also covers the draft extend: the
copies precede it on the forward stream.

The pieces:

* `StagedRead`: one staged read (``name``, ``nbytes``, ``copy(batch)``); `TensorCopy` stages a
  whole shared tensor into a private one;
* `Stager`: the staged reads of one consumer phase. It is a plugin: register it on the plugin
  manager whose observers the runners are built with, and it performs ``draft_extend_staged``
  (`Stager.warpolicy_batch_action`) for target verify. It reports success per batch (True only
  once every copy was enqueued); a copy that raises reports the failure (the action hook's
  fallback) and the batch is unstaged;
* `StagedPhase`: the consumer's model adapter. Its host prep first calls `Stager.consume`: a
  batch that was not staged (staging failed, was refused, or was never asked for) is copied
  **now**, by the consumer itself, so it is correct whatever happened, and the consumer is then
  a shared reader that releases at its own point (`SpecStep` hands its event, or nothing);
* `StagingCanary`: the WAR canary for staged steps. It saves the consumer's live reads **at the
  staging point** (before verify's release; the consumer's own host prep runs after it, too late
  to see the race), and checks the consumer's output against a replay that stages again from the
  saved contents behind a full barrier. A difference (staging that does not copy everything the
  consumer reads) turns staging off for that verify bucket for the rest of the process: later
  steps release at the consumer again.

Failure is always the later release: an unstaged batch makes verify publish nothing (the
registry's ``{after: draft_extend_staged}``), the draft extend copies for itself and publishes
its own release, and a step whose staging cannot be trusted falls back to that path or to the
coarse barrier; never an earlier one.

Costs: `Stager.nbytes` bytes copied on the forward stream per staged step (the benchmark
``warpolicy bench overlap --spec-step`` reports them with the GPU time they take).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.batch import DRAFT_EXTEND_STAGED
from warpolicy.runtime.canary import Canary, CanarySession, CanarySpec, Sample
from warpolicy.runtime.markers import hookimpl
from warpolicy.runtime.release import BucketRelease
from warpolicy.runtime.runners.adapters import ModelView
from warpolicy.runtime.runners.protocols import CanaryAdapter, ModelAdapter

TARGET_VERIFY = ForwardMode.TARGET_VERIFY


@runtime_checkable
class StagedRead(Protocol):
    """One shared read of a later phase, staged: ``copy(batch)`` enqueues, on the current
    (forward) stream, a copy of what the phase will read (a buffer, or a plan built from
    several, such as page tables) into buffers the scheduler never writes. ``name`` names what
    it stages; ``sources`` are the shared buffers it reads, by name (what the staging canary
    saves and the audit poisons); ``nbytes`` what one copy writes. ``batch`` is verify's batch
    when staging, the consumer's when it copies late (the same requests: a read must take what it
    needs from either)."""

    @property
    def name(self) -> str: ...

    @property
    def sources(self) -> Mapping[str, Any]: ...

    @property
    def nbytes(self) -> int: ...

    def copy(self, batch: Any) -> None: ...


def _tensor(value: Any, what: str) -> Any:
    if not (hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "copy_")):
        raise InputError(f"staging: {what} must be a tensor, not {type(value).__name__}")
    return value


@attrs.frozen(eq=False)  # tensors: identity, not an ambiguous elementwise ==
class TensorCopy:
    """Stage the whole shared tensor ``source`` into ``target`` (same shape and dtype, a buffer
    the scheduler never writes): what the consumer's graph reads instead of ``source``."""

    name: str
    source: Any = attrs.field(repr=False)
    target: Any = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        _tensor(self.source, f"{self.name!r}'s source")
        _tensor(self.target, f"{self.name!r}'s target")
        if tuple(self.source.shape) != tuple(self.target.shape):
            raise InputError(
                f"staging {self.name!r}: target shape {tuple(self.target.shape)} differs from "
                f"the source's {tuple(self.source.shape)}"
            )
        if self.source.dtype != self.target.dtype:
            raise InputError(
                f"staging {self.name!r}: target dtype {self.target.dtype} differs from the "
                f"source's {self.source.dtype}"
            )
        if self.source.data_ptr() == self.target.data_ptr():
            raise InputError(
                f"staging {self.name!r}: the target is the shared buffer itself (the scheduler "
                "writes it; a staged copy must be a buffer it never writes)"
            )

    @classmethod
    def of(cls, name: str, source: Any) -> TensorCopy:
        """Stage ``source`` into a fresh buffer like it (allocated here, once)."""
        _tensor(source, f"{name!r}'s source")
        return cls(name, source, source.detach().clone())

    @property
    def sources(self) -> Mapping[str, Any]:
        return {self.name: self.source}

    @property
    def nbytes(self) -> int:
        return int(self.source.numel()) * int(self.source.element_size())

    def copy(self, batch: Any) -> None:
        self.target.copy_(self.source)


class Stager:
    """The staged reads of one consumer phase (the draft extend), performed as the per-batch
    action ``action`` (default ``draft_extend_staged``) of the ``mode`` runners (default target
    verify), optionally only the runner named ``runner``.

    Per step: `stage` (the action, before verify's release) enqueues every copy and marks the
    step staged; the consumer's `StagedPhase` host prep calls `consume`, which clears the mark
    and, for a step that was not staged, copies now. `disable` turns staging off for a verify
    bucket (the staging canary does, on a violation).
    """

    def __init__(
        self,
        reads: Iterable[StagedRead],
        *,
        action: str = DRAFT_EXTEND_STAGED,
        mode: ForwardMode = TARGET_VERIFY,
        runner: str | None = None,
        name: str = "stager",
    ) -> None:
        self.reads: tuple[StagedRead, ...] = tuple(reads)
        if not self.reads:
            raise InputError(f"{name}: a stager needs at least one staged read")
        bad = [r for r in self.reads if not isinstance(r, StagedRead)]
        if bad:
            raise InputError(
                f"{name}: {type(bad[0]).__name__} is not a StagedRead (name, nbytes, copy(batch))"
            )
        names = [r.name for r in self.reads]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InputError(f"{name}: buffers staged twice: {', '.join(twice)}")
        self.name = name
        self.action = action
        self.mode = ForwardMode.parse(mode)
        self.runner = runner
        #: bytes one staged step copies
        self.nbytes = sum(int(r.nbytes) for r in self.reads)
        self._staged = False
        self._batch: Any = None
        self._disabled: dict[int | None, str] = {}
        #: called at the staging point (before the copies) with (bucket, batch): the staging
        #: canary saves the consumer's live reads there
        self.before_copies: Callable[[int | None, Any], None] | None = None
        #: ``staged`` (early copies), ``late`` (the consumer copied for itself), ``refused``
        #: (a disabled bucket), ``failed`` (a copy raised)
        self.counts: collections.Counter[str] = collections.Counter()

    @property
    def names(self) -> tuple[str, ...]:
        """What this stager stages, in order."""
        return tuple(r.name for r in self.reads)

    @property
    def sources(self) -> dict[str, Any]:
        """The shared buffers the staged reads read, by name."""
        return {n: t for r in self.reads for n, t in dict(r.sources).items()}

    @property
    def staged(self) -> bool:
        """Whether this step's reads were staged and the consumer has not run yet."""
        return self._staged

    @property
    def disabled(self) -> Mapping[int | None, str]:
        """Verify buckets where staging is off, and why."""
        return self._disabled

    def disable(self, bucket: int | None, reason: str) -> None:
        """Stage nothing for ``bucket`` from now on (its batches release at the consumer)."""
        self._disabled.setdefault(bucket, reason)

    # -- per step ----------------------------------------------------------------------------

    def stage(self, batch: Any, bucket: int | None = None) -> bool:
        """Enqueue every copy on the current stream; True once all are enqueued. An exception
        leaves the step unstaged (the consumer copies for itself) and propagates to the caller
        (the action hook reports it and the batch gets the later release)."""
        self._staged = False
        self._batch = batch
        if bucket in self._disabled:
            self.counts["refused"] += 1
            return False
        try:
            if self.before_copies is not None:
                self.before_copies(bucket, batch)
            self.copy_all(batch)
        except BaseException:
            self.counts["failed"] += 1
            raise
        self._staged = True
        self.counts["staged"] += 1
        return True

    def copy_all(self, batch: Any) -> None:
        """Enqueue every copy on the current stream (no bookkeeping: the canary's replay)."""
        for read in self.reads:
            read.copy(batch)

    def consume(self, batch: Any = None) -> bool:
        """The consumer's host prep: True when this step was staged early (the copies are in
        place); otherwise copy now (late: the consumer reads shared state itself) and False."""
        staged, self._staged = self._staged, False
        if staged:
            return True
        self.counts["late"] += 1
        self.copy_all(batch if batch is not None else self._batch)
        return False

    def forget(self) -> None:
        """Drop this step's mark (a step that failed before its consumer ran)."""
        self._staged = False

    # -- the per-batch action ----------------------------------------------------------------

    @hookimpl
    def warpolicy_batch_action(
        self, action: str, runner: str, mode: ForwardMode, bucket: int | None, batch: object
    ) -> bool | None:
        """Perform ``draft_extend_staged`` for the verify runner (see `stage`)."""
        if action != self.action or mode is not self.mode:
            return None
        if self.runner is not None and runner != self.runner:
            return None
        return self.stage(batch, bucket)

    def consumer(self, model: ModelAdapter, state: Mapping[str, Any] | None = None) -> StagedPhase:
        """``model`` (which reads the staged copies) as the consumer phase's adapter, keeping
        its canary support; ``state`` is what it reads and writes (its KV pool: the staging
        canary compares it)."""
        if isinstance(model, CanaryAdapter):
            return StagedCanaryPhase(model, self, state)
        return StagedPhase(model, self, state)

    def __repr__(self) -> str:
        return f"<Stager {self.name!r} {', '.join(self.names)} ({self.nbytes} bytes)>"


class StagedPhase(ModelView):
    """The consumer's model adapter: its host prep takes the staged copies first
    (`Stager.consume`, copying late for a batch that was not staged), then the model's.

    ``model`` must read the staged copies (each `TensorCopy`'s ``target``) where it would read
    the shared buffers; its ``shared_buffers`` are what it still reads live (none, when the
    stager covers everything)."""

    def __init__(
        self, model: ModelAdapter, stager: Stager, state: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(model)
        self.stager = stager
        #: what the consumer reads and writes (the staging canary saves and compares it)
        self.state: dict[str, Any] = dict(state or {})
        #: whether the last host prep found its batch staged
        self.was_staged = False

    def host_prep(self, batch: Any, bucket: int) -> None:
        self.was_staged = self.stager.consume(batch)
        self.model.host_prep(batch, bucket)

    @property
    def live_reads(self) -> dict[str, Any]:
        """What this phase reads of scheduler-shared state when unstaged: every staged read's
        source and whatever the model still reads live."""
        return {**dict(self.model.shared_buffers), **self.stager.sources}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class StagedCanaryPhase(StagedPhase):
    """A `StagedPhase` of a model the WAR canary can check (its runner's own canary: the
    batches that are not staged). ``canary_spec`` is defined on the class: a runtime protocol
    check does not see ``__getattr__`` (Python 3.12)."""

    def __init__(
        self,
        model: CanaryAdapter,
        stager: Stager,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(model, stager, state)  # type: ignore[arg-type]
        self._canary_model = model

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> CanarySpec | None:
        return self._canary_model.canary_spec(mode, bucket, batch)


class StagingCanary:
    """The WAR canary of staged steps (see the module doc): one `CanarySession` (mode draft
    extend, scope ``staging <name>``), its cells the verify buckets.

    ``live`` is what the consumer would read of scheduler-shared state unstaged (every staged
    read's source, and anything the consumer reads live): saved at the staging point, put back
    for the check's replay. ``state`` is what the consumer reads and writes (its KV pool)."""

    def __init__(
        self,
        canary: Canary,
        stager: Stager,
        *,
        name: str,
        live: Mapping[str, Any],
        state: Mapping[str, Any] | None = None,
        backend: str = "",
        spec: str = "",
        release_of: Callable[[int | None], BucketRelease],
    ) -> None:
        self.stager = stager
        self.live = dict(live)
        self.state = dict(state or {})
        self._release_of = release_of
        self.session: CanarySession = canary.session(
            f"{name}:staging", ForwardMode.DRAFT_EXTEND, backend=backend, spec=spec,
            on_demote=stager.disable,
        )  # fmt: skip
        self.session.scope = f"staging {name}"
        self._due = False
        self._sample: Sample | None = None
        self._rerun: Callable[[], Any] | None = None
        stager.before_copies = self._begin

    def step(self) -> None:
        """Once per step, before any phase runs: whether this step is sampled."""
        self._sample = None
        self._due = self.session.step()

    def _begin(self, bucket: int | None, batch: Any) -> None:
        if not self._due:
            return
        self._due = False
        self._sample = self.session.begin(
            bucket,
            0,
            self._release_of(bucket),
            lambda: CanarySpec(inputs=self.live, state=self.state),
            self.live,
            self._replay,
        )
        self._batch = batch

    def _replay(self) -> Any:
        self.stager.copy_all(self._batch)
        assert self._rerun is not None  # set by observe before the sample is pending
        return self._rerun()

    def observe(self, output: Any, rerun: Callable[[], Any]) -> None:
        """After the consumer ran on a staged step: save what it produced; ``rerun()`` replays
        the consumer (its graph, or its eager forward) for the check."""
        sample, self._sample = self._sample, None
        if sample is None:
            return
        self._rerun = rerun
        self.session.observe(sample, output)

    def discard(self) -> None:
        """The sampled step was not staged after all (or failed): nothing to check."""
        self._sample = None

    def check(self) -> None:
        self.session.check()


__all__ = [
    "StagedCanaryPhase",
    "StagedPhase",
    "StagedRead",
    "Stager",
    "StagingCanary",
    "TensorCopy",
]
