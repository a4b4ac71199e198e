"""Dynamic race audit: poison every shared buffer the moment the fence releases, and compare
the step's outputs (and the state it writes) to a reference computed without interference.

Per audited mode (docs/ARCHITECTURE.md, "Audit"):

1. build the runner around the model, wrapped so a GPU stall runs before each captured segment
   (before the in-graph prep and after the plant): the stall sits after the release point, so
   a late reader is still pending when the poison lands;
2. capture; snapshot the shared buffers and the subject's ``extra_outputs`` (to put back at
   the end);
3. per trial: make a batch (it may write shared state), then snapshot the shared buffers and
   extra outputs and compute the poison set from that snapshot (`warpolicy.audit.poison`: one
   round per poison); run the step undisturbed and keep its outputs and extra outputs (the
   reference); then, per round, restore the snapshot and run the same step again with the
   forward stream held by a head stall so the host enqueues the whole step and the scheduler's
   reaction before the GPU starts it: take the read-done event, apply the `SchedulerBarrier` on
   the schedule stream, and overwrite every shared buffer with that round's poison there;
   synchronize, compare with the reference, restore the snapshot. When the mode is done,
   everything gets back what it held before the audit;
4. the runner's capture self-check: a declared ``in_graph`` bucket it demoted because shared
   readers follow the marker is a refuted declaration (`warpolicy.audit.static.
   self_check_refutation`), reported UNSAFE with those readers.

On the simulated platform nothing runs concurrently, so the audit simulates the race in program
order instead: a log listener poisons the buffers at the instant the published event fires
(its position in the step's record sequence is learnt from the reference step). A read after
the release point then sees poison, exactly as a late GPU reader would in the widest window.

Verdict per (backend, mode, spec): UNSAFE when any trial differs (with the first differing
output element, trial and poison) or the self-check refuted the declaration; SAFE only when
none does and the trials really exercised the declaration: the declared point published by a
captured graph in every trial, each poisoned step publishing the same event as its reference,
every element of every shared buffer changed by every poison, every captured bucket replayed,
a race window widened by stalls or simulated, and on a real device at least `MIN_TRIALS`
trials. INCONCLUSIVE with the reasons otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from warpolicy.audit.class_poisons import class_poisons
from warpolicy.audit.poison import (
    Poison,
    first_mismatch,
    poison_set,
    snapshot_outputs,
    unchanged_elements,
)
from warpolicy.audit.report import (
    INCONCLUSIVE,
    SAFE,
    UNSAFE,
    AuditEntry,
    DynamicResult,
    Mismatch,
    StaticResult,
)
from warpolicy.audit.sites import refutation_with_sites, sited_model, static_with_sites
from warpolicy.audit.static import audit_static_buckets, self_check_refutation
from warpolicy.audit.subject import (
    DEFAULT_STALL_US,
    AuditSubject,
    RunnerBuilder,
    make_stall,
    stalled_model,
)
from warpolicy.errors import WarpolicyError
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, ForwardMode, WarReadDonePolicy
from warpolicy.runtime.fence import SchedulerBarrier
from warpolicy.runtime.platforms import SIM_DEVICE_TYPES
from warpolicy.runtime.runners.protocols import ClassMailbox, Runner

#: The head stall holds the forward stream while the host enqueues step + poison.
HEAD_STALL_MIN_US = 2000.0
#: A SAFE verdict on a real device needs at least this many trials (the race is
#: probabilistic there); the simulated platform's window is deterministic, so there every
#: captured bucket replayed once is enough.
MIN_TRIALS = 10
#: Platform names whose race is simulated in program order (the simulated platform).
SIMULATED = SIM_DEVICE_TYPES  # the one alias list (warpolicy.runtime.platforms)


def dynamic_verdict(
    trials: int,
    corrupted: int,
    first: Mismatch | None,
    notes: Sequence[str] = (),
    caught: Sequence[tuple[str, int]] = (),
) -> DynamicResult:
    """UNSAFE on any difference; else INCONCLUSIVE when a note says the declaration was not
    really exercised (or no trial ran); else SAFE. ``caught``: per poison, the trials whose
    step under it differed."""
    if not trials and not notes:
        notes = ["no trial ran"]
    reason = "; ".join(notes)
    if first is not None:
        return DynamicResult(UNSAFE, trials, corrupted, first, reason, caught=caught)
    if notes:
        return DynamicResult(INCONCLUSIVE, trials, 0, None, reason, caught=caught)
    return DynamicResult(SAFE, trials, 0, None, caught=caught)


# ---------------------------------------------------------------------------------------------
# The trial harness
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class Publication:
    """What one step published: the two steps of a trial must publish the same."""

    policy: WarReadDonePolicy | None  # None: nothing (the scheduler waits coarsely)
    bucket: int | None  # the captured bucket replayed (None: eager)
    event: int | None = None  # identity of the planted event an in_graph publish hands out

    def describe(self) -> str:
        what = self.policy.label if self.policy is not None else "nothing"
        where = f"bucket {self.bucket}" if self.bucket is not None else "eager"
        return f"{what} ({where})"


class _Harness:
    """Runs reference and poisoned steps of one runner and keeps the subject's state honest."""

    def __init__(
        self,
        subject: AuditSubject,
        mode: ForwardMode,
        runner: Runner,
        stall_us: float,
        buffer_class: str | None = None,
    ) -> None:
        self.subject = subject
        self.mode = mode
        self.runner = runner
        self.platform = runner.platform
        self.simulated = getattr(self.platform, "name", "") in SIMULATED
        # buffer_class: the scheduler writes (poisons) only that class's buffers, released by
        # that class's read-done (`ReadDoneFence.take_class`)
        self.buffer_class = buffer_class
        self.shared = dict(subject.model.shared_buffers)
        if buffer_class is not None:
            self.shared = {
                n: t for n, t in self.shared.items() if subject.class_of(n) == buffer_class
            }
        self.written = dict(subject.extra_outputs)
        self.forward = self.platform.new_stream()
        self.schedule = self.platform.new_stream()
        self.barrier = SchedulerBarrier(self.platform, name="audit")
        self.head_stall = make_stall(self.platform, max(HEAD_STALL_MIN_US, 4 * stall_us))
        self.platform.synchronize()
        self.original = self._clone()  # put back when the audit ends
        self.state = self.original  # the trial's state before its steps (restored between them)
        self.poisoned: dict[str, Any] = {}  # what `_poison` writes (the current round's poison)
        self.rounds: list[tuple[str, dict[str, Any]]] = []  # this trial's poisons, in order
        self.placed = True  # simulated: the last poisoned step's poison landed at the release
        # the simulated platform's call log: its listeners place the poison in program order
        self.log = self.platform.log if self.simulated else None

    def _clone(self) -> dict[str, Any]:
        tensors = {**self.written, **self.shared}
        return {n: t.detach().clone() for n, t in tensors.items()}

    def begin_trial(self) -> list[str]:
        """After ``make_batch`` (which may write shared state): snapshot the trial's state and
        poison *that*, so each poison differs from what this trial's step really reads.

        Builds ``rounds``: one poisoned step per poison of the longest per-buffer set (a buffer
        with fewer poisons repeats its own in turn). Returns a note for every buffer whose
        poison leaves some element unchanged."""
        self.platform.synchronize()
        self.state = self._clone()
        sets = {n: self._poisons(n) for n in self.shared}
        count = max((len(p) for p in sets.values()), default=0)
        self.rounds = [] if count else [("nothing", {})]  # no shared buffer: one plain step
        for k in range(count):
            chosen = {n: p[k % len(p)] for n, p in sets.items()}
            label = "+".join(dict.fromkeys(p.name for p in chosen.values()))
            self.rounds.append((label, {n: p(self.state[n]) for n, p in chosen.items()}))
        self.platform.synchronize()
        notes = []
        for label, poisoned in self.rounds:
            for name in self.shared:
                total = self.state[name].numel()
                same = unchanged_elements(poisoned[name], self.state[name]) if total else 0
                if same:
                    notes.append(
                        f"the poison of {name!r} leaves {same} of {total} elements unchanged "
                        f"under {label}: late reads of those are not checked there"
                    )
        return notes

    def _poisons(self, name: str) -> tuple[Poison, ...]:
        """The subject's override for buffer ``name``, else, for a subject that names its
        buffers' classes, the poisons that fit the buffer's class, else the defaults."""
        override = self.subject.poison.get(name)
        if override is None and self.subject.buffer_classes:
            return class_poisons(self.subject.class_of(name), self.state[name])
        return poison_set(override, self.state[name])

    def step(self, batch: Any) -> Any:
        """One step as the engine runs it, on the forward stream."""
        with self.platform.stream(self.forward):
            out = self.runner.run(batch)
            if self.subject.post_step is not None:
                out = self.subject.post_step(self.mode, batch, out)
        return out

    def published(self, read_done: Any) -> Publication:
        step = self.runner.last_step
        bucket = step.bucket if step is not None else None
        if read_done is None:
            return Publication(None, bucket)
        event = id(read_done.event) if read_done.policy == IN_GRAPH else None
        return Publication(read_done.policy, bucket, event)

    def reference(self, batch: Any) -> tuple[list, Publication, int | None]:
        """Undisturbed step: outputs, what it published, and (simulated) the release position."""
        with _watch_records(self.log) as records:
            out = self.step(batch)
        read_done = self._take()
        self.platform.synchronize()
        if read_done is not None:
            read_done.discard()  # the host waited: no barrier will
        position = _release_position(records, read_done) if self.simulated else None
        return snapshot_outputs(out, self.written), self.published(read_done), position

    def poisoned_step(
        self, batch: Any, position: int | None, poisoned: dict[str, Any] | None = None
    ) -> tuple[list, Publication]:
        """The step with the scheduler poisoning shared state (with ``poisoned``, else the
        first round's poison) the moment the fence releases."""
        self.poisoned = poisoned if poisoned is not None else self.rounds[0][1]
        if self.simulated:
            return self._simulated(batch, position)
        if self.head_stall is not None:
            with self.platform.stream(self.forward):
                self.head_stall()
        out = self.step(batch)
        read_done = self._take()  # right after the launch, like the scheduler
        self.barrier.apply(self.schedule, self.forward, read_done)
        scheduler_writes(self.platform, self.schedule, self.shared, self.poisoned)
        self.platform.synchronize()
        return snapshot_outputs(out, self.written), self.published(read_done)

    def _simulated(self, batch: Any, position: int | None) -> tuple[list, Publication]:
        fired: list[tuple] = []

        def on_record(index: int, entry: tuple) -> None:
            if index == position:
                fired.append(entry)
                self._poison()

        with _watch_records(self.log, on_record):
            out = self.step(batch)
        read_done = self._take()
        self.barrier.apply(self.schedule, self.forward, read_done)
        # whether the poison landed on the published event's record (checked by the caller
        # once it knows the step published what the reference did)
        self.placed = (
            bool(fired)
            and read_done is not None
            and fired[0][1] == getattr(read_done.event, "id", None)
        )
        return snapshot_outputs(out, self.written), self.published(read_done)

    def expected(
        self, reference: list[tuple[str, Any]], poisoned: dict[str, Any]
    ) -> list[tuple[str, Any]]:
        """What a poisoned step must leave: the reference step's outputs, except state the step
        writes that the scheduler also wrote after the release (a recurrent state slot, say):
        that must hold the scheduler's write, the poison; a forward that still wrote it after
        the release leaves something else there."""
        both = set(self.shared) & set(self.written)
        if not both:
            return reference
        return [(label, poisoned[label] if label in both else t) for label, t in reference]

    def _take(self) -> Any:
        """The read-done the audited writes wait for: the step's latest (`take`), or the
        audited class's (`take_class`; the latest is then discarded: the host synchronizes
        before the next step)."""
        fence = self.runner.fence
        if self.buffer_class is None:
            return fence.take()
        read_done = fence.take_class(self.buffer_class) if isinstance(fence, ClassMailbox) else None
        latest = fence.take()
        if latest is not None and latest is not read_done:
            latest.discard()
        return read_done

    def _poison(self) -> None:
        for name, tensor in self.shared.items():
            tensor.copy_(self.poisoned[name])

    def restore(self, original: bool = False) -> None:
        """Put the shared buffers and extra outputs back (after the device is idle): to the
        trial's state before its steps, or (``original``) to what they held before the audit."""
        source = self.original if original else self.state
        self.platform.synchronize()
        with self.platform.stream(self.forward):
            for name, tensor in {**self.written, **self.shared}.items():
                tensor.copy_(source[name])
        self.platform.synchronize()


