"""A speculative step as phases, with one read-done event for the scheduler.

A speculative-decoding step runs several forwards back to back on the forward stream: draft
forwards, the target verify, and (EAGLE family) a draft extend over the accepted tokens. Each
phase is its own graph runner with its own fence. The scheduler may overwrite shared metadata
only after the **last phase that reads it**, so the step hands the scheduler exactly one
event: the one published by the phase the speculative algorithm names as its last shared
reader (``SpecAlgorithm.last_reader``; ``None`` means the last phase the step runs).

Per step, in phase order, every phase up to and including the last reader:

1. clears the step's mailbox (an earlier phase's event is stale from now on);
2. runs (launches its graph on the forward stream, publishing through its own fence);
3. puts what its fence published into the step's mailbox (nothing if it decided ``none``).

So after the last reader the mailbox holds that phase's event, or nothing when it decided
``none`` (the scheduler then takes the coarse barrier). Phases after the last reader run too,
but by the declaration they read no shared state, so their events are discarded. The
release is sound for earlier phases as well: they ran before the last reader on the same
stream, so its event fires after their reads.

Failure of any phase fails closed: a phase that raises, or that decided to publish but whose
fence published nothing (a hook or record failed), leaves the step's mailbox empty (coarse).

The step looks like a runner to `OverlapLoop` and the audit (``run``, ``fence.take()``,
``platform``, ``capture``, ``last_step``), so ``loop.step(batch, write_next, runner=step)``
runs it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

import attrs

from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import NONE, ForwardMode
from warpolicy.runtime.runners.base import CapturedBucket, GraphRunner, StepInfo

if TYPE_CHECKING:  # the fence imports torch; runners import it lazily
    from warpolicy.runtime.fence import ReadDone

#: ``inputs(step_batch, earlier_outputs) -> this phase's batch``
PhaseInputs = Callable[[Any, Sequence[Any]], Any]


def last_reader_of(spec: Any) -> Optional[ForwardMode]:
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
    inputs: Optional[PhaseInputs] = None

    @property
    def mode(self) -> ForwardMode:
        return self.runner.mode

    @property
    def name(self) -> str:
        return self.runner.name


class StepMailbox:
    """The step's one-slot mailbox: what the scheduler takes (consume-once) after the launch.

    ``event`` is the persistent external event of the last reader's fence (the static audit
    looks for its record node in that phase's graph).
    """

    def __init__(self, name: str, last_fence: Any) -> None:
        self.name = name
        self._last_fence = last_fence
        self._read_done: Optional[ReadDone] = None

    @property
    def event(self) -> Any:
        return self._last_fence.event

    def clear(self) -> None:
        self._read_done = None

    def put(self, read_done: Optional[ReadDone]) -> None:
        self._read_done = read_done

    def peek(self) -> Optional[ReadDone]:
        return self._read_done

    def take(self) -> Optional[ReadDone]:
        read_done, self._read_done = self._read_done, None
        return read_done


class SpecStep:
    """Runs the phases of one speculative step in order and publishes one read-done event.

    ``last_reader`` is the mode of the phase whose event the scheduler waits on (the last
    phase of that mode when several share it); ``None`` means the last phase. Build it from a
    registry entry with `SpecStep.for_algorithm`.
    """

    def __init__(
        self,
        phases: Sequence[Union[Phase, GraphRunner]],
        *,
        last_reader: Union[str, ForwardMode, None] = None,
        name: str = "spec_step",
    ) -> None:
        self.phases: tuple[Phase, ...] = tuple(
            p if isinstance(p, Phase) else Phase(p) for p in phases
        )
        if not self.phases:
            raise InputError(f"{name}: a speculative step needs at least one phase")
        self.name = name
        self.last_reader: Optional[ForwardMode] = (
            None if last_reader is None else ForwardMode.parse(last_reader)
        )
        self.last_index = self._last_index()
        self.platform = self.phases[0].runner.platform
        if any(p.runner.platform is not self.platform for p in self.phases):
            raise InputError(f"{name}: every phase must run on the same platform")
        self.fence = StepMailbox(name, self.reader.runner.fence)
        self.last_step: Optional[StepInfo] = None
        #: what each phase did in the last step (``None`` for a phase that did not run)
        self.phase_steps: tuple[Optional[StepInfo], ...] = ()
        self._step = 0
        self._warned = False

    @classmethod
    def for_algorithm(
        cls, phases: Sequence[Union[Phase, GraphRunner]], spec: Any, **kwargs: Any
    ) -> SpecStep:
        """A step whose last reader is what the registry declares for ``spec`` (a
        `SpecAlgorithm`)."""
        kwargs.setdefault("name", f"{getattr(spec, 'name', 'spec')}_step")
        return cls(phases, last_reader=last_reader_of(spec), **kwargs)

    def _last_index(self) -> int:
        if self.last_reader is None:
            return len(self.phases) - 1
        hits = [i for i, p in enumerate(self.phases) if p.mode == self.last_reader]
        if not hits:
            raise InputError(
                f"{self.name}: the last shared reader is {self.last_reader.label}, "
                f"but the step has no such phase (phases: "
                f"{', '.join(p.mode.label for p in self.phases)})"
            )
        return hits[-1]

    # -- what the overlap loop and the audit see -------------------------------------------------

    @property
    def reader(self) -> Phase:
        """The phase whose event the scheduler waits on."""
        return self.phases[self.last_index]

    @property
    def mode(self) -> ForwardMode:
        return self.reader.mode

    @property
    def model(self) -> Any:
        return self.reader.runner.model

    @property
    def captured(self) -> Mapping[int, CapturedBucket]:
        """The last reader's captured graphs (the static audit walks the releasing graph)."""
        return self.reader.runner.captured

    @property
    def is_captured(self) -> bool:
        return all(p.runner.is_captured or not p.runner.buckets for p in self.phases)

    def capture(self) -> None:
        """Capture every phase's runner once (a runner may serve several phases)."""
        seen: set[int] = set()
        for phase in self.phases:
            if id(phase.runner) not in seen:
                seen.add(id(phase.runner))
                phase.runner.capture()

    # -- per step --------------------------------------------------------------------------------

    def run(self, batch: Any) -> tuple[Any, ...]:
        """Run every phase on the current (forward) stream; returns their outputs in order.

        Afterwards ``fence.take()`` gives the last reader's `ReadDone`, or None (coarse).
        """
        mailbox = self.fence
        mailbox.clear()
        outputs: list[Any] = []
        infos: list[Optional[StepInfo]] = [None] * len(self.phases)
        failed = False
        try:
            for i, phase in enumerate(self.phases):
                publishes = i <= self.last_index
                if publishes:
                    mailbox.clear()
                phase_batch = batch if phase.inputs is None else phase.inputs(batch, tuple(outputs))
                outputs.append(phase.runner.run(phase_batch))
                read_done, info, ok = self._collect(phase)
                infos[i] = info
                failed = failed or not ok
                if publishes and not failed:
                    mailbox.put(read_done)
        except BaseException:
            mailbox.clear()  # the scheduler's read of this step finds nothing: coarse
            self._record(batch, infos, None)
            raise
        if failed:
            mailbox.clear()
            self._warn(
                "a phase decided to publish but its fence published nothing; "
                "this step uses the coarse barrier"
            )
        self._record(batch, infos, None if failed else mailbox.peek())
        return tuple(outputs)

    def _collect(self, phase: Phase) -> tuple[Optional[ReadDone], Optional[StepInfo], bool]:
        """Take what the phase's fence published; ``ok`` is False when it decided to publish
        and nothing came out (its publish failed)."""
        runner = phase.runner
        try:
            read_done = runner.fence.take()
        except Exception:  # noqa: BLE001 - a fence that cannot be read is a failed phase
            return None, runner.last_step, False
        info = runner.last_step
        # what the runner decided for this step's graph (``info.policy`` is what its fence
        # really published: NONE after a failed publish, which must not pass as a choice)
        decided = runner.policy_for(info.bucket) if info is not None else NONE
        return read_done, info, decided == NONE or read_done is not None

    def _record(
        self, batch: Any, infos: list[Optional[StepInfo]], read_done: Optional[ReadDone]
    ) -> None:
        self._step += 1
        self.phase_steps = tuple(infos)
        reader = infos[self.last_index]
        policy = read_done.policy if read_done is not None else NONE
        size = reader.size if reader is not None else 0
        bucket = reader.bucket if reader is not None else None
        self.last_step = StepInfo(self._step, size, bucket, policy)

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"warpolicy {self.name}: {message}", RuntimeWarning, stacklevel=3)

    def __repr__(self) -> str:
        phases = " -> ".join(f"{p.name}:{p.mode.label}" for p in self.phases)
        return f"<SpecStep {self.name!r} {phases} last_reader={self.reader.name}>"
