"""A speculative step as phases, with one read-done event for the scheduler.

A speculative-decoding step runs several forwards back to back on the forward stream: draft
forwards, the target verify, and (EAGLE family) a draft extend over the accepted tokens. Each
phase is its own graph runner with its own fence. The scheduler may overwrite shared metadata
only after the **last phase that reads it**, so the step hands the scheduler exactly one
event: the one published by the last phase that reads shared state.

Which phases read shared state: every phase up to and including the one the speculative
algorithm declares as its last shared reader (``SpecAlgorithm.last_reader``; ``None`` means the
last phase the step runs), and **every later phase unless its policy explicitly answers
``nothing``** for its mode (`ModePolicies.reads_nothing`: the registry declares that the phase
reads no scheduler-shared state). ``none`` means unknown, so a later phase that answers ``none``
(an undeclared draft extend, a gate that makes it coarse), names a release point, or whose
lookup failed is a reader: the step releases at the latest such phase (one warning per phase,
and every occurrence counted) rather than before that phase's reads; if that phase then
publishes nothing (it decided ``none`` for the step, or failed closed), the step is coarse.

Per step, for each reading phase in order, what its fence published replaces the step's
mailbox (nothing if it decided ``none``). The release is sound for earlier phases too: they ran
before the releasing phase on the same stream, so its event fires after their reads.

Failure of any reading phase fails closed: a phase that raises, or that decided to publish but
whose fence published nothing (a hook or record failed), leaves the step's mailbox empty (coarse).

**Staged steps** (`warpolicy.runtime.runners.staging`). When target verify published after its
per-batch action ``draft_extend_staged`` succeeded, the draft extend's shared reads were copied
before verify's release into buffers the scheduler never writes, so verify's event ends the
step and the draft extend's is discarded. A phase whose model is a `StagedPhase` is the staged
consumer: the step is staged only if its `Stager` staged this batch (not merely some plugin
answering True) and the consumer found its copies in place; otherwise the consumer copied for
itself and is the release (its own event, or nothing: coarse). With a canary, a
`StagingCanary` checks staged steps (saved at the staging point) and turns staging off for a
verify bucket where a staged consumer raced.

`SpecStep` is a `warpolicy.runtime.runners.protocols.Runner`, so ``loop.step(batch, write_next,
runner=step)`` runs it and the audit audits it. It belongs to one thread, like its runners.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from warpolicy.errors import InputError
from warpolicy.registry.model import SpecAlgorithm
from warpolicy.registry.vocabulary import NONE, ForwardMode, WarReadDonePolicy
from warpolicy.runtime.batch import DRAFT_EXTEND_STAGED
from warpolicy.runtime.canary import Canary
from warpolicy.runtime.observers import NO_OBSERVERS, Observers, Reporter
from warpolicy.runtime.ownership import ThreadOwner, get_ident
from warpolicy.runtime.platforms import EventHandle, Platform
from warpolicy.runtime.release import ReadDone
from warpolicy.runtime.runners.base import GraphRunner
from warpolicy.runtime.runners.protocols import CapturedBucket, ModelAdapter, StepInfo
from warpolicy.runtime.runners.staging import StagedPhase, StagingCanary

#: ``inputs(step_batch, earlier_outputs) -> this phase's batch``
PhaseInputs = Callable[[Any, Sequence[Any]], Any]


def last_reader_of(spec: SpecAlgorithm) -> ForwardMode | None:
    """The mode of the last phase that reads shared state, as the spec algorithm declares it.

    ``None`` means "the last phase the step runs" (the conservative default).
    """
    reader = spec.last_reader
    return None if reader is None else ForwardMode.parse(reader)


@attrs.frozen
class Phase:
    """One forward of a speculative step: a runner, and how its batch is made.

    ``inputs`` gets the step's batch and the outputs of the phases before this one; without
    it the phase runs the step's batch itself.
    """

    runner: GraphRunner
    inputs: PhaseInputs | None = None

    @property
    def mode(self) -> ForwardMode:
        return self.runner.mode

    @property
    def name(self) -> str:
        return self.runner.name


class StepMailbox:
    """The step's one-slot mailbox: what the scheduler takes (consume-once) after the launch.

    ``event`` is the latest external event of the declared last reader's fence (the static
    audit's fallback when a bucket keeps none).
    """

    def __init__(self, name: str, last_fence: Any, owner: ThreadOwner) -> None:
        self.name = name
        self._last_fence = last_fence
        self._owner = owner
        self._read_done: ReadDone | None = None

    @property
    def event(self) -> EventHandle | None:
        return self._last_fence.event

    def clear(self) -> None:
        self.put(None)

    def put(self, read_done: ReadDone | None) -> None:
        """Hold ``read_done`` for the scheduler; one it replaces was never handed out."""
        old = self._read_done
        if old is not None and old is not read_done:
            old.slot.taken = False
        self._read_done = read_done

    def peek(self) -> ReadDone | None:
        return self._read_done

    def take(self) -> ReadDone | None:
        if self._owner.ident != get_ident():
            self._owner.claim()
        read_done, self._read_done = self._read_done, None
        return read_done


class SpecStep:
    """Runs the phases of one speculative step in order and publishes one read-done event.

    ``last_reader`` is the mode of the phase the algorithm declares as its last shared reader
    (the last phase of that mode when several share it); ``None`` means the last phase. Build
    it from a registry entry with `SpecStep.for_algorithm`.
    """

    def __init__(
        self,
        phases: Sequence[Phase | GraphRunner],
        *,
        last_reader: str | ForwardMode | None = None,
        name: str = "spec_step",
        observers: Observers = NO_OBSERVERS,
    ) -> None:
        self.phases: tuple[Phase, ...] = tuple(
            p if isinstance(p, Phase) else Phase(p) for p in phases
        )
        if not self.phases:
            raise InputError(f"{name}: a speculative step needs at least one phase")
        self._name = name
        self.last_reader: ForwardMode | None = (
            None if last_reader is None else ForwardMode.parse(last_reader)
        )
        self.last_index = self._last_index()
        self._platform = self.phases[0].runner.platform
        if any(p.runner.platform is not self._platform for p in self.phases):
            raise InputError(f"{name}: every phase must run on the same platform")
        self.observers = observers
        self.reporter = Reporter(observers, name)
        self._owner = ThreadOwner(f"speculative step {name!r}")
        self._mailbox = StepMailbox(name, self.reader.runner.fence, self._owner)
        self._last_step: StepInfo | None = None
        #: what each phase did in the last step (``None`` for a phase that did not run)
        self.phase_steps: tuple[StepInfo | None, ...] = ()
        #: the phase whose event the last step handed out (or would have: None before a step)
        self.released_by: Phase | None = None
        #: whether the last step was staged (verify's event handed for the draft extend too)
        self.staged = False
        self._step = 0
        self._consumer = self._staged_consumer()
        self.staging_canary = self._open_staging_canary()

    def _staged_consumer(self) -> int | None:
        """The index of the phase whose model is a `StagedPhase` (None: none). Its stager must
        stage for a target-verify phase that runs before it."""
        hits = [i for i, p in enumerate(self.phases) if isinstance(p.runner.model, StagedPhase)]
        if not hits:
            return None
        if len(hits) > 1:
            raise InputError(f"{self._name}: more than one phase reads staged copies")
        i = hits[0]
        if not any(p.mode is ForwardMode.TARGET_VERIFY for p in self.phases[:i]):
            raise InputError(
                f"{self._name}: phase {self.phases[i].name} reads staged copies, but no target "
                "verify runs before it to stage them"
            )
        return i

    def _open_staging_canary(self) -> StagingCanary | None:
        canary = self.canary
        i = self._consumer
        if i is None or canary is None or not canary.enabled:
            return None
        consumer = self.phases[i].runner.model
        assert isinstance(consumer, StagedPhase)
        verify = next(p.runner for p in self.phases[:i] if p.mode is ForwardMode.TARGET_VERIFY)
        session = verify.canary_session  # the cell names verify's backend and spec
        return StagingCanary(
            canary,
            consumer.stager,
            name=self._name,
            live=consumer.live_reads,
            state=consumer.state,
            backend=session.backend if session is not None else "",
            spec=session.spec if session is not None else "",
            release_of=verify.release_of,
        )

    @classmethod
    def for_algorithm(
        cls, phases: Sequence[Phase | GraphRunner], spec: SpecAlgorithm, **kwargs: Any
    ) -> SpecStep:
        """A step whose last reader is what the registry declares for ``spec``."""
        kwargs.setdefault("name", f"{spec.name}_step")
        return cls(phases, last_reader=last_reader_of(spec), **kwargs)

    def _last_index(self) -> int:
        if self.last_reader is None:
            return len(self.phases) - 1
        hits = [i for i, p in enumerate(self.phases) if p.mode == self.last_reader]
        if not hits:
            raise InputError(
                f"{self._name}: the last shared reader is {self.last_reader.label}, "
                f"but the step has no such phase (phases: "
                f"{', '.join(p.mode.label for p in self.phases)})"
            )
        return hits[-1]

    # -- what the overlap loop and the audit see (the Runner protocol) ---------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def platform(self) -> Platform:
        return self._platform

    @property
    def fence(self) -> StepMailbox:
        return self._mailbox

    @property
    def last_step(self) -> StepInfo | None:
        return self._last_step

    @property
    def staging(self) -> tuple[GraphRunner, GraphRunner] | None:
        """(the target verify runner whose event a staged step hands, the staged consumer's
        runner), or None when no phase reads staged copies."""
        i = self._consumer
        if i is None:
            return None
        verify = [p.runner for p in self.phases[:i] if p.mode is ForwardMode.TARGET_VERIFY]
        return verify[-1], self.phases[i].runner

    @property
    def reader(self) -> Phase:
        """The phase the algorithm declares as its last shared reader."""
        return self.phases[self.last_index]

    @property
    def mode(self) -> ForwardMode:
        return self.reader.mode

    @property
    def model(self) -> ModelAdapter:
        return self.reader.runner.model

    @property
    def captured(self) -> Mapping[int, CapturedBucket]:
        """The last reader's captured graphs (the static audit walks the releasing graph)."""
        return self.reader.runner.captured

    @property
    def is_captured(self) -> bool:
        return all(p.runner.is_captured or not p.runner.buckets for p in self.phases)

    def policy_for(self, bucket: int | None = None) -> WarReadDonePolicy:
        """What the declared last reader publishes for ``bucket`` (None: eager)."""
        return self.reader.runner.policy_for(bucket)

    @property
    def canary(self) -> Canary | None:
        """The canary of the first phase runner that has one (the overlap loop measures release
        leads with it)."""
        for phase in self.phases:
            if phase.runner.canary is not None:
                return phase.runner.canary
        return None

    def check_canary(self) -> None:
        """Check every phase runner's pending sampled step (each runner once, in phase order):
        after the scheduler's writes for the next step, with their stream current. A runner
        that serves several phases of a step checks a sample of an earlier phase at its next
        run, before the scheduler wrote: such a check cannot see the race (nor raise a false
        alarm); its last phase's sample is the one checked here."""
        seen: set[int] = set()
        for phase in self.phases:
            runner = phase.runner
            if id(runner) not in seen:
                seen.add(id(runner))
                runner.check_canary()
        if self.staging_canary is not None:
            self.staging_canary.check()

    def release_thread(self) -> None:
        """Hand the step to another thread (its runners too): the next user owns them."""
        self._owner.release()
        for phase in self.phases:
            phase.runner.release_thread()

    def capture(self) -> None:
        """Capture every phase's runner once (a runner may serve several phases)."""
        self._owner.check()
        seen: set[int] = set()
        for phase in self.phases:
            if id(phase.runner) not in seen:
                seen.add(id(phase.runner))
                phase.runner.capture()

    # -- per step --------------------------------------------------------------------------------

    def run(self, batch: Any) -> tuple[Any, ...]:
        """Run every phase on the current (forward) stream; returns their outputs in order.

        Afterwards ``fence.take()`` gives the last reading phase's `ReadDone`, or None (coarse).
        """
        if self._owner.ident != get_ident():
            self._owner.claim()
        mailbox = self._mailbox
        mailbox.clear()
        outputs: list[Any] = []
        infos: list[StepInfo | None] = [None] * len(self.phases)
        failed = False
        released_by: int | None = None
        staged = False  # target verify published after draft_extend_staged succeeded
        self.staged = False
        consumer = self._consumer
        stager = None if consumer is None else self._stager()
        canary = self.staging_canary
        if canary is not None:
            canary.step()
        try:
            for i, phase in enumerate(self.phases):
                phase_batch = batch if phase.inputs is None else phase.inputs(batch, tuple(outputs))
                outputs.append(phase.runner.run(phase_batch))
                read_done, info, decided, ok = self._collect(phase)
                infos[i] = info
                if staged and (
                    i == consumer
                    if consumer is not None
                    else phase.mode is ForwardMode.DRAFT_EXTEND
                ):
                    if consumer is None or self._found_staged(phase):
                        # staged: the draft extend read draft-owned copies, verify's event holds
                        if read_done is not None:
                            read_done.slot.taken = False
                        self.staged = True
                        if canary is not None:
                            canary.observe(outputs[-1], self._rerun(phase, info, outputs[-1]))
                        continue
                    staged = False  # the consumer copied for itself: it is the release
                if i > self.last_index and not phase.runner.mode_policies().reads_shared_state:
                    if read_done is not None:  # it reads nothing (declared): discard its event
                        read_done.slot.taken = False
                    continue
                if i > self.last_index:
                    self._late_reader(phase, decided)
                released_by = i
                failed = failed or not ok
                mailbox.put(None if failed else read_done)
                staged = (
                    phase.mode is ForwardMode.TARGET_VERIFY
                    and not failed
                    and read_done is not None
                    and info is not None
                    and info.facts is not None
                    and info.facts.get(DRAFT_EXTEND_STAGED) is True
                    # with a staged consumer, only its own stager's copies count
                    and (
                        stager is None or (consumer is not None and i < consumer and stager.staged)
                    )
                )
        except BaseException:
            mailbox.clear()  # the scheduler's read of this step finds nothing: coarse
            self.staged = False
            if stager is not None:
                stager.forget()
            if canary is not None:
                canary.discard()
            self._record(infos, released_by, None)
            raise
        if failed:
            mailbox.clear()
            self.reporter.warn(
                "publish",
                "a phase decided to publish but its fence published nothing; "
                "this step uses the coarse barrier",
            )
        if canary is not None and not self.staged:
            canary.discard()
        self._record(infos, released_by, mailbox.peek())
        return tuple(outputs)

    def _stager(self) -> Any:
        assert self._consumer is not None
        model = self.phases[self._consumer].runner.model
        assert isinstance(model, StagedPhase)
        return model.stager

    @staticmethod
    def _found_staged(phase: Phase) -> bool:
        model = phase.runner.model
        return isinstance(model, StagedPhase) and model.was_staged

    @staticmethod
    def _rerun(phase: Phase, info: StepInfo | None, output: Any) -> Callable[[], Any]:
        """Replay the consumer's last step for the staging canary (its graph, whose static
        output is ``output``, or its eager forward), without its host prep (which would take the
        staged copies again)."""
        runner = phase.runner
        if info is not None and info.bucket is not None:
            graph = runner.captured[info.bucket].graph

            def replay() -> Any:
                runner.platform.replay(graph)
                return output

            return replay
        size = info.size if info is not None else 0

        def eager() -> Any:
            runner.model.graph_prep(size)
            return runner.model.forward(size)

        return eager

    def _collect(
        self, phase: Phase
    ) -> tuple[ReadDone | None, StepInfo | None, WarReadDonePolicy, bool]:
        """Take what the phase's fence published, with what the runner decided for this step;
        ``ok`` is False when it decided to publish and nothing came out (its publish failed)."""
        runner = phase.runner
        info = runner.last_step
        # what the runner decided for this step (``info.policy`` is what its fence really
        # published: NONE after a failed publish, which must not pass as a choice); a per-batch
        # decision later than the bucket's is recorded in ``info.decided``
        if info is None:
            decided = NONE
        elif info.decided is not None:
            decided = info.decided
        else:
            decided = runner.policy_for(info.bucket)
        try:
            read_done = runner.fence.take()
        except Exception:  # noqa: BLE001 - a fence that cannot be read is a failed phase
            return None, info, decided, False
        return read_done, info, decided, decided is NONE or read_done is not None

    def _late_reader(self, phase: Phase, decided: WarReadDonePolicy) -> None:
        declared = self.reader
        self.reporter.warn(
            f"late-reader:{phase.name}",
            f"phase {phase.name} ({phase.mode.label}) runs after the declared last shared "
            f"reader {declared.name} ({declared.mode.label}) but decided {decided.label}, so "
            f"it reads shared state: the step releases after {phase.name}",
        )

    def _record(
        self,
        infos: list[StepInfo | None],
        released_by: int | None,
        read_done: ReadDone | None,
    ) -> None:
        self._step += 1
        self.phase_steps = tuple(infos)
        self.released_by = None if released_by is None else self.phases[released_by]
        info = infos[released_by] if released_by is not None else None
        policy = read_done.policy if read_done is not None else NONE
        size = info.size if info is not None else 0
        bucket = info.bucket if info is not None else None
        self._last_step = StepInfo(self._step, size, bucket, policy)

    def __repr__(self) -> str:
        phases = " -> ".join(f"{p.name}:{p.mode.label}" for p in self.phases)
        return f"<SpecStep {self._name!r} {phases} last_reader={self.reader.name}>"