def scheduler_writes(
    platform: Any, schedule: Any, targets: Mapping[str, Any], values: Mapping[str, Any]
) -> None:
    """The scheduler's writes after its barrier: ``targets[name].copy_(values[name])``.

    A device buffer is written on the ``schedule`` stream, which the barrier made wait. A
    host-visible buffer (pinned host memory a graph copies from, as vLLM's input slots and
    TensorRT-LLM's staging buffers are) is written by the host, so on CUDA the host first waits
    for the schedule stream (the barrier's event, or the whole forward stream): a host write
    issued at once would land before any release, a race of the audit's own making."""
    device = [n for n, t in targets.items() if not _host_side(platform, t)]
    host = [n for n in targets if n not in device]
    with platform.stream(schedule):
        for name in device:
            targets[name].copy_(values[name])
    if host:
        if platform.name == "cuda":
            schedule.synchronize()  # the host-side barrier of a host-visible buffer
        for name in host:
            targets[name].copy_(values[name])


def _host_side(platform: Any, tensor: Any) -> bool:
    return platform.name == "cuda" and tensor.device.type == "cpu"


@contextlib.contextmanager
def _watch_records(
    log: Any, on_record: Callable[[int, tuple], None] | None = None
) -> Iterator[list]:
    """Collect the ``record`` entries a simulated log emits inside the block."""
    records: list[tuple] = []
    if log is None:
        yield records
        return

    def listener(entry: tuple) -> None:
        if entry and entry[0] == "record":
            records.append(entry)
            if on_record is not None:
                on_record(len(records) - 1, entry)

    log.listeners.append(listener)
    try:
        yield records
    finally:
        log.listeners.remove(listener)


