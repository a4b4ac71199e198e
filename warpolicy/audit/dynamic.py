"""Dynamic race audit: poison every shared buffer the moment the fence releases, and compare
the step's outputs to a reference computed without interference.

Per audited mode (REFERENCE.md §3-4):

1. build the runner around the model, wrapped so a GPU stall runs before each captured segment
   (before the in-graph prep and after the plant): the stall sits after the release point, so
   a late reader is still pending when the poison lands;
2. capture; snapshot the shared buffers (to put back at the end);
3. per trial: make a batch (it may write shared state), then snapshot the shared buffers
   and compute the poison from that snapshot; run the step undisturbed and keep its outputs
   (the reference); restore the snapshot and run the same step again with the forward stream
   held by a head stall so the host enqueues the whole step and the scheduler's reaction
   before the GPU starts it: take the read-done event, apply the `SchedulerBarrier` on the
   schedule stream, and overwrite every shared buffer with poison there; synchronize,
   compare, restore the snapshot. When the mode is done, the buffers get back what they held
   before the audit.

On the fake platform nothing runs concurrently, so the audit simulates the race in program
order instead: a log listener poisons the buffers at the instant the published event fires
(its position in the step's record sequence is learnt from the reference step). A read after
the release point then sees poison, exactly as a late GPU reader would in the widest window.

Verdict per (backend, mode, spec): UNSAFE when any trial differs (with the first differing
output element and trial); SAFE only when none does and every trial really exercised the
declaration (a captured graph, the declared point published, something poisoned, a race
window widened by stalls or simulated); INCONCLUSIVE with the reason otherwise.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import attrs

from warpolicy.audit.report import (INCONCLUSIVE, SAFE, UNSAFE, AuditEntry, DynamicResult,
                                    Mismatch, StaticResult)
from warpolicy.audit.static import audit_static
from warpolicy.errors import WarpolicyError
from warpolicy.policy import ForwardMode, WarReadDonePolicy

NONE = WarReadDonePolicy.NONE

#: Default stall before each captured segment, in microseconds.
DEFAULT_STALL_US = 200.0
#: The head stall holds the forward stream while the host enqueues step + poison.
HEAD_STALL_MIN_US = 2000.0
#: GPU clock assumed when torch does not report one (the H200 boosts to ~1.98 GHz).
_DEFAULT_CLOCK_KHZ = 1_980_000

RunnerBuilder = Callable[[Any], Any]  # (model adapter) -> an uncaptured GraphRunner
BatchMaker = Callable[[ForwardMode, int], Any]  # (mode, trial) -> a batch on the device
PostStep = Callable[[ForwardMode, Any, Any], Any]  # (mode, batch, output) -> step output


def _modes(value: Mapping) -> Mapping[ForwardMode, Any]:
    return {ForwardMode.parse(k): v for k, v in dict(value or {}).items()}


@attrs.frozen
class AuditSubject:
    """What a factory (``module:callable``, called with the `Platform`) returns.

    ``runners`` maps each mode to a builder that wraps the given model adapter in an
    uncaptured runner (``lambda m: DecodeRunner(m, policy, platform, keep_graphs=True)``):
    the audit passes a stall-wrapped copy of ``model``. ``make_batch(mode, trial)`` returns the
    trial's batch, on the device, deterministic in ``trial``. ``post_step`` is eager work the
    engine runs on the forward stream after the runner's step (its reads of shared state count
    as reads of the step). ``poison`` overrides the default poison per buffer.
    """

    name: str
    model: Any
    runners: Mapping[ForwardMode, RunnerBuilder] = attrs.field(converter=_modes)
    make_batch: BatchMaker
    platform: Any
    declared: Mapping[ForwardMode, WarReadDonePolicy] = attrs.field(factory=dict,
                                                                    converter=_modes)
    spec: str = "none"
    post_step: Optional[PostStep] = None
    poison: Mapping[str, Callable[[Any], Any]] = attrs.field(factory=dict)


# ---------------------------------------------------------------------------------------------
# Stalls
# ---------------------------------------------------------------------------------------------

def make_stall(platform: Any, stall_us: float) -> Optional[Callable[[], None]]:
    """A callable enqueueing a ``stall_us`` GPU spin on the current stream (None: no stall)."""
    if stall_us <= 0 or getattr(platform, "name", "") != "cuda":
        return None
    import torch

    props = torch.cuda.get_device_properties(platform.device)
    clock_khz = int(getattr(props, "clock_rate", 0) or 0)
    if clock_khz < 100_000:  # missing, or not in kHz: a too-short stall would hide races
        clock_khz = _DEFAULT_CLOCK_KHZ
    cycles = max(1, int(stall_us * clock_khz / 1000))
    return lambda: torch.cuda._sleep(cycles)


class StalledModel:
    """A model adapter that spins the GPU before each captured segment, then delegates.

    Everything else (shared buffers, buckets, host prep, ``batch_size``) is the wrapped
    model's, so a runner built around it captures the same work with wider race windows.
    """

    def __init__(self, model: Any, stall: Callable[[], None]) -> None:
        self.model = model
        self.stall = stall

    def graph_prep(self, bucket: int) -> None:
        self.stall()
        self.model.graph_prep(bucket)

    def forward(self, bucket: int) -> Any:
        self.stall()  # right after the plant: a late reader is still pending at the release
        return self.model.forward(bucket)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


# ---------------------------------------------------------------------------------------------
# Poison and comparison
# ---------------------------------------------------------------------------------------------

def default_poison(tensor: Any) -> Any:
    """A value that differs from ``tensor`` in every element yet stays a valid index.

    Integers: ``(x + 1) mod (max + 1)`` (a 0/1 flip when nothing is positive), so a poisoned
    index table still points inside the pool it indexes (no illegal address, just wrong data).
    Booleans flip; floats add one.
    """
    import torch

    if tensor.dtype == torch.bool:
        return ~tensor
    if tensor.is_floating_point() or tensor.is_complex():
        return tensor + 1
    if tensor.numel() == 0:
        return tensor.clone()
    top = int(tensor.max().item())
    if top > 0:
        return torch.remainder(tensor + 1, top + 1)
    return (tensor == 0).to(tensor.dtype)


def flatten_outputs(output: Any, label: str = "out") -> list[tuple[str, Any]]:
    """``(label, tensor)`` for every tensor in a tensor / sequence / mapping output."""
    if hasattr(output, "shape") and hasattr(output, "dtype"):
        return [(label, output)]
    if isinstance(output, Mapping):
        return [x for k in sorted(output, key=str) for x in flatten_outputs(output[k],
                                                                            f"{label}[{k!r}]")]
    if isinstance(output, (list, tuple)):
        return [x for i, v in enumerate(output) for x in flatten_outputs(v, f"{label}[{i}]")]
    return []


def snapshot_outputs(output: Any) -> list[tuple[str, Any]]:
    """Detached clones of every output tensor (call after the device is idle)."""
    return [(label, t.detach().clone()) for label, t in flatten_outputs(output)]


def first_mismatch(reference: Sequence[tuple[str, Any]], observed: Sequence[tuple[str, Any]],
                   trial: int) -> Optional[Mismatch]:
    """The first element where ``observed`` differs from ``reference`` (NaN equals NaN)."""
    import torch

    want_labels = ", ".join(label for label, _ in reference)
    got_labels = ", ".join(label for label, _ in observed)
    if want_labels != got_labels:  # the step returned a differently shaped output
        return Mismatch(trial, "out", (), want_labels, got_labels, 1)
    for (label, want), (_, got) in zip(reference, observed):
        if want.shape != got.shape or want.dtype != got.dtype:
            return Mismatch(trial, label, (), f"{want.dtype}{list(want.shape)}",
                            f"{got.dtype}{list(got.shape)}", 1)
        differ = want != got
        if want.is_floating_point() or want.is_complex():
            differ &= ~(torch.isnan(want) & torch.isnan(got))
        count = int(differ.sum().item())
        if count:
            index = tuple(int(i) for i in differ.nonzero()[0].tolist()) if differ.dim() else ()
            return Mismatch(trial, label, index, want[index].item(), got[index].item(), count)
    return None


def dynamic_verdict(trials: int, corrupted: int, first: Optional[Mismatch],
                    notes: Sequence[str] = ()) -> DynamicResult:
    """UNSAFE on any difference; else INCONCLUSIVE when a note says the declaration was not
    really exercised (or no trial ran); else SAFE."""
    if not trials and not notes:
        notes = ["no trial ran"]
    reason = "; ".join(notes)
    if first is not None:
        return DynamicResult(UNSAFE, trials, corrupted, first, reason)
    if notes:
        return DynamicResult(INCONCLUSIVE, trials, 0, None, reason)
    return DynamicResult(SAFE, trials, 0, None)


# ---------------------------------------------------------------------------------------------
# The trial harness
# ---------------------------------------------------------------------------------------------

class _Harness:
    """Runs reference and poisoned steps of one runner and keeps the shared buffers honest."""

    def __init__(self, subject: AuditSubject, mode: ForwardMode, runner: Any,
                 stall_us: float) -> None:
        from warpolicy.fence import SchedulerBarrier

        self.subject = subject
        self.mode = mode
        self.runner = runner
        self.platform = runner.platform
        self.simulated = self.platform.name == "sim"
        self.shared = dict(subject.model.shared_buffers)
        self.forward = self.platform.new_stream()
        self.schedule = self.platform.new_stream()
        self.barrier = SchedulerBarrier(self.platform, name="audit")
        self.head_stall = make_stall(self.platform, max(HEAD_STALL_MIN_US, 4 * stall_us))
        self.platform.synchronize()
        self.original = self._clone_shared()  # put back when the audit ends
        self.state = self.original  # the trial's state before its steps (restored between them)
        self.poisoned: dict[str, Any] = {}
        self.log = _fake_log(self.platform) if self.simulated else None

    def _clone_shared(self) -> dict[str, Any]:
        return {n: t.detach().clone() for n, t in self.shared.items()}

    def begin_trial(self) -> list[str]:
        """After ``make_batch`` (which may write shared state): snapshot the trial's state and
        poison *that*, so the poison differs from what this trial's step really reads.

        Returns the names of non-empty buffers the poison leaves unchanged (not checked)."""
        self.platform.synchronize()
        self.state = self._clone_shared()
        self.poisoned = {n: self.subject.poison.get(n, default_poison)(t)
                         for n, t in self.state.items()}
        self.platform.synchronize()
        return [n for n, t in self.state.items()
                if t.numel() and _same(self.poisoned[n], t)]

    def step(self, batch: Any) -> Any:
        """One step as the engine runs it, on the forward stream."""
        with self.platform.stream(self.forward):
            out = self.runner.run(batch)
            if self.subject.post_step is not None:
                out = self.subject.post_step(self.mode, batch, out)
        return out

    def reference(self, batch: Any) -> tuple[list, Any, Optional[int]]:
        """Undisturbed step: outputs, what it published, and (fake) the release position."""
        with _watch_records(self.log) as records:
            out = self.step(batch)
        read_done = self.runner.fence.take()
        self.platform.synchronize()
        position = _release_position(records, read_done) if self.simulated else None
        return snapshot_outputs(out), read_done, position

    def poisoned_step(self, batch: Any, position: Optional[int]) -> list:
        """The step with the scheduler poisoning shared state the moment the fence releases."""
        if self.simulated:
            return self._simulated(batch, position)
        if self.head_stall is not None:
            with self.platform.stream(self.forward):
                self.head_stall()
        out = self.step(batch)
        read_done = self.runner.fence.take()  # right after the launch, like the scheduler
        self.barrier.apply(self.schedule, self.forward, read_done)
        with self.platform.stream(self.schedule):
            self._poison()
        self.platform.synchronize()
        return snapshot_outputs(out)

    def _simulated(self, batch: Any, position: Optional[int]) -> list:
        fired: list[tuple] = []

        def on_record(index: int, entry: tuple) -> None:
            if index == position:
                fired.append(entry)
                self._poison()

        with _watch_records(self.log, on_record):
            out = self.step(batch)
        read_done = self.runner.fence.take()
        self.barrier.apply(self.schedule, self.forward, read_done)
        if not fired or read_done is None or fired[0][1] != getattr(read_done.event, "id", None):
            raise RuntimeError("fake platform: the step recorded its events in a different order "
                               "than the reference step; cannot place the release")
        return snapshot_outputs(out)

    def _poison(self) -> None:
        for name, tensor in self.shared.items():
            tensor.copy_(self.poisoned[name])

    def restore(self, original: bool = False) -> None:
        """Put the shared buffers back (after the device is idle): to the trial's state before
        its steps, or (``original``) to what they held before the audit."""
        source = self.original if original else self.state
        self.platform.synchronize()
        with self.platform.stream(self.forward):
            for name, tensor in self.shared.items():
                tensor.copy_(source[name])
        self.platform.synchronize()


def _same(a: Any, b: Any) -> bool:
    """Whether a poison equals the state everywhere (it would hide every late read)."""
    try:
        return a.shape == b.shape and bool((a == b).all())
    except Exception:  # noqa: BLE001 - incomparable: copy_ will complain if it matters
        return False


def _fake_log(platform: Any) -> Any:
    from warpolicy.platform import sim_impl as fake_plugin

    return fake_plugin(platform).log


@contextlib.contextmanager
def _watch_records(log: Any, on_record: Optional[Callable[[int, tuple], None]] = None
                   ) -> Iterator[list]:
    """Collect the ``record`` entries a fake log emits inside the block (nothing elsewhere)."""
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


def _release_position(records: Sequence[tuple], read_done: Any) -> Optional[int]:
    """Index of the last record of the published event (a wait binds to the latest record)."""
    if read_done is None:
        return None
    event_id = getattr(read_done.event, "id", None)
    hits = [i for i, entry in enumerate(records) if entry[1] == event_id]
    return hits[-1] if hits else None


# ---------------------------------------------------------------------------------------------
# One mode
# ---------------------------------------------------------------------------------------------

def audit_mode(subject: AuditSubject, mode: ForwardMode, trials: int,
               stall_us: float = DEFAULT_STALL_US, *, static: bool = True) -> AuditEntry:
    """Audit one mode of ``subject``: dynamic trials, then the static graph walk."""
    declared = subject.declared.get(mode)
    builder = subject.runners.get(mode)
    if builder is None:
        return _entry(subject, mode, declared, None, _inconclusive(
            f"{subject.name} has no runner for mode {mode.label}"))
    try:
        return _audit_mode(subject, mode, builder, declared, trials, stall_us, static)
    except WarpolicyError:
        raise  # the subject's own usage error: one clear line at the CLI
    except Exception as exc:  # noqa: BLE001 - a failing audit is inconclusive, never a crash
        return _entry(subject, mode, declared, None,
                      _inconclusive(f"audit failed: {type(exc).__name__}: {exc}"))


def _audit_mode(subject: AuditSubject, mode: ForwardMode, builder: RunnerBuilder,
                declared: Optional[WarReadDonePolicy], trials: int, stall_us: float,
                static: bool) -> AuditEntry:
    stall = make_stall(subject.platform, stall_us)
    model = StalledModel(subject.model, stall) if stall is not None else subject.model
    runner = builder(model)
    runner.capture()
    harness = _Harness(subject, mode, runner, stall_us)
    try:
        out = _trials(harness, subject, mode, trials, declared)
    finally:
        with contextlib.suppress(Exception):  # never leave the subject's state poisoned
            harness.restore(original=True)
    dynamic = dynamic_verdict(out.ran, out.corrupted, out.first, out.notes)
    static_result = (audit_static(runner, out.bucket, harness.shared, out.policy,
                                  post_step=subject.post_step is not None)
                     if static else StaticResult(INCONCLUSIVE, reason="static audit skipped"))
    return AuditEntry(subject.name, mode, subject.spec, declared, out.policy, dynamic,
                      static_result)


@attrs.define
class _Outcome:
    """What the trials of one mode found."""

    ran: int = 0  # trials run to the comparison
    corrupted: int = 0
    first: Optional[Mismatch] = None
    policy: Optional[WarReadDonePolicy] = None  # published by the last step
    bucket: Optional[int] = None  # the last captured bucket a trial replayed (static audit)
    eager: int = 0  # trials that ran eagerly
    demoted: int = 0  # trials that published later than declared
    demoted_to: Optional[WarReadDonePolicy] = None  # the latest policy those published
    notes: list[str] = attrs.field(factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _trials(harness: _Harness, subject: AuditSubject, mode: ForwardMode, trials: int,
            declared: Optional[WarReadDonePolicy] = None) -> _Outcome:
    """Run the trials; every reason a clean run would not prove the declaration is a note."""
    runner = harness.runner
    out = _Outcome()
    if not harness.shared:
        out.note("the model declares no shared buffers: nothing to poison")
    if not harness.simulated and harness.head_stall is None:
        out.note(f"no GPU stall on platform {harness.platform.name!r}: the race window was not "
                 "widened, so a late reader may finish before the poison lands")
    for trial in range(trials):
        batch = subject.make_batch(mode, trial)
        for name in harness.begin_trial():
            out.note(f"the poison of {name!r} equals its contents: its reads are not checked")
        reference, read_done, position = harness.reference(batch)
        step = runner.last_step
        out.policy = step.policy if step is not None else None
        if read_done is None or out.policy is None or out.policy == NONE:
            out.note(_nothing_published(out.policy))
            break
        if step.bucket is None:
            out.eager += 1
        else:
            out.bucket = step.bucket
        if declared is not None and out.policy > declared:
            out.demoted += 1
            out.demoted_to = max(out.policy, out.demoted_to or out.policy)
        harness.restore()  # the poisoned step starts from the reference step's state
        mismatch = first_mismatch(reference, harness.poisoned_step(batch, position), trial)
        harness.restore()
        out.ran += 1
        if mismatch is not None:
            out.corrupted += 1
            out.first = out.first or mismatch
    out.notes += _exercise_notes(out, declared)
    return out


def _nothing_published(policy: Optional[WarReadDonePolicy]) -> str:
    label = policy.label if policy is not None else "none"
    return (f"policy {label}: the step published no read-done event, the scheduler waits for "
            "the whole forward (coarse); nothing to audit")


def _exercise_notes(out: _Outcome, declared: Optional[WarReadDonePolicy]) -> list[str]:
    """Why a clean run would not prove the declaration: every trial must have exercised it."""
    notes = []
    if out.eager:
        notes.append(f"{out.eager} of {out.ran} trials ran eagerly (no captured graph fits "
                     "the batch)")
    if out.demoted and declared is not None and out.demoted_to is not None:
        notes.append(f"declared {declared.label} but the runner published {out.demoted_to.label} "
                     f"(demoted: node not planted or no graph) in {out.demoted} of {out.ran} "
                     "trials, so the declaration itself was not exercised")
    return notes


def _inconclusive(reason: str) -> DynamicResult:
    return DynamicResult(INCONCLUSIVE, reason=reason)


def _entry(subject: AuditSubject, mode: ForwardMode, declared: Optional[WarReadDonePolicy],
           policy: Optional[WarReadDonePolicy], dynamic: DynamicResult) -> AuditEntry:
    static = StaticResult(INCONCLUSIVE, reason="not run")
    return AuditEntry(subject.name, mode, subject.spec, declared, policy, dynamic, static)
