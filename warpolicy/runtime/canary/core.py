"""The WAR canary: sample a step, replay it behind a full barrier, compare, fail closed.

A `Canary` is built once per process (at the composition root, next to the plugin manager and
the platform) and shared by every runner; each runner (or each set of graphs an engine owns)
opens a `CanarySession` on it. On one step in ``1 / rate`` (random gaps, `CanaryConfig`), up to
a per-process budget:

1. **before the release** (after the step's host prep, on the forward stream, before anything
   is published): `CanarySession.begin` saves the state the step reads (``inputs``: the shared
   buffers by default) and the state it reads and writes (``state``: KV pools), as the
   adapter's `CanarySpec` lists them;
2. the step runs **overlapped exactly like any other** (same publish, same barrier, the
   scheduler's next writes race it as usual); right after its publish `CanarySession.observe`
   saves what it produced (its output and ``state``), on the forward stream;
3. **after the scheduler's writes for the next step**, with the schedule stream current
   (`OverlapLoop` does this; an engine calls `CanarySession.check`): a host synchronize (the
   full barrier: the step and the writes are done); save the live contents of everything the
   check touches; put the pre-step ``inputs`` and ``state`` back; replay the same graph with
   nothing else running; synchronize; compare (bitwise, or within the spec's `Tolerance`); then
   put every live content back, on the schedule stream, before the event the next forward
   waits on is recorded. The scheduler's next writes come after the check on the same stream,
   so the check never races them.

A difference is an early release: the cell (backend, mode, spec, bucket) is demoted to the
coarse barrier for the rest of the process (every session of that cell, in every runner of the
canary, swaps its `BucketRelease` for `warpolicy.runtime.release.demote_release`'s), then
``warpolicy_on_violation`` fires and one log line names the backend, mode, bucket, step and the
first differing element. Any exception inside the canary (``BaseException`` included) fails
closed the same way: that cell coarse, reported to ``warpolicy_on_fallback``; a
``KeyboardInterrupt`` is re-raised once the cell is coarse and the live state is back. Only when
the live state cannot be put back does the check raise (`CanaryError`): serving on from state the
canary half-restored would be a silent corruption of its own.

What a sample holds (the byte budget, ``max_bytes``, counts it before saving anything): the
pre-step copies of ``inputs`` and ``state``, the observed output and ``state``, and during the
check the live copies of ``inputs``, ``state`` and output and the replay's ``state``: ``2 x
inputs + 4 x state + 2 x output`` bytes (an eager step's rerun allocates its own output too).
A sample over the budget is skipped (said once per bucket). ``Canary.max_sample_bytes`` is the
most one sample held.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from warpolicy import environment
from warpolicy.errors import InputError, WarpolicyError
from warpolicy.registry.vocabulary import NONE, ForwardMode
from warpolicy.runtime.canary.compare import Difference, first_difference, flatten_outputs
from warpolicy.runtime.canary.lead import (
    CudaLeadClock,
    HostLeadClock,
    LeadClock,
    LeadKey,
    LeadSummary,
    ReleaseLeadProbe,
)
from warpolicy.runtime.canary.sampling import Countdown
from warpolicy.runtime.canary.state import CanarySpec, Snapshot, as_snapshot
from warpolicy.runtime.observers import NO_OBSERVERS, Observers, Reporter
from warpolicy.runtime.platforms import Platform, is_simulated
from warpolicy.runtime.release import BucketRelease, demote_release

log = logging.getLogger("warpolicy")

#: The default byte budget of one sample (see the module docstring for what it holds).
DEFAULT_MAX_BYTES = 256 << 20

#: Violations a canary keeps for inspection (`Canary.violations`).
KEEP_VIOLATIONS = 100


class CanaryError(WarpolicyError):
    """The canary could not put the live state back after a check: the process must not serve
    on (the only case where the canary raises)."""


def _fraction(instance: Any, attribute: Any, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"canary {attribute.name} must be a number from 0 to 1, not {value!r}")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InputError(f"canary {attribute.name} must be from 0 to 1, not {value!r}")


def _count(minimum: int) -> Callable[[Any, Any, Any], None]:
    def check(instance: Any, attribute: Any, value: Any) -> None:
        if value is None and attribute.name in ("budget", "seed"):
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise InputError(
                f"canary {attribute.name} must be an integer >= {minimum}, not {value!r}"
            )

    return check


@attrs.frozen
class CanaryConfig:
    """How often the canary samples and what it may hold. Off by default (``rate`` 0).

    ``rate``: the share of each runner's steps that are checked (``0.001``: one in a thousand,
    at random); ``budget``: at most this many checks in the process (None: no limit);
    ``max_bytes``: what one sample may hold (larger ones are skipped, said once per bucket);
    ``lead_rate``: the share of overlap-loop steps whose release lead is measured (0: never);
    ``seed``: for reproducible sampling (None: random).
    """

    rate: float = attrs.field(default=0.0, validator=_fraction)
    budget: int | None = attrs.field(default=None, validator=_count(0))
    max_bytes: int = attrs.field(default=DEFAULT_MAX_BYTES, validator=_count(1))
    lead_rate: float = attrs.field(default=0.0, validator=_fraction)
    seed: int | None = attrs.field(default=None, validator=_count(0))

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> CanaryConfig:
        """The configuration the ``WARPOLICY_CANARY_*`` variables give: ``_RATE`` (``0.001``
        or ``1/1000``), ``_BUDGET``, ``_MAX_BYTES``, ``_LEAD_RATE``, ``_SEED``; unset ones keep
        their defaults (``environ`` None: the process environment). A bad value is an `InputError`
        naming the variable (one line)."""
        values: dict[str, Any] = {}
        for env, field, parse in (
            (environment.CANARY_RATE, "rate", _parse_rate),
            (environment.CANARY_BUDGET, "budget", _parse_int),
            (environment.CANARY_MAX_BYTES, "max_bytes", _parse_int),
            (environment.CANARY_LEAD_RATE, "lead_rate", _parse_rate),
            (environment.CANARY_SEED, "seed", _parse_int),
        ):
            raw = env.get(environ).strip()
            if raw:
                try:
                    values[field] = parse(raw)
                except ValueError:
                    raise InputError(f"{env.name}={raw!r} is not a valid {field}") from None
        try:
            return cls(**values)
        except InputError as exc:
            raise InputError(f"WARPOLICY_CANARY_*: {exc}") from None


def _parse_rate(raw: str) -> float:
    if "/" in raw:
        num, _, den = raw.partition("/")
        return float(num) / float(den)
    return float(raw)


def _parse_int(raw: str) -> int:
    return int(raw, 10)


@attrs.frozen
class CanaryCell:
    """What a violation demotes: (backend, mode, spec, bucket). ``scope`` is the backend, or,
    when the runner's policy names none, the runner (so unrelated anonymous policies never
    demote each other)."""

    backend: str
    mode: ForwardMode
    spec: str
    bucket: int | None
    scope: str

    def describe(self) -> str:
        bucket = "eager" if self.bucket is None else str(self.bucket)
        return (
            f"backend {self.backend or '?'}, mode {self.mode.label}, spec {self.spec or '?'}, "
            f"bucket {bucket}"
        )


@attrs.frozen
class Violation:
    """An early release the canary caught."""

    runner: str
    cell: CanaryCell
    step: int
    difference: Difference

    def describe(self) -> str:
        return (
            f"runner {self.runner!r} ({self.cell.describe()}), step {self.step}: "
            f"{self.difference.describe()}"
        )


class Sample:
    """One sampled step on its way to the check (see the module docstring)."""

    __slots__ = (
        "bucket",
        "held",
        "inputs",
        "observed",
        "outputs",
        "pre_inputs",
        "pre_state",
        "rerun",
        "spec",
        "state",
        "step",
    )

    def __init__(
        self,
        bucket: int | None,
        step: int,
        spec: CanarySpec,
        inputs: list[tuple[str, Snapshot]],
        state: list[tuple[str, Snapshot]],
        rerun: Callable[[], Any],
        held: int,
    ) -> None:
        self.bucket = bucket
        self.step = step
        self.spec = spec
        self.inputs = inputs
        self.state = state
        self.rerun = rerun
        self.held = held
        self.pre_inputs: list[Any] = []
        self.pre_state: list[Any] = []
        self.outputs: list[tuple[str, Any]] = []  # the live output tensors (put back)
        self.observed: list[tuple[str, Any]] = []  # what the overlapped step produced


class Canary:
    """The process's WAR canary: configuration, budget, demoted cells, release-lead summaries.

    Build it once at the composition root and give it to every runner (``canary=``) and to an
    engine's own graphs (`session`). ``platform`` is the runtime's platform; ``observers``
    receive ``warpolicy_on_violation``, ``warpolicy_on_fallback`` and
    ``warpolicy_on_release_lead``; ``lead_clock`` overrides how release leads are timed.
    """

    def __init__(
        self,
        platform: Platform,
        config: CanaryConfig | None = None,
        *,
        observers: Observers = NO_OBSERVERS,
        lead_clock: LeadClock | None = None,
    ) -> None:
        config = config if config is not None else CanaryConfig()
        if not isinstance(config, CanaryConfig):
            raise InputError(f"canary config must be a CanaryConfig, not {type(config).__name__}")
        if not isinstance(platform, Platform):
            raise InputError(f"a canary needs a Platform, not {type(platform).__name__}")
        self.platform = platform
        self.config = config
        self.observers = observers
        self.reporter = Reporter(observers, "canary")
        self._lock = threading.Lock()
        self._budget = config.budget
        self._cells: dict[CanaryCell, str] = {}
        #: bumped on every new demoted cell (sessions compare it once per step)
        self.version = 0
        #: ``sampled``, ``checked``, ``violations``, ``failures``, ``skipped``, ``discarded``
        self.stats: collections.Counter[str] = collections.Counter()
        self.violations: collections.deque[Violation] = collections.deque(maxlen=KEEP_VIOLATIONS)
        #: the most bytes one sample held (snapshots, observed results, the check's live copies)
        self.max_sample_bytes = 0
        self._leads: dict[LeadKey, LeadSummary] = {}
        self._lead_clock = lead_clock
        self._seeds = itertools.count(config.seed if config.seed is not None else 0)

    @property
    def enabled(self) -> bool:
        """Whether steps are sampled at all (``rate`` above 0)."""
        return self.config.rate > 0

    def _seed(self) -> int | None:
        return next(self._seeds) if self.config.seed is not None else None

    # -- sessions -----------------------------------------------------------------------------

    def session(
        self,
        name: str,
        mode: ForwardMode,
        *,
        backend: str = "",
        spec: str = "",
        on_demote: Callable[[int | None, str], None] | None = None,
    ) -> CanarySession:
        """A session for one runner (or one mode of an engine's graphs): ``backend`` and
        ``spec`` name the cell (empty when the policy does not say); ``on_demote(bucket,
        reason)`` is called, in the session's thread, for each of its buckets the canary
        demotes (the runner swaps that bucket's release)."""
        return CanarySession(self, name, ForwardMode.parse(mode), backend, spec, on_demote)

    # -- budget and demotions -------------------------------------------------------------------

    def has_budget(self) -> bool:
        budget = self._budget
        return budget is None or budget > 0

    def _consume(self) -> bool:
        with self._lock:
            if self._budget is not None:
                if self._budget <= 0:
                    return False
                self._budget -= 1
                if self._budget == 0:
                    log.info(
                        "warpolicy canary: the sampling budget (%d checks) is spent; no step is "
                        "sampled from now on",
                        self.config.budget,
                    )
            self.stats["sampled"] += 1
        return True

    def demote(self, cell: CanaryCell, reason: str) -> bool:
        """Demote ``cell`` to the coarse barrier for the rest of the process; False when it
        already was. Sessions of the cell apply it at their next step (the caller's at once)."""
        with self._lock:
            if cell in self._cells:
                return False
            self._cells[cell] = reason
            self.version += 1
        return True

    @property
    def demoted(self) -> Mapping[CanaryCell, str]:
        """Every demoted cell and why (a copy)."""
        with self._lock:
            return dict(self._cells)

    # -- reporting ------------------------------------------------------------------------------

    def _violation(self, violation: Violation) -> None:
        cell = violation.cell
        self.stats["violations"] += 1
        self.violations.append(violation)
        self.reporter.violation(
            violation.runner,
            cell.backend,
            cell.mode,
            cell.spec,
            cell.bucket,
            violation.step,
            violation.difference.describe(),
        )
        log.error(
            "warpolicy canary: early release caught: backend %s, mode %s, spec %s, bucket %s, "
            "step %d (runner %r): first difference %s; this cell runs the coarse barrier for "
            "the rest of the process",
            cell.backend or "?",
            cell.mode.label,
            cell.spec or "?",
            "eager" if cell.bucket is None else cell.bucket,
            violation.step,
            violation.runner,
            violation.difference.describe(),
        )

    def _failed(self, session: CanarySession, where: str, error: BaseException, text: str) -> None:
        self.stats["failures"] += 1
        session.reporter.fallback(where, error, text)

    def _skipped(self, key: str, text: str) -> None:
        self.stats["skipped"] += 1
        self.reporter.warn(key, text)

    # -- release leads --------------------------------------------------------------------------

    def lead_probe(self, reporter: Reporter | None = None) -> ReleaseLeadProbe | None:
        """A probe for one overlap loop (None when ``lead_rate`` is 0, or when this platform
        has no clock: said once). ``reporter`` is the loop's (its observers get the readings)."""
        if self.config.lead_rate <= 0:
            return None
        clock = self._lead_clock or self._default_clock()
        if clock is None:
            return None
        return ReleaseLeadProbe(
            clock,
            self.config.lead_rate,
            reporter or self.reporter,
            self._record_lead,
            self._seed(),
        )

    def _default_clock(self) -> LeadClock | None:
        p = self.platform
        if p.name == "cuda":
            return CudaLeadClock()
        if is_simulated(p.name):
            return HostLeadClock()
        self.reporter.warn(
            "lead-clock",
            f"no release-lead clock for platform {p.name!r} (give Canary(lead_clock=...)); "
            "release leads are not measured",
        )
        return None

    def _record_lead(self, key: LeadKey, step: int, lead_us: float) -> None:
        with self._lock:
            summary = self._leads.get(key)
            if summary is None:
                summary = self._leads[key] = LeadSummary()
            summary.add(lead_us)

    @property
    def leads(self) -> Mapping[LeadKey, LeadSummary]:
        """Release-lead summaries by (runner, mode, bucket) (a copy of the mapping)."""
        with self._lock:
            return dict(self._leads)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"<Canary rate={c.rate:g} budget={c.budget} lead_rate={c.lead_rate:g} "
            f"demoted={len(self._cells)} stats={dict(self.stats)}>"
        )


class CanarySession:
    """One runner's use of the canary (or one mode of an engine's own graphs).

    Per step, in order (`warpolicy.runtime.runners.GraphRunner.run` does exactly this)::

        due = session.step()                       # before reading the bucket's release
        release = session.release_for(bucket, release)   # engines; a runner swaps its own
        host_prep(batch, bucket)
        sample = session.begin(bucket, step, release, spec_fn, shared, rerun) if due else None
        fence.before_replay(release); replay(graph); fence.after_replay(release)
        if sample is not None: session.observe(sample, output)
        ... the scheduler takes, waits, writes the next step's state ...
        session.check()                            # schedule stream current, after the writes

    A session belongs to its runner's thread.
    """

    def __init__(
        self,
        canary: Canary,
        name: str,
        mode: ForwardMode,
        backend: str,
        spec: str,
        on_demote: Callable[[int | None, str], None] | None,
    ) -> None:
        self.canary = canary
        self.name = name
        self.mode = mode
        self.backend = backend
        self.spec = spec
        self.scope = backend or f"runner {name}"
        #: reports this session's fallbacks (``where="canary '<name>':<place>"``, place
        #: ``begin``, ``observe``, ``check`` or ``on_demote``)
        self.reporter = Reporter(canary.observers, f"canary {name!r}")
        self._on_demote = on_demote
        self._countdown = Countdown(canary.config.rate, canary._seed())
        self._seen = -1  # the canary version whose demotions this session applied
        self._pending: Sample | None = None
        #: this session's demoted buckets (None: the eager path) and why
        self.demoted: dict[int | None, str] = {}
        self._coarse: dict[int | None, BucketRelease] = {}

    def cell(self, bucket: int | None) -> CanaryCell:
        return CanaryCell(self.backend, self.mode, self.spec, bucket, self.scope)

    @property
    def pending(self) -> bool:
        """Whether a sampled step waits for its check."""
        return self._pending is not None

    # -- per step -------------------------------------------------------------------------------

    def step(self) -> bool:
        """Once per step, before the step reads its release: check a sample still pending (its
        check was never called: it runs now, before anything of this step), apply cells the
        canary demoted since the last step, and say whether this step is sampled."""
        if self._pending is not None:
            self.check()
        if self.canary.version != self._seen:
            self._sync()
        return self._countdown.due()

    def release_for(self, bucket: int | None, release: BucketRelease) -> BucketRelease:
        """``release``, or the coarse release that replaces it once ``bucket`` was demoted."""
        if not self.demoted:
            return release
        reason = self.demoted.get(bucket)
        if reason is None:
            return release
        coarse = self._coarse.get(bucket)
        if coarse is None or coarse.source != release.source:
            coarse = self._coarse[bucket] = demote_release(release, reason)
        return coarse

    def begin(
        self,
        bucket: int | None,
        step: int,
        release: BucketRelease,
        spec_fn: Callable[[], CanarySpec | None],
        shared: Mapping[str, Any],
        rerun: Callable[[], Any],
    ) -> Sample | None:
        """On a sampled step, after its host prep and before anything is published, on the
        forward stream: save what the step will read. None when the step is not checked: it
        publishes nothing (nothing can race), its cell is demoted, the budget is spent, the
        adapter has no spec for it, or it would hold more than ``max_bytes``.

        ``spec_fn()`` asks the adapter (`CanarySpec`); ``shared`` is the model's shared buffers
        (the default ``inputs``); ``rerun()`` replays the step's graph (or reruns its eager
        forward) and returns its output."""
        if release.policy is NONE or bucket in self.demoted or self._pending is not None:
            return None
        canary = self.canary
        if not canary.has_budget():
            return None
        try:
            return self._begin(bucket, step, spec_fn, shared, rerun)
        except BaseException as exc:
            self._fail(bucket, step, "begin", exc)
            if not isinstance(exc, Exception):
                raise
            return None

    def _begin(
        self,
        bucket: int | None,
        step: int,
        spec_fn: Callable[[], CanarySpec | None],
        shared: Mapping[str, Any],
        rerun: Callable[[], Any],
    ) -> Sample | None:
        canary = self.canary
        where = "eager" if bucket is None else f"bucket {bucket}"
        spec = spec_fn()
        if spec is None:
            canary._skipped(
                f"no-spec:{self.name}:{bucket}",
                f"runner {self.name!r} {where}: the model gives no canary spec; not sampled",
            )
            return None
        if not isinstance(spec, CanarySpec):
            raise InputError(f"canary_spec returned {type(spec).__name__}, not a CanarySpec")
        given = spec.inputs if spec.inputs is not None else shared
        inputs = [(str(n), as_snapshot(str(n), v)) for n, v in dict(given).items()]
        state = [(str(n), as_snapshot(str(n), v)) for n, v in dict(spec.state).items()]
        held = 2 * sum(s.nbytes for _, s in inputs) + 4 * sum(s.nbytes for _, s in state)
        if held > canary.config.max_bytes:
            canary._skipped(
                f"too-big:{self.name}:{bucket}",
                f"runner {self.name!r} {where}: a sample would hold {held} bytes of snapshots, "
                f"over the canary's max_bytes ({canary.config.max_bytes}); not sampled",
            )
            return None
        if not canary._consume():
            return None
        sample = Sample(bucket, step, spec, inputs, state, rerun, held)
        sample.pre_inputs = [s.save() for _, s in inputs]
        sample.pre_state = [s.save() for _, s in state]
        return sample

    def observe(self, sample: Sample, output: Any) -> None:
        """Right after the sampled step's publish, on the forward stream: save what it produced
        (its output and ``state``); the sample then waits for `check`."""
        try:
            outputs = flatten_outputs(output)
            out_bytes = sum(int(t.numel()) * int(t.element_size()) for _, t in outputs)
            limit = self.canary.config.max_bytes
            if sample.held + 2 * out_bytes > limit:
                where = "eager" if sample.bucket is None else f"bucket {sample.bucket}"
                self.canary._skipped(
                    f"too-big:{self.name}:{sample.bucket}",
                    f"runner {self.name!r} {where}: a sample would hold "
                    f"{sample.held + 2 * out_bytes} bytes with its output, over the canary's "
                    f"max_bytes ({limit}); not sampled",
                )
                return
            held = sample.held + 2 * out_bytes
            self.canary.max_sample_bytes = max(self.canary.max_sample_bytes, held)
            compared = outputs if sample.spec.compare_output else []
            observed = [(label, t.detach().clone()) for label, t in compared]
            observed += [(f"state[{n!r}]", s.save()) for n, s in sample.state]
            sample.outputs = outputs
            sample.observed = observed
        except BaseException as exc:
            self._fail(sample.bucket, sample.step, "observe", exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._pending = sample

    def discard(self) -> None:
        """Drop the pending sample unchecked (its graph is about to be replaced: a re-capture
        must never find an old graph replayed into memory the new capture reuses)."""
        if self._pending is not None:
            self._pending = None
            self.canary.stats["discarded"] += 1

    def check(self) -> Violation | None:
        """Check the pending sample, if any (see the module docstring); returns the violation
        it caught, else None. Call it after the scheduler's writes for the next step, with the
        stream those writes are on current, before recording the event the next forward waits
        on. Never raises, except `CanaryError` (the live state could not be put back) and a
        ``BaseException`` that is not an ``Exception`` (after failing closed)."""
        sample, self._pending = self._pending, None
        if sample is None:
            return None
        try:
            difference = self._compare(sample)
        except BaseException as exc:
            self._fail(sample.bucket, sample.step, "check", exc)
            if not isinstance(exc, Exception) or isinstance(exc, CanaryError):
                raise
            return None
        self.canary.stats["checked"] += 1
        if difference is None:
            return None
        violation = Violation(self.name, self.cell(sample.bucket), sample.step, difference)
        self._demote(
            sample.bucket,
            f"canary: step {sample.step} differed from its replay behind a full barrier "
            f"({difference.describe()}): an early release; coarse for the rest of the process",
        )
        self.canary._violation(violation)
        return violation

    # -- the check ------------------------------------------------------------------------------

    def _compare(self, sample: Sample) -> Difference | None:
        p = self.canary.platform
        p.synchronize()  # the full barrier: the overlapped step and the writes after it are done
        live_out = [t.detach().clone() for _, t in sample.outputs]
        live_in = [s.save() for _, s in sample.inputs]
        live_state = [s.save() for _, s in sample.state]
        try:
            for (_, s), saved in zip(sample.inputs, sample.pre_inputs):
                s.load(saved)
            for (_, s), saved in zip(sample.state, sample.pre_state):
                s.load(saved)
            output = sample.rerun()
            p.synchronize()
            reference = flatten_outputs(output) if sample.spec.compare_output else []
            reference += [(f"state[{n!r}]", s.save()) for n, s in sample.state]
            return first_difference(reference, sample.observed, sample.spec.tolerance)
        finally:
            self._put_back(sample, live_out, live_in, live_state)

    def _put_back(
        self, sample: Sample, live_out: list[Any], live_in: list[Any], live_state: list[Any]
    ) -> None:
        try:
            for (_, tensor), saved in zip(sample.outputs, live_out):
                tensor.copy_(saved)
            for (_, s), saved in zip(sample.inputs, live_in):
                s.load(saved)
            for (_, s), saved in zip(sample.state, live_state):
                s.load(saved)
        except BaseException as exc:
            raise CanaryError(
                f"warpolicy canary: runner {self.name!r}: putting the live state back after "
                f"checking step {sample.step} failed ({exc!r}); the shared buffers and state "
                "may hold the step's pre-step contents, so this process must not serve on"
            ) from exc

    # -- failing closed -------------------------------------------------------------------------

    def _fail(self, bucket: int | None, step: int, where: str, exc: BaseException) -> None:
        """Anything that raised inside the canary: the cell coarse, then reported."""
        text = (
            f"the canary failed in {where} of step {step} ({exc!r}); "
            f"{self.cell(bucket).describe()} runs the coarse barrier for the rest of the process"
        )
        self._demote(bucket, text)
        self.canary._failed(self, where, exc, text)

    def _demote(self, bucket: int | None, reason: str) -> None:
        self.canary.demote(self.cell(bucket), reason)
        self._sync()

    def _sync(self) -> None:
        """Apply every demoted cell of this session's (scope, mode, spec) not applied yet."""
        canary = self.canary
        self._seen = canary.version
        for cell, reason in canary.demoted.items():
            if (
                cell.scope != self.scope
                or cell.mode != self.mode
                or cell.spec != self.spec
                or cell.bucket in self.demoted
            ):
                continue
            self.demoted[cell.bucket] = reason
            if self._on_demote is not None:
                try:
                    self._on_demote(cell.bucket, reason)
                except Exception as exc:  # noqa: BLE001 - release_for still answers coarse
                    self.reporter.fallback("on_demote", exc)

    def __repr__(self) -> str:
        return (
            f"<CanarySession {self.name!r} {self.mode.label} scope={self.scope!r} "
            f"demoted={sorted(self.demoted, key=str)} pending={self.pending}>"
        )


__all__ = [
    "DEFAULT_MAX_BYTES",
    "Canary",
    "CanaryCell",
    "CanaryConfig",
    "CanaryError",
    "CanarySession",
    "Sample",
    "Violation",
]