def _release_position(records: Sequence[tuple], read_done: Any) -> int | None:
    """Index of the last record of the published event (a wait binds to the latest record)."""
    if read_done is None:
        return None
    event_id = getattr(read_done.event, "id", None)
    hits = [i for i, entry in enumerate(records) if entry[1] == event_id]
    return hits[-1] if hits else None


# ---------------------------------------------------------------------------------------------
# One mode
# ---------------------------------------------------------------------------------------------


def audit_mode(
    subject: AuditSubject,
    mode: ForwardMode,
    trials: int,
    stall_us: float = DEFAULT_STALL_US,
    *,
    static: bool = True,
) -> AuditEntry:
    """Audit one mode of ``subject``: dynamic trials, then the static walk of every captured
    bucket. A failure of the audit itself is an INCONCLUSIVE entry marked ``failed``."""
    declared = subject.declared.get(mode)
    builder = subject.runners.get(mode)
    if builder is None:
        return _entry(
            subject,
            mode,
            declared,
            None,
            DynamicResult(
                INCONCLUSIVE, reason=f"{subject.name} has no runner for mode {mode.label}"
            ),
        )
    try:
        return _audit_mode(subject, mode, builder, declared, trials, stall_us, static)
    except WarpolicyError:
        raise  # the subject's own usage error: one clear line at the CLI
    except Exception as exc:  # noqa: BLE001 - a failing audit is reported, never a crash
        return _entry(
            subject,
            mode,
            declared,
            None,
            DynamicResult(
                INCONCLUSIVE, reason=f"audit failed: {type(exc).__name__}: {exc}", failed=True
            ),
        )


