"""The cases of the matrix and how one runs: scenario x variant x fault (or none).

For each scenario and variant a fault-free *baseline* run counts how often each target is
called, overall and per phase. The cases are then: the baseline itself, and for every target
the baseline called, its n-th call failing (every n with ``full=True``; the first three, the
middle and the last one otherwise) and every call in each phase it was called in, in every
fault mode (observer hooks have no result: raising modes only). A target no baseline calls
has no cases and shows in the report as never firing.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs

from warpolicy.runtime.platforms.sim import SimPlatform
from warpolicy.testing.faults.harness import PLATFORM_TARGETS, Harness, Outcome
from warpolicy.testing.faults.injection import ACTION_MODES, MODES, RAISING_MODES, Fault
from warpolicy.testing.faults.model import ACTION_TARGETS, MODEL_TARGETS, OBSERVER_TARGETS
from warpolicy.testing.faults.scenarios import SCENARIOS
from warpolicy.testing.faults.staging import STAGING_TARGETS

#: Everything the matrix can fail, by kind.
TARGET_KINDS: dict[str, tuple[str, ...]] = {
    "platform": PLATFORM_TARGETS,
    "model": MODEL_TARGETS,
    "scheduler": ("write_next",),
    "policy": ("policy",),
    "observer": OBSERVER_TARGETS,
    "action": ACTION_TARGETS,
    "staging": STAGING_TARGETS,
}
TARGETS: tuple[str, ...] = tuple(t for group in TARGET_KINDS.values() for t in group)
#: Scenarios run without faults only (their interest is the configuration itself).
BASELINE_ONLY = frozenset({"threads"})

PlatformHook = Callable[[Harness, SimPlatform], None]


@attrs.frozen
class Case:
    """One run: a scenario, its variant, the fault injected (None: the baseline), and an
    optional trigger (a second fault that takes the runtime down the path ``fault`` aims at,
    e.g. a failure the fence absorbs, so that the fallback observer is called at all)."""

    scenario: str
    variant: str
    fault: Fault | None = None
    trigger: Fault | None = None
    #: the two-fault mode: a fault that arms once ``fault`` fired (`Injector`), e.g. a
    #: KeyboardInterrupt in the fallback the first fault sent the runtime down
    second: Fault | None = None

    @property
    def target(self) -> str:
        return self.fault.target if self.fault is not None else "(no fault)"

    @property
    def faults(self) -> tuple[Fault, ...]:
        return tuple(f for f in (self.fault, self.trigger) if f is not None)

    def describe(self) -> str:
        fault = self.fault.describe() if self.fault is not None else "no fault"
        trigger = f" (after {self.trigger.describe()})" if self.trigger is not None else ""
        second = f", then {self.second.describe()} after it" if self.second is not None else ""
        return f"{self.scenario}/{self.variant}: {fault}{trigger}{second}"


@attrs.frozen
class CaseResult:
    case: Case
    outcome: Outcome

    @property
    def fired(self) -> bool:
        return self.outcome.fired > 0

    @property
    def both_fired(self) -> bool:
        """A two-fault case whose second fault fired too (after the first)."""
        return self.case.second is not None and self.outcome.fired_second > 0

    @property
    def early(self) -> bool:
        return self.outcome.early_writes > 0

    @property
    def early_kind(self) -> str | None:
        """How the case's early releases came: ``silent``, ``warned`` or ``error`` (the
        quietest of them: one silent early release makes the case silent)."""
        o = self.outcome
        if o.early_silent:
            return "silent"
        if o.early_warned:
            return "warned"
        if o.early_after_error:
            return "error"
        return None


def run_case(
    case: Case,
    platform_hook: PlatformHook | None = None,
    *,
    runner_options: dict[str, Any] | None = None,
    wrap_runner: Callable[[Harness, Any], Any] | None = None,
) -> CaseResult:
    """Run one case on a fresh harness. The positive controls add a misbehaving platform
    (``platform_hook``), runner options, or a runner with a bug (``wrap_runner``)."""
    scenario = SCENARIOS[case.scenario]
    harness = Harness(
        *case.faults,
        second=case.second,
        check_stale=scenario.check_stale,
        yield_points=scenario.yield_points,
        platform_hook=platform_hook,
        runner_options=runner_options,
        wrap_runner=wrap_runner,
    )
    with harness.recording():
        scenario.run(harness, case.variant)
    return CaseResult(case, harness.outcome())


@functools.cache
def baseline(scenario: str, variant: str, trigger: Fault | None = None) -> Outcome:
    """The run of a scenario and variant without a fault (but the ``trigger``, if any), cached:
    it sizes the cases."""
    return run_case(Case(scenario, variant, trigger=trigger)).outcome


#: Targets called only on a failure path, and the trigger that takes the runtime there.
TRIGGERS: dict[str, Fault] = {
    "warpolicy_on_fallback": Fault("record", "raise", phase="run"),
    "warpolicy_on_demotion": Fault("check_marker", "raise", phase="capture"),
}
#: Faults aimed at one path, each with its trigger: a re-capture that fails after the
#: fence's seed record failed (the bucket not yet re-captured must not keep its old graph).
COMPOUND: tuple[tuple[str, Fault], ...] = (
    ("capture_callable", Fault("record", "raise", nth=1, phase="recapture")),
)


def _sample(count: int, full: bool) -> list[int]:
    if full or count <= 5:
        return list(range(1, count + 1))
    return sorted({1, 2, 3, (count + 1) // 2, count})


#: Operations whose success returns nothing: "return None" there is a platform that silently
#: skips its work, which no caller can tell from success (the positive controls cover that).
VOID_TARGETS = frozenset(
    {
        "record",
        "wait_event",
        "wait_stream",
        "capture_callable",
        "replay",
        "synchronize",
        "instantiate",
    }
)


def modes_for(target: str) -> tuple[str, ...]:
    if target in ACTION_TARGETS:
        return ACTION_MODES
    # a staging copy returns nothing: "return None" would be a stager that silently skips a
    # copy, a lie no caller can tell from success (the lying-stager control covers it)
    if target in OBSERVER_TARGETS or target in VOID_TARGETS or target in STAGING_TARGETS:
        return RAISING_MODES
    return MODES


def cases(
    *,
    full: bool = False,
    scenarios: Iterable[str] | None = None,
    targets: Iterable[str] | None = None,
) -> Iterator[Case]:
    """Every case, in a stable order (``scenarios`` / ``targets``: only those)."""
    wanted = set(targets) if targets is not None else None
    for name in scenarios if scenarios is not None else SCENARIOS:
        for variant in SCENARIOS[name].variants:
            if wanted is None or "(no fault)" in wanted:
                yield Case(name, variant)
            if name in BASELINE_ONLY:
                continue
            for target in TARGETS:
                if wanted is None or target in wanted:
                    yield from _target_cases(name, variant, target, full)
            for target, trigger in COMPOUND:
                if wanted is None or target in wanted:
                    for mode in modes_for(target):
                        fault = Fault(target, mode, nth=1, phase="recapture")
                        yield Case(name, variant, fault, trigger)


def _target_cases(name: str, variant: str, target: str, full: bool) -> Iterator[Case]:
    trigger = None
    base = baseline(name, variant)
    if not dict(base.calls).get(target) and target in TRIGGERS:
        trigger = TRIGGERS[target]
        base = baseline(name, variant, trigger)
    count = dict(base.calls).get(target, 0)
    if not count:
        return
    for mode in modes_for(target):
        for nth in _sample(count, full):
            yield Case(name, variant, Fault(target, mode, nth=nth), trigger)
        for t, phase in base.phases:
            if t == target and phase not in ("setup", "drain"):
                yield Case(name, variant, Fault(target, mode, phase=phase), trigger)


#: The second faults of the two-fault mode: an interrupt (or another BaseException) in an
#: ordering operation the runtime calls after the first fault, i.e. in its fallback.
SECOND_TARGETS = ("wait_stream", "synchronize", "wait_event", "record")
SECOND_MODES = ("interrupt", "base")
#: Two-fault cases the default (CI) run samples, and its seed (reproducible).
TWO_FAULT_SAMPLE = 1500
TWO_FAULT_SEED = 26


def two_fault_cases(
    *,
    sample: int | None = TWO_FAULT_SAMPLE,
    seed: int = TWO_FAULT_SEED,
    scenarios: Iterable[str] | None = None,
) -> list[Case]:
    """Two faults in one run: every raising single-fault case of the matrix (``full=False``),
    followed by each second fault (`SECOND_TARGETS` x `SECOND_MODES`, on the first or second
    call of its target after the first fault fired). ``sample``: that many of them, drawn with
    ``seed`` (None: all), in a stable order."""
    pool: list[Case] = []
    for case in cases(scenarios=scenarios):
        if case.fault is None or case.fault.mode not in RAISING_MODES:
            continue
        for target in SECOND_TARGETS:
            for mode in SECOND_MODES:
                for nth in (1, 2):
                    pool.append(attrs.evolve(case, second=Fault(target, mode, nth=nth)))
    if sample is None or sample >= len(pool):
        return pool
    chosen = sorted(random.Random(seed).sample(range(len(pool)), sample))
    return [pool[i] for i in chosen]


def run_cases(
    selected: Sequence[Case], platform_hook: PlatformHook | None = None
) -> list[CaseResult]:
    return [run_case(case, platform_hook) for case in selected]