def audit_classes(
    subject: AuditSubject,
    mode: ForwardMode,
    trials: int,
    stall_us: float = DEFAULT_STALL_US,
) -> list[AuditEntry]:
    """Audit each buffer class ``subject`` declares for ``mode`` separately: only that class's
    buffers are poisoned, the moment that class's read-done releases (one entry per class,
    named ``SUBJECT:CLASS``; the whole step's audit is `audit_mode`'s). A class no buffer
    belongs to is INCONCLUSIVE (nothing to poison)."""
    builder = subject.runners.get(mode)
    out = []
    for buffer_class, declared in subject.declared_classes.get(mode, {}).items():
        name = f"{subject.name}:{buffer_class}"
        if builder is None:
            continue
        try:
            out.append(
                _audit_mode(subject, mode, builder, declared, trials, stall_us, False, buffer_class)
            )
        except WarpolicyError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing audit is reported, never a crash
            why = f"audit failed: {type(exc).__name__}: {exc}"
            dynamic = DynamicResult(INCONCLUSIVE, reason=why, failed=True)
            out.append(attrs.evolve(_entry(subject, mode, declared, None, dynamic), backend=name))
    return out


def _audit_mode(
    subject: AuditSubject,
    mode: ForwardMode,
    builder: RunnerBuilder,
    declared: WarReadDonePolicy | None,
    trials: int,
    stall_us: float,
    static: bool,
    buffer_class: str | None = None,
) -> AuditEntry:
    stall = make_stall(subject.platform, stall_us)
    model = stalled_model(subject.model, stall) if stall is not None else subject.model
    sited = sited_model(model, subject.platform)  # names late readers by file:line (CUDA)
    runner = builder(sited if sited is not None else model)
    runner.capture()
    harness = _Harness(subject, mode, runner, stall_us, buffer_class)
    try:
        out = _trials(harness, subject, mode, trials, declared)
    finally:
        with contextlib.suppress(Exception):  # never leave the subject's state poisoned
            harness.restore(original=True)
    dynamic = dynamic_verdict(
        out.ran, out.corrupted, out.first, out.notes, tuple(out.caught.items())
    )
    static_result = (
        audit_static_buckets(runner, harness.shared, post_step=subject.post_step is not None)
        if static
        else StaticResult(INCONCLUSIVE, reason="static audit skipped")
    )
    if buffer_class is not None:  # the class's own published point, not the step's
        static_result = StaticResult(
            INCONCLUSIVE, reason="per-class entry: the step's static audit covers the graph"
        )
        return AuditEntry(
            f"{subject.name}:{buffer_class}",
            mode,
            subject.spec,
            declared,
            out.class_policy,
            dynamic,
            static_result,
        )
    refuted = self_check_refutation(runner, harness.shared, declared, out.policy)
    if sited is not None:
        static_result = static_with_sites(static_result, sited.sites)
        refuted = refutation_with_sites(refuted, sited.sites)
    return AuditEntry(
        subject.name, mode, subject.spec, declared, out.policy, dynamic, static_result, refuted
    )


@attrs.define
class _Outcome:
    """What the trials of one mode found."""

    ran: int = 0  # trials run to the comparison
    corrupted: int = 0
    first: Mismatch | None = None
    policy: WarReadDonePolicy | None = None  # published by the last step
    class_policy: WarReadDonePolicy | None = None  # the audited class's, last step
    replayed: set[int] = attrs.field(factory=set)  # captured buckets the checked trials replayed
    eager: int = 0  # trials that ran eagerly
    demoted: int = 0  # trials that published later than declared
    demoted_to: WarReadDonePolicy | None = None  # the latest policy those published
    unmatched: int = 0  # poisoned steps that published something else than the reference
    caught: dict[str, int] = attrs.field(factory=dict)  # poison -> trials its step differed in
    notes: list[str] = attrs.field(factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _trials(
    harness: _Harness,
    subject: AuditSubject,
    mode: ForwardMode,
    trials: int,
    declared: WarReadDonePolicy | None = None,
) -> _Outcome:
    """Run the trials; every reason a clean run would not prove the declaration is a note."""
    runner = harness.runner
    out = _Outcome()
    if not harness.shared:
        out.note("the model declares no shared buffers: nothing to poison")
    if not harness.simulated and harness.head_stall is None:
        out.note(
            f"no GPU stall on platform {harness.platform.name!r}: the race window was not "
            "widened, so a late reader may finish before the poison lands"
        )
    for trial in range(trials):
        batch = subject.make_batch(mode, trial)
        for note in harness.begin_trial():
            out.note(note)
        reference, published, position = harness.reference(batch)
        step = runner.last_step
        out.policy = step.policy if step is not None else None
        if harness.buffer_class is not None:  # judged by what the class published
            out.class_policy = published.policy
            out.policy = published.policy if published.policy is not None else NONE
        if published.policy is None or out.policy is None or out.policy == NONE:
            out.note(_nothing_published(out.policy))
            break
        counted = False
        caught: Mismatch | None = None
        for label, poisoned in harness.rounds:
            out.caught.setdefault(label, 0)
            harness.restore()  # each poisoned step starts from the reference step's state
            observed, again = harness.poisoned_step(batch, position, poisoned)
            harness.restore()
            if again != published:  # a comparison of two different releases proves nothing
                out.unmatched += 1
                out.note(
                    f"trial {trial}: the poisoned step published {again.describe()}, the "
                    f"reference step {published.describe()}"
                )
                continue
            if not harness.placed:
                raise RuntimeError(
                    "simulated platform: the step recorded its events in a different "
                    "order than the reference step; cannot place the release"
                )
            counted = True
            mismatch = first_mismatch(harness.expected(reference, poisoned), observed, trial, label)
            if mismatch is not None:
                out.caught[label] += 1
                caught = caught or mismatch
        if not counted:
            continue
        out.ran += 1
        if published.bucket is None:
            out.eager += 1
        else:
            out.replayed.add(published.bucket)
        if declared is not None and out.policy > declared:
            out.demoted += 1
            # an explicit None test: PRE_REPLAY is 0, so a policy is falsy there
            later = out.demoted_to
            out.demoted_to = out.policy if later is None else max(out.policy, later)
        if caught is not None:
            out.corrupted += 1
            out.first = out.first or caught
    out.notes += _exercise_notes(out, declared, harness)
    return out


def _nothing_published(policy: WarReadDonePolicy | None) -> str:
    label = policy.label if policy is not None else "none"
    return (
        f"policy {label}: the step published no read-done event, the scheduler waits for "
        "the whole forward (coarse); nothing to audit"
    )


def _exercise_notes(
    out: _Outcome, declared: WarReadDonePolicy | None, harness: _Harness
) -> list[str]:
    """Why a clean run would not prove the declaration: every trial must have exercised it,
    the trials must have replayed every captured bucket, and (real devices) there must be
    enough of them."""
    notes = []
    if out.eager:
        notes.append(
            f"{out.eager} of {out.ran} trials ran eagerly (no captured graph fits the batch)"
        )
    if out.demoted and declared is not None and out.demoted_to is not None:
        notes.append(
            f"declared {declared.label} but the runner published {out.demoted_to.label} "
            f"(demoted: node not planted or no graph) in {out.demoted} of {out.ran} "
            "trials, so the declaration itself was not exercised"
        )
    if out.unmatched:
        notes.append(
            f"{out.unmatched} poisoned step(s) did not publish what the reference step "
            "did; those steps were not counted"
        )
    captured = sorted(getattr(harness.runner, "captured", None) or ())
    missed = [b for b in captured if b not in out.replayed]
    if out.ran and missed:
        notes.append(
            f"no trial replayed captured bucket(s) {', '.join(map(str, missed))}: "
            "make_batch must cover every bucket (or run more trials)"
        )
    if out.ran and not harness.simulated and out.ran < MIN_TRIALS:
        notes.append(
            f"only {out.ran} trial(s) checked; a SAFE verdict on a real device needs "
            f"at least {MIN_TRIALS}"
        )
    return notes


def _entry(
    subject: AuditSubject,
    mode: ForwardMode,
    declared: WarReadDonePolicy | None,
    policy: WarReadDonePolicy | None,
    dynamic: DynamicResult,
) -> AuditEntry:
    static = StaticResult(INCONCLUSIVE, reason="not run")
    return AuditEntry(subject.name, mode, subject.spec, declared, policy, dynamic, static)
